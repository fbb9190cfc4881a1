"""tokenize: the tokenizer (vocabulary, what it was trained on) and each token split (documents,
tokens, bytes, bytes per token), from their manifests. The per-language premium is shown when the
tokenizer folder holds report.json, the output of
`llmctl tokenize report TOKENIZER --sample DOCS --json > TOKENIZER/report.json` (the stage that
measures it); it is not measured here."""

from __future__ import annotations

import json

from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Section, Table
from llmctl.report.sections.common import Images, changed_note

REPORT_FILE = "report.json"


def sections(lineage: Lineage, images: Images) -> list[Section]:
    tokenizers, splits = lineage.stage("tokenize train"), [a for a in lineage.artifacts if a.kind == "tokens"]
    if not tokenizers and not splits:
        return []
    s = Section("tokenize", "tokenize", [str(a.path) for a in (*tokenizers, *splits)])
    for a in tokenizers:
        s.notes += changed_note(a)
        c, cfg = a.manifest.counts, a.manifest.config
        s.facts.update({
            "vocabulary": c.get("vocab_size", cfg.get("vocab_size")),
            "special tokens": len(cfg.get("special") or {}),
            "pre-tokenizer pattern": cfg.get("pattern"),
            "tokenizer trained on (documents)": c.get("docs_sampled"),
            "tokenizer trained on (characters)": c.get("chars_sampled"),
            "tokenizer wall seconds": a.manifest.wall_seconds,
        })
        _premium(a, s)
    rows = []
    for a in splits:
        s.notes += changed_note(a)
        c, cfg = a.manifest.counts, a.manifest.config
        tokens, nbytes = c.get("tokens"), c.get("bytes")
        rows.append([a.path.name, cfg.get("split"), c.get("docs"), tokens, nbytes,
                     round(nbytes / tokens, 4) if tokens and nbytes else None, cfg.get("dtype"), a.manifest.wall_seconds])
    if rows:
        s.tables.append(Table(["artifact", "split", "documents", "tokens", "UTF-8 bytes", "bytes / token", "dtype", "wall seconds"],
                              rows, "token artifacts"))
    return [s]


def _premium(a: Artifact, s: Section) -> None:
    f = a.path / REPORT_FILE
    if not f.is_file():
        s.notes.append(f"No {REPORT_FILE} beside the tokenizer: no per-language premium "
                       f"(llmctl tokenize report {a.path} --sample DOCS --json > {f} writes one).")
        return
    try:
        r = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        s.notes.append(f"{f} is unreadable ({e}): no per-language premium.")
        return
    labels = {"bytes_per_token": "bytes / token (report sample)", "chars_per_token": "characters / token (report sample)",
              "vocab_utilization": "share of the vocabulary used (report sample)"}
    s.facts.update({label: r[k] for k, label in labels.items() if k in r})
    langs = r.get("languages") or {}
    if langs:
        s.tables.append(Table(["language", "documents", "tokens / character", "premium vs en"],
                              [[k, v.get("docs"), v.get("tokens_per_char"), v.get("premium_vs_en")] for k, v in langs.items()],
                              f"per-language premium, from {f.name} ({r.get('sample_docs')} sampled documents)"))

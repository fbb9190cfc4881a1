"""crawl-extract: the WARC files, their records, what was skipped and why, the languages kept.

Languages are the `lang` column the stage wrote into its own Parquet shards (lid.176's label for
each kept document), counted here; the manifest records no per-language totals."""

from __future__ import annotations

from collections import Counter

from llmctl.report import charts
from llmctl.report.collect import Artifact, Lineage
from llmctl.report.page import Figure, Section, Table
from llmctl.report.sections.common import Images, per_artifact, per_second

TOP_LANGUAGES = 15  # bars in the chart; the table lists every language


def languages(a: Artifact) -> Counter:
    import pyarrow.parquet as pq

    counts: Counter = Counter()
    for out in a.manifest.outputs:
        f = a.path / out["file"]
        if not out["file"].endswith(".parquet") or out["file"].startswith("rejected/") or not f.is_file():
            continue
        if "lang" in pq.read_schema(f).names:
            counts.update(x if x is not None else "?" for x in pq.read_table(f, columns=["lang"]).column("lang").to_pylist())
    return counts


def sections(lineage: Lineage, images: Images) -> list[Section]:
    return per_artifact(lineage.stage("crawl-extract"), "crawl", images, _fill)


def _fill(a: Artifact, s: Section, images: Images) -> None:
    m, c = a.manifest, a.manifest.counts
    warcs = [r for r in m.inputs if r.get("kind") == "file"]
    s.facts = {
        "WARC files": len(warcs),
        "WARC bytes": sum(r.get("bytes", 0) for r in warcs),
        "WARC records": c.get("records"),
        "response records": c.get("in"),
        "documents out": c.get("out"),
        "errors": c.get("errors"),
        "wall seconds": m.wall_seconds,
        "documents / s": per_second(c.get("out"), m.wall_seconds),
    }
    reasons = [[f"skipped: {k}", v] for k, v in (c.get("skipped") or {}).items()]
    reasons += [[f"rejected: {k}", v] for k, v in (c.get("rejected") or {}).items()]
    reasons.sort(key=lambda r: -r[1])
    s.tables.append(Table(["reason", "records"], reasons, "records skipped or rejected, by reason"))
    if warcs:
        s.tables.append(Table(["WARC file", "bytes", "sha256"], [[r["path"], r.get("bytes"), r.get("sha256", "")[:16]] for r in warcs], "inputs"))
    langs = languages(a)
    if langs:
        ranked = langs.most_common()
        s.tables.append(Table(["language", "documents", "share"], [[k, v, round(v / sum(langs.values()), 4)] for k, v in ranked],
                              "documents kept, by lid.176 language (the lang column of the shards)"))
        top = ranked[:TOP_LANGUAGES]
        path = charts.bars(images.folder(s.key) / "languages.png", [k for k, _ in top], [v for _, v in top],
                           "documents by language", "documents")
        s.figures.append(Figure(images.rel(path), "documents kept, by language" + (f" (top {TOP_LANGUAGES})" if len(ranked) > TOP_LANGUAGES else "")))
    else:
        s.notes.append("The shards have no lang column: no language counts.")

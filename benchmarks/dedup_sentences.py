"""dedup --sentences side by side with datatrove's sentence dedup, on real pages and on the same
pages with planted repeats.

    make bench-setup
    .venv-bench/bin/python benchmarks/dedup_sentences.py [--repeat 3] [--no-write]

Inputs: (a) the documents `llmctl crawl-extract` makes from pages-a.warc.gz (common.DEFAULT_WARC);
(b) the same documents (same ids, same parts) with repeats planted, seeded: into 30% of them 1-3
lines of another document, into 12% a run of 3-6 sentences of another document in the middle of a
line, and 3% replaced by another document with its case and digits changed (equal after
datatrove's simplification). Donors are earlier or later documents, so both "keep the first copy"
directions occur.

Sides, each a child process timed from the outside (start-up and imports count alike), interleaved:
  llmctl     llmctl dedup DOCS -o OUT --sentences --n-sentences 3 --min-doc-words 50 --workers N
             --keep-rejected                                                        (N = 1, 2)
  datatrove  ParquetReader -> SentenceDedupSignature; SentenceFindDedups; ParquetReader ->
             SentenceDedupFilter (exclusion writer) -> ParquetWriter, SentDedupConfig(n_sentences=3,
             min_doc_words=50), its other defaults. 1 worker: one task, so documents are numbered in
             input order, as llmctl numbers them. 2 workers: one task per input file, the only way it
             uses two; each task numbers its own documents and the finder orders them by (number in
             the task, task), so which copy survives can change where a repeat spans files.
  module     sentences.dedup_texts in this process: the core the stage calls, without the stage.
A document is identical when both sides drop it or both keep it with the same text; the reference
is datatrove with one task. Every difference is listed with its cause.
The tables go to stdout and into benchmarks/RESULTS.md (## dedup sentences).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, first_difference, make_docs, pct, timed_cpu, write_results  # noqa: E402

N_SENTENCES, MIN_WORDS = 3, 50
WORKERS = (1, 2)
SEED = 20261204


# ---------------------------------------------------------------------------------------------
# inputs


def read_docs(folder: str) -> list[list[tuple[str, str]]]:
    """(id, text) of each row, part by part, in input order."""
    import pyarrow.parquet as pq

    return [list(zip(*pq.read_table(p, columns=["id", "text"]).to_pydict().values()))
            for p in sorted(glob.glob(os.path.join(folder, "part-*.parquet")))]  # fmt: skip


_SENT_END = re.compile(r"(?<=[.!?])\s+")  # a neutral splitter for choosing what to copy, not llmctl's or spaCy's


def plant(texts: list[str], seed: int) -> tuple[list[str], Counter]:
    rng = random.Random(seed)
    out, kinds = list(texts), Counter()
    for i in range(len(texts)):
        r, donor = rng.random(), rng.randrange(len(texts))
        if donor == i or r >= 0.45:
            continue
        if r < 0.30:  # 1-3 whole lines of another document, at a line boundary
            lines, mine = texts[donor].split("\n"), out[i].split("\n")
            k, j = rng.randrange(len(lines)), rng.randrange(len(out[i].split("\n")) + 1)
            out[i] = "\n".join(mine[:j] + lines[k : k + rng.randint(1, 3)] + mine[j:])
            kinds["lines"] += 1
        elif r < 0.42:  # 3-6 sentences of another document, after a sentence in the middle of a line
            sents = _SENT_END.split(texts[donor])
            k = rng.randrange(max(1, len(sents) - 3))
            run = " ".join(sents[k : k + rng.randint(3, 6)])
            cuts = [m.end() for m in _SENT_END.finditer(out[i])] or [len(out[i])]
            at = rng.choice(cuts)
            out[i] = out[i][:at] + run + " " + out[i][at:]
            kinds["sentences"] += 1
        else:  # a whole other document, its case and digits changed
            t = "".join(c.swapcase() if rng.random() < 0.1 else c for c in texts[donor])
            out[i] = re.sub(r"[0-9]", lambda m: str((int(m.group()) + 1) % 10), t)
            kinds["near-copy"] += 1
    return out, kinds


def write_docs(parts: list[list[tuple[str, str]]], texts: list[str], folder: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    k = 0
    for p, rows in enumerate(parts):
        ids = [i for i, _ in rows]
        pq.write_table(pa.table({"id": ids, "text": texts[k : k + len(rows)]}), os.path.join(folder, f"part-{p:05d}.parquet"))
        k += len(rows)


# ---------------------------------------------------------------------------------------------
# sides


def run_llmctl(docs: str, out: str, workers: int) -> tuple[float, float]:
    cmd = [str(LLMCTL), "dedup", docs, "-o", out, "--sentences", "--n-sentences", str(N_SENTENCES), "--min-doc-words",
           str(MIN_WORDS), "--workers", str(workers), "--keep-rejected", "--overwrite", "--quiet"]  # fmt: skip
    return timed_cpu(cmd, dict(os.environ), out + ".log")


def run_datatrove(docs: str, out: str, tasks: int, workers: int) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)  # its executor skips the tasks its logs call done: every run starts bare
    cmd = [sys.executable, __file__, "--datatrove-child", docs, out, str(tasks), str(workers)]
    return timed_cpu(cmd, dict(os.environ), out + ".log")


def datatrove_child(docs: str, out: str, tasks: int, workers: int) -> None:
    """Runs inside the timed child: datatrove's three steps as its example script chains them."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.sentence_dedup import SentDedupConfig, SentenceDedupFilter, SentenceDedupSignature, SentenceFindDedups
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import ParquetWriter

    cfg = SentDedupConfig(n_sentences=N_SENTENCES, min_doc_words=MIN_WORDS)
    sigs, dups = os.path.join(out, "sigs"), os.path.join(out, "dups")

    def reader():
        return ParquetReader(docs, glob_pattern="part-*.parquet", text_key="text", id_key="id")

    stages = [
        ([reader(), SentenceDedupSignature(output_folder=sigs, config=cfg, finder_workers=1)], tasks),
        ([SentenceFindDedups(data_folder=sigs, output_folder=dups, config=cfg)], 1),
        ([reader(), SentenceDedupFilter(data_folder=dups, config=cfg, exclusion_writer=ParquetWriter(os.path.join(out, "removed"))),
          ParquetWriter(os.path.join(out, "output"))], tasks),  # fmt: skip
    ]
    for i, (pipeline, t) in enumerate(stages, 1):
        LocalPipelineExecutor(pipeline, tasks=t, workers=min(t, workers), logging_dir=os.path.join(out, "logs", f"stage{i}")).run()


def kept(folder: str, pattern: str) -> dict[str, str]:
    """{id: text} of the documents a side kept."""
    import pyarrow.parquet as pq

    out = {}
    for p in sorted(glob.glob(os.path.join(folder, pattern))):
        t = pq.read_table(p, columns=["id", "text"]).to_pydict()
        out.update(zip(t["id"], t["text"]))
    return out


# ---------------------------------------------------------------------------------------------
# comparison


def outcome(text: str | None) -> str:
    return "dropped" if text is None else f"kept ({len(text)} chars)"


def explain(original: str, ref: str | None, other: str | None, module: str | None) -> str:
    """Why `other` (llmctl's CLI) differs from datatrove's `ref`."""
    from llmctl.data.dedup import sentences as S

    why = []
    if module == ref:
        why.append("the module agrees with datatrove: the stage's wiring differs")
    if ref is None and other is not None:
        words, sents = S.word_count(other), len(S.sentence_spans(other))
        if not other:
            why.append("datatrove drops an empty text")
        elif words >= MIN_WORDS and sents < 3:
            why.append(f"{words} words but {sents} sentence(s): datatrove's min_num_sentences = 3")
    if ref is not None and other is not None:
        d = first_difference(ref, other, 60, 30)
        why.append(f"first difference: datatrove {d[0]!r} / llmctl {d[1]!r}" if d else "same text")
    return "; ".join(why) or "unexplained"


def compare(ids: list[str], texts: list[str], ref: dict, other: dict, module: list | None = None,
            names: tuple[str, str] = ("datatrove", "llmctl")) -> tuple[int, list[str]]:
    same, notes = 0, []
    for k, (i, t) in enumerate(zip(ids, texts)):
        a, b = ref.get(i), other.get(i)
        if a == b:
            same += 1
        else:
            why = explain(t, a, b, module[k] if module else None) if module is not None else ""
            notes.append(f"`{i}`: {names[0]} {outcome(a)}, {names[1]} {outcome(b)}" + (f" — {why}" if why else ""))
    return same, notes


def changed(ids: list[str], texts: list[str], out: dict) -> tuple[int, int]:
    """(documents cut or dropped, documents dropped)."""
    return sum(out.get(i) != t for i, t in zip(ids, texts)), sum(i not in out for i in ids)


# ---------------------------------------------------------------------------------------------


def versions() -> dict:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    return {"datatrove": version("datatrove"), "spacy": version("spacy"), "llmctl": llm or f"llmctl {version('llmctl')}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side, interleaved; the median counts")
    ap.add_argument("--workdir", help="keep every output here (default: a temporary folder, removed)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not update RESULTS.md")
    ap.add_argument("--datatrove-child", nargs=4, metavar=("DOCS", "OUT", "TASKS", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.datatrove_child:
        docs, out, tasks, workers = args.datatrove_child
        return datatrove_child(docs, out, int(tasks), int(workers))
    if not DEFAULT_WARC.exists():
        sys.exit(f"needs {DEFAULT_WARC}")
    from llmctl.data.dedup import sentences as S

    load_before, t_start = os.getloadavg()[0], time.perf_counter()
    tmp_obj = None if args.workdir else tempfile.TemporaryDirectory(prefix="bench-sentences-")
    tmp = args.workdir or tmp_obj.name
    os.makedirs(tmp, exist_ok=True)
    try:
        pages = make_docs(tmp, "pages")
        parts = read_docs(pages)
        ids = [i for rows in parts for i, _ in rows]
        base = [t for rows in parts for _, t in rows]
        planted_texts, kinds = plant(base, SEED)
        write_docs(parts, planted_texts, os.path.join(tmp, "planted"))
        corpora = {"pages": (pages, base), "planted": (os.path.join(tmp, "planted"), planted_texts)}
        files = len(parts)

        secs: dict = {}
        for r in range(args.repeat):
            for name, (docs, _) in corpora.items():
                for w in WORKERS:
                    tasks = 1 if w == 1 else files
                    print(f"run {r + 1}/{args.repeat}: {name}, {w} worker(s)", file=sys.stderr)
                    secs.setdefault((name, "datatrove", w), []).append(run_datatrove(docs, os.path.join(tmp, f"dt-{name}-{w}"), tasks, w))
                    secs.setdefault((name, "llmctl", w), []).append(run_llmctl(docs, os.path.join(tmp, f"ll-{name}-{w}"), w))

        rows, speed, notes = [], [], []
        for name, (docs, texts) in corpora.items():
            t0 = time.perf_counter()
            module = S.dedup_texts(texts, N_SENTENCES, MIN_WORDS)
            module_s = time.perf_counter() - t0
            mod = {i: t for i, t in zip(ids, module) if t is not None}
            dt = {w: kept(os.path.join(tmp, f"dt-{name}-{w}", "output"), "*.parquet") for w in WORKERS}
            ll = {w: kept(os.path.join(tmp, f"ll-{name}-{w}"), "part-*.parquet") for w in WORKERS}
            same_cli, cli_notes = compare(ids, texts, dt[1], ll[1], module)
            same_mod, mod_notes = compare(ids, texts, dt[1], mod)
            same_dt2, dt2_notes = compare(ids, texts, dt[1], dt[2], names=("1 task", f"{files} tasks"))
            same_ll2 = sum(ll[1].get(i) == ll[2].get(i) for i in ids)
            ch = {k: changed(ids, texts, v) for k, v in (("dt", dt[1]), ("dt2", dt[2]), ("ll", ll[1]))}
            n = len(ids)
            rows.append(f"| {name} | {n} | {ch['dt'][0]} ({ch['dt'][1]} dropped) | {ch['ll'][0]} ({ch['ll'][1]} dropped) | "
                        f"**{pct(same_cli, n)}** | {pct(same_mod, n)} | {pct(same_ll2, n)} | {ch['dt2'][0]} ({ch['dt2'][1]} dropped), "
                        f"{pct(same_dt2, n)} |")  # fmt: skip
            for w in WORKERS:
                d = statistics.median(s for s, _ in secs[(name, "datatrove", w)])
                l = statistics.median(s for s, _ in secs[(name, "llmctl", w)])  # noqa: E741
                dc = statistics.median(c for _, c in secs[(name, "datatrove", w)])
                lc = statistics.median(c for _, c in secs[(name, "llmctl", w)])
                speed.append(f"| {name} | {w} | {1 if w == 1 else files} | {n / d:.1f} ({d:.1f} s, {dc:.1f} CPU s) | "
                             f"{n / l:.1f} ({l:.1f} s, {lc:.1f} CPU s) | **{d / l:.2f}×** |")  # fmt: skip
            speed.append(f"| {name} | module, in process | - | - | {n / module_s:.1f} ({module_s:.2f} s) | - |")
            if cli_notes:
                notes.append(f"**{name}**, llmctl CLI vs datatrove (one task), every difference:\n\n" + "\n".join(f"- {x}" for x in cli_notes))
            if mod_notes:
                notes.append(f"**{name}**, module vs datatrove (one task), every difference:\n\n" + "\n".join(f"- {x}" for x in mod_notes))
            if dt2_notes:
                notes.append(f"**{name}**, datatrove with {files} tasks vs datatrove with one task ({len(dt2_notes)} docs differ: "
                             f"which copy is the earlier one depends on its task split, not on input order):\n\n"
                             + "\n".join(f"- {x}" for x in dt2_notes[:10]) + (f"\n- … {len(dt2_notes) - 10} more" if len(dt2_notes) > 10 else ""))  # fmt: skip
    finally:
        if tmp_obj:
            tmp_obj.cleanup()

    v = versions()
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/dedup_sentences.py"] + sys.argv[1:])
    section = f"""## dedup sentences

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
1-min load average {load_before:.2f} before / {os.getloadavg()[0]:.2f} after, {time.perf_counter() - t_start:.0f} s in all.
{v['llmctl']}, datatrove {v['datatrove']} (spaCy {v['spacy']} blank `en` + sentencizer).
Inputs: **pages** = the {len(ids)} docs of `llmctl crawl-extract {os.path.relpath(DEFAULT_WARC, REPO)}` ({files} parts);
**planted** = the same docs with repeats planted (seed {SEED}): {kinds['lines']} with 1-3 lines of another doc,
{kinds['sentences']} with a run of 3-6 sentences of another doc mid-line, {kinds['near-copy']} replaced by another doc
with case and digits changed. Windows of 3 sentences, min_doc_words 50, datatrove's other defaults.
llmctl: `llmctl dedup DOCS -o OUT --sentences --n-sentences 3 --min-doc-words 50 --workers N --keep-rejected`;
datatrove: `ParquetReader → SentenceDedupSignature`, `SentenceFindDedups`, `ParquetReader → SentenceDedupFilter
(exclusion writer) → ParquetWriter`, one task at 1 worker, one task per part at 2. *Changed*: cut or dropped.
*Identical*: both drop the doc, or both keep it with the same text; the reference is datatrove with one task.

| input | docs | changed: datatrove | changed: llmctl | identical: llmctl CLI | identical: llmctl module | llmctl 1 vs 2 workers | datatrove {files} tasks: changed, identical |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Speed: docs/s per whole process (start-up included), median of {args.repeat} interleaved runs; the module row is
`sentences.dedup_texts` in one process, without reading or writing.

| input | workers | datatrove tasks | datatrove docs/s | llmctl docs/s | llmctl / datatrove |
|---|---|---|---|---|---|
{chr(10).join(speed)}

"""
    section += "\n\n".join(x for x in notes if x) + "\n" if any(notes) else "No differences.\n"
    print(section)
    if not args.no_write:
        write_results("dedup sentences", section)


if __name__ == "__main__":
    main()

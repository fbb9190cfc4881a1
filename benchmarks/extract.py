"""crawl-extract side by side with datatrove (DESIGN §7, issue 3).

    make bench-setup
    .venv-bench/bin/python benchmarks/extract.py [--warc PATH] [--repeat N]

One run, one WARC file, the same cores, interleaved repeats:
  datatrove  WarcReader -> Trafilatura(favour_precision=True) -> LanguageFilter(ft176, label only) -> JsonlWriter
  llmctl     llmctl crawl-extract WARC -o OUT --workers N   (defaults = the FineWeb settings, no language filter)
each with 1 and 2 workers. Both sides run as a child process timed from the outside, so interpreter
start-up and imports count on both sides alike. Then the outputs are checked: llmctl's text against
plain trafilatura.extract, its `lang` against lid.176's top-1, and both tools' documents against each
other by URL. The table goes to stdout and into benchmarks/RESULTS.md (## crawl-extract).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, datatrove_tasks_with_docs, first_difference, pct, read_parts, timed, write_results  # noqa: E402  (benchmarks/common.py)

LID_FTZ = REPO / ".venv" / "share" / "llmctl" / "lid.176.ftz"  # put there by `make setup`
# datatrove downloads its language-ID model into the Hugging Face assets cache at run time. We point
# that cache (HF_ASSETS_CACHE) at a folder of the bench venv and put lid.176 there ourselves: the run
# needs no network, and the user's own ~/.cache never gets a .ftz posing as datatrove's lid.176.bin.
DT_ASSETS = REPO / ".venv-bench" / "share" / "datatrove-assets"
WORKERS = (1, 2)
TRAFILATURA_OPTS = dict(favor_precision=True, include_comments=False)  # + deduplicate, see reference_texts


# ---------------------------------------------------------------------------------------------
# datatrove side


def datatrove_env() -> dict:
    """Environment for the datatrove child: a private assets cache holding lid.176, and offline."""
    from datatrove.io import strip_protocol
    from datatrove.utils.lid import FT176LID

    env = dict(os.environ, HF_ASSETS_CACHE=str(DT_ASSETS), HF_HUB_OFFLINE="1")
    # the same path datatrove.io.cached_asset_path_or_download computes for FT176LID
    folder = DT_ASSETS / "datatrove" / "lid" / FT176LID.MODEL_SUBFOLDER
    target = folder / strip_protocol(FT176LID.MODEL_URL).replace("/", "_")
    if not target.exists() or target.stat().st_size != LID_FTZ.stat().st_size:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(LID_FTZ, target)  # fastText loads a .ftz under any name
    Path(f"{target}.completed").touch()  # datatrove's "already downloaded" marker
    return env


def datatrove_child(warc: str, out: str, workers: int) -> None:
    """Runs inside the timed child process: the pipeline a datatrove user writes for this job."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import JsonlWriter

    pipeline = [
        WarcReader(os.path.dirname(warc), glob_pattern=os.path.basename(warc)),
        # its defaults: timeout=1 s per document (in a sandbox process), deduplicate=True
        Trafilatura(favour_precision=True),
        # backend ft176 = fastText lid.176; label_only keeps every document, it only scores
        LanguageFilter(backend="ft176", label_only=True),
        JsonlWriter(os.path.join(out, "output")),
    ]
    # a user asking for N workers gives N tasks; with one input file only task 0 gets any work
    LocalPipelineExecutor(pipeline, tasks=workers, workers=workers, logging_dir=os.path.join(out, "logs")).run()


def run_datatrove(warc: str, out: str, workers: int, env: dict) -> float:
    cmd = [sys.executable, __file__, "--datatrove-child", warc, out, str(workers)]
    return timed(cmd, env, out + ".log")


def read_datatrove(out: str) -> list[dict]:
    import gzip

    rows = []
    for path in sorted(glob.glob(os.path.join(out, "output", "*.jsonl.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                m = d["metadata"]
                rows.append(dict(id=d["id"], url=m["url"], text=d["text"], lang=m["language"], lang_score=m["language_score"]))
    return rows



# ---------------------------------------------------------------------------------------------
# llmctl side


def run_llmctl(warc: str, out: str, workers: int, env: dict) -> float:
    # no --languages: score only, keep every language, as datatrove's label_only above
    cmd = [str(LLMCTL), "crawl-extract", warc, "-o", out, "--workers", str(workers), "--overwrite", "--quiet", "--json"]
    return timed(cmd, env, out + ".log")


# ---------------------------------------------------------------------------------------------
# timing


def measure(warc: str, repeat: int, tmp: str) -> tuple[dict, dict]:
    """Median seconds per (tool, workers); runs interleaved so drift in machine load hits all alike.
    Returns (seconds, output dir of the last run) keyed by (tool, workers)."""
    runners = {"datatrove": run_datatrove, "llmctl": run_llmctl}
    envs = {"datatrove": datatrove_env(), "llmctl": dict(os.environ)}
    times, outs = {}, {}
    for r in range(repeat):
        for workers in WORKERS:
            for tool, run in runners.items():
                out = os.path.join(tmp, f"{tool}-w{workers}-r{r}")
                sec = run(warc, out, workers, envs[tool])
                times.setdefault((tool, workers), []).append(sec)
                if (tool, workers) in outs and outs[(tool, workers)] != out:
                    shutil.rmtree(outs[(tool, workers)], ignore_errors=True)  # keep only the last output
                outs[(tool, workers)] = out
                print(f"  run {r + 1}/{repeat}  {tool:9s} workers={workers}  {sec:6.2f} s", file=sys.stderr)
    return {k: statistics.median(v) for k, v in times.items()}, outs


# ---------------------------------------------------------------------------------------------
# agreement


def reference_texts(rows: list[dict], scope: str) -> list[str | None]:
    """trafilatura.extract on each llmctl row's own WARC record, as a user would call it.

    deduplicate=True drops a paragraph already seen more than twice in the same LRUCache, so the
    cache's scope changes the text. scope="file": one cache, rows in file order, which is what a
    user looping over the file gets, and what datatrove (one sandbox process per file) gets.
    scope="range": a fresh cache per llmctl task (byte range), which is llmctl's own contract."""
    import trafilatura
    from trafilatura.deduplication import LRU_SIZE, LRUCache

    from llmctl.data.decode import decode_html
    from llmctl.data.extract import http_headers, plan_tasks
    from llmctl.data.warc import WarcRecord, iter_records

    starts = {}  # warc_path -> start offsets of llmctl's byte ranges
    for t in plan_tasks(sorted({r["warc_path"] for r in rows})):
        starts.setdefault(t.payload["path"], []).append(t.payload["start"])

    def cache_scope(row):
        if scope == "file":
            return row["warc_path"]
        return row["warc_path"], max(s for s in starts[row["warc_path"]] if s <= row["warc_offset"])

    cache, cache_key, texts = None, None, []
    for row in rows:  # in file order
        if (key := cache_scope(row)) != cache_key:
            cache, cache_key = LRUCache(maxsize=LRU_SIZE), key
        rec = next(r for r in iter_records(row["warc_path"], row["warc_offset"], row["warc_offset"] + 1) if isinstance(r, WarcRecord)).record
        headers = http_headers(rec, row["url"])  # as a user's reader must, for escaped target URIs
        html, _ = decode_html(rec.content_stream().read(), headers.get_header("Content-Type"))
        texts.append(trafilatura.extract(html, **TRAFILATURA_OPTS, deduplicate=cache))
    return texts


def lid_top1(texts: list[str]) -> list[str]:
    import fasttext

    model = fasttext.load_model(str(LID_FTZ))
    return [model.predict(t.replace("\n", " "))[0][0].removeprefix("__label__") for t in texts]


NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]{2,}")
LEGACY = ("cp1252", "latin-1", "cp1250", "iso8859-2", "iso8859-10")


def mojibake(text: str) -> bool:
    """UTF-8 bytes decoded as a legacy charset ('schÃ¶n'): a run of non-ASCII characters that, encoded
    back in that charset, is valid UTF-8. Catches a decoder that read a UTF-8 page as something else."""
    for m in NON_ASCII_RUN.finditer(text):
        for enc in LEGACY:
            try:
                if m.group(0).encode(enc).decode("utf-8") != m.group(0):
                    return True
            except UnicodeError:
                pass
    return False



def short_diff(a: str, b: str, width: int = 100, before: int = 30) -> str:
    """The first differing region of two texts (with a little context before it), for the report."""
    d = first_difference(a, b, width, before)
    return f"- {d[0]!r}\n+ {d[1]!r}" if d else "(equal)"


def agreement(llm: list[dict], llm2: list[dict], dt: list[dict]) -> tuple[dict, list[str]]:
    """Agreement numbers and a few disagreement examples. `llm`/`llm2`: llmctl with 1/2 workers."""
    llm = sorted(llm, key=lambda r: (r["warc_path"], r["warc_offset"]))
    ref = reference_texts(llm, "file")
    ref_range = reference_texts(llm, "range")
    same_text = [r["text"] == t for r, t in zip(llm, ref)]
    top1 = lid_top1([r["text"] for r in llm])
    same_lang = [r["lang"] == t for r, t in zip(llm, top1)]
    by_id2 = {r["id"]: r for r in llm2}
    by_url_llm = {r["url"]: r for r in llm}
    by_url_dt = {r["url"]: r for r in dt}
    both = sorted(by_url_llm.keys() & by_url_dt.keys())
    n = {
        "llmctl docs (1 / 2 workers)": f"{len(llm)} / {len(llm2)}",
        "llmctl 1 vs 2 workers: identical rows": pct(sum(by_id2.get(r["id"]) == r for r in llm), len(llm)),
        "text = trafilatura.extract, one dedup cache per file": pct(sum(same_text), len(llm)),
        "text = trafilatura.extract, one dedup cache per llmctl range": pct(sum(r["text"] == t for r, t in zip(llm, ref_range)), len(llm)),
        "lang = lid.176 top-1": pct(sum(same_lang), len(llm)),
        "datatrove docs": str(len(dt)),
        "texts with mojibake, llmctl / datatrove": f"{sum(mojibake(r['text']) for r in llm)} / {sum(mojibake(r['text']) for r in dt)}",
        "URLs in both / only llmctl / only datatrove": f"{len(both)} / {len(by_url_llm.keys() - by_url_dt.keys())} / {len(by_url_dt.keys() - by_url_llm.keys())}",
        "same text as datatrove (URLs in both)": pct(sum(by_url_llm[u]["text"] == by_url_dt[u]["text"] for u in both), len(both)),
        "same lang as datatrove (URLs in both)": pct(sum(by_url_llm[u]["lang"] == by_url_dt[u]["lang"] for u in both), len(both)),
    }
    examples = []
    for r, t, ok in zip(llm, ref, same_text):
        if not ok and len(examples) < 5:
            examples.append(f"text vs trafilatura.extract  {r['url']}\n{short_diff(t, r['text'])}")
    for r, t, ok in zip(llm, top1, same_lang):
        if not ok and len(examples) < 8:
            examples.append(f"lang vs lid.176  {r['url']}: llmctl {r['lang']} ({r['lang_score']:.3f}), lid.176 {t}")
    for u in [u for u in both if by_url_llm[u]["text"] != by_url_dt[u]["text"]][:3]:
        examples.append(f"text vs datatrove  {u}\n{short_diff(by_url_dt[u]['text'], by_url_llm[u]['text'])}")
    only_dt = sorted(by_url_dt.keys() - by_url_llm.keys())[:3]
    only_llm = sorted(by_url_llm.keys() - by_url_dt.keys())[:3]
    if only_dt or only_llm:
        examples.append(f"only datatrove: {only_dt}\nonly llmctl: {only_llm}")
    return n, examples


# ---------------------------------------------------------------------------------------------
# report



def versions() -> dict:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    return {"datatrove": version("datatrove"), "trafilatura": version("trafilatura"), "llmctl": llm or version("llmctl")}


def table(times: dict, docs: dict, dt_tasks: dict) -> str:
    lines = ["| workers | datatrove docs/s | llmctl docs/s | llmctl / datatrove | datatrove tasks with input |", "|---|---|---|---|---|"]
    for w in WORKERS:
        dt = docs[("datatrove", w)] / times[("datatrove", w)]
        lm = docs[("llmctl", w)] / times[("llmctl", w)]
        lines.append(f"| {w} | {dt:.1f} | {lm:.1f} | **{lm / dt:.2f}×** | {dt_tasks[w]} |")
    return "\n".join(lines)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warc", default=str(DEFAULT_WARC))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--datatrove-child", nargs=3, metavar=("WARC", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.datatrove_child:
        warc, out, workers = args.datatrove_child
        return datatrove_child(warc, out, int(workers))

    warc = os.path.abspath(args.warc)
    load_before = os.getloadavg()[0]  # the machines are shared: say how busy this one was
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        print(f"timing on {warc}, {args.repeat} repeats", file=sys.stderr)
        times, outs = measure(warc, args.repeat, tmp)
        rows = {k: (read_datatrove(o) if k[0] == "datatrove" else read_parts(o)) for k, o in outs.items()}
        docs = {k: len(v) for k, v in rows.items()}
        dt_tasks = {w: datatrove_tasks_with_docs(outs[("datatrove", w)], "Warc") for w in WORKERS}
        print("checking agreement", file=sys.stderr)
        agree, examples = agreement(rows[("llmctl", 1)], rows[("llmctl", 2)], rows[("datatrove", 1)])

    load_after = os.getloadavg()[0]
    speed = table(times, docs, dt_tasks)
    agree_md = "\n".join(["| check | result |", "|---|---|"] + [f"| {k} | {v} |" for k, v in agree.items()])
    v = versions()
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/extract.py"] + sys.argv[1:])
    section = f"""## crawl-extract

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
input `{os.path.relpath(warc, REPO)}`, median of {args.repeat} interleaved runs, wall clock per whole process,
1-min load average {load_before:.2f} before / {load_after:.2f} after.
datatrove {v['datatrove']}, trafilatura {v['trafilatura']}, {v['llmctl']}.

{speed}

{agree_md}
"""
    if examples:
        section += "\nDisagreements (first few; `-` reference, `+` llmctl):\n\n```\n" + "\n\n".join(examples) + "\n```\n"
    print(section)
    write_results("crawl-extract", section)


if __name__ == "__main__":
    main()

"""crawl-extract side by side with datatrove (DESIGN §7, issues 3 and 22).

    make bench-setup
    .venv-bench/bin/python benchmarks/extract.py [--warc PATH] [--copies 11] [--repeat N] [--baseline-src DIR]

One run, the same cores, interleaved repeats, on two inputs: the WARC given (pages-a.warc.gz) and a
larger one made from it in a temporary folder (its records `--copies` times over, each copy with
new WARC-Record-IDs; never kept). Three sides, each with 1 and 2 workers:
  datatrove     WarcReader -> Trafilatura(favour_precision=True) -> LanguageFilter(ft176, label only) -> JsonlWriter
  trafilatura   llmctl crawl-extract WARC -o OUT --workers N   (defaults = the FineWeb settings, no language filter)
  resiliparse   llmctl crawl-extract WARC -o OUT --workers N --config dclm   (DCLM's extractor and settings)
Every side runs as a child process timed from the outside (wall clock, and CPU seconds of the child
and its workers), so interpreter start-up and imports count on all sides alike.

Then, on the first input: llmctl's trafilatura text against plain trafilatura.extract, its `lang`
against lid.176's top-1, both tools' documents against each other by URL; what the fast path costs
in quality (resiliparse against trafilatura on the same pages: who extracts text, token F1 of the
two texts, language agreement, and how many pass `llmctl filter --config fineweb`); and a per-page
profile of crawl-extract's components (CPU ms/page), for this checkout and, with --baseline-src,
for another source tree (the "before" column). The tables go to stdout and into
benchmarks/RESULTS.md (## crawl-extract).
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
import uuid
import zlib
from collections import Counter
from pathlib import Path

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, datatrove_tasks_with_docs, first_difference, pct, read_parts, timed_cpu, write_results  # noqa: E402  (benchmarks/common.py)

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


def run_datatrove(warc: str, out: str, workers: int, env: dict) -> tuple[float, float]:
    cmd = [sys.executable, __file__, "--datatrove-child", warc, out, str(workers)]
    return timed_cpu(cmd, env, out + ".log")


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

SIDES = ("datatrove", "trafilatura", "resiliparse")  # llmctl's two extractors are the last two
LLMCTL_ARGS = {"trafilatura": [], "resiliparse": ["--config", "dclm"]}


def run_llmctl(extractor: str, warc: str, out: str, workers: int, env: dict) -> tuple[float, float]:
    # no --languages: score only, keep every language, as datatrove's label_only above
    cmd = [str(LLMCTL), "crawl-extract", warc, "-o", out, "--workers", str(workers), *LLMCTL_ARGS[extractor], "--overwrite", "--quiet", "--json"]
    return timed_cpu(cmd, env, out + ".log")


# ---------------------------------------------------------------------------------------------
# the larger input


def gzip_members(data: bytes):
    """(content) of each gzip member of a per-record-gzipped WARC, in order."""
    pos, window = 0, 1 << 18
    while pos < len(data):
        d, fed, out = zlib.decompressobj(31), 0, []
        while not d.eof:
            block = data[pos + fed : pos + fed + window]
            if not block:
                raise ValueError(f"gzip member at {pos} is truncated")
            out.append(d.decompress(block))
            fed += len(block)
        pos += fed - len(d.unused_data)
        yield b"".join(out)


_UUID = re.compile(rb"<urn:uuid:([0-9a-fA-F-]{36})>")
_ID_HEADERS = (b"WARC-Record-ID:", b"WARC-Concurrent-To:", b"WARC-Refers-To:")  # not WARC-Warcinfo-ID: one warcinfo


def make_large_warc(src: str, copies: int, out: str) -> int:
    """`src`'s records `copies` times over (its warcinfo once), each copy k > 0 with new record ids
    (uuid5 of k and the old id, so every run writes the same file) in WARC-Record-ID and the
    headers that point at records. Each record stays its own gzip member. Returns the number of
    response records (captures)."""
    members = list(gzip_members(Path(src).read_bytes()))
    captures = 0
    with open(out, "wb") as f:
        for k in range(copies):
            for content in members:
                head, sep, block = content.partition(b"\r\n\r\n")
                if k and b"WARC-Type: warcinfo" in head:
                    continue
                captures += b"WARC-Type: response" in head
                if k:
                    lines = head.split(b"\r\n")
                    for i, line in enumerate(lines):
                        if line.startswith(_ID_HEADERS):
                            lines[i] = _UUID.sub(lambda m: b"<urn:uuid:%s>" % str(uuid.uuid5(uuid.NAMESPACE_URL, f"{k}:{m.group(1).decode()}")).encode(), line)
                    head = b"\r\n".join(lines)
                z = zlib.compressobj(6, zlib.DEFLATED, 31)
                f.write(z.compress(head + sep + block) + z.flush())
    return captures


# ---------------------------------------------------------------------------------------------
# timing


def measure(warc: str, repeat: int, tmp: str, tag: str) -> tuple[dict, dict, dict]:
    """Median wall and CPU seconds per (side, workers); runs interleaved so drift in machine load
    hits all alike. Returns (wall, cpu, output dir of the last run), keyed by (side, workers)."""
    env = {"datatrove": datatrove_env(), "llmctl": dict(os.environ)}
    walls, cpus, outs = {}, {}, {}
    for r in range(repeat):
        for workers in WORKERS:
            for side in SIDES:
                out = os.path.join(tmp, f"{tag}-{side}-w{workers}-r{r}")
                if side == "datatrove":
                    wall, cpu = run_datatrove(warc, out, workers, env["datatrove"])
                else:
                    wall, cpu = run_llmctl(side, warc, out, workers, env["llmctl"])
                walls.setdefault((side, workers), []).append(wall)
                cpus.setdefault((side, workers), []).append(cpu)
                if (side, workers) in outs and outs[(side, workers)] != out:
                    shutil.rmtree(outs[(side, workers)], ignore_errors=True)  # keep only the last output
                outs[(side, workers)] = out
                print(f"  {tag} run {r + 1}/{repeat}  {side:11s} workers={workers}  {wall:7.2f} s wall  {cpu:7.2f} s CPU", file=sys.stderr)
    med = lambda d: {k: statistics.median(v) for k, v in d.items()}  # noqa: E731
    return med(walls), med(cpus), outs


def startup_cpu(tmp: str) -> dict:
    """CPU seconds of a whole crawl-extract process on a one-page WARC: what every run pays before
    its first page (interpreter, imports, lid.176, the extractor's warm-up)."""
    tiny = REPO.parent / "shared" / "data" / "warc-bad" / "example.warc.gz"
    if not tiny.exists():
        return {}
    out = {}
    for side in SIDES[1:]:
        runs = [run_llmctl(side, str(tiny), os.path.join(tmp, f"startup-{side}-{i}"), 1, dict(os.environ))[1] for i in range(3)]
        out[side] = statistics.median(runs)
    return out


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

    from llmctl.data.crawl.decode import decode_html
    from llmctl.data.crawl.extract import http_headers, plan_tasks
    from llmctl.data.crawl.warc import WarcRecord, iter_records

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
# what the fast path costs: resiliparse against trafilatura on the same pages

PRE_EXTRACTION = ("url", "status", "truncated", "too_large", "not_html", "decode")  # skips before the extractor runs


def token_f1(a: str, b: str) -> float:
    """F1 of the two texts' bags of whitespace-separated tokens (SQuAD-style overlap)."""
    ta, tb = Counter(a.split()), Counter(b.split())
    common = sum((ta & tb).values())
    if not common:
        return 0.0
    p, r = common / sum(tb.values()), common / sum(ta.values())
    return 2 * p * r / (p + r)


def fineweb_kept(docs: str, out: str) -> set[str]:
    """ids of the docs that pass llmctl's own FineWeb chain (stages/filter/fineweb.toml, English first)."""
    subprocess.run([str(LLMCTL), "filter", docs, "-o", out, "--config", "fineweb", "--quiet", "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    return {r["id"] for r in read_parts(out)}


def quality(traf_dir: str, res_dir: str, tmp: str) -> dict:
    traf = {r["id"]: r for r in read_parts(traf_dir)}
    res = {r["id"]: r for r in read_parts(res_dir)}
    counts = json.loads(Path(traf_dir, "manifest.json").read_text())["counts"]
    reached = counts["in"] - sum(counts["skipped"][k] for k in PRE_EXTRACTION)
    both = sorted(traf.keys() & res.keys())
    f1 = [token_f1(traf[i]["text"], res[i]["text"]) for i in both]
    kept_t, kept_r = fineweb_kept(traf_dir, os.path.join(tmp, "fw-traf")), fineweb_kept(res_dir, os.path.join(tmp, "fw-res"))
    mean_chars = lambda rows: statistics.mean(len(r["text"]) for r in rows.values()) if rows else 0  # noqa: E731
    return {
        "pages that reach the extractor": str(reached),
        "text from both / only trafilatura / only resiliparse / neither": f"{len(both)} / {len(traf.keys() - res.keys())} / {len(res.keys() - traf.keys())} / {reached - len(traf.keys() | res.keys())}",
        "**both extract text**": pct(len(both), reached),
        "mean characters per doc, trafilatura / resiliparse": f"{mean_chars(traf):,.0f} / {mean_chars(res):,.0f}",
        "**token F1** of the two texts (pages with both): mean / median": f"{statistics.mean(f1):.3f} / {statistics.median(f1):.3f}" if f1 else "n/a",
        "pages with token F1 >= 0.8 / < 0.5": f"{pct(sum(x >= 0.8 for x in f1), len(f1))} / {pct(sum(x < 0.5 for x in f1), len(f1))}",
        "**same lid.176 language** (pages with both)": pct(sum(traf[i]["lang"] == res[i]["lang"] for i in both), len(both)),
        "**pass the FineWeb chain**, trafilatura / resiliparse (of its docs)": f"{pct(len(kept_t), len(traf))} / {pct(len(kept_r), len(res))}",
        "pass on both sides / only trafilatura's text / only resiliparse's": f"{len(kept_t & kept_r)} / {len(kept_t - kept_r)} / {len(kept_r - kept_t)}",
    }


# ---------------------------------------------------------------------------------------------
# per-page profile


def crawl_module(name: str):
    """A crawl-extract module of the source tree under test: data/crawl/NAME.py, or data/NAME.py
    in a --baseline-src tree from before crawl-extract's helpers had their own folder."""
    import importlib

    try:
        return importlib.import_module(f"llmctl.data.crawl.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("llmctl.data.crawl", f"llmctl.data.crawl.{name}"):
            raise
        return importlib.import_module(f"llmctl.data.{name}")


def profile_child(warc: str) -> None:
    """Runs in a child whose PYTHONPATH is the source tree under test: crawl-extract's steps one
    after another over every HTML 200 response of `warc`, CPU time of each, printed as JSON."""
    import time

    import pyarrow as pa
    import trafilatura
    import trafilatura.external
    from resiliparse.extract.html2text import extract_plain_text
    from trafilatura.deduplication import LRU_SIZE, LRUCache

    from llmctl.artifacts.docs_write import ShardWriter
    from llmctl.data import langid

    decode_html = crawl_module("decode").decode_html
    SCHEMA, http_headers, page_title = (getattr(crawl_module("extract"), n) for n in ("SCHEMA", "http_headers", "page_title"))
    iter_records = crawl_module("warc").iter_records

    model = langid.load(str(LID_FTZ))  # the product venv's copy (this runs in the bench venv)
    if getattr(trafilatura.external, "JT_STOPLIST", None) is None and hasattr(trafilatura.external, "jt_stoplist_init"):
        trafilatura.external.jt_stoplist_init()  # crawl-extract does this before its workers start
    pa.Table.from_pylist([], schema=SCHEMA)  # pyarrow's one-time pandas import, outside the timings
    dclm = tomllib_load(REPO / "stages" / "crawl-extract" / "dclm.toml")
    res_opts = dict(main_content=dclm["main_content"], preserve_formatting=dclm["preserve_formatting"], list_bullets=dclm["list_bullets"], alt_texts=dclm["alt_texts"],
                    links=dclm["links"], form_fields=dclm["form_fields"], noscript=dclm["noscript"], comments=dclm["include_comments"])
    cpu = time.process_time
    ms = {}

    t = cpu()
    pages = []
    for item in iter_records(warc):
        rec = getattr(item, "record", None)
        if rec is None or rec.rec_type != "response":
            continue
        url = rec.rec_headers.get_header("WARC-Target-URI") or ""
        http = http_headers(rec, url)
        if http is None or http.get_statuscode() != "200":
            continue
        pages.append((url, rec.content_stream().read(10 << 20), http.get_header("Content-Type")))
    ms["read"] = cpu() - t
    t = cpu()
    htmls = [decode_html(body, ctype)[0] for _, body, ctype in pages]
    ms["decode"] = cpu() - t
    t = cpu()
    titles = [page_title(h) for h in htmls]
    ms["title"] = cpu() - t
    t = cpu()
    cache = LRUCache(maxsize=LRU_SIZE)
    traf = [trafilatura.extract(h, favor_precision=True, include_comments=False, include_tables=True, deduplicate=cache) for h in htmls]
    ms["extract_trafilatura"] = cpu() - t
    t = cpu()
    res = [extract_plain_text(h, **res_opts) for h in htmls]
    ms["extract_resiliparse"] = cpu() - t
    for name, texts in (("trafilatura", traf), ("resiliparse", res)):
        kept = [x for x in texts if x and x.strip()]
        t = cpu()
        langs = langid.predict(model, kept)
        ms[f"langid_{name}"] = cpu() - t
        rows = [{"id": f"r{i}", "text": x, "url": u, "date": None, "title": ti, "lang": lang, "lang_score": score, "warc_path": warc, "warc_offset": i}
                for i, (x, (u, _, _), ti, (lang, score)) in enumerate(zip(kept, pages, titles, langs))]
        t = cpu()
        with ShardWriter(Path(tempfile.mkdtemp(prefix="bench-profile-")) / "part.parquet", SCHEMA) as w:
            w.write(pa.Table.from_pylist(rows, schema=SCHEMA))
        ms[f"parquet_{name}"] = cpu() - t
    print(json.dumps({"pages": len(pages), "ms_per_page": {k: 1000 * v / len(pages) for k, v in ms.items()}}))


def overhead_child(warc: str, out: str) -> None:
    """Runs in a child whose PYTHONPATH is the source tree under test: a whole 1-worker
    crawl-extract run in this process with trafilatura.extract replaced by a stub (the first 200
    characters of the HTML), so its CPU time is everything the stage does besides extracting:
    reading, decoding, language ID, Parquet, the manifest, and the imports a task needs."""
    import time

    import trafilatura

    trafilatura.extract = lambda html, **kw: html[:200]
    from llmctl.runtime.options import RunOptions

    ExtractConfig, run_crawl_extract = crawl_module("extract").ExtractConfig, crawl_module("extract").run_crawl_extract

    t = time.process_time()
    m = run_crawl_extract([warc], out, ExtractConfig(langid_model=str(LID_FTZ)), RunOptions(workers=1, overwrite=True))
    print(json.dumps({"pages": m.counts["in"], "cpu_s": time.process_time() - t}))


def overhead(src: Path, warc: str, tmp: str) -> float:
    """CPU ms per page of `overhead_child`, median of 3 runs."""
    env = dict(os.environ, PYTHONPATH=str(src / "src"))
    runs = []
    for i in range(3):
        p = subprocess.run([sys.executable, __file__, "--overhead-child", warc, os.path.join(tmp, f"overhead-{i}")], env=env, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"overhead run on {src} failed:\n{p.stderr[-3000:]}")
        d = json.loads(p.stdout.strip().splitlines()[-1])
        runs.append(1000 * d["cpu_s"] / d["pages"])
    return statistics.median(runs)


def tomllib_load(path: Path) -> dict:
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)


def profile(src: Path, warc: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src / "src"))
    p = subprocess.run([sys.executable, __file__, "--profile-child", warc], env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"profile on {src} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


PROFILE_ROWS = (
    ("read", "WARC read: gunzip, warcio records, HTTP headers, body"),
    ("decode", "charset decode (data/crawl/decode.py)"),
    ("title", "title"),
    ("extract_trafilatura", "extract: trafilatura (FineWeb settings)"),
    ("extract_resiliparse", "extract: resiliparse (dclm.toml)"),
    ("langid_trafilatura", "language ID, lid.176, on trafilatura's text"),
    ("langid_resiliparse", "language ID, lid.176, on resiliparse's text"),
    ("parquet_trafilatura", "Parquet write, trafilatura's docs"),
    ("parquet_resiliparse", "Parquet write, resiliparse's docs"),
)


def profile_table(after: dict, before: dict | None, per_doc: dict, startup: dict, over: tuple[float, float | None]) -> str:
    cols = ["before (ms/page)"] if before else []
    lines = ["| component (CPU, one process) | " + " | ".join(cols + ["now (ms/page)"]) + " |", "|---|" + "---|" * (len(cols) + 1)]
    for key, label in PROFILE_ROWS:
        cells = ([f"{before['ms_per_page'][key]:.2f}"] if before else []) + [f"{after['ms_per_page'][key]:.2f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for side in SIDES[1:]:
        keys = ("read", "decode", "title", f"extract_{side}", f"langid_{side}", f"parquet_{side}")
        cells = ([f"{sum(before['ms_per_page'][k] for k in keys):.2f}"] if before else []) + [f"{sum(after['ms_per_page'][k] for k in keys):.2f}"]
        lines.append(f"| **sum of the steps, {side}** | " + " | ".join(cells) + " |")
    lines.append("| whole 1-worker run in one process, extraction stubbed: everything but the extractor (read, decode, lid.176, Parquet, manifest, start-up work) | "
                 + " | ".join(([f"{over[1]:.2f}"] if before else []) + [f"{over[0]:.2f}"]) + " |")
    for side in SIDES[1:]:
        if side in per_doc:
            lines.append(f"| whole `crawl-extract` process, {side}, 1 worker, larger WARC (CPU ms/doc, timing table) | " + " | ".join([""] * len(cols) + [f"{per_doc[side]:.2f}"]) + " |")
    for side, sec in startup.items():
        lines.append(f"| process start-up, {side} (CPU s, a one-page WARC, once a run) | " + " | ".join([""] * len(cols) + [f"{sec:.2f} s"]) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# report


def versions() -> dict:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    return {"datatrove": version("datatrove"), "trafilatura": version("trafilatura"), "resiliparse": version("resiliparse"), "llmctl": llm or version("llmctl")}


def speed_table(walls: dict, cpus: dict, docs: dict) -> str:
    lines = ["| side | workers | docs | wall s | **docs/s** | docs/s ÷ datatrove's | CPU s | **CPU ms/doc** | datatrove's CPU/doc ÷ this |", "|---|---|---|---|---|---|---|---|---|"]
    for w in WORKERS:
        dt_rate = docs[("datatrove", w)] / walls[("datatrove", w)]
        dt_cpu = cpus[("datatrove", w)] / docs[("datatrove", w)]
        for side in SIDES:
            k = (side, w)
            rate, per_doc = docs[k] / walls[k], cpus[k] / docs[k]
            name = side if side == "datatrove" else f"llmctl {side}"
            lines.append(f"| {name} | {w} | {docs[k]:,} | {walls[k]:.1f} | {rate:.1f} | **{rate / dt_rate:.2f}×** | {cpus[k]:.1f} | {1000 * per_doc:.2f} | **{dt_cpu / per_doc:.2f}×** |")
    return "\n".join(lines)


def md_table(d: dict, head: tuple[str, str] = ("check", "result")) -> str:
    return "\n".join([f"| {head[0]} | {head[1]} |", "|---|---|"] + [f"| {k} | {v} |" for k, v in d.items()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warc", default=str(DEFAULT_WARC))
    ap.add_argument("--copies", type=int, default=11, help="the larger WARC holds the input's records this many times (11 x 455 = 5,005 captures)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline-src", help="a source tree (e.g. an export of main before this change) to profile as the 'before' column")
    ap.add_argument("--datatrove-child", nargs=3, metavar=("WARC", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", metavar="WARC", help=argparse.SUPPRESS)
    ap.add_argument("--overhead-child", nargs=2, metavar=("WARC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.datatrove_child:
        warc, out, workers = args.datatrove_child
        return datatrove_child(warc, out, int(workers))
    if args.profile_child:
        return profile_child(args.profile_child)
    if args.overhead_child:
        return overhead_child(*args.overhead_child)

    warc = os.path.abspath(args.warc)
    # byte-compile llmctl first, as an installed package is (this sandbox sets PYTHONDONTWRITEBYTECODE)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "src" / "llmctl")], check=True, stdout=subprocess.DEVNULL)
    load_before = os.getloadavg()[0]  # the machines are shared: say how busy this one was
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        big = os.path.join(tmp, "pages-a-x%d.warc.gz" % args.copies)
        captures = make_large_warc(warc, args.copies, big)
        print(f"larger input: {captures:,} captures, {os.path.getsize(big) / 1e6:.0f} MB", file=sys.stderr)
        results = {}
        for tag, path in (("small", warc), ("large", big)):
            print(f"timing on {path}, {args.repeat} repeat(s)", file=sys.stderr)
            walls, cpus, outs = measure(path, args.repeat, tmp, tag)
            rows = {k: (read_datatrove(o) if k[0] == "datatrove" else read_parts(o)) for k, o in outs.items()}
            docs = {k: len(v) for k, v in rows.items()}
            dt_tasks = {w: datatrove_tasks_with_docs(outs[("datatrove", w)], "Warc") for w in WORKERS}
            results[tag] = (walls, cpus, outs, rows, docs, dt_tasks)
            if tag == "small":
                print("checking agreement and quality", file=sys.stderr)
                agree, examples = agreement(rows[("trafilatura", 1)], rows[("trafilatura", 2)], rows[("datatrove", 1)])
                agree["llmctl resiliparse 1 vs 2 workers: identical rows"] = pct(sum(a == b for a, b in zip(rows[("resiliparse", 1)], rows[("resiliparse", 2)])), len(rows[("resiliparse", 1)]))
                qual = quality(outs[("trafilatura", 1)], outs[("resiliparse", 1)], tmp)
                small_captures = json.loads(Path(outs[("trafilatura", 1)], "manifest.json").read_text())["counts"]["in"]
            for k in outs:
                if tag == "large":
                    shutil.rmtree(outs[k], ignore_errors=True)
        print("profiling", file=sys.stderr)
        after = profile(REPO, warc)
        before = profile(Path(args.baseline_src), warc) if args.baseline_src else None
        over = (overhead(REPO, warc, tmp), overhead(Path(args.baseline_src), warc, tmp) if args.baseline_src else None)
        startup = startup_cpu(tmp)

    load_after = os.getloadavg()[0]
    v = versions()
    walls, cpus, _, _, docs, _ = results["large"]
    per_doc_large = {side: 1000 * cpus[(side, 1)] / docs[(side, 1)] for side in SIDES[1:]}
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/extract.py"] + sys.argv[1:])
    parts = [f"""## crawl-extract

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
1-min load average {load_before:.2f} before / {load_after:.2f} after (the machine is shared: CPU ms/doc,
user + system time of the whole child process and its workers, is the steadier figure; docs/s is wall clock).
datatrove {v['datatrove']}, trafilatura {v['trafilatura']}, resiliparse {v['resiliparse']}, {v['llmctl']}.
Sides: datatrove `WarcReader → Trafilatura(favour_precision=True) → LanguageFilter(ft176, label only) → JsonlWriter`;
llmctl trafilatura `llmctl crawl-extract WARC -o OUT --workers N` (FineWeb settings); llmctl resiliparse
`… --config dclm` (stages/crawl-extract/dclm.toml: DCLM's `extract_plain_text(main_content=True)`).
Median of {args.repeat} interleaved run(s) per cell. datatrove gives one input file to one task, so its
second worker idles."""]
    for tag, title in (("small", f"`{os.path.relpath(warc, REPO)}` ({small_captures:,} captures)"),
                       ("large", f"the larger WARC: its records × {args.copies}, new record ids ({captures:,} captures, made in a temporary folder)")):
        walls, cpus, _, _, docs, dt_tasks = results[tag]
        parts.append(f"**Input: {title}.** datatrove tasks with input: {', '.join(f'{w} workers {t}' for w, t in dt_tasks.items())}.\n\n" + speed_table(walls, cpus, docs))
    parts.append(f"**Per-page profile** (`{os.path.relpath(warc, REPO)}`, {after['pages']} HTML 200 responses; each step timed alone "
                 "in one process, CPU time / pages" + (f"; *before*: `--baseline-src {args.baseline_src}`" if before else "") + "):\n\n"
                 + profile_table(after, before, per_doc_large, startup, over))
    parts.append("**What the fast path costs** (same pages, llmctl trafilatura vs llmctl resiliparse, 1 worker; "
                 "FineWeb chain = `llmctl filter DOCS --config fineweb`, English ≥ 0.65 first):\n\n" + md_table(qual, ("resiliparse vs trafilatura", "result")))
    parts.append("**Agreement** (llmctl trafilatura, 1 worker):\n\n" + md_table(agree))
    section = "\n\n".join(parts) + "\n"
    if examples:
        section += "\nDisagreements (first few; `-` reference, `+` llmctl):\n\n```\n" + "\n\n".join(examples) + "\n```\n"
    print(section)
    write_results("crawl-extract", section)


if __name__ == "__main__":
    main()

"""tokenize side by side with Hugging Face tokenizers, tiktoken and datatrove (DESIGN §7, issue 6).

    make bench-setup
    .venv-bench/bin/python benchmarks/tokenization.py [--docs DIR] [--repeat N]

One run, the same inputs, the same cores, interleaved repeats, median wall times:

1. training, on the text crawl-extract makes from pages-a.warc.gz, and on a seeded sample of the
   synthetic corpus (below):
     llmctl   llmctl tokenize train DOCS -o TOK --vocab-size 8192 [--max-chars N]   (whole CLI process)
     direct   a child process that reads the same Parquet text with pyarrow, takes the same seeded
              sample, and calls tokenizers' BpeTrainer with the same settings (written out here from
              issue 6 / tokenizer.py, not imported from llmctl)
   and the two tokenizer.json files compared (merges, vocabulary, the whole file).
2. encoding, Parquet in -> token shards on disk, 2 workers, on a synthetic corpus (pages-a's texts
   repeated 25 times, shuffled with a seed, 8 Parquet parts, ~65 MB of text):
     llmctl     llmctl tokenize CORPUS -o OUT --tokenizer TOK/tokenizer.json --workers 2
     datatrove  LocalPipelineExecutor(tasks=8, workers=2): ParquetReader -> DocumentTokenizer(
                tokenizer_name_or_path=TOK/tokenizer.json, eos_token="<|endoftext|>",
                shuffle_documents=False)
     raw        one process, texts already in memory: tiktoken.Encoding(our ranks, our regex)
                .encode_ordinary_batch(texts, num_threads=2), only that call timed
   and the three token streams compared (the same ids, EOS after each document, in the same order).
The tables go to stdout and into benchmarks/RESULTS.md (## tokenize).
"""

from __future__ import annotations

import os
import sys


import argparse  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from common import LLMCTL, REPO, cpu_name, make_docs, write_results  # noqa: E402  (benchmarks/common.py)

LLMCTL_PY = REPO / ".venv" / "bin" / "python"

VOCAB = 8192
COPIES = 25  # synthetic corpus: every pages-a text this many times
PARTS = 8
SEED = 0
SAMPLE_CHARS = 20_000_000  # --max-chars of the second training row (a seeded sample of the corpus)
WORKERS = 2

# What issue 6 and tokenizer.py specify, written out for the direct side: cl100k's published
# pre-tokenizer regex, then byte-level without its own regex; 16 special tokens at ids 0..15.
CL100K = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
EOS = "<|endoftext|>"
SPECIALS = [EOS, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>"] + [f"<|reserved_{i}|>" for i in range(10)]
MIN_FREQUENCY = 2  # llmctl's default


# ---------------------------------------------------------------------------------------------
# inputs



def parquet_parts(folder: str) -> list[str]:
    """A docs folder's Parquet parts in the order llmctl reads them (its manifest's, else sorted)."""
    manifest = Path(folder) / "manifest.json"
    if manifest.is_file():
        outs = json.loads(manifest.read_text())["outputs"]
        return [str(Path(folder) / o["file"]) for o in outs if o["file"].endswith(".parquet") and not o["file"].startswith("rejected/")]
    return sorted(glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))


def read_texts(folder: str) -> list[str]:
    import pyarrow.parquet as pq

    return [t or "" for p in parquet_parts(folder) for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()]


def make_corpus(docs: str, out: str) -> dict:
    """pages-a's documents COPIES times (ids made unique), shuffled with SEED, in PARTS Parquet parts
    (zstd, all columns, as crawl-extract writes them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables([pq.read_table(p) for p in parquet_parts(docs)])
    rows = [r for r in table.to_pylist() if r["text"]]
    corpus = [dict(r, id=f"{r['id']}#{c}") for c in range(COPIES) for r in rows]
    random.Random(SEED).shuffle(corpus)
    os.makedirs(out)
    for k in range(PARTS):
        part = pa.Table.from_pylist(corpus[k::PARTS], schema=table.schema)
        pq.write_table(part, os.path.join(out, f"part-{k:05d}.parquet"), compression="zstd")
    return {"docs": len(corpus), "bytes": sum(len(r["text"].encode("utf-8")) for r in corpus), "chars": sum(len(r["text"]) for r in corpus)}


# ---------------------------------------------------------------------------------------------
# 1. training


def seeded_sample(texts: list[str], max_chars: int, seed: int) -> list[str]:
    """The sample issue 6's --max-chars describes: whole non-empty documents in input order, each
    kept with probability max_chars/total (random.Random(seed)) while the budget lasts; all of them
    when they fit."""
    texts = [t for t in texts if t]
    total = sum(len(t) for t in texts)
    if total <= max_chars:
        return texts
    rng, p = random.Random(seed), max_chars / total
    out, used = [], 0
    for t in texts:
        if rng.random() < p and used + len(t) <= max_chars:
            out.append(t)
            used += len(t)
    return out


def direct_train_child(docs: str, out: str, vocab: int, max_chars: int) -> None:
    """Runs inside the timed child: what a user writes to train this tokenizer with `tokenizers`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = seeded_sample(read_texts(docs), max_chars, SEED)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(CL100K), behavior="isolated", invert=False), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=MIN_FREQUENCY, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))


def run_llmctl_train(docs: str, out: str, vocab: int, max_chars: int) -> tuple[float, float]:
    cmd = [str(LLMCTL), "tokenize", "train", docs, "-o", out, "--vocab-size", str(vocab), "--pattern", "cl100k", "--max-chars", str(max_chars)]
    return timed(cmd + ["--overwrite", "--quiet", "--json"], out + ".log")


def run_direct_train(docs: str, out: str, vocab: int, max_chars: int) -> tuple[float, float]:
    return timed([sys.executable, __file__, "--train-child", docs, out, str(vocab), str(max_chars)], out + ".log")


def compare_tokenizers(a: str, b: str) -> dict:
    ja, jb = (json.loads(Path(p, "tokenizer.json").read_text()) for p in (a, b))
    return {
        "merges": ja["model"]["merges"] == jb["model"]["merges"],
        "n_merges": len(ja["model"]["merges"]),
        "vocab": ja["model"]["vocab"] == jb["model"]["vocab"],
        "specials": [t["content"] for t in ja["added_tokens"]] == [t["content"] for t in jb["added_tokens"]],
        "file": ja == jb,
    }


# ---------------------------------------------------------------------------------------------
# 2. encoding


def datatrove_child(corpus: str, tokenizer: str, out: str) -> None:
    """Runs inside the timed child: the pipeline a datatrove user writes for this job."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    pipeline = [
        ParquetReader(corpus, glob_pattern="*.parquet"),  # its defaults: batch_size=1000, all columns
        DocumentTokenizer(
            os.path.join(out, "output"),
            tokenizer_name_or_path=tokenizer,
            eos_token=EOS,  # a post-processor appends <|endoftext|> to every document
            shuffle_documents=False,  # llmctl keeps input order; datatrove's shuffle is a second copy pass
            # its defaults: batch_size=10000 documents per encode_batch, save_index, save_final_metadata
        ),
    ]
    LocalPipelineExecutor(pipeline, tasks=PARTS, workers=WORKERS, logging_dir=os.path.join(out, "logs")).run()


def tiktoken_encoding(tokenizer: str):
    """tiktoken.Encoding with the tokenizer.json's merges, as issue 6 describes llmctl's fast path:
    rank of a token = its id, the byte-level alphabet mapped back to bytes, the Split regex."""
    import tiktoken

    data = json.loads(Path(tokenizer).read_text(encoding="utf-8"))
    specials = {t["content"] for t in data["added_tokens"]}
    # GPT-2's byte <-> printable character table (the ByteLevel pre-tokenizer's alphabet)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_of = {b: chr(b) for b in printable}
    char_of.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in char_of)})
    byte_of = {c: b for b, c in char_of.items()}
    ranks = {bytes(byte_of[c] for c in tok): i for tok, i in data["model"]["vocab"].items() if tok not in specials}
    split = next(p for p in data["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split")
    return tiktoken.Encoding(name="bench", pat_str=split["pattern"]["Regex"], mergeable_ranks=ranks, special_tokens={})


def raw_child(corpus: str, tokenizer: str, result: str, digest: bool) -> None:
    """Runs as its own process: only encode_ordinary_batch over the in-memory texts is timed."""
    import numpy as np

    texts = read_texts(corpus)
    enc = tiktoken_encoding(tokenizer)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    ids = enc.encode_ordinary_batch(texts, num_threads=WORKERS)
    sec, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    out = {"seconds": sec, "cpu": cpu_seconds(r1) - cpu_seconds(r0), "docs": len(texts), "tokens": sum(len(d) for d in ids), "bytes": sum(len(t.encode("utf-8")) for t in texts)}
    if digest:  # last run only: the stream a shard holds, each document's ids then EOS, uint16, in corpus order
        eos = next(t["id"] for t in json.loads(Path(tokenizer).read_text())["added_tokens"] if t["content"] == EOS)
        h = hashlib.sha256()
        for d in ids:
            h.update(np.asarray(d + [eos], dtype="<u2").tobytes())
        out["sha256"] = h.hexdigest()
    Path(result).write_text(json.dumps(out))


def run_llmctl_encode(corpus: str, tokenizer: str, out: str) -> tuple[float, float]:
    cmd = [str(LLMCTL), "tokenize", corpus, "-o", out, "--tokenizer", tokenizer, "--workers", str(WORKERS), "--overwrite", "--quiet", "--json"]
    return timed(cmd, out + ".log")


def run_datatrove(corpus: str, tokenizer: str, out: str) -> tuple[float, float]:
    # its workers are forked by a multiprocess forkserver that this process never waits for, so
    # their CPU time does not reach getrusage(RUSAGE_CHILDREN) here: wall time only
    return timed([sys.executable, __file__, "--datatrove-child", corpus, tokenizer, out], out + ".log", count_others=False)[0], float("nan")


def run_raw(corpus: str, tokenizer: str, out: str, digest: bool) -> dict:
    cmd = [sys.executable, __file__, "--raw-child", corpus, tokenizer, out + ".json"] + (["--digest"] if digest else [])
    timed(cmd, out + ".log")
    return json.loads(Path(out + ".json").read_text())


def stream_digest(files: list[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def llmctl_encode_stats(out: str) -> dict:
    import numpy as np

    m = json.loads(Path(out, "manifest.json").read_text())
    bins = sorted(glob.glob(os.path.join(out, "tokens-*.bin")))
    starts = [np.fromfile(b[:-4] + ".idx", dtype="<i8") for b in bins]
    return {
        "docs": m["counts"]["docs"],
        "tokens_with_eos": m["counts"]["tokens"],
        "bytes": m["counts"]["bytes"],
        "dtype": m["config"]["dtype"],
        "encoder": m["config"]["encoder"],
        "sha256": stream_digest(bins),
        "ends": [np.append(s[1:], os.path.getsize(b) // 2) for s, b in zip(starts, bins)],
    }


def datatrove_encode_stats(out: str) -> dict:
    import numpy as np

    ds = sorted(glob.glob(os.path.join(out, "output", "*.ds")))
    ends = [np.fromfile(f + ".index", dtype="<u8") for f in ds]
    return {"docs": sum(len(e) for e in ends), "tokens_with_eos": sum(os.path.getsize(f) // 2 for f in ds), "sha256": stream_digest(ds), "ends": ends}


# ---------------------------------------------------------------------------------------------
# timing


def cpu_seconds(r) -> float:
    return r.ru_utime + r.ru_stime


# Share of the machine's cores that other processes took during each timed run (the machines are
# shared): the machine's busy time from /proc/stat minus the CPU time of the run itself.
OTHERS: list[float] = []


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (every process on the machine)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str], log: str, count_others: bool = True) -> tuple[float, float]:
    """Wall and CPU seconds of a whole child process (start-up included; CPU counts its threads and
    the worker processes it waited for); its output goes to `log`. `count_others`: record in OTHERS
    what the rest of the machine used meanwhile (only meaningful when the CPU seconds are complete)."""
    with open(log, "w") as f:
        b0, r0, t0 = machine_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        dt, r1, b1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_seconds()
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}\n--- {log}:\n{Path(log).read_text()[-3000:]}")
    cpu = cpu_seconds(r1) - cpu_seconds(r0)
    if count_others:
        OTHERS.append(max(0.0, b1 - b0 - cpu) / dt / len(os.sched_getaffinity(0)))
    return dt, cpu


def others_summary(shares: list[float]) -> str:
    return f"median {statistics.median(shares):.0%}, max {max(shares):.0%}" if shares else "n/a"


def medians(times: dict) -> dict:
    """{key: [(wall, cpu), ...]} -> {key: (median wall, median cpu)}"""
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}


def fresh(out: str) -> str:
    """An output path with nothing left from an earlier run (datatrove would skip tasks it finds done)."""
    shutil.rmtree(out, ignore_errors=True)
    for leftover in (out + ".json", out + ".log"):
        if os.path.exists(leftover):
            os.remove(leftover)
    return out


def keep_last(outs: dict, key, out: str) -> None:
    """Remember the newest output of `key`, deleting the previous one (disk stays small)."""
    old = outs.get(key)
    if old and old != out:
        shutil.rmtree(old, ignore_errors=True)
    outs[key] = out


def measure_train(inputs: dict[str, tuple[str, int]], repeat: int, tmp: str) -> tuple[dict, dict, dict]:
    """Median seconds per (input, side), interleaved; the last output dir of each; every run's."""
    runners = {"llmctl": run_llmctl_train, "direct": run_direct_train}
    times, outs = {}, {}
    for r in range(repeat):
        for name, (docs, max_chars) in inputs.items():
            for side, run in runners.items():
                out = fresh(os.path.join(tmp, f"train-{name}-{side}-r{r}"))
                sec, cpu = run(docs, out, VOCAB, max_chars)
                times.setdefault((name, side), []).append((sec, cpu))
                if side == "llmctl":  # the run without interpreter start-up and imports
                    inside = json.loads(Path(out, "manifest.json").read_text())["wall_seconds"]
                    times.setdefault((name, "llmctl-run"), []).append((inside, float("nan")))
                keep_last(outs, (name, side), out)
                print(f"  train run {r + 1}/{repeat}  {name:9s} {side:7s} {sec:6.2f} s  cpu {cpu:6.2f} s", file=sys.stderr)
    return medians(times), outs, times


def measure_encode(corpus: str, tokenizer: str, repeat: int, tmp: str) -> tuple[dict, dict, list[dict], dict]:
    """Median seconds per side (raw: the encode call only), interleaved; last outputs; raw results."""
    times, outs, raws = {}, {}, []
    for r in range(repeat):
        for side in ("llmctl", "datatrove", "raw"):
            out = fresh(os.path.join(tmp, f"encode-{side}-r{r}"))
            if side == "llmctl":
                sec, cpu = run_llmctl_encode(corpus, tokenizer, out)
                inside = json.loads(Path(out, "manifest.json").read_text())["wall_seconds"]
                times.setdefault("llmctl-run", []).append((inside, float("nan")))
            elif side == "datatrove":
                sec, cpu = run_datatrove(corpus, tokenizer, out)
            else:
                raws.append(run_raw(corpus, tokenizer, out, digest=r == repeat - 1))
                sec, cpu = raws[-1]["seconds"], raws[-1]["cpu"]
            times.setdefault(side, []).append((sec, cpu))
            if side != "raw":
                keep_last(outs, side, out)
            print(f"  encode run {r + 1}/{repeat}  {side:9s} {sec:6.2f} s  cpu {cpu:6.2f} s", file=sys.stderr)
    return medians(times), outs, raws, times


# ---------------------------------------------------------------------------------------------
# report



def byte_compile() -> None:
    """Compile llmctl's modules once, as `pip install` does for an installed package. This checkout
    is an editable install and the sandbox sets PYTHONDONTWRITEBYTECODE=1, so without it every
    llmctl process would compile its own source again (the peers' packages ship bytecode)."""
    subprocess.run([str(LLMCTL_PY), "-m", "compileall", "-q", str(REPO / "src" / "llmctl")], check=True, stdout=subprocess.DEVNULL)


def versions() -> dict:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    product = subprocess.run(
        [str(LLMCTL_PY), "-c", "from importlib.metadata import version as v; print(v('tokenizers'), v('tiktoken'))"], capture_output=True, text=True
    ).stdout.split()
    return {
        "datatrove": version("datatrove"),
        "tokenizers": version("tokenizers"),
        "tiktoken": version("tiktoken"),
        "llmctl": llm or version("llmctl"),
        "llmctl_tokenizers": product[0] if product else "?",
        "llmctl_tiktoken": product[1] if len(product) > 1 else "?",
    }


def yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", help="a docs folder to use instead of crawl-extract's output of pages-a.warc.gz")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", help="keep every output here (default: a temporary folder)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    ap.add_argument("--train-child", nargs=4, metavar=("DOCS", "OUT", "VOCAB", "MAX_CHARS"), help=argparse.SUPPRESS)
    ap.add_argument("--datatrove-child", nargs=3, metavar=("CORPUS", "TOKENIZER", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--raw-child", nargs=3, metavar=("CORPUS", "TOKENIZER", "RESULT"), help=argparse.SUPPRESS)
    ap.add_argument("--digest", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train_child:
        docs, out, vocab, max_chars = args.train_child
        return direct_train_child(docs, out, int(vocab), int(max_chars))
    if args.datatrove_child:
        return datatrove_child(*args.datatrove_child)
    if args.raw_child:
        return raw_child(*args.raw_child, args.digest)

    load_before = os.getloadavg()[0]  # the machines are shared: say how busy this one was
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp_auto:
        tmp = args.workdir or tmp_auto
        os.makedirs(tmp, exist_ok=True)
        docs = os.path.abspath(args.docs) if args.docs else make_docs(tmp, "pages")
        corpus = os.path.join(tmp, "corpus")
        shutil.rmtree(corpus, ignore_errors=True)
        cstats = make_corpus(docs, corpus)
        pages_texts = [t for t in read_texts(docs) if t]
        pages = {"docs": len(pages_texts), "chars": sum(map(len, pages_texts)), "bytes": sum(len(t.encode()) for t in pages_texts)}
        sample_chars = sum(map(len, seeded_sample(read_texts(corpus), SAMPLE_CHARS, SEED)))
        print(f"pages: {pages['docs']} docs, {pages['chars']:,} chars; corpus: {cstats['docs']} docs, {cstats['bytes'] / 1e6:.1f} MB", file=sys.stderr)

        # 1. training (pages: everything fits in the default --max-chars; corpus: a seeded sample)
        train_inputs = {"pages-a": (docs, 50_000_000), "corpus": (corpus, SAMPLE_CHARS)}
        byte_compile()
        train_t, train_outs, train_runs = measure_train(train_inputs, args.repeat, tmp)
        train_others = OTHERS[:]
        same = {name: compare_tokenizers(train_outs[(name, "llmctl")], train_outs[(name, "direct")]) for name in train_inputs}
        tmanifest = {name: json.loads(Path(train_outs[(name, "llmctl")], "manifest.json").read_text()) for name in train_inputs}

        # 2. encoding, with the tokenizer llmctl trained on pages-a
        tokenizer = os.path.join(tmp, "tok", "tokenizer.json")
        os.makedirs(os.path.dirname(tokenizer), exist_ok=True)
        shutil.copyfile(os.path.join(train_outs[("pages-a", "llmctl")], "tokenizer.json"), tokenizer)
        enc_t, enc_outs, raws, enc_runs = measure_encode(corpus, tokenizer, args.repeat, tmp)
        encode_others = OTHERS[len(train_others) :]
        lm = llmctl_encode_stats(enc_outs["llmctl"])
        dt = datatrove_encode_stats(enc_outs["datatrove"])
        raw = raws[-1]
    load_after = os.getloadavg()[0]
    total_min = (time.perf_counter() - t_start) / 60

    # --- training table
    rows = [
        "| input | chars trained on | llmctl s | direct s | **llmctl / direct** | fastest runs: llmctl / direct | llmctl CPU s | direct CPU s | CPU llmctl / direct | llmctl run only s | same merges | same tokenizer.json |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in train_inputs:
        (a, ac), (b, bc) = train_t[(name, "llmctl")], train_t[(name, "direct")]
        fastest = min(w for w, _ in train_runs[(name, "llmctl")]) / min(w for w, _ in train_runs[(name, "direct")])
        label = f"pages-a ({pages['docs']} docs, all)" if name == "pages-a" else f"corpus, `--max-chars {SAMPLE_CHARS}` (seeded sample)"
        chars = tmanifest[name]["counts"]["chars_sampled"]
        rows.append(
            f"| {label} | {chars:,} | {a:.2f} | {b:.2f} | **{a / b:.2f}×** | {fastest:.2f}× | {ac:.2f} | {bc:.2f} | {ac / bc:.2f}× | {train_t[(name, 'llmctl-run')][0]:.2f} "
            f"| {yes(same[name]['merges'])} ({same[name]['n_merges']:,}) | {yes(same[name]['file'])} |"
        )
    train_md = "\n".join(rows)

    # --- encoding table (tokens = text tokens, the EOS after each document not counted)
    text_tokens = lm["tokens_with_eos"] - lm["docs"]
    sides = ("llmctl", "datatrove", "raw")
    rate = {side: (text_tokens / enc_t[side][0], lm["docs"] / enc_t[side][0], lm["bytes"] / enc_t[side][0] / 1e6) for side in sides + ("llmctl-run",)}
    erows = [
        "| side | what is timed | median s | tokens/s | docs/s | MB/s | **llmctl / side** (tokens/s) | CPU s | CPU side / llmctl |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    what = {
        "llmctl": "whole process, Parquet → shards",
        "datatrove": "whole process, Parquet → shards",
        "raw": "`encode_ordinary_batch` only, texts in memory",
        "llmctl-run": "its manifest's `wall_seconds`: the run without interpreter start-up and imports",
    }
    for side in sides + ("llmctl-run",):
        (tps, dps, mbs), cpu = rate[side], enc_t[side][1]
        ratio = {"llmctl": "—", "llmctl-run": f"vs raw: {tps / rate['raw'][0]:.2f}×"}.get(side, f"**{rate['llmctl'][0] / tps:.2f}×**")
        cpu_s, cpu_ratio = ("n/a", "n/a") if cpu != cpu or side == "llmctl-run" else (f"{cpu:.2f}", "—" if side == "llmctl" else f"{cpu / enc_t['llmctl'][1]:.2f}")
        erows.append(f"| {side.replace('llmctl-run', 'llmctl, run only')} | {what[side]} | {enc_t[side][0]:.2f} | {tps / 1e6:.2f} M | {dps:,.0f} | {mbs:.1f} | {ratio} | {cpu_s} | {cpu_ratio} |")
    enc_md = "\n".join(erows)

    import numpy as np

    same_ends = len(lm["ends"]) == len(dt["ends"]) and all(np.array_equal(a, b) for a, b in zip(lm["ends"], dt["ends"]))
    checks = [
        ("llmctl docs / datatrove docs / corpus docs", f"{lm['docs']} / {dt['docs']} / {cstats['docs']}"),
        ("llmctl text tokens = raw tiktoken tokens", f"{yes(text_tokens == raw['tokens'])} ({text_tokens:,} / {raw['tokens']:,})"),
        ("llmctl tokens incl. EOS = datatrove tokens incl. EOS", f"{yes(lm['tokens_with_eos'] == dt['tokens_with_eos'])} ({lm['tokens_with_eos']:,} / {dt['tokens_with_eos']:,})"),
        ("token stream identical (sha256 of the shards in order): llmctl = raw", yes(lm["sha256"] == raw.get("sha256"))),
        ("token stream identical: llmctl = datatrove (`tokenizers` ids)", yes(lm["sha256"] == dt["sha256"])),
        ("document boundaries: llmctl `.idx` = datatrove `.index`", yes(same_ends)),
        ("manifest bytes = UTF-8 bytes of the corpus texts", f"{yes(lm['bytes'] == cstats['bytes'] == raw['bytes'])} ({lm['bytes']:,})"),
        ("llmctl encoder / dtype", f"{lm['encoder']} / {lm['dtype']}"),
        ("wall s of each run: llmctl / datatrove / raw", " / ".join(", ".join(f"{w:.2f}" for w, _ in enc_runs[side]) for side in sides)),
        ("CPU s of each run: llmctl / raw", " / ".join(", ".join(f"{c:.2f}" for _, c in enc_runs[side]) for side in ("llmctl", "raw"))),
        (
            "llmctl ÷ side in tokens/s, run by run (each pair ran back to back): datatrove / raw",
            " / ".join(", ".join(f"{b[0] / a[0]:.2f}" for a, b in zip(enc_runs["llmctl"], enc_runs[side])) for side in ("datatrove", "raw")),
        ),
        (
            "cores used = CPU s ÷ wall s, median (2.00 = both cores): llmctl / raw",
            " / ".join(f"{statistics.median(c / w for w, c in enc_runs[side]):.2f}" for side in ("llmctl", "raw")),
        ),
    ]
    check_md = "\n".join(["| check | result |", "|---|---|"] + [f"| {k} | {v} |" for k, v in checks])

    v = versions()
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/tokenization.py"] + [a for a in sys.argv[1:]])
    section = f"""## tokenize

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
median of {args.repeat} interleaved runs, 1-min load average {load_before:.2f} before / {load_after:.2f} after,
{total_min:.1f} min in all. {v['llmctl']} (tokenizers {v['llmctl_tokenizers']}, tiktoken {v['llmctl_tiktoken']});
peers: tokenizers {v['tokenizers']}, tiktoken {v['tiktoken']}, datatrove {v['datatrove']}.
Inputs: the {pages['docs']} docs of `llmctl crawl-extract ../shared/data/web/pages-a.warc.gz`
({pages['chars']:,} chars, {pages['bytes'] / 1e6:.1f} MB), and a synthetic corpus of those texts
× {COPIES}, shuffled (seed {SEED}) into {PARTS} Parquet parts: {cstats['docs']:,} docs, {cstats['bytes'] / 1e6:.1f} MB of UTF-8
(its seeded {SAMPLE_CHARS:,}-char sample: {sample_chars:,} chars). llmctl's modules are byte-compiled
first, as an installed package is (this sandbox sets PYTHONDONTWRITEBYTECODE=1, so an editable
checkout would otherwise compile its source in every process; the peers' packages ship bytecode).
Other processes on the machine during the timed runs (its busy time from /proc/stat minus the run's
own CPU time, as a share of all cores): training {others_summary(train_others)}, encoding (llmctl and raw
runs) {others_summary(encode_others)}.

**Training** (vocab {VOCAB:,}, cl100k pre-tokenizer, 16 special tokens, min frequency {MIN_FREQUENCY}),
whole process on both sides: `llmctl tokenize train DOCS -o TOK --vocab-size {VOCAB}` vs a child
process that reads the same Parquet with pyarrow, takes the same seeded sample and calls
`tokenizers`' `BpeTrainer` with the same settings. Target: llmctl ≤ 1.1× direct (wall). CPU s = user + sys
of the whole process (the trainer's threads included). Both sides train on two threads, so another
job on the machine slows whichever run it overlaps: the fastest run of each side is the least disturbed.

{train_md}

**Encoding** the synthetic corpus with the pages-a tokenizer, {WORKERS} workers: `llmctl tokenize CORPUS -o OUT
--tokenizer TOK/tokenizer.json --workers {WORKERS}` vs datatrove `ParquetReader → DocumentTokenizer(eos_token="<|endoftext|>",
shuffle_documents=False)` with `LocalPipelineExecutor(tasks={PARTS}, workers={WORKERS})`, both timed around the whole
process; and the raw rate, tiktoken `encode_ordinary_batch(texts, num_threads={WORKERS})` on the texts in memory
(the same merges and regex, rebuilt from tokenizer.json by this script). llmctl calls tiktoken's
`encode_to_numpy` with no special token allowed (ids straight into a uint32 buffer, no Python int
list), which is how the whole llmctl process can outrun that call. Tokens are text tokens (the EOS
after each document not counted). Targets: llmctl ≥ 2× datatrove, ≥ 0.9× raw. CPU s = user + sys: of
the whole process and the workers it waited for (llmctl), of the encode call (raw); not measured for
datatrove (its workers are forked by a forkserver it never waits for). The machines are shared: when
another job holds a core, wall-clock ratios between a 2-process run and a 2-thread call move with it,
the CPU ratio much less (the "cores used" row says how much of the two cores each side got).

{enc_md}

{check_md}
"""
    print(section)
    if not args.no_write:
        write_results("tokenize", section)


if __name__ == "__main__":
    main()

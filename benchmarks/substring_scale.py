"""dedup --substring at scale: bytes/s and peak memory at 100 MB, 1 GB and 4 GB of text, so the
cost's growth is measured, not assumed; and the same result at 1 and 2 workers and in one shard
or several.

    .venv/bin/python benchmarks/substring_scale.py [--sizes 100 1024 4096] [--memory 8G] [--workers 2]
        [--budget-s 1800] [--sample-pairs 6] [--workdir DIR]

The text is generated from the real pages: words drawn from the word frequencies of the documents
`llmctl crawl-extract` makes from pages-a.warc.gz, in documents of 200-2,000 words, and 5 % of the
bytes planted repeats (a span of 20-400 words copied from an earlier document). Units are bytes,
N = 100 bytes.

A size whose predicted run fits --budget-s runs whole (wall time and the peak resident memory of
the whole process tree, sampled from /proc). A larger one runs the units phase and the first
--sample-pairs shard-pair tasks, one worker, and predicts the total from them: the pair tasks are
S(S-1)/2 + 1 for S shards, all the same size, so their mean times their count over the workers is
the repeats phase; the units, cuts and filter phases are linear in the bytes and scaled from the
largest whole run. The smallest size also runs at --small-memory (several shards), 1 and 2 workers,
and every output of it must be the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import LLMCTL, REPO, cpu_name, make_docs, read_parts, write_results

sys.path.insert(0, str(REPO / "src"))
from llmctl.data.dedup import substring  # noqa: E402

MIN_LEN = 100
FILE_MB = 256  # input file size: one units task per file


# ---------------------------------------------------------------------------------------------
# corpus


def vocabulary(tmp: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """pages-a's words, each with a trailing space, end to end (blob), where each starts and how
    long it is, and the cumulative distribution of their frequencies."""
    counts: Counter = Counter()
    for r in read_parts(make_docs(str(tmp))):
        counts.update(r["text"].split())
    words = [w.encode() + b" " for w, _ in counts.most_common()]
    lengths = np.array([len(w) for w in words], np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    freq = np.array([c for _, c in counts.most_common()], np.float64)
    return np.frombuffer(b"".join(words), np.uint8), starts, lengths, np.cumsum(freq / freq.sum())


def word_salad(rng, vocab, n_words: int) -> tuple[bytes, np.ndarray]:
    """n_words words drawn by frequency, as one byte string, and where each word ends in it."""
    blob, starts, lengths, cdf = vocab
    ids = np.minimum(np.searchsorted(cdf, rng.random(n_words)), len(cdf) - 1)
    size = lengths[ids]
    ends = np.cumsum(size)
    pos = np.repeat(starts[ids] - (ends - size), size) + np.arange(ends[-1])
    return blob[pos].tobytes(), ends


def generate(folder: Path, mb: int, vocab, seed: int = 0) -> int:
    """Write `mb` MB of documents as Parquet files of FILE_MB; returns the text bytes."""
    done = folder.with_suffix(".json")  # beside the folder: everything inside it is read as docs
    if done.exists():
        return json.loads(done.read_text())["bytes"]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    total, target, file_no, doc_no, batch, batch_bytes = 0, mb << 20, 0, 0, [], 0
    recent: list[bytes] = []
    while total < target:
        text, ends = word_salad(rng, vocab, 1 << 21)
        k = 0
        while k < len(ends) and total < target:
            m = int(rng.integers(200, 2000))
            lo, hi = (int(ends[k - 1]) if k else 0), int(ends[min(k + m, len(ends)) - 1])
            k += m
            doc = text[lo:hi]
            if recent and rng.random() < 0.5:  # a planted repeat: half the docs, 20-400 words of an earlier one
                src = recent[int(rng.integers(len(recent)))].split(b" ")
                n = int(rng.integers(20, 400))
                at = int(rng.integers(0, max(1, len(src) - n)))
                cut = doc.rfind(b" ", 0, int(rng.integers(0, len(doc)))) + 1
                doc = doc[:cut] + b" ".join(src[at : at + n]) + b" " + doc[cut:]
            recent = (recent + [doc])[-200:]
            batch.append({"id": f"g{doc_no}", "text": doc.decode("utf-8", "replace")})
            doc_no += 1
            total += len(doc)
            batch_bytes += len(doc)
            if batch_bytes >= FILE_MB << 20 or total >= target:
                pq.write_table(pa.Table.from_pylist(batch), folder / f"part-{file_no:05d}.parquet")
                file_no, batch, batch_bytes = file_no + 1, [], 0
    done.write_text(json.dumps({"bytes": total, "docs": doc_no}))
    return total


# ---------------------------------------------------------------------------------------------
# runs


class TreeRSS(threading.Thread):
    """The peak summed VmRSS of a process and its descendants, sampled every 0.2 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.sample())
            time.sleep(0.2)

    def sample(self) -> int:
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                status = Path(f"/proc/{d}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            children.setdefault(int(fields["PPid"].strip()), []).append(int(d))
            rss[int(d)] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
        total, todo = 0, [self.pid]
        while todo:
            q = todo.pop()
            total += rss.get(q, 0)
            todo += children.get(q, [])
        return total


def run(inp: Path, out: Path, memory: str, workers: int, stop_after_pairs: int | None = None) -> dict:
    """One `llmctl dedup --substring` run: wall, peak tree memory, phase times from _work's files."""
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(LLMCTL), "dedup", str(inp), "-o", str(out), "--substring", "--unit", "bytes", "--min-len", str(MIN_LEN),
           "--memory", memory, "--workers", str(workers), "--min-doc-words", "0", "--keep-work", "-q"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    mem = TreeRSS(proc.pid)
    mem.start()
    marks: dict[str, float] = {}
    pair_done: list[float] = []
    while proc.poll() is None:
        time.sleep(0.5)
        now = time.perf_counter() - t0
        if "units" not in marks and (out / "_work" / "layout.npz").exists():
            marks["units"] = now
        reps = out / "_work" / "repeats"
        n = len(list(reps.glob("*.npy"))) if reps.is_dir() else 0
        while len(pair_done) < n:
            pair_done.append(now)
        if stop_after_pairs is not None and n >= stop_after_pairs:
            os.killpg(proc.pid, 9)
            proc.wait()
            break
    mem.stop.set()
    mem.join()
    if stop_after_pairs is None and proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()[-2000:]}")
    with np.load(out / "_work" / "layout.npz") as z:
        shards = len(z["shard_units"])
    return {"wall": time.perf_counter() - t0, "peak": mem.peak, "marks": marks, "pair_done": pair_done, "shards": shards}


def digest(out: Path) -> str:
    rows = read_parts(str(out))
    return hashlib.sha256(json.dumps([[r["id"], r["text"], r["removed_spans"]] for r in rows]).encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1024, 4096], help="MB of text")
    ap.add_argument("--memory", default="8G")
    ap.add_argument("--small-memory", default="1G", help="the smallest size again at this --memory (several shards)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=1800, help="run a size whole when its predicted wall fits this")
    ap.add_argument("--sample-pairs", type=int, default=6)
    ap.add_argument("--workdir", default="/tmp/substring-scale")
    ap.add_argument("--table-only", action="store_true", help="rewrite the RESULTS section from WORKDIR/results.json, run nothing")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.table_only:
        saved = json.loads((work / "results.json").read_text())
        return write(args, saved["rows"], [tuple(i) for i in saved["identity"]])
    vocab = vocabulary(work)
    rows, identity = [], []
    for mb in sorted(args.sizes):
        inp = work / f"corpus-{mb}"
        n_bytes = generate(inp, mb, vocab)
        cap = substring.shard_cap(substring.memory_bytes(args.memory), "bytes")
        n_shards = -(-n_bytes // cap)  # about: shards close at document boundaries
        task_units = min(n_bytes, 2 * cap)  # what one pair task sorts
        predicted = None
        whole = [r for r in rows if r["mode"] == "whole"]
        if whole:  # per pair task in proportion to what it sorts; the other phases per byte
            last = whole[-1]
            per_pair = last["pair_s"] * min(args.workers, last["pairs"]) / last["pairs"] * task_units / last["task_units"]
            predicted = (last["wall"] - last["pair_s"]) / last["bytes"] * n_bytes + per_pair * len(substring.shard_pairs(n_shards)) / args.workers
        out = work / f"out-{mb}"
        if predicted is None or predicted <= args.budget_s:
            r = run(inp, out, args.memory, args.workers)
            pairs = len(r["pair_done"])
            m = json.loads((out / "manifest.json").read_text())
            rows.append({"mb": mb, "bytes": n_bytes, "mode": "whole", "wall": r["wall"], "peak": r["peak"], "shards": r["shards"],
                         "pairs": pairs, "pair_s": r["pair_done"][-1] - r["marks"]["units"], "task_units": task_units,
                         "cut": m["counts"]["spans"]["substring"]["bytes"]})
            if mb == min(args.sizes):
                identity.append((args.memory, args.workers, r["shards"], digest(out)))
                for w in (1, 2):
                    o = work / f"out-{mb}-small-{w}"
                    rr = run(inp, o, args.small_memory, w)
                    identity.append((args.small_memory, w, rr["shards"], digest(o)))
                    shutil.rmtree(o, ignore_errors=True)
        else:
            r = run(inp, out, args.memory, 1, stop_after_pairs=args.sample_pairs)
            gaps = np.diff([r["marks"]["units"], *r["pair_done"]])
            per_pair = float(np.mean(gaps[1:] if len(gaps) > 1 else gaps))  # the first is shard 0 alone: half the work
            n_pairs = len(substring.shard_pairs(r["shards"]))
            last = whole[-1]
            rest = (last["wall"] - last["pair_s"] - last["units_s"]) / last["bytes"] * n_bytes  # cuts + filter, per byte
            rows.append({"mb": mb, "bytes": n_bytes, "mode": "sampled", "units_s": r["marks"]["units"], "per_pair": per_pair,
                         "shards": r["shards"], "pairs": n_pairs, "sampled": len(r["pair_done"]), "peak": r["peak"],
                         "wall": r["marks"]["units"] + per_pair * n_pairs / args.workers + rest})
        if rows[-1]["mode"] == "whole":
            rows[-1]["units_s"] = r["marks"]["units"]
        shutil.rmtree(out, ignore_errors=True)
        print(json.dumps(rows[-1]), file=sys.stderr)
        (work / "results.json").write_text(json.dumps({"rows": rows, "identity": identity}))
    write(args, rows, identity)


def write(args, rows: list[dict], identity: list[tuple]) -> None:
    gib = 1 << 30
    lines = [
        "## dedup: substrings at scale",
        "",
        f"`.venv/bin/python benchmarks/substring_scale.py --sizes {' '.join(map(str, args.sizes))} --memory {args.memory} "
        f"--workers {args.workers} --budget-s {args.budget_s:g} --sample-pairs {args.sample_pairs}` on {cpu_name()} "
        f"({os.cpu_count()} cores). Text generated from pages-a's word frequencies with 5 % planted repeats; "
        f"`llmctl dedup --substring --unit bytes --min-len {MIN_LEN} --memory {args.memory} --workers {args.workers}`.",
        "",
        "| text | run | shards | pair tasks | wall s | MB/s | peak memory (process tree) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        how = ("whole" if r["mode"] == "whole" else
               f"predicted: units phase measured ({r['units_s']:.0f} s, 1 worker), {r['sampled']} pair tasks measured ({r['per_pair']:.0f} s each, 1 worker) x {r['pairs']} / {args.workers} workers, the rest per byte as at the largest whole size")
        lines.append(f"| {r['bytes'] / 2**20:,.0f} MB | {how} | {r['shards']} | {r['pairs']} | {r['wall']:,.0f} | "
                     f"{r['bytes'] / 2**20 / r['wall']:.2f} | {r['peak'] / gib:.1f} GiB{' (1 worker)' if r['mode'] != 'whole' else ''} |")
    if len(rows) > 1:
        lines += ["", " ".join(f"From {a['bytes'] / 2**20:,.0f} MB to {b['bytes'] / 2**20:,.0f} MB the text grows {b['bytes'] / a['bytes']:.1f}x "
                               f"and the wall time {b['wall'] / a['wall']:.1f}x." for a, b in zip(rows, rows[1:]))]
        lines.append("Each pair task sorts two shards, and there are S(S-1)/2 + 1 of them for S shards: at a fixed --memory the work "
                     "grows with the square of the text once it spans several shards, and a larger --memory (fewer, larger shards) "
                     "buys it back. Lee et al. instead merge per-part suffix arrays into one array on disk (8 bytes a unit), which needs no pairs.")
    if identity:
        same = len({d for *_, d in identity}) == 1
        lines += ["", f"At {rows[0]['bytes'] / 2**20:,.0f} MB the output (id, text, removed_spans of every document) is "
                  f"{'identical' if same else 'NOT identical'} across " + ", ".join(f"--memory {m} / {w} worker(s) ({s} shard(s))" for m, w, s, _ in identity) + "."]
    write_results("dedup: substrings at scale", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

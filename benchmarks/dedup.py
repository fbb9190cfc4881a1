"""dedup (MinHash) side by side with datatrove and datasketch, and against planted truth (DESIGN §7, issue 5).

    make bench-setup   # + datasketch and xxhash in .venv-bench, see benchmarks/README.md
    .venv-bench/bin/python benchmarks/dedup.py [--docs N] [--repeat R]

Corpus: paragraphs of the documents `llmctl crawl-extract` makes from ../shared/data/web/pages-a.warc.gz,
recombined into N new documents of 150-600 words, with planted near-duplicate pairs at known word
5-gram Jaccard J (measured after llmctl's normalization) and planted exact duplicates. Built once
(seeded, deterministic) and cached under .venv-bench/share/.

Speed, one run, the same cores, interleaved repeats, 14 bands x 8 rows, word 5-grams; all three sides
on a fixed 1-in-10 subset of the corpus (--subset; datatrove would need ~10 minutes a run for the
whole of it), and llmctl and datasketch on the whole corpus too:
  llmctl      llmctl dedup DOCS -o OUT --minhash --keep-rejected --workers N          (N = 1, 2)
  datatrove   MinhashDedupSignature -> MinhashDedupBuckets -> MinhashDedupCluster
              -> MinhashDedupFilter (ParquetReader in, ParquetWriter out and for the removed)  (N = 1, 2)
  datasketch  a loop: MinHash.generator(5-grams, num_perm=112) -> MinHashLSH(params=(14, 8))
              query, insert -> union-find                                              (1 process)
Each side is a child process timed from the outside (start-up and imports count alike), with its
CPU time and peak memory. Accuracy: llmctl --minhash --exact on the whole corpus: the share of
planted pairs flagged per J against 1 - (1 - J^8)^14, exact duplicates removed, false merges
(removed documents outside every planted group); the same for all three sides on the subset.
The tables go to stdout and into benchmarks/RESULTS.md (## dedup).
"""

from __future__ import annotations

import os
import sys

import argparse
import datetime
import glob
import hashlib
import json
import math
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import LLMCTL, REPO, cpu_name, pct, write_results  # noqa: E402  (benchmarks/common.py)

WARC = REPO.parent / "shared" / "data" / "web" / "pages-a.warc.gz"
CACHE = REPO / ".venv-bench" / "share" / "dedup-corpus"
WORKERS = (1, 2)
BANDS, ROWS, NGRAM = 14, 8, 5  # FineWeb's banding; the same on all three sides
J_VALUES = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
J_TOL = 0.005  # a planted pair's measured J is within this of its nominal J (the issue allows 0.01)
PARTS = 8
SEED = 20261129
CORPUS_VERSION = 1  # bump when the corpus recipe changes, so the cache is rebuilt


def s_curve(j: float) -> float:
    """P(a pair at Jaccard j shares at least one band) = 1 - (1 - j^r)^b."""
    return 1.0 - (1.0 - j**ROWS) ** BANDS


# ---------------------------------------------------------------------------------------------
# corpus: real paragraphs, recombined, with planted near and exact duplicates


def paragraph_pool(tmp: str) -> list[str]:
    """Distinct paragraphs (>= 8 words) of the extracted pages-a documents; long ones cut into pieces
    of at most 80 words, so that a 150-600 word document is made of several unrelated pieces."""
    import pyarrow.parquet as pq

    out = os.path.join(tmp, "pages")
    subprocess.run([str(LLMCTL), "crawl-extract", str(WARC), "-o", out, "--quiet", "--overwrite"], check=True)
    seen, pool = set(), []
    for path in sorted(glob.glob(os.path.join(out, "part-*.parquet"))):
        for text in pq.read_table(path, columns=["text"]).column("text").to_pylist():
            for para in text.split("\n"):
                words = para.split()
                for i in range(0, len(words), 80):
                    piece = " ".join(words[i : i + 80])
                    if len(words[i : i + 80]) >= 8 and piece not in seen:
                        seen.add(piece)
                        pool.append(piece)
    return pool


def compose(rng: random.Random, pool: list[str], sizes: list[int]) -> tuple[str, list[int]]:
    """A new document of 150-600 words from random pool pieces (one paragraph each); returns the text
    and the piece numbers, which the overlap check below needs."""
    target, words, picked = rng.randint(150, 600), 0, []
    while words < target:
        k = rng.randrange(len(pool))
        if k not in picked:
            picked.append(k)
            words += sizes[k]
    return "\n".join(pool[k] for k in picked), picked


def shingles(words: list[str]) -> set[tuple]:
    return set(zip(*(words[i:] for i in range(NGRAM))))


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def norm_words(text: str) -> list[str]:
    """llmctl's normalization: the same words as normalize_text(text).split()."""
    from llmctl.data.dedup.normalize import normalized_words

    return normalized_words(text)


class NearDup:
    """Makes a copy of a text whose word-5-gram Jaccard with it (after llmctl's normalization) is J.

    The copy is the original with k word edits (each a substitution, a deletion or an insertion, at
    a random token); J falls as k grows, so k is found by bisection over one random edit order. A
    token normalizes on its own to the same words it gives in context (normalization is per
    character, and whitespace stays whitespace), so the words of the copy are the concatenation of
    per-token words, which makes each try cheap; the final J is measured again on the whole texts."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab  # replacement words, each one normalized word on its own

    def make(self, rng: random.Random, text: str, j: float) -> tuple[str, float] | None:
        toks = re.split(r"(\s+)", text)  # words at even positions, whitespace at odd ones
        tok_words = [norm_words(t) if i % 2 == 0 else [] for i, t in enumerate(toks)]
        base = shingles([w for tw in tok_words for w in tw])
        editable = [i for i in range(0, len(toks), 2) if tok_words[i]]
        for _ in range(20):  # edit orders to try
            order = rng.sample(editable, len(editable))
            edits = [self._edit(rng, toks[i]) for i in order]

            def apply(k):
                new = dict(zip(order[:k], edits[:k]))
                return [new.get(i, t) for i, t in enumerate(toks)]

            def j_of(k):
                new = dict(zip(order[:k], edits[:k]))
                ws = []
                for i, tw in enumerate(tok_words):
                    ws += norm_words(new[i]) if i in new else tw
                return jaccard(base, shingles(ws))

            lo, hi = 0, len(order)  # J(lo) >= j > J(hi), roughly: J is not strictly monotone in k
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if j_of(mid) >= j else (lo, mid)
            for k in (lo, hi):
                copy = "".join(apply(k))
                measured = jaccard(base, shingles(norm_words(copy)))
                if abs(measured - j) <= J_TOL:
                    return copy, measured
        return None

    def _edit(self, rng: random.Random, tok: str) -> str:
        op = rng.random()
        if op < 0.6:
            return rng.choice(self.vocab)  # substitute
        if op < 0.8:
            return ""  # delete (the whitespace around it folds)
        return f"{tok} {rng.choice(self.vocab)}"  # insert after


def exact_copy(rng: random.Random, text: str) -> str:
    """A copy that normalizes to the same text: verbatim, or with its whitespace changed."""
    if rng.random() < 0.5:
        return text
    return "  " + text.replace("\n", "\n\n").replace(" ", "  ", 3) + "\n"


def build_corpus(n_docs: int, pairs: int, folder: Path) -> None:
    """Writes folder/docs/part-*.parquet (id, text) and folder/truth.json. Deterministic for (n_docs, pairs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory(prefix="bench-dedup-pool-") as tmp:
        pool = paragraph_pool(tmp)
    sizes = [len(p.split()) for p in pool]
    vocab = sorted({w for p in pool for w in p.split() if w.isalpha() and len(norm_words(w)) == 1})
    near = NearDup(vocab)
    n_exact_once, n_exact_twice = 1000, 1000
    n_background = n_docs - 2 * pairs * len(J_VALUES) - n_exact_once - 2 * n_exact_twice  # + the copies
    if n_background < 1000:
        sys.exit(f"--docs {n_docs} is too small for {pairs} pairs per J and 2,000 exact-duplicate groups")

    texts, pieces, groups = [], [], {"pairs": [], "exact": []}  # groups hold indices into texts until ids exist
    for _ in range(n_background):
        t, p = compose(rng, pool, sizes)
        texts.append(t)
        pieces.append(p)
    # exact duplicates of 2,000 distinct background documents: the first half copied once, the rest twice
    originals = rng.sample(range(n_background), n_exact_once + n_exact_twice)
    for k, orig in enumerate(originals):
        idx = [orig]
        for _ in range(1 if k < n_exact_once else 2):
            texts.append(exact_copy(rng, texts[orig]))
            pieces.append(pieces[orig])
            idx.append(len(texts) - 1)
        groups["exact"].append(idx)
    for j in J_VALUES:
        made = 0
        while made < pairs:
            orig, p = compose(rng, pool, sizes)
            got = near.make(rng, orig, j)
            if got is None:
                continue  # this text cannot land within J_TOL of j; compose another
            texts += [orig, got[0]]
            pieces += [p, p]
            groups["pairs"].append({"j": j, "measured": round(got[1], 5), "docs": [len(texts) - 2, len(texts) - 1]})
            made += 1
        print(f"  planted {pairs} pairs at J = {j}", file=sys.stderr)

    # shuffle, so that planted documents are spread over all parts and far apart in input order
    order = list(range(len(texts)))
    rng.shuffle(order)
    new_id = {old: f"doc-{new:06d}" for new, old in enumerate(order)}
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    per = math.ceil(len(order) / PARTS)
    for part in range(PARTS):
        rows = order[part * per : (part + 1) * per]
        table = pa.table({"id": [new_id[i] for i in rows], "text": [texts[i] for i in rows]})
        pq.write_table(table, docs / f"part-{part:05d}.parquet", compression="zstd")
    truth = {
        "docs": len(texts),
        "background": n_background,
        "pool_pieces": len(pool),
        "pairs": [{**g, "docs": [new_id[i] for i in g["docs"]]} for g in groups["pairs"]],
        "exact": [[new_id[i] for i in g] for g in groups["exact"]],
        "overlap": background_overlap(rng, texts, pieces, n_background),
    }
    (folder / "truth.json").write_text(json.dumps(truth))


def background_overlap(rng: random.Random, texts: list[str], pieces: list[list[int]], n_background: int) -> dict:
    """How much unrelated documents share: pieces are reused (the pool has ~8,500), so pairs of
    background documents that share a piece exist. Sample 2,000 of them, measure their J exactly,
    and estimate how many of all such pairs the banding should flag: the false merges that the corpus
    itself explains. Anything far above that is the tool's doing."""
    users: dict[int, list[int]] = {}
    for d in range(n_background):
        for p in pieces[d]:
            users.setdefault(p, []).append(d)
    reused = [u for u in users.values() if len(u) > 1]
    n_pairs = sum(len(u) * (len(u) - 1) // 2 for u in reused)  # counted once per shared piece
    weights = [len(u) * (len(u) - 1) for u in reused]
    js = []
    for u in rng.choices(reused, weights=weights, k=2000):
        a, b = rng.sample(u, 2)
        js.append(jaccard(shingles(norm_words(texts[a])), shingles(norm_words(texts[b]))))
    return {
        "pairs_sharing_a_piece": n_pairs,
        "sample": len(js),
        "mean_j": round(statistics.mean(js), 4),
        "max_j": round(max(js), 4),
        "expected_flagged": round(n_pairs * statistics.mean(s_curve(j) for j in js), 3),
    }


def corpus(n_docs: int, pairs: int) -> Path:
    """The cached corpus folder for these settings, built if missing."""
    import inspect

    from llmctl.data.dedup import normalize  # the measured J's depend on its definition: a change rebuilds the corpus

    definition = inspect.getsource(normalize.normalized_words) + "".join(r.pattern for r in (normalize._MARKS, normalize._PUNCT, normalize._DIGITS))
    recipe = f"{CORPUS_VERSION}-{n_docs}-{pairs}-{SEED}-{WARC.stat().st_size}-{definition}"
    key = hashlib.sha1(recipe.encode()).hexdigest()[:10]
    folder = CACHE / f"{n_docs}-{pairs}-{key}"
    if not (folder / "truth.json").exists():
        print(f"building the corpus in {folder} (once)", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        build_corpus(n_docs, pairs, folder)
        print(f"  built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return folder


def truth_of(folder: Path) -> dict:
    return json.loads((folder / "truth.json").read_text())


# ---------------------------------------------------------------------------------------------
# the three sides; each runs as a child process and leaves {removed id: id of its survivor or ""}
# in OUT/removed.json (datatrove does not say which document a removed one duplicates: "")


def run_llmctl(docs: Path, out: str, workers: int, extra: tuple = ()) -> dict:
    cmd = [str(LLMCTL), "dedup", str(docs), "-o", out, "--minhash", *extra, "--bands", str(BANDS), "--rows", str(ROWS),
           "--ngram", str(NGRAM), "--workers", str(workers), "--keep-rejected", "--overwrite", "--quiet", "--json"]  # fmt: skip
    return timed(cmd, out + ".log")


def read_llmctl(out: str) -> dict:
    """{removed id: dup_of} and {removed id: reason}, from OUT/rejected/."""
    import pyarrow.parquet as pq

    removed, reasons = {}, {}
    for path in sorted(glob.glob(os.path.join(out, "rejected", "part-*.parquet"))):
        t = pq.read_table(path, columns=["id", "dup_of", "reason"]).to_pydict()
        removed.update(zip(t["id"], t["dup_of"]))
        reasons.update(zip(t["id"], t["reason"]))
    return {"removed": removed, "reasons": reasons}


def run_datatrove(docs: Path, out: str, workers: int) -> dict:
    return timed([sys.executable, __file__, "--datatrove-child", str(docs), out, str(workers)], out + ".log")


def datatrove_child(docs: str, out: str, workers: int) -> None:
    """Runs inside the timed child: datatrove's four MinHash stages as its example script chains them.
    Stage 1 and 4 get one task per input file, stage 2 one per band (it needs a multiple of 14),
    stage 3 exactly one; each stage with min(tasks, workers) workers."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import ParquetWriter

    # its defaults otherwise: 64-bit xxhash of each n-gram, simplify_text, English word tokenizer (spaCy)
    config = MinhashConfig(n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS)
    files = len(glob.glob(os.path.join(docs, "part-*.parquet")))

    def reader():
        return ParquetReader(docs, glob_pattern="part-*.parquet", text_key="text", id_key="id")

    sigs, buckets, clusters = (os.path.join(out, d) for d in ("signatures", "buckets", "remove_ids"))
    stages = [
        ([reader(), MinhashDedupSignature(output_folder=sigs, config=config)], files),
        ([MinhashDedupBuckets(input_folder=sigs, output_folder=buckets, config=config)], BANDS),
        ([MinhashDedupCluster(input_folder=buckets, output_folder=clusters, config=config)], 1),
        ([reader(), MinhashDedupFilter(input_folder=clusters, exclusion_writer=ParquetWriter(os.path.join(out, "removed"))),
          ParquetWriter(os.path.join(out, "output"))], files),  # fmt: skip
    ]
    seconds = []
    for i, (pipeline, tasks) in enumerate(stages, 1):
        t0 = time.perf_counter()
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=min(tasks, workers), logging_dir=os.path.join(out, "logs", f"stage{i}")).run()
        seconds.append(time.perf_counter() - t0)
    (Path(out) / "stage_seconds.json").write_text(json.dumps(seconds))


def read_datatrove(out: str) -> dict:
    import pyarrow.parquet as pq

    ids = [i for p in sorted(glob.glob(os.path.join(out, "removed", "*.parquet"))) for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]
    return {"removed": dict.fromkeys(ids, ""), "stage_seconds": json.loads((Path(out) / "stage_seconds.json").read_text())}


def run_datasketch(docs: Path, out: str) -> dict:
    return timed([sys.executable, __file__, "--datasketch-child", str(docs), out], out + ".log")


def datasketch_child(docs: str, out: str) -> None:
    """Runs inside the timed child: the loop a datasketch user writes. The same shingles as llmctl
    (llmctl's normalized_words, word 5-grams), MinHash.generator (datasketch's way to make many
    MinHashes without re-drawing the permutations), MinHashLSH with the same banding; each document
    is queried before it is inserted, and every candidate is joined to it by union-find. The first
    document (input order) of a cluster survives, as in llmctl's default --keep first."""
    import pyarrow.parquet as pq
    from datasketch import MinHash, MinHashLSH

    from llmctl.data.dedup.normalize import normalized_words

    ids = []

    def grams():
        for path in sorted(glob.glob(os.path.join(docs, "part-*.parquet"))):
            for batch in pq.ParquetFile(path).iter_batches(columns=["id", "text"]):
                for doc_id, text in zip(batch.column("id").to_pylist(), batch.column("text").to_pylist()):
                    ids.append(doc_id)
                    w = normalized_words(text)
                    yield list({" ".join(w[i : i + NGRAM]).encode() for i in range(max(1, len(w) - NGRAM + 1))})

    lsh = MinHashLSH(num_perm=BANDS * ROWS, params=(BANDS, ROWS))
    parent: list[int] = []

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for k, m in enumerate(MinHash.generator(grams(), num_perm=BANDS * ROWS)):
        parent.append(k)
        for other in lsh.query(m):
            a, b = find(k), find(other)
            parent[max(a, b)] = min(a, b)  # the smaller index is the root, so roots survive
        lsh.insert(k, m)
    removed = {ids[k]: ids[find(k)] for k in range(len(ids)) if find(k) != k}
    (Path(out) / "removed.json").write_text(json.dumps({"docs": len(ids), "removed": removed}))


def read_datasketch(out: str) -> dict:
    return json.loads((Path(out) / "removed.json").read_text())


# ---------------------------------------------------------------------------------------------
# timing and memory


class PeakPss(threading.Thread):
    """Peak of the summed PSS of a process and all its descendants, sampled every 0.2 s. RSS alone
    would count the pages that forked workers share with their parent once per process; PSS splits
    them. GNU time's peak RSS (below) is exact but only gives the largest single process."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.peak_kb, self.done = root, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.peak_kb = max(self.peak_kb, sum(self.pss_kb(p) for p in self.tree()))

    def tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = Path(f"/proc/{d}/stat").read_text()
                except OSError:
                    continue
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d))
        todo, found = [self.root], []
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    @staticmethod
    def pss_kb(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0


# GNU time reports the rusage of a child it forks itself. os.wait4 on our own child would not do: a
# child keeps the peak RSS of the process it was forked from (the kernel carries the high-water mark
# across fork and exec), and this process holds the whole corpus while it builds it.
GNU_TIME = shutil.which("time", path="/usr/bin:/bin")


def timed(cmd: list[str], log: str) -> dict:
    """Wall seconds of a whole child process (start-up included), its CPU seconds and peak RSS from
    GNU time (the largest process of its tree that was waited for; None without /usr/bin/time), and
    the sampled peak PSS of its whole tree."""
    usage = log + ".rusage"
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen([GNU_TIME, "-f", "%U %S %M", "-o", usage, *cmd] if GNU_TIME else cmd, stdout=f, stderr=subprocess.STDOUT)
        sampler = PeakPss(proc.pid)
        sampler.start()
        rc = proc.wait()
        sec = time.perf_counter() - t0
        sampler.done.set()
        sampler.join()
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}\n--- {log}:\n{Path(log).read_text()[-3000:]}")
    cpu = rss = None
    if GNU_TIME:
        user, system, max_kb = Path(usage).read_text().split()[-3:]
        cpu, rss = float(user) + float(system), int(max_kb) / 1024
    return {"sec": sec, "cpu": cpu, "rss_mb": rss, "pss_mb": sampler.peak_kb / 1024}


def subset(folder: Path, every: int) -> Path:
    """A fixed 1-in-`every` subset of the corpus for the timed runs: every `every`-th planted pair of
    each J and exact-duplicate group (whole), and the background documents whose number is a
    multiple of `every`; the same 8 parts, in the same order, and its own truth.json."""
    import pyarrow.parquet as pq

    if every == 1:
        return folder
    sub = folder / f"subset-1in{every}"
    if (sub / "truth.json").exists():
        return sub
    truth = truth_of(folder)
    pairs = [p for j in J_VALUES for p in [q for q in truth["pairs"] if q["j"] == j][::every]]
    exact = truth["exact"][::every]
    planted = {d for p in truth["pairs"] for d in p["docs"]} | {d for g in truth["exact"] for d in g}
    keep = {d for p in pairs for d in p["docs"]} | {d for g in exact for d in g}
    (sub / "docs").mkdir(parents=True, exist_ok=True)
    n = 0
    for path in sorted((folder / "docs").glob("part-*.parquet")):
        t = pq.read_table(path)
        ids = t.column("id").to_pylist()
        rows = [i for i, d in enumerate(ids) if d in keep or (d not in planted and int(d[4:]) % every == 0)]
        pq.write_table(t.take(rows), sub / "docs" / path.name, compression="zstd")
        n += len(rows)
    (sub / "truth.json").write_text(json.dumps({**truth, "docs": n, "pairs": pairs, "exact": exact, "overlap": None}))
    return sub


# ---------------------------------------------------------------------------------------------
# runs


def llmctl_phases(out: str, started: float, sec: float) -> dict:
    """Seconds per llmctl phase, from the modification times of what each phase leaves under
    OUT/_work/ (kept by `keep_work = true` in a --config file): start-up + sign, pairs, clusters, filter, exit."""
    work = Path(out) / "_work"
    ends = [max(p.stat().st_mtime for p in (work / "sign").glob("*.npz")), max(p.stat().st_mtime for p in (work / "pairs").glob("*.npy")),
            (work / "clusters.npz").stat().st_mtime, (Path(out) / "manifest.json").stat().st_mtime, started + sec]  # fmt: skip
    names = ("start-up + sign", "pairs", "clusters", "filter", "exit")
    return dict(zip(names, [b - a for a, b in zip([started] + ends[:-1], ends)]))


SIDES = [("llmctl", 1), ("datatrove", 1), ("datasketch", 1), ("llmctl", 2), ("datatrove", 2)]  # on the subset
WHOLE_SIDES = [("llmctl", 1), ("datasketch", 1), ("llmctl", 2)]  # on the whole corpus


def run_side(tool: str, workers: int, docs: Path, out: str) -> dict:
    os.makedirs(out, exist_ok=True)
    started = time.time()
    if tool == "llmctl":
        keep_work = Path(out).parent / "keep-work.toml"  # the CLI has no --keep-work flag; the config key
        keep_work.write_text("keep_work = true\n")
        m = run_llmctl(docs, out, workers, ("--config", str(keep_work)))
        m["phases"] = llmctl_phases(out, started, m["sec"])
    elif tool == "datatrove":
        m = run_datatrove(docs, out, workers)
        m["phases"] = dict(zip(("signature", "buckets", "cluster", "filter"), read_datatrove(out)["stage_seconds"]))
    else:
        m = run_datasketch(docs, out)
    return m


def measure(docs: Path, repeat: int, tmp: str, sides: list[tuple[str, int]]) -> tuple[dict, dict]:
    """Median seconds, peak memory and phases per (tool, workers); interleaved, so that drift in the
    machine's load hits all sides alike. Returns (figures, output dir of the last run)."""
    runs, outs = {}, {}
    for r in range(repeat):
        for side in sides:
            out = os.path.join(tmp, f"{docs.parent.name}-{side[0]}-w{side[1]}-r{r}")
            m = run_side(*side, docs, out)
            runs.setdefault(side, []).append(m)
            if side in outs:
                shutil.rmtree(outs[side], ignore_errors=True)  # keep only the last output
            outs[side] = out
            print(f"  run {r + 1}/{repeat}  {side[0]:10s} workers={side[1]}  {m['sec']:7.2f} s  {m['pss_mb']:6.0f} MB", file=sys.stderr)
    figures = {}
    for side, ms in runs.items():
        med = {k: None if ms[0][k] is None else statistics.median(m[k] for m in ms) for k in ("sec", "cpu", "rss_mb", "pss_mb")}
        if "phases" in ms[0]:
            med["phases"] = {k: statistics.median(m["phases"][k] for m in ms) for k in ms[0]["phases"]}
        figures[side] = med
    return figures, outs


def read_side(tool: str, out: str) -> dict:
    return {"llmctl": read_llmctl, "datatrove": read_datatrove, "datasketch": read_datasketch}[tool](out)


# ---------------------------------------------------------------------------------------------
# accuracy


def accuracy(truth: dict, removed: dict) -> dict:
    """removed: {id: id of its survivor, or "" if the tool does not say}. A planted pair counts as
    flagged when both end in one cluster (same survivor); where the survivor is unknown
    (datatrove), when one of the two was removed (planted pairs are unrelated to everything else,
    so that is the same thing but for a chance merge with a third document)."""

    def root(d):
        return removed[d] or None if d in removed else d

    def flagged(a, b):
        if root(a) is None or root(b) is None:
            return a in removed or b in removed
        return root(a) == root(b)

    per_j = {}
    for j in J_VALUES:
        pairs = [p for p in truth["pairs"] if p["j"] == j]
        hits = [flagged(*p["docs"]) for p in pairs]
        measured = [p["measured"] for p in pairs]
        per_j[j] = {"pairs": len(pairs), "flagged": sum(hits) / len(pairs), "mean_j": statistics.mean(measured),
                    "expected": statistics.mean(s_curve(m) for m in measured)}  # fmt: skip
    def exact_done(group):  # all copies but one removed, into one cluster where the tool says so
        roots = {root(d) for d in group} - {None}
        return sum(d in removed for d in group) >= len(group) - 1 and len(roots) <= 1

    exact_ok = sum(exact_done(g) for g in truth["exact"])
    planted = {d for p in truth["pairs"] for d in p["docs"]} | {d for g in truth["exact"] for d in g}
    false = sorted(d for d in removed if d not in planted)
    return {"per_j": per_j, "exact_ok": exact_ok, "exact_groups": len(truth["exact"]), "exact_copies": sum(len(g) - 1 for g in truth["exact"]),
            "false": false, "unplanted": truth["docs"] - len(planted), "removed": len(removed)}  # fmt: skip



# ---------------------------------------------------------------------------------------------
# report


def accuracy_table(acc: dict) -> str:
    lines = ["| J | pairs | mean measured J | P(flag) = 1 − (1 − J⁸)¹⁴ | P(flag) over the measured J's | llmctl flagged | flagged − P(flag) | within ±0.05 |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for j, a in acc["per_j"].items():
        d = a["flagged"] - s_curve(j)
        lines.append(f"| {j} | {a['pairs']} | {a['mean_j']:.4f} | {s_curve(j):.4f} | {a['expected']:.4f} | {a['flagged']:.4f} | {d:+.4f} | {'yes' if abs(d) <= 0.05 else '**no**'} |")
    return "\n".join(lines)


def side_by_side_table(accs: dict) -> str:
    tools = list(accs)
    lines = ["| J | pairs | P(flag) | " + " | ".join(tools) + " |", "|---" * (3 + len(tools)) + "|"]
    for j in J_VALUES:
        a0 = accs[tools[0]]["per_j"][j]
        lines.append(f"| {j} | {a0['pairs']} | {s_curve(j):.3f} | " + " | ".join(f"{accs[t]['per_j'][j]['flagged']:.3f}" for t in tools) + " |")
    lines.append("| exact-duplicate groups fully removed | | | " + " | ".join(f"{accs[t]['exact_ok']}/{accs[t]['exact_groups']}" for t in tools) + " |")
    lines.append("| false merges (removed, outside every planted group) | | | " + " | ".join(pct(len(accs[t]["false"]), accs[t]["unplanted"], 3) for t in tools) + " |")
    return "\n".join(lines)


def blind(tool: str, workers: int) -> bool:
    """datatrove's pool workers are forked by a forkserver that its main process does not wait for,
    so their CPU time and memory never reach the rusage that GNU time reads."""
    return tool == "datatrove" and workers > 1


def speed_table(fig: dict, n_docs: int) -> str:
    lines = ["| side | workers | median s | docs/s | llmctl ÷ side (same workers) | CPU s (user + sys) | peak RSS, largest process | peak PSS, all processes |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for tool, w in sorted(fig, key=lambda s: (s[1], ["llmctl", "datatrove", "datasketch"].index(s[0]))):
        f = fig[(tool, w)]
        ratio = "" if tool == "llmctl" else f"**{f['sec'] / fig[('llmctl', w)]['sec']:.2f}×**"
        cpu, rss = ("n/a¹", "n/a¹") if blind(tool, w) or f["cpu"] is None else (f"{f['cpu']:.1f}", f"{f['rss_mb']:.0f} MB")
        lines.append(f"| {tool} | {w} | {f['sec']:.1f} | {n_docs / f['sec']:.0f} | {ratio} | {cpu} | {rss} | {f['pss_mb']:.0f} MB |")
    ds = fig[("datasketch", 1)]
    lines.append(f"| datasketch vs llmctl with 2 workers | | | | **{ds['sec'] / fig[('llmctl', 2)]['sec']:.2f}×** | | | |")
    if any(blind(*side) for side in fig):
        lines += ["", "¹ " + " ".join(blind.__doc__.split())]
    return "\n".join(lines)


def targets(sub: dict, whole: dict) -> str:
    """The issue's two speed targets: wall time, llmctl's best against each peer's best (datatrove on
    the subset, datasketch on the whole corpus and the subset), and the same by CPU time with 1 worker."""

    def best(fig, tool):
        return min(fig[(t, w)]["sec"] for t, w in fig if t == tool)

    def cpu(fig, tool):
        return (fig[(tool, 1)]["cpu"] or math.nan) / fig[("llmctl", 1)]["cpu"]

    dt, ds, ds_sub = best(sub, "datatrove") / best(sub, "llmctl"), best(whole, "datasketch") / best(whole, "llmctl"), best(sub, "datasketch") / best(sub, "llmctl")
    return (f"Targets (issue 5), wall time, best of each side: llmctl ÷ datatrove = {dt:.2f}× on the subset (≥ 3×: {'met' if dt >= 3 else '**missed**'}); "
            f"llmctl ÷ datasketch = {ds:.2f}× on the whole corpus (≥ 10×: {'met' if ds >= 10 else '**missed**'}), {ds_sub:.2f}× on the subset (where "
            f"llmctl's fixed start-up, about 0.4 s, counts against fewer documents). By CPU time with 1 worker (single processes; less sensitive to "
            f"other load on a shared machine): llmctl ÷ datatrove = {cpu(sub, 'datatrove'):.2f}× (subset), llmctl ÷ datasketch = "
            f"{cpu(whole, 'datasketch'):.2f}× (whole corpus), {cpu(sub, 'datasketch'):.2f}× (subset).")  # fmt: skip


def breakdown(docs: Path, n: int = 2500, passes: int = 3) -> dict:
    """Where the CPU time of a document goes, in this process: llmctl's sign phase step by step (the
    functions its _Sign task calls, on the same chunks of documents) and the datasketch loop's steps,
    over the first `n` documents of the subset; the least CPU time of `passes` passes per step."""
    import numpy as np
    import pyarrow.parquet as pq
    from datasketch import MinHash, MinHashLSH

    from llmctl.data.dedup.minhash import MinHasher, Shingler, Words
    from llmctl.data.dedup.normalize import normalized_codes, normalized_words
    from llmctl.data.dedup.run import text_chunks

    texts = [t for p in sorted(docs.glob("part-*.parquet")) for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()][:n]
    best: dict[str, float] = {}
    for _ in range(passes):
        t = time.process_time()

        def lap(name):
            nonlocal t
            best[name], t = min(best.get(name, math.inf), time.process_time() - t), time.process_time()

        codes = [normalized_codes(texts[lo:hi]) for lo, hi in text_chunks(texts)]
        lap("llmctl: normalized_codes")
        shingler, hasher = Shingler(NGRAM), MinHasher(BANDS, ROWS)
        sets = [shingler.shingles(Words.of(*c)) for c in codes]
        lap("llmctl: Words.of + Shingler.shingles")
        hasher.band_keys(np.concatenate([hasher.signatures(*s) for s in sets]))
        lap("llmctl: MinHasher.signatures + band_keys")
        words = [normalized_words(x) for x in texts]
        lap("datasketch loop: normalized_words")
        grams = [list({" ".join(w[i : i + NGRAM]).encode() for i in range(max(1, len(w) - NGRAM + 1))}) for w in words]
        lap("datasketch loop: 5-gram byte strings")
        minhashes = list(MinHash.generator(grams, num_perm=BANDS * ROWS))
        lap("datasketch loop: MinHash.generator")
        lsh = MinHashLSH(num_perm=BANDS * ROWS, params=(BANDS, ROWS))
        for k, m in enumerate(minhashes):
            lsh.query(m)
            lsh.insert(k, m)
        lap("datasketch loop: MinHashLSH query + insert")
    return {"docs": len(texts), "passes": passes, "seconds": best}


def breakdown_table(b: dict) -> str:
    lines = ["| step | s | µs per document |", "|---|---|---|"]
    lines += [f"| {k} | {v:.2f} | {1e6 * v / b['docs']:.0f} |" for k, v in b["seconds"].items()]
    return "\n".join(lines)


def scale_note(fig: dict, n_sub: int, n_full: int, full_run: dict) -> str:
    """datatrove is timed on the subset only; say what the whole corpus would cost it at those rates."""
    if n_sub == n_full:
        return "All sides were timed on the whole corpus."
    est = {f"{w} worker{'s' if w > 1 else ''}": n_full / (n_sub / fig[(t, w)]["sec"]) for t, w in fig if t == "datatrove"}
    return (f"The accuracy run above (whole corpus, llmctl with 2 workers, `--exact` too) made {n_full / full_run['sec']:.0f} docs/s. "
            f"datatrove is timed on the subset only; at its subset rates the whole corpus would take it " + ", ".join(f"≈ {v:.0f} s with {k}" for k, v in est.items()) + ".")  # fmt: skip


def phases_table(fig: dict) -> str:
    lines = ["| side | workers | phases (median s) |", "|---|---|---|"]
    for (tool, w), f in sorted(fig.items()):
        if "phases" in f:
            lines.append(f"| {tool} | {w} | " + ", ".join(f"{k} {v:.1f}" for k, v in f["phases"].items()) + " |")
    return "\n".join(lines)



def versions() -> str:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip() or "llmctl ?"
    return f"{llm}, datatrove {version('datatrove')} (xxhash {version('xxhash')}), datasketch {version('datasketch')}"



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000, help="documents in the corpus (default 100,000)")
    ap.add_argument("--pairs", type=int, default=600, help="planted near-duplicate pairs per J (default 600)")
    ap.add_argument("--subset", type=int, default=10, help="time the three sides on 1 in N of the corpus (default 10; 1 = all)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", help="keep every output here instead of a temporary folder")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    ap.add_argument("--datatrove-child", nargs=3, metavar=("DOCS", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    ap.add_argument("--datasketch-child", nargs=2, metavar=("DOCS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.datatrove_child:
        docs, out, workers = args.datatrove_child
        return datatrove_child(docs, out, int(workers))
    if args.datasketch_child:
        return datasketch_child(*args.datasketch_child)

    t_start, load_before = time.perf_counter(), os.getloadavg()[0]  # the machines are shared: say how busy
    full = corpus(args.docs, args.pairs)
    speed = subset(full, args.subset)
    truth_full, truth_speed = truth_of(full), truth_of(speed)
    tmp_ctx = tempfile.TemporaryDirectory(prefix="bench-dedup-") if not args.workdir else None
    tmp = args.workdir or tmp_ctx.name
    try:
        print(f"timing on {speed} ({truth_speed['docs']} docs), {args.repeat} repeats", file=sys.stderr)
        fig, outs = measure(speed / "docs", args.repeat, tmp, SIDES)
        accs = {tool: accuracy(truth_speed, read_side(tool, outs[(tool, w)])["removed"]) for tool, w in outs if w == 1}
        same_w = read_side("llmctl", outs[("llmctl", 1)])["removed"] == read_side("llmctl", outs[("llmctl", 2)])["removed"]
        whole = fig
        if speed != full:
            print(f"timing llmctl and datasketch on {full} ({truth_full['docs']} docs), {args.repeat} repeats", file=sys.stderr)
            whole, _ = measure(full / "docs", args.repeat, tmp, WHOLE_SIDES)
        print(f"accuracy run on {full} ({truth_full['docs']} docs)", file=sys.stderr)
        full_out = os.path.join(tmp, "llmctl-full")
        full_run = run_llmctl(full / "docs", full_out, 2, ("--exact",))
        res = read_llmctl(full_out)
        acc = accuracy(truth_full, res["removed"])
        print("timing the steps in-process", file=sys.stderr)
        steps = breakdown(speed / "docs")
    finally:
        if tmp_ctx:
            tmp_ctx.cleanup()

    copies = {d for g in truth_full["exact"] for d in g[1:]}
    in_exact = {d for g in truth_full["exact"] for d in g}
    in_pair = {d for p in truth_full["pairs"] for d in p["docs"]}
    reasons = {}  # (kind of document, reason) -> removals
    for d, r in res["reasons"].items():
        kind = "exact group" if d in in_exact else "planted pair" if d in in_pair else "unplanted"
        reasons[(kind, r)] = reasons.get((kind, r), 0) + 1
    ov = truth_full["overlap"]
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/dedup.py"] + [a for a in sys.argv[1:]])
    section = f"""## dedup

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
1-min load average {load_before:.2f} before / {os.getloadavg()[0]:.2f} after, {time.perf_counter() - t_start:.0f} s in all.
{versions()}. All sides: 14 bands × 8 rows (112 hashes), word 5-grams.

**Corpus** (seeded, cached in `.venv-bench/share/dedup-corpus/`): {truth_full['docs']:,} documents of 150-600 words,
recombined from the {truth_full['pool_pieces']:,} distinct paragraphs (cut to ≤ 80 words) of pages-a's extracted documents;
{len(truth_full['pairs'])} planted near-duplicate pairs ({args.pairs} per J, each copy's word-5-gram Jaccard after llmctl's
normalization within ±{J_TOL} of J); {len(truth_full['exact'])} exact-duplicate groups ({len(copies)} copies, half verbatim, half
with whitespace changed). Unrelated documents share pieces: {ov['pairs_sharing_a_piece']:,} background pairs share one, at
J = {ov['mean_j']:.3f} on average (max {ov['max_j']:.3f} in a sample of {ov['sample']:,}), from which the banding should
flag ≈ {ov['expected_flagged']:.1f}: the false merges the corpus itself explains.

### Accuracy: llmctl, whole corpus

`llmctl dedup DOCS -o OUT --minhash --exact --bands 14 --rows 8 --ngram 5 --workers 2 --keep-rejected`
({full_run['sec']:.1f} s, {truth_full['docs'] / full_run['sec']:.0f} docs/s, peak PSS {full_run['pss_mb']:.0f} MB). A pair is flagged when both
documents end in one cluster.

{accuracy_table(acc)}

| check | result |
|---|---|
| exact-duplicate groups fully removed (all copies but one, one cluster) | {pct(acc['exact_ok'], acc['exact_groups'])} |
| false merges: removed documents outside every planted group | {pct(len(acc['false']), acc['unplanted'], 3)} (target < 0.1%) |
| removals by (document, reason) | {', '.join(f'{k[0]} / {k[1]}: {v}' for k, v in sorted(reasons.items()))} |

### Speed: the three sides on the same 1-in-{args.subset} subset

{truth_speed['docs']:,} documents ({len(truth_speed['pairs'])} planted pairs, {len(truth_speed['exact'])} exact groups), median of {args.repeat} interleaved
runs, wall clock per whole process. Peak RSS: GNU time's `%M` (`ru_maxrss` of the largest single process); peak PSS: the
sum over the process and all its descendants, sampled every 0.2 s (shared pages split between processes).
datasketch runs in one process.

{speed_table(fig, truth_speed['docs'])}

{scale_note(fig, truth_speed['docs'], truth_full['docs'], full_run)}

{phases_table(fig)}

### Speed: llmctl and datasketch on the whole corpus

{truth_full['docs']:,} documents, the same commands and measures, median of {args.repeat} interleaved runs.

{speed_table(whole, truth_full['docs'])}

{phases_table(whole)}

{targets(fig, whole)}

Where the CPU time of llmctl's sign phase and of the datasketch loop goes, step by step, in the benchmark's own
process ({steps['docs']:,} documents of the subset, least of {steps['passes']} passes, one core). llmctl normalizes and hashes
chunks of documents at once in numpy (`normalized_codes` gives exactly `normalized_words`' words, see tests/test_dedup.py);
the datasketch loop calls `normalized_words` per document:

{breakdown_table(steps)}

### Flagged share on the subset, side by side (workers = 1)

datatrove shingles its own normalization (`simplify_text`, spaCy's English tokenizer), so its J per pair differs
slightly from the J measured here; it does not say which document a removed one duplicates, so a pair counts as
flagged when one of the two was removed. llmctl with 1 and 2 workers removed {'the same' if same_w else '**different**'} documents.

{side_by_side_table(accs)}
"""
    print(section)
    if not args.no_write:
        write_results("dedup", section)


if __name__ == "__main__":
    main()

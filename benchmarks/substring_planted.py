"""dedup --substring on planted repeats: every planted later copy of >= N tokens cut whole, none
shorter cut, no byte cut that was not planted; in one shard and with --memory forcing many.

    .venv/bin/python benchmarks/substring_planted.py [--docs 3000] [--per-length 30] [--seeds 0 1 2]

The corpus: the paragraphs of the documents `llmctl crawl-extract` makes from pages-a.warc.gz,
first cleaned of every natural repeat of >= 8 tokens (llmctl dedup --substring --min-len 8 until
it cuts nothing), shuffled and recombined into --docs documents. Plants: --per-length spans for
each length in LENGTHS, each cut from paragraphs held out of the corpus, so it occurs nowhere
else; its first copy goes into one document and its second into a later one, inline between two
words, where the tokens before and after the two copies differ (so the longest repeat is exactly
the plant, L tokens). Expected: the second copy of every plant with L >= N is cut exactly (its
bytes, no more); nothing else anywhere.

Runs: one shard (--memory 2G) and --memory sized to about 8 shards, each at --workers 1 and 2;
the four outputs must be identical. Shards cut at document boundaries, so a span never straddles
one; what the small --memory tests is two copies in different shards (their count is printed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import LLMCTL, REPO, cpu_name, llmctl, make_docs, read_parts, write_results

sys.path.insert(0, str(REPO / "src"))
from llmctl.data.dedup import substring  # noqa: E402

N = 50  # Lee et al. 2022's threshold
LENGTHS = (20, 30, 40, 45, 48, 49, 50, 51, 52, 55, 60, 80, 100, 200, 300, 500)


def pieces(text: str) -> list[str]:
    return substring.GPT2_PIECES.findall(text)


def is_word(p: str) -> bool:
    return p.lstrip(" ").isalpha()


def dedup_texts(texts: list[str], folder: Path, min_len: int) -> tuple[list[str], int]:
    """One llmctl substring pass over `texts`: the texts after it and the spans it cut."""
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{"id": f"c{i}", "text": t} for i, t in enumerate(texts)]), folder / "in.parquet")
    llmctl("dedup", folder / "in.parquet", "-o", folder / "out", "--substring", "--min-len", min_len, "--min-doc-words", 0, "--overwrite", "-q")
    rows = {r["id"]: r for r in read_parts(str(folder / "out"))}
    # a text left empty is not read back (dedup skips empty texts): it is empty here too
    return [rows[f"c{i}"]["text"] if f"c{i}" in rows else "" for i in range(len(texts))], sum(len(r["removed_spans"]) for r in rows.values())


def clean_paragraphs(docs_dir: str, tmp: Path) -> list[str]:
    texts = [r["text"] for r in read_parts(docs_dir)]
    for k in range(5):
        texts, cut = dedup_texts(texts, tmp / f"clean-{k}", 8)
        print(f"cleaning pass {k}: {cut} spans of >= 8 tokens cut", file=sys.stderr)
        if cut == 0:
            break
    else:
        sys.exit("the corpus still has repeats of >= 8 tokens after 5 passes")
    return [p for t in texts for p in t.split("\n") if len(pieces(p)) >= 8]


def build(args, tmp: Path) -> tuple[list[str], list[dict]]:
    rng = random.Random(args.seed)
    paras = clean_paragraphs(make_docs(str(tmp)), tmp)
    rng.shuffle(paras)
    held = max(1, len(paras) // 4)
    stream = pieces(" " + " ".join(paras[:held]))
    base = paras[held:]
    docs = [[] for _ in range(args.docs)]
    for i, p in enumerate(base):
        docs[i % args.docs].append(p)
    docs_text = ["\n".join(d) for d in docs if d]
    doc_pieces = [pieces(t) for t in docs_text]

    # plants: consecutive windows of the held-out stream, starting at " word", ending in a word
    plants, pos = [], 0
    for L in [L for L in LENGTHS for _ in range(args.per_length)]:
        while pos + L <= len(stream) and not (stream[pos].startswith(" ") and is_word(stream[pos]) and is_word(stream[pos + L - 1])):
            pos += 1
        if pos + L > len(stream):
            sys.exit("not enough held-out text for the plants: lower --per-length")
        plants.append({"length": L, "text": "".join(stream[pos : pos + L])})
        pos += L + 1

    # places: a boundary after a word and before " word" in an earlier and a later document
    taken: dict[int, set] = {}

    def place(d: int) -> int | None:
        ps = doc_pieces[d]
        ok = [j for j in range(1, len(ps)) if is_word(ps[j - 1]) and ps[j].startswith(" ") and is_word(ps[j]) and not taken.get(d, set()) & {j - 1, j, j + 1}]
        return rng.choice(ok) if ok else None

    for plant in plants:
        for _ in range(1000):
            a, b = sorted(rng.sample(range(len(docs_text)), 2))
            ja, jb = place(a), place(b)
            if ja is None or jb is None:
                continue
            pa_, pb = doc_pieces[a], doc_pieces[b]
            if pa_[ja - 1] != pb[jb - 1] and pa_[ja] != pb[jb]:  # the repeat ends exactly at the plant
                break
        else:
            sys.exit("no place for a plant")
        taken.setdefault(a, set()).add(ja)
        taken.setdefault(b, set()).add(jb)
        plant.update(first=(a, ja), second=(b, jb))

    # insert, last boundary first so earlier ones keep their piece numbers
    inserts: dict[int, list] = {}
    for k, plant in enumerate(plants):
        for which in ("first", "second"):
            d, j = plant[which]
            inserts.setdefault(d, []).append((j, k, which))
    texts = []
    for d, ps in enumerate(doc_pieces):
        ps = list(ps)
        for j, k, which in sorted(inserts.get(d, []), reverse=True):
            ps.insert(j, "\0" + str(k) + "\0" + which + "\0")
        out, off = [], 0
        for p in ps:
            if p.startswith("\0"):
                _, k, which, _ = p.split("\0")
                text = plants[int(k)]["text"]
                plants[int(k)][which + "_bytes"] = (off, off + len(substring.utf8(text)))
                p = text
            out.append(p)
            off += len(substring.utf8(p))
        texts.append("".join(out))
    return texts, plants


def score(rows: dict, plants: list[dict], n_docs: int) -> dict:
    want = {}
    for p in plants:
        if p["length"] >= N:
            want.setdefault(p["second"][0], set()).add(tuple(p["second_bytes"]))
    whole = missed = short_cut = first_cut = false_bytes = 0
    by_doc = {d: {tuple(s) for s in rows[f"p{d}"]["removed_spans"]} for d in range(n_docs)}
    for p in plants:
        b, span = p["second"][0], tuple(p["second_bytes"])
        touched = [s for s in by_doc[b] if s[0] < span[1] and s[1] > span[0]]
        if p["length"] >= N:
            whole += span in by_doc[b]
            missed += span not in by_doc[b]
        else:
            short_cut += bool(touched)
        a, first = p["first"][0], tuple(p["first_bytes"])
        first_cut += any(s[0] < first[1] and s[1] > first[0] for s in by_doc[a])
    for d, spans in by_doc.items():
        false_bytes += sum(e - s for s, e in spans if (s, e) not in want.get(d, set()))
    return {"cut_whole": whole, "missed": missed, "short_cut": short_cut, "first_cut": first_cut, "false_bytes": false_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--per-length", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one corpus and set of plants per seed")
    ap.add_argument("--workdir", default=None, help="keep the corpus and outputs here (default: a temporary folder)")
    args = ap.parse_args()
    results, lines = [], []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(args.workdir or t) / f"seed-{seed}"
            tmp.mkdir(parents=True, exist_ok=True)
            head, rows = run_seed(argparse.Namespace(**{**vars(args), "seed": seed}), tmp)
            lines.append(head)
            results += rows
    table = [
        "## dedup: planted substrings",
        "",
        f"`.venv/bin/python benchmarks/substring_planted.py --docs {args.docs} --per-length {args.per_length} --seeds {' '.join(map(str, args.seeds))}` "
        f"on {cpu_name()}. Per seed, {args.docs} documents from pages-a's paragraphs (shuffled by the seed), cleaned of every natural "
        f"repeat of >= 8 tokens; {args.per_length} plants of each length {', '.join(map(str, LENGTHS))} tokens, "
        f"each copied into an earlier and a later document with different tokens on both sides; N = {N} tokens. "
        "The small --memory is sized to about 8 shards.",
        "",
        *lines,
        "",
        "| seed | --memory | workers | later copies >= N cut whole | missed | copies < N touched | first copies touched | bytes cut not planted | wall s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        table.append(f"| {r['seed']} | {r['memory']} | {r['workers']} | {r['cut_whole']}/{r['n_long']} | {r['missed']} | {r['short_cut']}/{r['n_short']} | {r['first_cut']} | {r['false_bytes']} | {r['wall']:.1f} |")
    same = all(r["same"] for r in results)
    table += ["", f"Per seed, the four outputs (text and removed_spans of every document) are {'identical' if same else 'NOT identical'} (sha256)."]
    write_results("dedup: planted substrings", "\n".join(table) + "\n")
    print("\n".join(table))


def run_seed(args, tmp: Path) -> tuple[str, list[dict]]:
    texts, plants = build(args, tmp)
    pq.write_table(pa.Table.from_pylist([{"id": f"p{d}", "text": x} for d, x in enumerate(texts)]), tmp / "planted.parquet")
    per_doc = [len(pieces(x)) + 1 for x in texts]
    units = sum(per_doc)
    small = f"{(units // 8 + 1) * 2 * substring.COST_PER_UNIT['tokens'] // 1024 + 1}K"  # about 8 shards
    shards = substring.plan_shards(np.array(per_doc), substring.shard_cap(substring.memory_bytes(small), "tokens"))
    shard_of = np.zeros(len(texts), int)
    for s, (lo, hi) in enumerate(shards):
        shard_of[lo:hi] = s
    apart = sum(shard_of[p["first"][0]] != shard_of[p["second"][0]] for p in plants)
    results, digests = [], set()
    for memory in ("2G", small):
        for workers in (1, 2):
            out = tmp / f"out-{memory}-{workers}"
            t0 = time.perf_counter()
            llmctl("dedup", tmp / "planted.parquet", "-o", out, "--substring", "--min-len", N, "--min-doc-words", 0, "--memory", memory, "--workers", workers, "--overwrite", "-q")
            wall = time.perf_counter() - t0
            rows = {r["id"]: r for r in read_parts(str(out))}
            digests.add(hashlib.sha256(json.dumps([[rows[f"p{d}"]["text"], rows[f"p{d}"]["removed_spans"]] for d in range(len(texts))]).encode()).hexdigest())
            m = json.loads((out / "manifest.json").read_text())
            results.append({"memory": memory, "workers": workers, "wall": wall, **score(rows, plants, len(texts)), "bytes": m["counts"]["spans"]["substring"]["bytes"]})
            print(json.dumps(results[-1]), file=sys.stderr)
    n_long = sum(p["length"] >= N for p in plants)
    for r in results:
        r.update(seed=args.seed, n_long=n_long, n_short=len(plants) - n_long, same=len(digests) == 1)
    head = (f"- seed {args.seed}: {len(texts)} documents, {units:,} tokens, {len(plants)} plants; small --memory {small} = "
            f"{len(shards)} shards, {apart} of the {len(plants)} plants with their copies in different shards")
    return head, results


if __name__ == "__main__":
    main()

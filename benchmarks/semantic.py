"""dedup --semantic against MinHash on planted near-copy sets built from real pages: which
planted copies each catches, and what each removes that was not planted.

    .venv/bin/python benchmarks/semantic.py [--seeds 0 1 2] [--eps 0.02 0.05 0.1 0.15] [--embedder minilm]

Documents: pages-a's extracted documents (`llmctl crawl-extract`) with at least 100 words. For
each seed, a third of them get a planted copy of one kind, placed after its original:
  edited      2 % of the words replaced by other words of the page (MinHash's home ground)
  reordered   the sentences in another order (the same content, other 5-grams at every seam)
  truncated   the first 60 % of the document only
  restyled    every sentence case-swapped, digits spelled, punctuation changed: no 5-gram the same
A copy is caught when the run removes it (or its original) as a duplicate of the other. Recall:
caught / planted, per kind; other removals: removed documents that are not planted copies or
their originals (pages-a's own near-duplicates among them). Both methods run on the same embedded documents (`llmctl embed`, then `llmctl dedup
--minhash` and `llmctl dedup --semantic --eps E`).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from common import cpu_name, llmctl, make_docs, read_parts, write_results

KINDS = ("edited", "reordered", "truncated", "restyled")
DIGITS = "zero one two three four five six seven eight nine".split()


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def plant(rng: random.Random, text: str, kind: str) -> str:
    words = text.split()
    if kind == "edited":
        for i in rng.sample(range(len(words)), max(1, len(words) // 50)):
            words[i] = rng.choice(words)
        return " ".join(words)
    if kind == "reordered":
        s = sentences(text)
        rng.shuffle(s)
        return " ".join(s)
    if kind == "truncated":
        return " ".join(words[: int(len(words) * 0.6)])
    s = [t.swapcase() for t in sentences(text)]  # restyled
    s = [re.sub(r"\d", lambda m: f" {DIGITS[int(m.group())]} ", t).replace(",", ";").replace(".", "!") for t in s]
    return "\n".join(s)


def build(docs: list[dict], seed: int, folder: Path) -> tuple[Path, dict[str, tuple[str, str]]]:
    rng = random.Random(seed)
    chosen = rng.sample(range(len(docs)), len(docs) // 3)
    kinds = {i: KINDS[k % len(KINDS)] for k, i in enumerate(chosen)}
    rows, planted = [], {}
    for i, d in enumerate(docs):
        rows.append({"id": d["id"], "text": d["text"]})
        if i in kinds:
            cid = f"{d['id']}#{kinds[i]}"
            rows.append({"id": cid, "text": plant(rng, d["text"], kinds[i])})
            planted[cid] = (d["id"], kinds[i])
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "docs.parquet")
    return folder / "docs.parquet", planted


def score(out: Path, planted: dict, n_docs: int) -> dict:
    removed = {r["id"]: r.get("dup_of") for r in read_parts(str(out / "rejected"))}
    originals = {o for o, _ in planted.values()}
    caught = {k: 0 for k in KINDS}
    for cid, (orig, kind) in planted.items():
        caught[kind] += (removed.get(cid) == orig) or (removed.get(orig) == cid)
    other = sum(1 for rid in removed if rid not in planted and rid not in originals)
    return {"caught": caught, "other": other, "removed": len(removed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eps", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.15])
    ap.add_argument("--embedder", default="minilm")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(args.workdir or t)
        docs = [r for r in read_parts(make_docs(str(tmp))) if len(r["text"].split()) >= 100]
        for seed in args.seeds:
            src, planted = build(docs, seed, tmp / f"seed-{seed}")
            emb = tmp / f"seed-{seed}" / "embedded"
            llmctl("embed", src, "-o", emb, "--embedder", args.embedder, "--overwrite", "-q")
            per_kind = {k: sum(1 for _, kk in planted.values() if kk == k) for k in KINDS}
            runs = [("minhash (14 x 8)", ["--minhash"])] + [(f"semantic eps {e:g}", ["--semantic", "--eps", e]) for e in args.eps]
            for name, flags in runs:
                out = tmp / f"seed-{seed}" / name.replace(" ", "-")
                llmctl("dedup", emb, "-o", out, *flags, "--keep-rejected", "--overwrite", "-q")
                r = score(out, planted, len(docs))
                rows.append({"seed": seed, "method": name, **r, "planted": per_kind})
                print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [
        "## dedup semantic",
        "",
        f"`.venv/bin/python benchmarks/semantic.py --seeds {' '.join(map(str, args.seeds))} --eps {' '.join(f'{e:g}' for e in args.eps)} "
        f"--embedder {args.embedder}` on {cpu_name()}. pages-a's {len(docs)} documents of >= 100 words, a third of them "
        "(per seed) with a planted copy of one kind after the original: edited (2 % of words replaced), reordered "
        "(sentences shuffled), truncated (first 60 %), restyled (case swapped, digits spelled, punctuation changed). "
        "Recall per kind: copies removed as a duplicate of their original (or the reverse); other removals: removed "
        "documents that are neither a planted copy nor its original (pages-a's own near-duplicates count here). "
        "minilm reads a document's first 256 word pieces only, so a reordered copy, which starts with other "
        "sentences, is a different text to it; MinHash normalizes case and punctuation, so it sees through the restyling.",
        "",
        "| seed | method | " + " | ".join(KINDS) + " | other removals |",
        "|---:|---|" + "---:|" * (len(KINDS) + 1),
    ]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['method']} | " + " | ".join(f"{r['caught'][k]}/{r['planted'][k]}" for k in KINDS) + f" | {r['other']} |")
    write_results("dedup semantic", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

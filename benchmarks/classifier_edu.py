"""FineWeb-Edu's classifier (`filter train-classifier --regression`, a linear head on minilm
embeddings) against a fastText classifier (`filter train-classifier`, DCLM's recipe) trained on the
same labels of real pages, both applied by the filter's `classifier` step.

    .venv/bin/python benchmarks/classifier_edu.py [--seeds 0 1 2 3 4] [--warc FILE]

Labels. No LLM annotator runs here (no network, no model worth asking), so the labels come from a
transparent rule-based proxy, `edu_proxy` below: an additive 0-5 rubric in FineWeb-Edu's shape
whose five points are counts of an English and German educational vocabulary (present, varied,
dense, denser) and the absence of shopping words. It stands in for an LLM's judgement to compare
how well each classifier learns a graded label from little data; it is not educational value,
and the numbers say nothing about how either would do on Llama-3-70B's scores.

Documents: pages-a's extracted documents (`llmctl crawl-extract`). For each seed they are split in
half (by a seeded hash of the id): the regression head trains on one half's scores (the command
holds out 10% of it as usual), fastText on the same half as positive (score >= 3) against
negative, with DCLM's settings but 200k n-gram buckets (the 2M default makes a 2 GB model for 200
documents); both are applied to the other half with `llmctl filter --annotate-only` and compared
with its proxy scores: Spearman's rho of the classifier's score (the head's `score`, fastText's
P(hq)), and F1 of its keep decision (int_score >= 3; P(hq) >= 0.5) against score >= 3.

Speed and memory: each command is run whole by /usr/bin/time; docs/s over the stage's own wall
seconds (its manifest), peak resident memory of the process. `llmctl embed` on all documents is
timed once for the embedding rate alone.

The table goes to stdout and into benchmarks/RESULTS.md (## classifier edu).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean, pstdev

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, make_docs, read_parts, write_results  # benchmarks/common.py

sys.path.insert(0, str(REPO / "src"))
from llmctl.data.filters.regression import spearman  # noqa: E402
from llmctl.hashing import h64  # noqa: E402

# The proxy's vocabularies, English and German (pages-a is mostly German): words of lessons,
# explanations and reference pages, and words of shops.
EDU_WORDS = set("""learn learning lesson lessons teach teacher teachers student students school university course
study studies research science scientific history historical theory example examples explain explains explained
definition defined chapter method methods analysis evidence experiment understand knowledge concept concepts
education educational mathematics physics chemistry biology geography literature culture society economy species
century ancient government law lernen lernt schule schulen unterricht lehrer lehrerin schüler schülerin studium
studie studien universität hochschule wissenschaft wissenschaftlich forschung geschichte theorie beispiel beispiele
erklären erklärt definition kapitel methode methoden analyse wissen bildung kultur gesellschaft entwicklung umwelt
jahrhundert regierung gesetz experiment""".split())
SHOP_WORDS = set("""buy shop shopping cart price prices sale discount order shipping delivery checkout coupon deal deals
offer store product products customer subscribe casino bonus kaufen preis preise warenkorb versand versandkostenfrei
angebot angebote rabatt bestellen shop produkt produkte kunden lieferung gutschein""".split())
WORD = re.compile(r"[^\W\d_]+")


def edu_proxy(text: str) -> int:
    """0-5, a point for each: an educational word; three distinct ones; educational words at least
    0.3% of the words; at least 1%; no shopping word. Content only (a text's length and layout
    earn nothing), so an encoder of meaning and a bag of words can both learn it."""
    words = WORD.findall(text.lower())
    n = max(1, len(words))
    edu = [w for w in words if w in EDU_WORDS]
    shop = sum(w in SHOP_WORDS for w in words)
    return int(len(edu) >= 1) + int(len(set(edu)) >= 3) + int(len(edu) / n >= 0.003) + int(len(edu) / n >= 0.01) + int(shop == 0)


def timed(cmd: list, log: Path) -> tuple[dict | None, float, float]:
    """(the command's JSON output, peak RSS in MiB, whole-process seconds)."""
    mem = log.with_suffix(".rss")
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(mem), str(LLMCTL), "--json", *map(str, cmd)],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log.write_text(p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout), int(mem.read_text().split()[-1]) / 1024, wall


def f1(pred: list[bool], truth: list[bool]) -> float:
    tp = sum(p and t for p, t in zip(pred, truth))
    prec = tp / max(1, sum(pred))
    rec = tp / max(1, sum(truth))
    return 2 * prec * rec / (prec + rec) if prec + rec else 0.0


def f1_top(scores: list[float], truth: list[bool]) -> float:
    """F1 when the classifier keeps as many documents as truly pass, its best-scored ones: how well
    it ranks at the boundary, whatever the scale of its scores."""
    k = sum(truth)
    top = set(np.argsort(-np.asarray(scores, np.float64), kind="stable")[:k].tolist())
    return f1([i in top for i in range(len(scores))], truth)


def one_seed(seed: int, rows: list[dict], work: Path) -> dict:
    d = work / f"seed{seed}"
    d.mkdir()
    train = [r for r in rows if h64(f"{seed}/{r['id']}") % 2 == 0]
    test = [r for r in rows if h64(f"{seed}/{r['id']}") % 2 == 1]
    pq.write_table(pa.Table.from_pylist(train), d / "train.parquet")
    pq.write_table(pa.Table.from_pylist(test), d / "test.parquet")
    pq.write_table(pa.Table.from_pylist([r for r in train if r["score"] >= 3]), d / "pos.parquet")
    pq.write_table(pa.Table.from_pylist([r for r in train if r["score"] < 3]), d / "neg.parquet")
    truth = {r["id"]: r["score"] for r in test}
    out = {"train": len(train), "test": len(test), "train_pos": sum(r["score"] >= 3 for r in train)}

    def apply(model: Path, name: str) -> tuple[list[dict], dict, float, float]:
        (d / f"{name}.toml").write_text(f'[[steps]]\nname = "classifier"\nmodel = "{model}"\n')
        m, rss, wall = timed(["filter", d / "test.parquet", "-o", d / f"{name}-applied", "--config", d / f"{name}.toml",
                              "--annotate-only"], d / f"{name}-apply.log")
        return read_parts(str(d / f"{name}-applied")), m, rss, wall

    m, rss, wall = timed(["filter", "train-classifier", "--regression", d / "train.parquet", "-o", d / "head", "--seed", seed],
                         d / "head-train.log")
    applied, am, arss, awall = apply(d / "head", "head")
    s = [r["score"] for r in applied]
    y = [truth[r["id"]] for r in applied]
    out["head"] = {"spearman": spearman(np.array(s), np.array(y)), "f1": f1([r["int_score"] >= 3 for r in applied], [v >= 3 for v in y]),
                   "f1_top": f1_top(s, [v >= 3 for v in y]),
                   "train_s": m["wall_seconds"], "train_rss": rss, "apply_dps": len(applied) / am["wall_seconds"], "apply_rss": arss,
                   "ridge": m["counts"]["ridge"]}

    m, rss, wall = timed(["filter", "train-classifier", "--positive", d / "pos.parquet", "--negative", d / "neg.parquet", "-o",
                          d / "fasttext", "--bucket", 200000, "--seed", seed], d / "ft-train.log")
    applied, am, arss, awall = apply(d / "fasttext", "fasttext")
    q = [r["quality_score"] for r in applied]
    y = [truth[r["id"]] for r in applied]
    out["fasttext"] = {"spearman": spearman(np.array(q), np.array(y)), "f1": f1([v >= 0.5 for v in q], [v >= 3 for v in y]),
                       "f1_top": f1_top(q, [v >= 3 for v in y]),
                       "train_s": m["wall_seconds"], "train_rss": rss, "apply_dps": len(applied) / am["wall_seconds"], "apply_rss": arss}
    return out


def spread(vals: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(mean(vals))} ± {fmt.format(pstdev(vals))}" if len(vals) > 1 else fmt.format(vals[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--warc", default=str(DEFAULT_WARC))
    args = ap.parse_args()
    if not Path(args.warc).is_file():
        raise SystemExit(f"no WARC at {args.warc} (pass --warc)")
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-edu-") as tmp:
        work = Path(tmp)
        docs = make_docs(tmp) if Path(args.warc) == DEFAULT_WARC else None
        if docs is None:
            docs = str(work / "docs")
            subprocess.run([str(LLMCTL), "crawl-extract", args.warc, "-o", docs, "--quiet"], check=True)
        rows = [{"id": r["id"], "text": r["text"], "score": edu_proxy(r["text"])} for r in read_parts(docs) if r["text"]]
        hist = np.bincount([r["score"] for r in rows], minlength=6).tolist()
        em, erss, _ = timed(["embed", docs, "-o", work / "embedded"], work / "embed.log")
        embed = {"docs": em["counts"]["in"], "dps": em["counts"]["in"] / em["wall_seconds"], "rss": erss}
        runs = []
        for seed in args.seeds:
            print(f"seed {seed} ...", file=sys.stderr)
            runs.append(one_seed(seed, rows, work))

    lines = [
        f"`.venv/bin/python benchmarks/classifier_edu.py --seeds {' '.join(map(str, args.seeds))}` — {time.strftime('%Y-%m-%d')}, "
        f"{cpu_name()}; {time.perf_counter() - t0:.0f} s in all; 1-min load average {load0:.2f} before / {os.getloadavg()[0]:.2f} after "
        "(other work on the machine slows the speeds, not the scores).",
        "",
        f"Labels: the rule-based proxy `edu_proxy` (benchmarks/classifier_edu.py: an additive 0-5 rubric counting an educational and a shopping vocabulary, English and German, "
        f"**not an LLM's judgement**) on pages-a's {len(rows)} documents with text; scores 0-5: {hist}. Per seed the documents are "
        "split in half by a seeded hash; both classifiers train on one half (the commands hold out 10% of it) and are applied "
        "with `llmctl filter --annotate-only` to the other. Spearman: the classifier's score (head: `score`; fastText: P(hq)) "
        "against the proxy score; F1 at 3: its keep decision (int_score >= 3; P(hq) >= 0.5) against proxy score >= 3; F1 top-k: "
        "keeping as many of its best-scored documents as have proxy score >= 3 (ranking at the boundary, whatever the scale). "
        f"Mean ± standard deviation over {len(runs)} seeds.",
        "",
        "| classifier | Spearman | F1 at 3 | F1 top-k | train s | train peak MiB | apply docs/s | apply peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, name in (("head", "regression head on minilm (`--regression`)"), ("fasttext", "fastText, DCLM settings, 200k buckets")):
        v = [r[key] for r in runs]
        lines.append(f"| {name} | {spread([x['spearman'] for x in v])} | {spread([x['f1'] for x in v])} | {spread([x['f1_top'] for x in v])} | "
                     f"{spread([x['train_s'] for x in v], '{:.1f}')} | {spread([x['train_rss'] for x in v], '{:.0f}')} | "
                     f"{spread([x['apply_dps'] for x in v], '{:.1f}')} | {spread([x['apply_rss'] for x in v], '{:.0f}')} |")
    lines += [
        "",
        "Per seed (Spearman head / fastText; F1 head / fastText; training positives of training documents; the head's ridge): "
        + "; ".join(f"{s}: {r['head']['spearman']:.2f} / {r['fasttext']['spearman']:.2f}, {r['head']['f1']:.2f} / "
                    f"{r['fasttext']['f1']:.2f}, {r['train_pos']}/{r['train']}, {r['head']['ridge']:g}" for s, r in zip(args.seeds, runs)) + ".",
        "",
        f"`llmctl embed` (minilm) on all {embed['docs']} documents: {embed['dps']:.1f} docs/s, peak {embed['rss']:.0f} MiB. "
        "The head's apply rate is the embedding's plus a dot product; fastText's is a hashed bag of n-grams.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results("classifier edu", f"## classifier edu\n\n{text}")


if __name__ == "__main__":
    main()

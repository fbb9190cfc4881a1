"""eval's strict and flexible scores against lm-evaluation-harness's GSM8K `strict-match` and
`flexible-extract` on the same completions (issue 34).

    make bench-setup && .venv-bench/bin/pip install "lm-eval[hf]==0.4.13"
    .venv-bench/bin/python benchmarks/eval_split.py [--evals out/demo/eval-sft out/demo/eval-rl] [--gsm8k FILE]
    .venv-bench/bin/python benchmarks/eval_split.py --freeze tests/data/gsm8k_completions.jsonl

Runs in .venv-bench (lm-eval and llmctl; this checkout's src/ goes first on sys.path), in one
process, no model: both tools read the same strings.

- lm-eval's side is its own gsm8k task config, read from the installed package
  (lm_eval/tasks/gsm8k/gsm8k.yaml): its `filter_list` built into filter ensembles with
  `lm_eval.filters.build_filter_ensemble`, component by component as `ConfigurableTask` builds
  them, applied to `lm_eval.api.instance.Instance`s holding each completion; each filtered answer
  scored by the yaml's `metric_list` entry, `exact_match` (`exact_match_hf_evaluate` with the
  yaml's `ignore_case`, `ignore_punctuation` and `regexes_to_ignore`) against the task's
  `doc_to_target`, the whole reference solution ("... #### 18").
- llmctl's side is what `llmctl eval` scores with: `tasks.answers.GenScoring` with the gsm8k
  family's rule (strict: after_hash; flexible: lm-eval's flexible-extract regex, canonical), the
  target read by the gsm8k family from the same reference.

Completions: each --evals folder's samples.parquet (the first sample's `completion` of every
generative item; the references from the task file its results.json names, resolved against the
folder's checkout, i.e. OUT/../../..), and the reference solutions of --gsm8k themselves (GSM8K
test: 1,319 texts that end in '#### n', the format models trained on GSM8K write), once whole and
once with the '#### n' line cut (a worked solution with no answer line: what flexible-extract is
for). Per set:
items on which the two tools agree on well-formed (strict-match finds a number / after_hash an
answer), strict correctness, the flexible string (character for character) and flexible
correctness; each tool's three scores; and every disagreement, with its text.

`--freeze FILE` writes lm-eval's extractions and verdicts into a completions fixture
(tests/data/gsm8k_completions.jsonl: `completion`, `answer` per line), which tests/test_eval_split.py
holds llmctl to without lm-eval installed. The section goes to benchmarks/RESULTS.md (## eval split).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_name, write_results  # noqa: E402

sys.path.insert(0, str(REPO / "src"))  # this checkout's llmctl, not whichever the venv installed

from llmctl.tasks.answers import GenScoring, canonical_number, flexible_extract  # noqa: E402
from llmctl.tasks.gsm8k import item as gsm8k_item  # noqa: E402

INVALID = "[invalid]"  # lm-eval's RegexFilter fallback
FILTERS = ("strict-match", "flexible-extract")


def harness():
    """lm-eval's gsm8k: (its version, {filter name: FilterEnsemble}, score(prediction, reference) -> 0/1)."""
    import lm_eval
    import yaml
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters import build_filter_ensemble

    cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    ensembles = {}
    for f in cfg["filter_list"]:  # as ConfigurableTask.__init__ builds them
        components = [[fn["function"], {k: v for k, v in fn.items() if k != "function"}] for fn in f["filter"]]
        ensembles[f["name"]] = build_filter_ensemble(f["name"], components)
    (em,) = [m for m in cfg["metric_list"] if m["metric"] == "exact_match"]
    kwargs = {k: v for k, v in em.items() if k not in ("metric", "aggregation", "higher_is_better")}

    def score(prediction: str, reference: str) -> int:
        return int(exact_match_hf_evaluate(predictions=[prediction], references=[reference], **kwargs)["exact_match"])

    assert set(FILTERS) <= set(ensembles), f"lm-eval's gsm8k filters are {sorted(ensembles)}"
    return lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?", ensembles, score


def lm_eval_side(completions: list[str], references: list[str]) -> list[dict]:
    """Per completion: {filter: (filtered answer, exact_match 0/1)} by lm-eval's own code."""
    from lm_eval.api.instance import Instance

    _, ensembles, score = harness()
    out = [{} for _ in completions]
    for name in FILTERS:
        insts = [Instance("generate_until", {"answer": ref}, ("", {}), 0, ("gsm8k", i, 1), resps=[c])
                 for i, (c, ref) in enumerate(zip(completions, references))]
        ensembles[name].apply(insts)
        for i, inst in enumerate(insts):
            got = inst.filtered_resps[name]
            out[i][name] = (got, score(got, references[i]))
    return out


def llmctl_side(completions: list[str], references: list[str]) -> list[dict]:
    """Per completion: what `llmctl eval` records (GenScoring with the gsm8k family's rule)."""
    scoring = GenScoring(extract="after_hash")
    out = []
    for c, ref in zip(completions, references):
        target = gsm8k_item({"question": "", "answer": ref}, "reference").target
        strict, flexible = scoring.strict(c), scoring.flexible(c)
        out.append({"well_formed": strict is not None, "strict": int(strict == target), "flexible": int(flexible == target),
                    "flexible_string": flexible_extract(c)})
    return out


def spelling(h: dict, reference: str) -> bool:
    """lm-eval's exact_match calls wrong an answer that is the target's number spelled another way
    ("16.00" for 16): it compares strings, llmctl canonical numbers."""
    target = canonical_number(reference.split("####")[-1])
    return any(got != INVALID and not em and canonical_number(got) == target for got, em in h.values())


def agreement(completions: list[str], references: list[str]) -> dict:
    h, m = lm_eval_side(completions, references), llmctl_side(completions, references)
    n = len(completions)
    checks = {
        "well-formed": lambda x, y: (x["strict-match"][0] != INVALID) == y["well_formed"],
        "strict correct": lambda x, y: x["strict-match"][1] == y["strict"],
        "flexible string": lambda x, y: x["flexible-extract"][0] == (y["flexible_string"] or INVALID),
        "flexible correct": lambda x, y: x["flexible-extract"][1] == y["flexible"],
    }
    same = {k: sum(f(x, y) for x, y in zip(h, m)) for k, f in checks.items()}
    differ = [{"i": i, "completion": completions[i], "lm_eval": h[i], "llmctl": m[i], "spelling": spelling(h[i], references[i])}
              for i in range(n) if not all(f(h[i], m[i]) for f in checks.values())]
    scores = {"lm-eval": {"acc (strict-match)": sum(x["strict-match"][1] for x in h) / n,
                          "acc_flexible (flexible-extract)": sum(x["flexible-extract"][1] for x in h) / n,
                          "well_formed": sum(x["strict-match"][0] != INVALID for x in h) / n},
              "llmctl": {"acc (strict-match)": sum(y["strict"] for y in m) / n,
                         "acc_flexible (flexible-extract)": sum(y["flexible"] for y in m) / n,
                         "well_formed": sum(y["well_formed"] for y in m) / n}}
    return {"n": n, "same": same, "scores": scores, "differ": differ}


def eval_completions(folder: Path) -> tuple[list[str], list[str], str]:
    """The first sample's completion of each generative item of an eval folder, with its
    reference solution from the task file the eval read."""
    import pyarrow.parquet as pq

    results = json.loads((folder / "results.json").read_text())
    rows = pq.read_table(folder / "samples.parquet").to_pylist()
    completions, references, files = [], [], []
    for task, t in results["tasks"].items():
        if t["kind"] not in ("gsm8k", "gen"):
            continue
        path = Path(t["file"])
        path = path if path.is_absolute() else folder.resolve().parents[2] / path
        records = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        for r in (r for r in rows if r["task"] == task):
            completions.append(r["completion"])
            references.append(records[r["item"]]["answer"])
        files.append(str(path))
    return completions, references, ", ".join(files)


def split_table(names: tuple[str, str], reads: tuple[list[dict], list[dict]]) -> str:
    """What `llmctl eval compare A B` reports for the gain of the second eval over the first
    (eval/split.py), from the per-item counts llmctl's reading gives their completions."""
    from llmctl.eval.split import Counts, gain_split

    a, b = ({i: Counts(1, x["strict"], x["flexible"], int(x["well_formed"])) for i, x in enumerate(r)} for r in reversed(reads))
    rows = "".join(f"| {part} | {p['n']} | {p['mean_a']:.4f} | {p['mean_b']:.4f} | {p['diff']:+.4f} | "
                   f"[{p['ci_low']:+.4f}, {p['ci_high']:+.4f}] | {p['z']:.2f} |\n" for part, p in gain_split(a, b).items())
    rescued = {n: sum(x["flexible"] - x["strict"] for x in r) for n, r in zip(names, reads)}
    return (f"The gain split of {names[1]} over {names[0]} (A = {names[1]}, B = {names[0]}; `eval/split.gain_split` on these "
            "completions, as `llmctl eval compare A B` reports it for evals that carry the counts):\n\n"
            "| part | n | A | B | A − B | 95% interval | z |\n|---|---|---|---|---|---|---|\n" + rows +
            "\nItems flexible-extract scores right minus items strict scores right: "
            + ", ".join(f"{n} {k:+d}" for n, k in rescued.items())
            + (". None: flexible rescues no answer that strict misses (the answers without '#### n' end in a number that "
               "is not the answer), so here the flexible gain carries the change of ending as much as the strict one; "
               "`strict_given_format` is the part no change of ending can move.\n" if not any(rescued.values()) else ".\n"))


def freeze(path: Path) -> None:
    """Write lm-eval's extractions and exact_match verdicts into each fixture line."""
    lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    h = lm_eval_side([r["completion"] for r in lines], [r["answer"] for r in lines])
    version = harness()[0]
    with path.open("w") as f:
        for r, x in zip(lines, h):
            r["lm_eval"] = {name: {"answer": x[name][0], "exact_match": x[name][1]} for name in FILTERS}
            r["lm_eval_version"] = version
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{path}: {len(lines)} completions, lm-eval {version}'s gsm8k filters frozen in", file=sys.stderr)


def report(sets: list[tuple[str, str, dict]], version: str) -> str:
    head = ("| completions | n | well-formed same | strict correct same | flexible string same | flexible correct same |\n"
            "|---|---|---|---|---|---|\n")
    rows = "".join(f"| {name} | {r['n']:,} | " + " | ".join(f"{r['same'][k]:,}" for k in r["same"]) + " |\n" for name, _, r in sets)
    scores = "| completions | score | lm-eval | llmctl |\n|---|---|---|---|\n" + "".join(
        f"| {name} | {k} | {r['scores']['lm-eval'][k]:.4f} | {r['scores']['llmctl'][k]:.4f} |\n"
        for name, _, r in sets for k in r["scores"]["lm-eval"])
    differ = []
    for name, _, r in sets:
        if r["differ"]:
            k = sum(d["spelling"] for d in r["differ"])
            differ.append(f"- {name}: {len(r['differ'])} item(s); in {k} of them lm-eval's answer is the target's number "
                          "spelled another way (\"16.00\" for 16), which its exact_match (a string comparison) calls "
                          "wrong and llmctl (canonical numbers) right")
        for d in r["differ"][:3]:
            text = json.dumps(d["completion"][-90:], ensure_ascii=False)
            differ.append(f"- {name} #{d['i']}: …{text}: lm-eval strict {d['lm_eval']['strict-match']}, flexible "
                          f"{d['lm_eval']['flexible-extract']}; llmctl {d['llmctl']}")
        if len(r["differ"]) > 3:
            differ.append(f"- {name}: {len(r['differ']) - 3} more like these")
    sources = "; ".join(f"{name}: {src}" for name, src, _ in sets)
    return (f"## eval split\n\n`.venv-bench/bin/python benchmarks/eval_split.py {' '.join(sys.argv[1:])}` — "
            f"{datetime.date.today()}, {cpu_name()}; lm-eval {version}, its gsm8k task's own filters and exact_match "
            f"(lm_eval/tasks/gsm8k/gsm8k.yaml), against llmctl's `GenScoring` (gsm8k: strict `after_hash`, flexible "
            f"lm-eval's flexible-extract regex; canonical numbers). Completions: {sources}.\n\n"
            f"Items on which the two tools agree:\n\n{head}{rows}\nEach tool's scores:\n\n{scores}\n"
            + ("Disagreements:\n\n" + "\n".join(differ) + "\n" if differ else "No disagreement.\n"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evals", nargs="*", default=[str(REPO / "out" / "demo" / "eval-sft"), str(REPO / "out" / "demo" / "eval-rl")])
    ap.add_argument("--gsm8k", default=str(REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"),
                    help="GSM8K-format file whose reference solutions are read as completions too ('' for none)")
    ap.add_argument("--freeze", help="write lm-eval's extractions into this completions fixture instead")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write RESULTS.md")
    args = ap.parse_args()
    if args.freeze:
        return freeze(Path(args.freeze))
    sets, reads = [], []
    for folder in map(Path, args.evals):
        completions, references, src = eval_completions(folder)
        sets.append((folder.name, f"`{folder}` ({src})", agreement(completions, references)))
        reads.append(llmctl_side(completions, references))
    if args.gsm8k:
        records = [json.loads(ln) for ln in Path(args.gsm8k).read_text().splitlines() if ln.strip()]
        refs = [r["answer"] for r in records]
        sets.append(("gsm8k references", f"`{args.gsm8k}`, each reference solution read as a completion", agreement(refs, refs)))
        cut = [r.rsplit("####", 1)[0].rstrip() for r in refs]  # the worked solution without its answer line
        sets.append(("gsm8k references, '#### n' cut", "the same solutions without their last line", agreement(cut, refs)))
    section = report(sets, harness()[0])
    if len(args.evals) == 2 and len(reads[0]) == len(reads[1]):
        section += "\n" + split_table((Path(args.evals[0]).name, Path(args.evals[1]).name), (reads[0], reads[1]))
    print(section)
    if not args.no_write:
        write_results("eval split", section)


if __name__ == "__main__":
    main()

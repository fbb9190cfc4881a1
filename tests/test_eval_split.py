"""Strict and flexible scoring, the gain split into format and content, and pass@k curves (issue 34).

- the unbiased pass@k estimator on hand-worked counts;
- strict and flexible equal lm-evaluation-harness's gsm8k `strict-match` and `flexible-extract` on
  shipped completions (tests/data/gsm8k_completions.jsonl: lm-eval 0.4.13's extractions and
  exact_match verdicts, frozen by `benchmarks/eval_split.py --freeze`), the lines where the two are
  meant to differ saying why; and, where lm_eval imports, lm-eval's own filters run live;
- two eval runs made by `run_eval` on a tiny model whose engine is handed known completions, so
  the format and content gains are known: the split `eval compare` reports, and the pass@k curves
  of two runs that cross at a known k.
"""

import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import llmctl
from llmctl.eval.compare import compare_results
from llmctl.eval.metrics import pass_at_k
from llmctl.eval.runner import EvalConfig, run_eval
from llmctl.eval.split import crossing, load_counts
from llmctl.eval.tasks import TaskSpec
from llmctl.model.generate import Engine
from llmctl.model.sampling import Generation
from llmctl.tasks import GenScoring, flexible_extract
from llmctl.tasks.gsm8k import item as gsm8k_item
from preflib import make_checkpoint

FIXTURE = Path(__file__).parent / "data" / "gsm8k_completions.jsonl"
INVALID = "[invalid]"  # lm-eval's answer when its regex finds nothing


# ---------------------------------------------------------------------------------------------
# pass@k


def test_pass_at_k_on_hand_worked_counts():
    # 1 - C(n-c, k) / C(n, k): n = 5 samples, c = 2 right
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3,2) = 3, C(5,2) = 10
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3) = 1, C(5,3) = 10
    assert pass_at_k(5, 2, 4) == 1.0  # only 3 wrong samples: any 4 hold a right one
    assert pass_at_k(10, 1, 5) == pytest.approx(1 - 126 / 252)  # C(9,5) / C(10,5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    with pytest.raises(ValueError, match="not identified"):
        pass_at_k(4, 1, 5)


def test_crossing_is_the_first_k_of_the_opposite_sign():
    assert crossing([0.1, 0.05, -0.01, 0.2]) == 3
    assert crossing([-0.1, 0.0, 0.2]) == 3  # a tie is no crossing; the sign after it is
    assert crossing([0.1, 0.2, 0.3]) is None
    assert crossing([0.0, -0.1]) is None  # tied at k = 1: nothing to cross from


# ---------------------------------------------------------------------------------------------
# strict and flexible against lm-eval's gsm8k filters


def fixture() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


def llmctl_reads(row: dict) -> dict:
    """What `llmctl eval` records for a completion of a gsm8k item (its family's rule)."""
    scoring = GenScoring(extract="after_hash")
    target = gsm8k_item({"question": "", "answer": row["answer"]}, "fixture").target
    strict = scoring.strict(row["completion"])
    return {"strict": strict, "well_formed": strict is not None, "strict_correct": int(strict == target),
            "flexible_correct": int(scoring.flexible(row["completion"]) == target)}


def test_strict_and_flexible_equal_lm_eval_on_shipped_completions():
    rows = fixture()
    same = [r for r in rows if "differs" not in r]
    assert len(rows) >= 30 and len(same) >= 25 and {r["lm_eval_version"] for r in rows} == {"0.4.13"}
    for r in rows:  # flexible is lm-eval's flexible-extract, character for character, on every line
        want = r["lm_eval"]["flexible-extract"]["answer"]
        assert (flexible_extract(r["completion"]) or INVALID) == want, r["completion"]
    for r in same:
        got, h = llmctl_reads(r), r["lm_eval"]
        assert got["well_formed"] == (h["strict-match"]["answer"] != INVALID), r["completion"]
        assert got["strict_correct"] == h["strict-match"]["exact_match"], r["completion"]
        assert got["flexible_correct"] == h["flexible-extract"]["exact_match"], r["completion"]
    # the fixture exercises every case: right and wrong, well-formed or not, flexible rescuing or not
    kinds = {(llmctl_reads(r)["well_formed"], llmctl_reads(r)["strict_correct"], llmctl_reads(r)["flexible_correct"]) for r in same}
    assert kinds == {(True, 1, 1), (True, 0, 0), (False, 0, 1), (False, 0, 0)}


# llmctl's reading of the lines where it and lm-eval's strict-match part on purpose (each line's
# "differs" says why): strict answer, strict right, flexible right
DIFFERENCES = {5: ("64", 1, 1), 18: ("7", 1, 1), 21: ("14", 1, 1), 24: ("26", 1, 1), 27: ("16", 1, 1), 33: ("70", 1, 1)}


def test_where_strict_differs_from_lm_eval_it_is_for_the_reason_given():
    rows = [r for r in fixture() if "differs" in r]
    assert {r["item"] for r in rows} == set(DIFFERENCES)
    for r in rows:
        got, h = llmctl_reads(r), r["lm_eval"]
        assert (got["strict"], got["strict_correct"], got["flexible_correct"]) == DIFFERENCES[r["item"]], r["completion"]
        lm = (h["strict-match"]["answer"] != INVALID, h["strict-match"]["exact_match"], h["flexible-extract"]["exact_match"])
        assert lm != (got["well_formed"], got["strict_correct"], got["flexible_correct"]), r["differs"]


def lm_eval_filters():
    """lm-eval's gsm8k filter ensembles and exact_match, built from its installed task yaml as
    ConfigurableTask builds them (benchmarks/eval_split.py does the same over more completions)."""
    lm_eval = pytest.importorskip("lm_eval")
    yaml = pytest.importorskip("yaml")
    from lm_eval.api.instance import Instance
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters import build_filter_ensemble

    cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    ensembles = {f["name"]: build_filter_ensemble(f["name"], [[s["function"], {k: v for k, v in s.items() if k != "function"}]
                                                              for s in f["filter"]]) for f in cfg["filter_list"]}
    (em,) = [m for m in cfg["metric_list"] if m["metric"] == "exact_match"]
    kwargs = {k: v for k, v in em.items() if k not in ("metric", "aggregation", "higher_is_better")}

    def run(completions: list[str], references: list[str]) -> list[dict]:
        out = [{} for _ in completions]
        for name, ensemble in ensembles.items():
            insts = [Instance("generate_until", {"answer": ref}, ("", {}), 0, ("gsm8k", i, 1), resps=[c])
                     for i, (c, ref) in enumerate(zip(completions, references))]
            ensemble.apply(insts)
            for i, inst in enumerate(insts):
                got = inst.filtered_resps[name]
                score = exact_match_hf_evaluate(predictions=[got], references=[references[i]], **kwargs)["exact_match"]
                out[i][name] = {"answer": got, "exact_match": int(score)}
        return out

    return run


def test_lm_eval_filters_live_give_the_frozen_answers_and_llmctls_flexible():
    run = lm_eval_filters()
    rows = fixture()
    assert run([r["completion"] for r in rows], [r["answer"] for r in rows]) == [r["lm_eval"] for r in rows]
    # flexible_extract is lm-eval's filter on any text, not only on these: random strings of the
    # characters its regex cares about
    rng = random.Random(0)
    texts = ["".join(rng.choice("0123456789.,$- #x\n") for _ in range(rng.randrange(0, 30))) for _ in range(3000)]
    live = run(texts, ["#### 1"] * len(texts))
    assert [flexible_extract(t) or INVALID for t in texts] == [x["flexible-extract"]["answer"] for x in live]


# ---------------------------------------------------------------------------------------------
# two runs with known completions: the split and the pass@k curves


def ending(kind: str, t: int) -> str:
    """A completion for target t: well-formed (W) or not (N), right (R) or wrong (W)."""
    return {"WR": f"So it is 3 + {t - 3} = {t}.\n#### {t}", "WW": f"So it is {t} + 1 = {t + 1}.\n#### {t + 1}",
            "NR": f"So it is 3 + {t - 3} = {t}.", "NW": f"So it is {t}.\nCheck: {t} - 1 = {t - 1}."}[kind]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    ck, _ = make_checkpoint(d)
    targets = [10 + i for i in range(40)]
    with open(d / "sums.jsonl", "w") as f:
        for t in targets:
            f.write(json.dumps({"question": f"What is 3 + {t - 3}?", "answer": f"3 + {t - 3} = {t}\n#### {t}"}) + "\n")
    return {"dir": d, "ck": ck, "task": TaskSpec("gsm8k", str(d / "sums.jsonl")), "targets": targets}


def eval_with(tiny, monkeypatch, out: Path, kinds: list[list[str]]) -> dict:
    """run_eval on the tiny model, its engine answering item i's sample j with ending kinds[i][j]."""
    texts = [ending(k, t) for t, ks in zip(tiny["targets"], kinds) for k in ks]

    def generate(self, prompts, params, use_cache=True, seeds=None, on_done=None):
        assert len(prompts) == len(texts)
        return [Generation(prompt_ids=list(p), ids=[], text=x, finish="eos") for p, x in zip(prompts, texts)]

    monkeypatch.setattr(Engine, "generate", generate)
    k = len(kinds[0])
    cfg = EvalConfig(samples=k, temperature=1.0 if k > 1 else 0.0, pass_k=[1, k], max_new_tokens=8, device="cpu")
    run_eval(str(tiny["ck"]), [tiny["task"]], out, cfg)
    return json.loads((out / "results.json").read_text())["tasks"]["gsm8k:sums"]


# B (the SFT-like run) and A (the RL-like run), one greedy answer per item: 40 items
B = ["WR"] * 8 + ["NR"] * 12 + ["WW"] * 4 + ["NW"] * 16
A = ["WR"] * 18 + ["NR"] * 2 + ["WR"] * 2 + ["WW"] * 2 + ["WW"] * 12 + ["NW"] * 4


def test_eval_scores_strict_flexible_and_well_formed(tiny, monkeypatch, tmp_path):
    r = eval_with(tiny, monkeypatch, tmp_path / "b", [[k] for k in B])
    m = r["metrics"]
    assert r["headline"] == "acc" and set(m) == {"acc", "acc_flexible", "well_formed"}
    assert m["acc"]["mean"] == 8 / 40 and m["acc_flexible"]["mean"] == 20 / 40 and m["well_formed"]["mean"] == 12 / 40
    assert all(m[x]["n"] == 40 and m[x]["ci_low"] <= m[x]["mean"] <= m[x]["ci_high"] for x in m)
    assert set(r["reporting"]["answer_extraction"]) == {"acc", "acc_flexible", "well_formed"}
    rows = pq.read_table(tmp_path / "b" / "samples.parquet").to_pylist()
    assert [(x["correct"], x["correct_flexible"], x["well_formed"]) for x in rows] == \
        [({"WR": 1}.get(k, 0), int(k[1] == "R"), int(k[0] == "W")) for k in B]
    assert rows[8]["prediction"] is None and rows[8]["prediction_flexible"] == str(tiny["targets"][8])
    assert all(x["score"] == x["correct"] for x in rows)


def test_compare_splits_the_gain_into_format_and_content(tiny, monkeypatch, tmp_path):
    eval_with(tiny, monkeypatch, tmp_path / "b", [[k] for k in B])
    eval_with(tiny, monkeypatch, tmp_path / "a", [[k] for k in A])
    (t,) = compare_results(tmp_path / "a", tmp_path / "b")["tasks"]
    assert t["diff"] == pytest.approx((20 - 8) / 40)  # the strict headline: +30 points
    s = t["split"]
    assert set(s) == {"format", "content", "strict_given_format"} and t["pass_at_k"] is None
    # format: A well-formed on 34 items, B on 12, and B's well-formed items are well-formed in A
    assert (s["format"]["mean_a"], s["format"]["mean_b"]) == (34 / 40, 12 / 40)
    d = [1.0] * 22 + [0.0] * 18  # per item, A's well-formed minus B's
    assert s["format"]["diff"] == pytest.approx(22 / 40)
    assert s["format"]["se"] == pytest.approx(statistics.stdev(d) / math.sqrt(40))
    assert s["format"]["z"] == pytest.approx(s["format"]["diff"] / s["format"]["se"])
    assert s["format"]["ci_low"] == pytest.approx(22 / 40 - 1.96 * s["format"]["se"])
    # content: flexible right on 22 items in A, 20 in B: 2 points, far inside the noise
    assert (s["content"]["mean_a"], s["content"]["mean_b"]) == (22 / 40, 20 / 40)
    assert s["content"]["ci_low"] < 0 < s["content"]["ci_high"]
    # strict among the 12 items well-formed in both: B right on its 8 WR, A on those and 2 of B's 4 WW
    g = s["strict_given_format"]
    assert g["n"] == 12 and (g["mean_a"], g["mean_b"]) == (10 / 12, 8 / 12) and g["diff"] == pytest.approx(2 / 12)
    # the CLI: the same numbers as JSON, and the tables in an 80-column terminal
    out = json.loads(llmctl("eval", "compare", tmp_path / "a", tmp_path / "b", "--json", check=True).stdout)
    assert out["tasks"][0]["split"]["format"]["diff"] == pytest.approx(22 / 40)
    text = compare_on_80_columns(tmp_path / "a", tmp_path / "b")
    assert "what A − B is made of" in text and "strict | wf" in text and "+0.5500" in text


def compare_on_80_columns(a: Path, b: Path) -> str:
    p = subprocess.run([sys.executable, "-m", "llmctl", "eval", "compare", a, b], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "80"}, check=True)
    assert "…" not in p.stderr and max(map(len, p.stderr.splitlines())) <= 80, p.stderr
    return p.stderr


def test_pass_at_k_curves_of_two_runs_cross_where_the_counts_say(tiny, monkeypatch, tmp_path):
    # A: sure of itself, 24 items always right, 16 never (pass@k = 0.6 at every k);
    # B: every item right 2 times in 4 (pass@1 = 0.5, pass@2 = 1 - 1/6, pass@3 = pass@4 = 1)
    a = [["WR"] * 4 if i < 24 else ["WW"] * 4 for i in range(40)]
    b = [["WR", "WW", "WR", "WW"] for _ in range(40)]
    ra = eval_with(tiny, monkeypatch, tmp_path / "a", a)
    rb = eval_with(tiny, monkeypatch, tmp_path / "b", b)
    assert ra["metrics"]["pass@4"]["mean"] == pytest.approx(0.6) and rb["metrics"]["pass@4"]["mean"] == 1.0
    assert rb["metrics"]["pass@4_flexible"]["mean"] == 1.0 and rb["metrics"]["maj@4"]["mean"] == 1.0  # ties go to the first
    (t,) = compare_results(tmp_path / "a", tmp_path / "b")["tasks"]
    c = t["pass_at_k"]
    assert c["K"] == 4 and c["n"] == 40 and [p["k"] for p in c["curve"]] == [1, 2, 3, 4]
    assert [p["a"]["mean"] for p in c["curve"]] == pytest.approx([0.6] * 4)
    assert [p["b"]["mean"] for p in c["curve"]] == pytest.approx([0.5, 1 - 1 / 6, 1.0, 1.0])
    assert c["cross_k"] == 2 and c["curve"][0]["diff"]["diff"] == pytest.approx(0.1)
    assert all(p["a"]["ci_low"] <= p["a"]["mean"] <= p["a"]["ci_high"] for p in c["curve"])
    assert c["curve"][1]["diff"]["z"] < -2  # B's lead at k = 2 is real
    text = compare_on_80_columns(tmp_path / "a", tmp_path / "b")
    assert "pass@k: gsm8k:sums" in text and "changes sign at k = 2" in " ".join(text.split())  # the legend wraps


def test_results_written_before_the_counts_compare_without_a_split(tmp_path):
    """An eval folder from before eval counted flexible and well-formed answers: compare gives the
    headline as before, no split, and the pass@k curves from the counts it had."""
    import pyarrow as pa

    from llmctl.artifacts.manifest import Manifest, write_manifest

    for name, correct in (("a", [3, 0, 2, 1]), ("b", [1, 1, 1, 1])):
        d = tmp_path / name
        d.mkdir()
        rows = [{"task": "gsm8k:t", "item": i, "score": c / 3, "correct": c, "samples": 3} for i, c in enumerate(correct)]
        rows.append({"task": "mc:m", "item": 0, "score": 1.0})  # another kind's row: no counts
        rows.append({"task": "mc:m", "item": 1, "score": 0.0})
        pq.write_table(pa.Table.from_pylist(rows), d / "samples.parquet")
        (d / "results.json").write_text(json.dumps({"tasks": {"gsm8k:t": {"headline": "acc"}, "mc:m": {"headline": "acc_norm"}}}))
        write_manifest(d, Manifest(kind="eval", stage="eval"))
    gen, mc = compare_results(tmp_path / "a", tmp_path / "b")["tasks"]
    assert gen["task"] == "gsm8k:t" and gen["split"] is None and mc["split"] is None and mc["pass_at_k"] is None
    c = gen["pass_at_k"]
    assert c["K"] == 3 and [p["a"]["mean"] for p in c["curve"]] == pytest.approx([0.5, (1 + 0 + 1 + 2 / 3) / 4, 0.75])
    assert [p["b"]["mean"] for p in c["curve"]] == pytest.approx([1 / 3, 2 / 3, 1.0]) and c["cross_k"] == 3


def test_the_counts_survive_a_task_before_them_in_one_eval(tiny, monkeypatch, tmp_path):
    # a multiple-choice task first: samples.parquet keeps every task's columns, not the first row's
    mc = tmp_path / "mc.jsonl"
    mc.write_text("".join(json.dumps({"context": f"{i} +", "choices": [" 1", " 2"], "label": i % 2}) + "\n" for i in range(4)))
    texts = [ending(k, t) for t, k in zip(tiny["targets"], B)]

    def generate(self, prompts, params, use_cache=True, seeds=None, on_done=None):
        return [Generation(prompt_ids=list(p), ids=[], text=x, finish="eos") for p, x in zip(prompts, texts)]

    monkeypatch.setattr(Engine, "generate", generate)
    run_eval(str(tiny["ck"]), [TaskSpec("mc", str(mc)), tiny["task"]], tmp_path / "r", EvalConfig(max_new_tokens=8, device="cpu"))
    names = pq.read_schema(tmp_path / "r" / "samples.parquet").names
    assert {"acc", "acc_norm", "correct", "correct_flexible", "well_formed", "samples"} <= set(names)
    counts = load_counts(tmp_path / "r")["gsm8k:sums"]
    assert [(c.correct, c.correct_flexible, c.well_formed) for c in counts.values()] == \
        [({"WR": 1}.get(k, 0), int(k[1] == "R"), int(k[0] == "W")) for k in B]

"""A MATH-style family (Hendrycks et al. 2021, MATH) is one file, tasks/math.py: on a small file
written here, eval, rl, SFT and decontam all take it through their usual entry points, none of
them changed for it."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.errors import UsageError
from llmctl.tasks import GenScoring, family_for_kind

RECORDS = [
    # Hendrycks MATH: {problem, solution, level, type}; the answer is the last \boxed{...}, nested braces
    {"problem": "What is $\\frac{1}{4} + \\frac{1}{4}$? Express your answer as a common fraction in lowest terms.",
     "solution": "We add: $\\frac{1}{4}+\\frac{1}{4}=\\frac{2}{4}=\\boxed{\\frac{1}{2}}$.", "level": "Level 1", "type": "Prealgebra"},
    {"problem": "Compute $\\dbinom{5}{2}$.", "solution": "First $\\boxed{9}$ is wrong; $\\dbinom{5}{2} = \\frac{5 \\times 4}{2} = \\boxed{10}$.",
     "level": "Level 2", "type": "Counting & Probability"},
    # MATH-500 copies add a bare `answer`
    {"problem": "Which choice is a prime: (A) 4, (B) 6, (C) 7?", "solution": "Only 7 is prime, so $\\boxed{\\text{(C)}}$.", "answer": "\\text{(C)}"},
    # copies that call the fields question / answer
    {"question": "If $x + 2 = 5$, what is $x$?", "answer": "3"},
    {"question": "What is $2^{10}$?", "solution": "$2^{10} = \\boxed{1{,}024}$ hmm, written plainly \\boxed{1,024}."},
]


@pytest.fixture
def math_file(tmp_path):
    p = tmp_path / "math" / "test.jsonl"
    p.parent.mkdir()
    p.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    return p


def test_eval_reads_math_with_boxed_answers(math_file):
    from llmctl.eval.tasks import gen_prompt, gen_stop, load_items, parse_task

    spec = parse_task(f"math:{math_file}")
    assert spec.name == "math:test"
    items = load_items(spec)
    assert [i.target for i in items] == ["0.5", "10", "\\text{(C)}", "3", "1024"]
    assert items[0].question == RECORDS[0]["problem"] and items[0].answer == RECORDS[0]["solution"]
    assert items[3].answer == "3"  # a bare answer, as written
    assert gen_prompt("math", items[1], "") == "Problem: Compute $\\dbinom{5}{2}$.\nAnswer:"
    assert gen_stop("math") == ("Problem:",)
    family = family_for_kind("math")
    assert family.extract == "boxed" and family.item_kind == "gen"
    from llmctl.eval.runner import EvalConfig
    from llmctl.eval.tasks import gen_extract

    assert EvalConfig().extract is None  # no --extract: eval scores each kind with its family's rule
    assert gen_extract("math") == "boxed" and gen_extract("gsm8k") == "after_hash"
    scoring = GenScoring(extract=family.extract)
    completions = ["So the sum is $\\boxed{\\dfrac{1}{2}}$.", "That gives \\boxed{10}.", "The answer is \\boxed{\\text{(C)}}.",
                   "x = 3, so \\boxed{3}", "\\boxed{1024}"]
    assert [scoring.strict(c) for c in completions] == [i.target for i in items]
    assert scoring.strict("\\boxed{\\frac{1}{3}}") != items[0].target
    bad = math_file.with_name("bad.jsonl")
    bad.write_text(json.dumps({"problem": "p", "solution": "no box here"}) + "\n")
    with pytest.raises(UsageError, match=r"bad\.jsonl:1: a MATH record needs a solution with a \\boxed"):
        load_items(parse_task(f"math:{bad}"))


def test_rl_prompts_carry_reference_answers(math_file):
    from llmctl.rl.rewards import make_verifier
    from llmctl.tasks import load_prompts, reference_answer

    prompts = load_prompts(math_file)
    assert [p["prompt"] for p in prompts] == [r.get("problem", r.get("question")) for r in RECORDS]
    assert prompts[0]["reference"] == RECORDS[0]["solution"]
    assert [reference_answer(p["reference"]) for p in prompts] == ["0.5", "10", "\\text{(C)}", "3", "1024"]
    v = make_verifier("math")
    assert v.verify("so \\boxed{\\frac{2}{4}}", prompts[0]["reference"]).correct is True
    assert v.verify("so \\boxed{9}", prompts[1]["reference"]).correct is False
    assert v.verify("thus \\boxed{\\text{(C)}}", prompts[2]["reference"]).correct is True


def test_sft_reads_math_conversations(math_file):
    from llmctl.train.sft import read_conversations

    convs = read_conversations(math_file)
    assert convs[0] == [{"role": "user", "content": RECORDS[0]["problem"]}, {"role": "assistant", "content": RECORDS[0]["solution"]}]
    assert convs[3] == [{"role": "user", "content": RECORDS[3]["question"]}, {"role": "assistant", "content": "3"}]
    assert convs[4][1]["content"] == RECORDS[4]["solution"]


def test_decontam_finds_a_planted_math_problem(math_file, tmp_path):
    from llmctl.data.decontam.against import EvalTask
    from llmctl.data.decontam.run import DecontamConfig, run_decontam
    from llmctl.runtime.options import RunOptions

    task = EvalTask.load("math-test", str(math_file))
    assert task.passages[0] == [RECORDS[0]["problem"] + " " + RECORDS[0]["solution"]]
    assert task.passages[2] == [RECORDS[2]["problem"] + " \\text{(C)}"]  # the answer, when there is one
    docs = tmp_path / "docs.parquet"
    texts = ["A page about gardens and the weather in spring, with nothing else on it at all.",
             "Homework help! " + RECORDS[0]["problem"] + " Anyone?", "Another quiet page about trains."]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": texts}), docs)
    m = run_decontam([str(docs)], str(tmp_path / "out"), DecontamConfig(), [str(math_file)], RunOptions(workers=1))
    assert m.counts["contaminated"] == 1 and m.counts["out"] == 2
    t = m.counts["tasks"]["math-test"]
    assert (t["items"], t["items_contaminated"]) == (5, 1)
    report = json.loads((tmp_path / "out" / "decontam.json").read_text())
    assert [i["index"] for i in report["tasks"]["math-test"]["contaminated_items"]] == [0]

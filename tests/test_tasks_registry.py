"""The task-family registry (tasks/registry.py): families found by themselves, eval kinds in
order, rl prompt files and SFT records read by the first family that takes them, and the package
importing nothing of its users."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import shared_file

from llmctl.errors import UsageError
from llmctl.eval.tasks import kinds, parse_task
from llmctl.rl.rewards import make_verifier
from llmctl.tasks import eval_kinds, families, family_for_kind, load_prompts, to_messages


def test_every_family_module_is_found_and_kinds_keep_their_order():
    names = [f.name for f in families()]
    assert {"gsm8k", "hellaswag", "arc", "piqa", "winogrande", "mmlu", "math", "mc", "gen", "prompt-answer", "chat", "freeform"} <= set(names)
    assert names[-1] == "freeform"  # the catch-all is asked last
    assert eval_kinds()[:8] == ("mc", "hellaswag", "arc", "piqa", "winogrande", "mmlu", "gsm8k", "gen")
    assert kinds()[-1] == "loss" and "math" in kinds()
    assert family_for_kind("arc").item_kind == "mc" and family_for_kind("gsm8k").item_kind == "gen"
    with pytest.raises(UsageError, match="unknown task kind"):
        family_for_kind("nope")


def test_parse_task_names_the_kinds(tmp_path):
    with pytest.raises(UsageError, match=r"KIND:PATH with KIND one of mc, hellaswag, .*, math, loss"):
        parse_task("nope:x")
    (tmp_path / "t.jsonl").write_text("{}\n")
    assert parse_task(f"gsm8k:{tmp_path / 't.jsonl'}").name == "gsm8k:t"


def test_the_package_imports_none_of_its_users():
    code = ("import sys, llmctl.tasks as t; t.families(); "
            "bad = sorted(m for m in sys.modules if m.startswith(('llmctl.eval', 'llmctl.rl', 'llmctl.train', 'llmctl.data', 'llmctl.cli'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_sft_records_and_the_error_that_lists_every_shape():
    assert to_messages({"messages": [{"role": "user", "content": 1}]}, "x") == [{"role": "user", "content": "1"}]
    assert to_messages({"question": "q", "answer": "a", "solution": "s"}, "x")[1]["content"] == "a"  # the generic reader first
    with pytest.raises(UsageError, match=r"f:2: expected 'messages', 'question'\+'answer', 'prompt'\+'answer' or 'problem'\+'solution' \(keys: id, text\)"):
        to_messages({"text": "t", "id": 1, "_line": 2}, "f:2")
    with pytest.raises(UsageError, match="expected an object"):
        to_messages(["x"], "f:1")


def test_load_prompts_gsm8k_native_and_plain_jsonl_and_parquet(tmp_path):
    gsm = load_prompts(shared_file("gsm8k/test.jsonl"))
    assert len(gsm) == 1319 and set(gsm[0]) == {"prompt", "reference"}
    assert gsm[0]["prompt"].startswith("Janet") and gsm[0]["reference"].endswith("#### 18")
    assert make_verifier("math").verify("... #### 18", gsm[0]["reference"]).correct is True

    plain = tmp_path / "p.jsonl"
    plain.write_text('{"prompt": "2+2?", "answer": "4"}\n\n{"prompt": "code", "tests": ["assert f()"]}\n')
    assert load_prompts(plain) == [{"prompt": "2+2?", "reference": "4"}, {"prompt": "code", "reference": ["assert f()"]}]

    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["1 + 1 = 2\n#### 2"]}), tmp_path / "p.parquet")
    assert load_prompts(tmp_path / "p.parquet") == [{"prompt": "1+1?", "reference": "1 + 1 = 2\n#### 2"}]


def test_load_prompts_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n')
    with pytest.raises(UsageError, match=r"bad\.jsonl:2: not valid JSON"):
        load_prompts(bad)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    with pytest.raises(UsageError, match=r"missing\.jsonl:2: expected an 'answer'"):
        load_prompts(missing)
    no_prompt = tmp_path / "np.jsonl"
    no_prompt.write_text('{"text": "a", "answer": "1"}\n')
    with pytest.raises(UsageError, match=r"np\.jsonl:1: expected a non-empty 'prompt'"):
        load_prompts(no_prompt)
    with pytest.raises(UsageError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")

"""The native task families (tasks/*.py): each reads its own record into eval items with
lm-evaluation-harness's prompt format, and writes it out as decontam passages."""

from __future__ import annotations

import json

import pytest

from llmctl.errors import UsageError
from llmctl.eval.tasks import gen_prompt, gen_stop, prompt_format
from llmctl.tasks import GenItem, MCItem, fewshot_prefix, load_items, record_passages

HELLASWAG = {"activity_label": "Baking cookies", "ctx_a": "A woman mixes flour [title] in a bowl.", "ctx_b": "she",
             "ctx": "A woman mixes flour [title] in a bowl. she", "endings": ["adds [step] water.", "eats the bowl."], "label": "0"}
ARC_AI2 = {"question": {"stem": "Which is a gas?", "choices": [{"text": "steam", "label": "A"}, {"text": "ice", "label": "B"}]}, "answerKey": "A"}
ARC_HF = {"question": "Which is a metal?", "choices": {"text": ["wood", "iron"], "label": ["1", "2"]}, "answerKey": "2"}
PIQA = {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "bake the lid", "label": 0}
WINOGRANDE = {"sentence": "Ann gave Bea a book because _ was kind.", "option1": "Ann", "option2": "Bea", "answer": "2"}
MMLU = {"question": " 2 + 2 = ", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}
GSM8K = {"question": "Tom has 3 pens. How many?", "answer": "He has 3*2=<<3*2=6>>6 pens.\n#### 6"}


def write(tmp_path, name, rec):
    p = tmp_path / f"{name}.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    return str(p)


@pytest.mark.parametrize("kind, rec, pairs, label", [
    ("hellaswag", HELLASWAG, [("Baking cookies: A woman mixes flour. in a bowl. She", " adds water."), ("Baking cookies: A woman mixes flour. in a bowl. She", " eats the bowl.")], 0),
    ("arc", ARC_AI2, [("Question: Which is a gas?\nAnswer:", " steam"), ("Question: Which is a gas?\nAnswer:", " ice")], 0),
    ("arc", ARC_HF, [("Question: Which is a metal?\nAnswer:", " wood"), ("Question: Which is a metal?\nAnswer:", " iron")], 1),
    ("piqa", PIQA, [("Question: Open a jar\nAnswer:", " twist the lid"), ("Question: Open a jar\nAnswer:", " bake the lid")], 0),
    ("winogrande", WINOGRANDE, [("Ann gave Bea a book because Ann", " was kind."), ("Ann gave Bea a book because Bea", " was kind.")], 1),
    ("mmlu", MMLU, [("2 + 2 =\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:", f" {c}") for c in "ABCD"], 1),
])
def test_native_multiple_choice_items(tmp_path, kind, rec, pairs, label):
    [item] = load_items(kind, write(tmp_path, kind, rec))
    assert isinstance(item, MCItem) and item.pairs == pairs and item.label == label
    assert item.fewshot_text == "".join(pairs[label])


def test_gsm8k_item_prompt_and_stops(tmp_path):
    items = load_items("gsm8k", write(tmp_path, "g", GSM8K))
    assert items == [GenItem(GSM8K["question"], GSM8K["answer"], "6", "Question: Tom has 3 pens. How many?\nAnswer: " + GSM8K["answer"])]
    assert gen_prompt("gsm8k", items[0], "X\n\n") == "X\n\nQuestion: Tom has 3 pens. How many?\nAnswer:"
    assert gen_stop("gsm8k") == gen_stop("gen") == ("\n\nQuestion:", "Question:", "\n\n")
    assert prompt_format("gsm8k") == "Question: {question}\\nAnswer:" and prompt_format("gen") == "{prompt}"
    assert fewshot_prefix(items * 3, 0, 1, 0) == items[0].fewshot_text + "\n\n"
    with pytest.raises(UsageError, match=r"g\.jsonl:1: GSM8K answer has no '#### N' line"):
        load_items("gsm8k", write(tmp_path, "g", {"question": "q", "answer": "42"}))
    with pytest.raises(UsageError, match=r":1: missing field 'answer' for a gsm8k item"):
        load_items("gsm8k", write(tmp_path, "g", {"question": "q"}))


def test_native_passages():
    assert record_passages(HELLASWAG, "h") == ["A woman mixes flour   in a bowl. she adds   water.", "A woman mixes flour   in a bowl. she eats the bowl."]
    assert record_passages(ARC_AI2, "a") == ["Which is a gas? steam", "Which is a gas? ice"]
    assert record_passages(ARC_HF, "a") == ["Which is a metal? wood", "Which is a metal? iron"]  # the free-form question + choices
    assert record_passages(PIQA, "p") == ["Open a jar twist the lid", "Open a jar bake the lid"]
    assert record_passages(WINOGRANDE, "w") == ["Ann gave Bea a book because Ann was kind.", "Ann gave Bea a book because Bea was kind."]
    assert record_passages(MMLU, "m") == [" 2 + 2 =  3", " 2 + 2 =  4", " 2 + 2 =  5", " 2 + 2 =  6"]
    assert record_passages(GSM8K, "g") == ["Tom has 3 pens. How many? He has 3*2=6 pens.\n#### 6"]
    with pytest.raises(UsageError, match="a: 'question' has no 'stem' text"):
        record_passages({"question": {"choices": []}}, "a")

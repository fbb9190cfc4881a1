"""Task families: the one place that knows each dataset's file format.

One module per family (gsm8k, hellaswag, arc, piqa, winogrande, mmlu, math, and the generic mc,
gen, prompt-answer, chat and free-form records) exports a `Family` (tasks/base.py) that tells
each user what it needs: eval its items, prompt and answer rule; decontam the passages of a
record; rl prompts with their references; SFT conversations. The registry (tasks/registry.py)
finds the modules by itself, so a new family is one new file; answers.py reads answers and
canonical numbers, files.py reads task files, fewshot.py writes few-shot prompts.

eval, data/decontam, rl and train import from here; this package imports none of them.
"""

from llmctl.tasks.answers import GenScoring, canonical_number, extract_answer, flexible_extract, math_answer, reference_answer
from llmctl.tasks.base import Family, GenItem, MCItem
from llmctl.tasks.fewshot import chat_messages, fewshot_indices, fewshot_prefix
from llmctl.tasks.files import read_records, where
from llmctl.tasks.registry import (eval_kinds, families, family_for_kind, load_items, load_prompts, read_prompts, record_passages,
                                   rl_prompt, to_messages)

__all__ = [
    "Family", "GenItem", "MCItem", "GenScoring", "canonical_number", "extract_answer", "flexible_extract", "math_answer", "reference_answer",
    "chat_messages", "fewshot_indices", "fewshot_prefix", "read_records", "where",
    "eval_kinds", "families", "family_for_kind", "load_items", "load_prompts", "read_prompts", "record_passages", "rl_prompt",
    "to_messages",
]

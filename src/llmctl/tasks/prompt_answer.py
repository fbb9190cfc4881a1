"""Prompt + reference records `{prompt | question, answer | reference | tests}`: the generic rl
prompt file and the generic SFT exchange. GSM8K's `{question, answer}` is one of them.

- rl: the prompt is `prompt` (else `question`), a non-empty string; the reference is the first
  of `answer`, `reference`, `tests` that is set, kept as written (a GSM8K solution stays whole: the
  `math` verifier reads the number after ####; `tests` is for the `python` verifier). A record
  with a `solution` but none of these is left to tasks/math.py. A checkpoint without a chat
  template is given GSM8K's plain prompt and stop strings (tasks/gsm8k.py), the format such a
  record comes in.
- SFT: `{question, answer}` or `{prompt, answer}` is one exchange — the user asks, the assistant
  says the answer (a GSM8K solution with its "#### n" line); a number is written out.
"""

from __future__ import annotations

from llmctl.errors import UsageError
from llmctl.tasks import gsm8k
from llmctl.tasks.base import Family, exchange

REFERENCE_KEYS = ("answer", "reference", "tests")


def rl_prompt(rec: dict, at: str) -> dict | None:
    prompt = rec.get("prompt", rec.get("question"))
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    key = next((k for k in REFERENCE_KEYS if rec.get(k) is not None), None)
    if key is None:
        if "solution" in rec:  # a worked solution and no reference: MATH's {question, solution} (tasks/math.py)
            return None
        raise UsageError(f"{at}: expected an 'answer' (or 'reference' / 'tests')")
    return {"prompt": prompt, "reference": rec[key]}


def conversation(rec: dict, at: str) -> list[dict] | None:
    for ask in ("question", "prompt"):
        if ask in rec and "answer" in rec:
            return exchange(rec[ask], rec["answer"], at, ask, "answer")
    return None


FAMILY = Family(
    name="prompt-answer", order=85,
    rl_prompt=rl_prompt, rl_shapes=("'prompt' (or GSM8K 'question')",), rl_plain_prompt=gsm8k.plain_prompt, stop=gsm8k.STOP,
    conversation=conversation, conversation_shapes=("'question'+'answer'", "'prompt'+'answer'"),
)

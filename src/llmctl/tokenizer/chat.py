"""The one chat template: SFT trains on it, rl samples with it, eval and generate prompt with it.

A conversation is rendered as

    <|endoftext|> <|system|> text <|end|> <|user|> text <|end|> <|assistant|> text <|end|> …

Each turn is its role's special id, then the content encoded as ordinary text, then `<|end|>`.
Content never becomes a special id: "<|end|>" typed by a user is the characters it is (the
ordinary encoding of tokenizer/bpe.py `Encoder`, the one tokenize uses). The conversation starts
with `<|endoftext|>` (when the tokenizer has it): in pretraining every document follows an EOS, so
the model has always seen that token as the context of a document's first token; it is also the
row's anchor after packing. Generation stops at `<|end|>`.

The loss mask (spec 001-posttrain-rl §A1) is 1 on every assistant turn's content tokens and on the
`<|end|>` closing that turn — the model must learn to stop — and 0 on everything else (the role
tokens included). `mask[i]` refers to `ids[i]` as a *target*: training predicts ids[i] from
ids[:i] where mask[i] is 1.

`jinja_source` writes the same rendering as a Jinja chat template, which `llmctl export` puts in
tokenizer_config.json: transformers' `apply_chat_template` then yields these ids — for content that
holds no special-token text (transformers parses "<|end|>" typed in a message as the special id).

Reading a record as a conversation (a `messages` list, {question, answer}, …) is the task
families' job: `llmctl.tasks.to_messages`.
"""

from __future__ import annotations

from pathlib import Path

from llmctl.errors import UsageError
from llmctl.tasks.chat import ROLES

NAME = "llmctl-chat-v1"  # written into trainer_state.json of SFT checkpoints ("chat_template")
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END = "<|end|>"
BOS = "<|endoftext|>"


__all__ = ["NAME", "ROLES", "ROLE_TOKENS", "END", "BOS", "ChatTemplate"]


class ChatTemplate:
    name = NAME

    def __init__(self, tokenizer_json: str | Path):
        from llmctl.tokenizer.bpe import encoder

        p = Path(tokenizer_json)
        if p.is_dir():
            p = p / "tokenizer.json"
        self.path = p
        self.encoder = encoder(str(p))
        special = self.encoder.info.special
        missing = [t for t in (*ROLE_TOKENS.values(), END) if t not in special and t != ROLE_TOKENS["system"]]
        if missing:
            raise UsageError(f"{p}: the tokenizer lacks the chat token(s) {', '.join(missing)} "
                             "(train one with `llmctl tokenize train`, which reserves them)")
        self.role_ids = {r: special[t] for r, t in ROLE_TOKENS.items() if t in special}
        self.end_id: int = special[END]
        self.end_ids: tuple[int, ...] = (self.end_id,)
        self.bos_id: int | None = special.get(BOS)
        self.pad_id: int = special.get("<|pad|>", self.bos_id if self.bos_id is not None else self.end_id)

    @property
    def jinja(self) -> str:
        """This template as a Hugging Face chat template (export writes it)."""
        return jinja_source(self.bos_id is not None)

    def _check(self, messages) -> None:
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ROLES:
                raise UsageError(f"message {i}: role {role!r} is not system, user or assistant")
            if role not in self.role_ids:
                raise UsageError(f"{self.path}: the tokenizer has no {ROLE_TOKENS[role]} token")
            if not isinstance(m.get("content"), str):
                raise UsageError(f"message {i}: content must be a string")

    def _assemble(self, messages, contents: list[list[int]]) -> tuple[list[int], list[int]]:
        ids, mask = ([self.bos_id], [0]) if self.bos_id is not None else ([], [])
        for m, body in zip(messages, contents):
            train = 1 if m["role"] == "assistant" else 0
            ids.append(self.role_ids[m["role"]])
            mask.append(0)
            ids.extend(body)
            mask.extend([train] * len(body))
            ids.append(self.end_id)
            mask.append(train)
        return ids, mask

    def encode_chat(self, messages) -> tuple[list[int], list[int]]:
        """(ids, loss mask): mask 1 on assistant content and the <|end|> closing each assistant turn."""
        self._check(messages)
        return self._assemble(messages, self.encoder.encode_batch([m["content"] for m in messages]))

    def encode_many(self, conversations: list[list[dict]]) -> list[tuple[list[int], list[int]]]:
        """encode_chat over many conversations, the contents encoded in one batch."""
        for msgs in conversations:
            self._check(msgs)
        flat = self.encoder.encode_batch([m["content"] for msgs in conversations for m in msgs])
        out, i = [], 0
        for msgs in conversations:
            out.append(self._assemble(msgs, flat[i:i + len(msgs)]))
            i += len(msgs)
        return out

    def prompt_ids(self, messages) -> list[int]:
        """The generation prompt: all messages (the last one the user's) rendered, then <|assistant|>."""
        if not messages or messages[-1].get("role") != "user":
            raise UsageError("a generation prompt must end with a user message")
        ids, _ = self.encode_chat(messages)
        return ids + [self.role_ids["assistant"]]

    def render_text(self, messages, add_generation_prompt: bool = False) -> str:
        """The same rendering as text, for display (special tokens spelled out)."""
        self._check(messages)
        parts = [BOS] if self.bos_id is not None else []
        for m in messages:
            parts += [ROLE_TOKENS[m["role"]], m["content"], END]
        if add_generation_prompt:
            parts.append(ROLE_TOKENS["assistant"])
        return "".join(parts)


def jinja_source(has_bos: bool) -> str:
    """This template as the Jinja text of a Hugging Face chat template (export writes it)."""
    roles = ", ".join(f"'{r}'" for r in ROLE_TOKENS)
    return (("{{ '" + BOS + "' }}" if has_bos else "")
            + "{% for message in messages %}"
            + "{% if message['role'] not in [" + roles + "] %}"
            + "{{ raise_exception('" + NAME + " has the roles system, user and assistant') }}{% endif %}"
            + "{{ '<|' + message['role'] + '|>' + message['content'] + '" + END + "' }}"
            + "{% endfor %}"
            + "{% if add_generation_prompt %}{{ '" + ROLE_TOKENS["assistant"] + "' }}{% endif %}")

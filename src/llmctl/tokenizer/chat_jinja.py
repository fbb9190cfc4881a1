"""A released model's own chat template (the Jinja text in its tokenizer_config.json or
chat_template.jinja), rendered the way transformers' `apply_chat_template` renders it, so an
imported model is prompted, fine-tuned and rolled out in the format it was trained on.

Rendering follows transformers: a sandboxed Jinja environment with trim_blocks and lstrip_blocks,
loop controls, its `tojson` (no HTML escaping), `raise_exception` and `strftime_now`, and the
special-token strings as variables; the text is then tokenized with special tokens parsed and
none added (a template writes its own BOS). Written here rather than calling transformers
because transformers is not a dependency of llmctl, and SFT needs what it does not give for most
templates: which tokens are the assistant's. Those are found by rendering the conversation turn by
turn: the characters an assistant message adds after the generation prompt, up to and including
the turn-end token, are the ones trained on (templates whose earlier turns change when a later one
is added — e.g. ones that drop past reasoning — are refused for SFT with one line).

The turn-end token is found by rendering a probe answer: the first special token the template
writes after it (`<|im_end|>`, `<|eot_id|>`, `</s>`, `<|end|>`). Generation stops there.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from llmctl.errors import UsageError

PROBE = "llmctl turn-end probe"


def _environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTags(Extension):
        """{% generation %}…{% endgeneration %} (transformers' assistant-mask markers) render their body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTags, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class JinjaChat:
    """`encode_chat`, `encode_many`, `prompt_ids`, `render_text`, `end_ids`, `pad_id`: the interface of
    tokenizer/chat.py's ChatTemplate, for a template given as Jinja text."""

    def __init__(self, source: str, tokenizer, specials: dict[str, str], eos_ids: tuple[int, ...], pad_id: int,
                 where: str = "chat template"):
        import jinja2

        self.source, self.tok, self.where = source, tokenizer, where
        self.specials = {k: v for k, v in specials.items() if v is not None}
        self.name = "jinja:" + hashlib.sha256(source.encode()).hexdigest()[:12]
        self.pad_id = pad_id
        try:
            self.template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise UsageError(f"{where}: not a valid Jinja template ({e})") from e
        self.end_ids = self._turn_end()  # () when the template writes no special token after an answer
        self.end_id = self.end_ids[0] if self.end_ids else None
        # an answer's trained tokens end at its turn end, or at an EOS the template writes instead
        self._stops = [self.tok.id_to_token(i) for i in (*self.end_ids, *eos_ids)]

    # -- rendering -----------------------------------------------------------------------------

    def render_text(self, messages, add_generation_prompt: bool = False) -> str:
        import jinja2

        try:
            return self.template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                        **self.specials)
        except jinja2.TemplateError as e:
            raise UsageError(f"{self.where}: {e}") from e

    def _ids(self, text: str):
        return self.tok.encode(text, add_special_tokens=False)

    def _turn_end(self) -> tuple[int, ...]:
        """(turn-end id,): the first special token the template writes after a probe answer."""
        user = [{"role": "user", "content": "ping"}]
        before = self.render_text(user, add_generation_prompt=True)
        full = self.render_text(user + [{"role": "assistant", "content": PROBE}])
        at = full.find(PROBE, len(before) if full.startswith(before) else 0)
        found: list[int] = []
        if at >= 0:
            special = set(self.tok.get_added_tokens_decoder())
            found = [i for i in self._ids(full[at + len(PROBE):]).ids if i in special][:1]
        return tuple(found)

    # -- the ChatTemplate interface -------------------------------------------------------------

    def prompt_ids(self, messages) -> list[int]:
        if not messages or messages[-1].get("role") != "user":
            raise UsageError("a generation prompt must end with a user message")
        return self._ids(self.render_text(messages, add_generation_prompt=True)).ids

    def encode_chat(self, messages) -> tuple[list[int], list[int]]:
        """(ids, loss mask): 1 on each assistant message's tokens and the turn-end token closing it."""
        full = self.render_text(messages)
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            before = self.render_text(messages[:i], add_generation_prompt=True) if i else ""
            upto = self.render_text(messages[: i + 1])
            if not (upto.startswith(before) and full.startswith(upto)):
                raise UsageError(f"{self.where}: the template renders an earlier turn differently once a later one "
                                 f"follows, so the assistant's tokens of message {i} cannot be located for the loss mask")
            turn = upto[len(before):]
            ends = [turn.find(s) + len(s) for s in self._stops if s and turn.find(s) >= 0]
            spans.append((len(before), len(before) + (min(ends) if ends else len(turn))))
        enc = self._ids(full)
        mask = [int(any(s < b and a < e for s, e in spans)) for a, b in enc.offsets]
        return list(enc.ids), mask

    def encode_many(self, conversations) -> list[tuple[list[int], list[int]]]:
        return [self.encode_chat(c) for c in conversations]

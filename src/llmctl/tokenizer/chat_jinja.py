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
import threading
import time
from datetime import datetime

from llmctl.errors import UsageError

PROBE = "llmctl turn-end probe"

# A chat template comes with a downloaded model: untrusted code. Jinja's sandbox keeps it from the
# host (no attributes of Python internals, ranges of at most 100,000 items) but not from the
# machine's time and memory, so each render is held to these bounds and stopped with one line past
# them. A release's template renders a conversation in well under 10,000 steps and writes little
# besides the messages themselves.
MAX_STEPS = 1_000_000  # loop iterations, calls, filters and operators in one render
MAX_SECONDS = 10.0  # one render's wall time: the backstop for steps that are each slow
MAX_CHARS = 1 << 20  # characters of output (and of any value built) beyond 4x the messages' own size
MAX_INT_ARG = 1 << 20  # an integer argument to a call or filter (a width, a count)
MAX_POWER_BITS = 1 << 16  # the bits of an integer power
RESERVED = "__llmctl_"  # the names below; a template may not use them
STEPS = "__llmctl_steps"  # wraps what every loop iterates over: each item is a step
CONCAT = "__llmctl_concat"  # what `~` becomes, so its result is measured


class TemplateLimit(Exception):
    """A render went past one of the bounds above."""


def _weight(v, limit: int) -> int:
    """At least the characters str(v) takes (strings and the items of lists, tuples and dicts,
    nested), counting no further than `limit`."""
    if isinstance(v, str):
        return len(v)
    if not isinstance(v, (list, tuple, dict)):
        return 0
    total = len(v)
    for item in (v.items() if isinstance(v, dict) else v):
        if total > limit:
            break
        total += _weight(item, limit - total)
    return total


def _predicted(name: str, obj, args) -> int:
    """The size of what a call of str's quadratic methods (replace, join) would build, before it is built."""
    if not isinstance(obj, str) or name not in ("replace", "join"):
        return 0
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        return len(obj) + (obj.count(args[0]) if args[0] else len(obj) + 1) * len(args[1])
    if name == "join" and args and isinstance(args[0], (list, tuple)):
        return len(obj) * len(args[0]) + _weight(args[0], MAX_CHARS << 8)
    return 0


def _filter_size(name: str, data, kwargs) -> int:
    """What the quadratic filters (replace, join, indent) would build, before they build it."""
    if name == "replace" and len(data) >= 3:
        return _predicted("replace", str(data[0]), (str(data[1]), str(data[2])))
    if name == "join" and data:
        sep = data[1] if len(data) > 1 else kwargs.get("d", "")
        return _predicted("join", str(sep), data[:1])
    if name == "indent" and data:
        width = data[1] if len(data) > 1 else kwargs.get("width", 4)
        per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        text = str(data[0])
        return len(text) + per_line * (1 + text.count("\n"))
    return 0


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

    class Bounded(ImmutableSandboxedEnvironment):
        """The sandbox with a budget: every call, filter, `*`, `**`, `+`, `~` and loop iteration is a
        step; each value they build is measured; a render that goes past MAX_STEPS, MAX_SECONDS or
        its character limit raises TemplateLimit."""

        intercepted_binops = frozenset({"*", "**", "+"})

        def __init__(self, **kw):
            super().__init__(**kw)
            self.budget = threading.local()

        def start(self, limit: int) -> None:
            b = self.budget
            b.steps, b.deadline, b.limit = 0, time.monotonic() + MAX_SECONDS, limit

        def stop(self) -> None:
            self.budget.limit = None

        def tick(self) -> int:
            b = self.budget
            if getattr(b, "limit", None) is None:  # compile-time constant folding: leave it to the render
                raise TemplateLimit("not rendering")
            b.steps += 1
            if b.steps > MAX_STEPS:
                raise TemplateLimit(f"rendering took over {MAX_STEPS:,} steps (a loop that does not end?)")
            if time.monotonic() > b.deadline:
                raise TemplateLimit(f"rendering took over {MAX_SECONDS:g} s")
            return b.limit

        def measured(self, value):
            limit = self.budget.limit
            if _weight(value, limit) > limit:
                raise TemplateLimit(f"the template builds a value of over {limit:,} characters")
            return value

        def check_args(self, name: str, args) -> None:
            for a in args:
                if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
                    raise TemplateLimit(f"{name}() given {a:,}, past the {MAX_INT_ARG:,} a template may pass")

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (the sandbox's own signature)
            limit = __self.tick()
            name = getattr(__obj, "__name__", type(__obj).__name__).removeprefix("safe_")  # safe_range: range
            __self.check_args(name, (*args, *kwargs.values()))
            if _predicted(name, getattr(__obj, "__self__", None), args) > limit:
                raise TemplateLimit(f"{name}() would build a value of over {limit:,} characters")
            return __self.measured(super().call(__context, __obj, *args, **kwargs))

        def call_binop(self, context, operator, left, right):
            limit = self.tick()
            ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
            if operator == "**" and ints and right > 0 and right * abs(left).bit_length() > MAX_POWER_BITS:
                raise TemplateLimit(f"{left} ** {right} has over {MAX_POWER_BITS:,} bits")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and not isinstance(n, bool) and _weight(seq, limit) * n > limit:
                        raise TemplateLimit(f"a value repeated {n:,} times would be over {limit:,} characters")
            return self.measured(super().call_binop(context, operator, left, right))

        def is_safe_attribute(self, obj, attr, value):
            # expandtabs(n) multiplies a string by n per tab: no template needs it
            return attr != "expandtabs" and super().is_safe_attribute(obj, attr, value)

        def _parse(self, source, name, filename):  # what compile() and parse() both call
            """The template's tree with every loop's items counted as steps and `~` made a call."""
            from jinja2 import nodes
            from jinja2.exceptions import TemplateSyntaxError
            from jinja2.visitor import NodeTransformer

            tree = super()._parse(source, name, filename)
            for node in tree.find_all((nodes.Name, nodes.Macro, nodes.NSRef)):
                if node.name.startswith(RESERVED):
                    raise TemplateSyntaxError(f"the name {node.name} is reserved", node.lineno, name, filename)

            class Counted(NodeTransformer):
                def visit_For(self, node):
                    node = self.generic_visit(node)
                    node.iter = nodes.Call(nodes.Name(STEPS, "load"), [node.iter], [], None, None).set_lineno(node.lineno)
                    return node

                def visit_Concat(self, node):
                    node = self.generic_visit(node)
                    return nodes.Call(nodes.Name(CONCAT, "load"), list(node.nodes), [], None, None).set_lineno(node.lineno)

            return Counted().visit(tree)

    def guarded(name, f):
        passes_context = getattr(f, "jinja_pass_arg", None) is not None

        def run(*args, **kwargs):
            limit = env.tick()
            data = args[1:] if passes_context else args
            env.check_args(name, (*data, *kwargs.values()))
            if _filter_size(name, data, kwargs) > limit:
                raise TemplateLimit(f"|{name} would build a value of over {limit:,} characters")
            return env.measured(f(*args, **kwargs))

        run.__dict__.update(getattr(f, "__dict__", {}))  # keeps jinja's pass_context / pass_environment marks
        run.__name__ = name
        return run

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTags, loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: guarded(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

    def steps(items):
        for item in items:
            env.tick()
            yield item

    env.globals[STEPS] = steps
    env.globals[CONCAT] = lambda *parts: "".join(map(str, parts))
    return env


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if isinstance(e, (TemplateLimit, UsageError)) or type(e).__module__.startswith("jinja2") \
        else f"{type(e).__name__}: {text}"


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
        self.env = _environment()
        try:
            self.template = self.env.from_string(source)
        except (jinja2.TemplateError, RecursionError, MemoryError) as e:
            raise UsageError(f"{where}: not a valid Jinja template ({_one_line(e)})") from e
        self.end_ids = self._turn_end()  # () when the template writes no special token after an answer
        self.end_id = self.end_ids[0] if self.end_ids else None
        # an answer's trained tokens end at its turn end, or at an EOS the template writes instead
        self._stops = [self.tok.id_to_token(i) for i in (*self.end_ids, *eos_ids)]

    # -- rendering -----------------------------------------------------------------------------

    def render_text(self, messages, add_generation_prompt: bool = False) -> str:
        """The template's text for `messages`, rendered within the sandbox's bounds (MAX_STEPS,
        MAX_SECONDS, and MAX_CHARS beyond 4x the messages' size). Whatever stops a render — the
        template's raise_exception, an error in its code, a bound — is one line naming the template."""
        messages = list(messages)
        limit = MAX_CHARS + 4 * len(json.dumps(messages, ensure_ascii=False, default=str))
        out, size = [], 0
        self.env.start(limit)
        try:
            for piece in self.template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **self.specials):
                size += len(piece)
                if size > limit:
                    raise TemplateLimit(f"the template writes over {limit:,} characters")
                out.append(piece)
        except Exception as e:  # a foreign template's code: every way it fails is the template's
            raise UsageError(f"{self.where}: {_one_line(e)}") from e
        finally:
            self.env.stop()
        return "".join(out)

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

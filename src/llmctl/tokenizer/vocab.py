"""How a checkpoint turns text into ids and back: its tokenizer and the special ids around it.

A checkpoint keeps, beside its weights, the tokenizer files transformers reads
(artifacts/checkpoint.py TOKENIZER_FILES): tokenizer.json always; for an imported model also
tokenizer_config.json (special-token strings, the chat template), generation_config.json (the EOS
ids generation stops on, one or several) and chat_template.jinja. `Vocab` reads them once, for
eval, generate, rl and SFT alike:

- `eos_ids`: generation_config.json's eos_token_id (what transformers' generate stops on), else
  tokenizer_config.json's eos_token, else `<|endoftext|>` or a usual end-of-text name.
- `add_bos`: a prompt starts with BOS exactly when the tokenizer's post-processor adds one, which
  is what `tokenizer(text)` does in transformers 5 (a Llama or Llama 3 tokenizer: yes; Qwen: no).
- `chat`: the template a chat model speaks. A template in the files wins (JinjaChat), unless it is
  llmctl's own exported one; a tokenizer with llmctl's chat tokens and no template speaks llmctl's
  (ChatTemplate); else there is none.
- `stop_ids(chat)`: generation stops at any EOS id, and for a chat prompt first at the turn end.

Text from users and data is always encoded as ordinary text: "<|endoftext|>" typed in a prompt
stays characters. Only a rendered chat template has its special tokens parsed, as transformers does.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from llmctl.artifacts.checkpoint import TOKENIZER_FILES
from llmctl.errors import UsageError


def read_json_object(path: Path) -> dict:
    """A JSON file's object ({} when the file is absent); unreadable JSON, or JSON that is not an
    object, is a UsageError naming the file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"{path}: not readable JSON ({' '.join(str(e).split())})") from e
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    return data


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _token_text(config: dict, key: str, where: Path) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": …} (None: none)."""
    value = config.get(key)
    text = value.get("content") if isinstance(value, dict) else value
    if text is not None and not isinstance(text, str):
        raise UsageError(f"{where}: {key} must be a token string or {{\"content\": string}}, got {_shown(value)}")
    return text


def token_ids(value) -> list[int]:
    """The ids of a config's token-id field: one int or a list of them (booleans and other values dropped)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def checked_ids(config: dict, key: str, size: int, where: Path) -> list[int]:
    """A generation_config.json id field (an id, a list of ids, or null), every id one of the
    model's 0..size-1: the tokenizer's Rust side would abort on an id past 2^32 or below 0."""
    value = config.get(key)
    ids = value if isinstance(value, list) else [] if value is None else [value]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
            raise UsageError(f"{where}: {key} must be a token id (0 to {size - 1}) or a list of them, got {_shown(value)}")
    return ids


def model_rows(folder: Path, tokenizer_size: int) -> int:
    """How many ids the model beside a tokenizer has: its config.json's vocab_size rounded up to the
    64 rows tables are padded to (a release's or a checkpoint's config.json both name it so), or the
    tokenizer's size. An unreadable config.json is left to whoever reads it for the model."""
    try:
        rows = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError, RecursionError):
        rows = None
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 < rows <= 1 << 24:
        return tokenizer_size
    return max(tokenizer_size, -(-rows // 64) * 64)


def chat_source(folder: Path, tok_cfg: dict) -> tuple[str | None, str]:
    """The Jinja chat template of a model folder, and where it is (for messages): chat_template.jinja,
    else tokenizer_config.json's chat_template (a string, or a list of named templates: the "default" one)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), str(jinja)
        except UnicodeDecodeError as e:
            raise UsageError(f"{jinja}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    where = f"{folder / 'tokenizer_config.json'}: chat_template"
    source = tok_cfg.get("chat_template")
    if isinstance(source, list):
        if not all(isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in source):
            raise UsageError(f"{where} must be a string or a list of {{\"name\", \"template\"}} strings, got {_shown(source)}")
        source = next((t["template"] for t in source if t["name"] == "default"), None)
    elif source is not None and not isinstance(source, str):
        raise UsageError(f"{where} must be a string or a list of {{\"name\", \"template\"}} strings, got {_shown(source)}")
    return (source if source and source.strip() else None), where


class Vocab:
    def __init__(self, path: str | Path):
        from llmctl.tokenizer.bpe import encoder

        p = Path(path)
        self.folder = p if p.is_dir() else p.parent
        self.tokenizer_file = self.folder / TOKENIZER_FILES[0] if p.is_dir() else p
        if not self.tokenizer_file.is_file():
            raise UsageError(f"{self.folder}: no tokenizer.json")
        self.encoder = encoder(str(self.tokenizer_file))
        self.tok = self.encoder.tok
        self.size: int = self.tok.get_vocab_size(with_added_tokens=True)
        tok_cfg_file, gen_file = self.folder / "tokenizer_config.json", self.folder / "generation_config.json"
        self.tok_cfg = read_json_object(tok_cfg_file)
        gen = read_json_object(gen_file)
        self.specials = {k: _token_text(self.tok_cfg, k, tok_cfg_file) for k in SPECIAL_TOKENS}
        rows = model_rows(self.folder, self.size) if (self.folder / "config.json").is_file() else self.size
        gen_ids = {k: checked_ids(gen, k, rows, gen_file) for k in ID_FIELDS}

        eos = gen_ids["eos_token_id"] or self._id_list(self.specials["eos_token"])
        if not eos and self.encoder.info.eos_id is not None:
            eos = [self.encoder.info.eos_id]
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))
        with_specials = self.tok.encode("a", add_special_tokens=True).ids
        plain = self.tok.encode("a", add_special_tokens=False).ids
        self.add_bos = len(with_specials) > len(plain) and with_specials[-len(plain):] == plain
        bos = with_specials[0] if self.add_bos else None
        if bos is None:
            bos = next(iter(gen_ids["bos_token_id"] or self._id_list(self.specials["bos_token"])), None)
        if bos is None:  # llmctl's tokenizers: a conversation, like a document, starts after <|endoftext|>
            bos = next(iter(self._id_list("<|endoftext|>")), None)
        self.bos_id: int | None = bos
        pad = gen_ids["pad_token_id"] or self._id_list(self.specials["pad_token"]) or self._id_list("<|pad|>")
        self.pad_id: int = pad[0] if pad else (self.eos_ids[0] if self.eos_ids else 0)
        self.chat_source, self.chat_where = chat_source(self.folder, self.tok_cfg)

    def _id_list(self, token: str | None) -> list[int]:
        i = self.tok.token_to_id(token) if token else None
        return [] if i is None else [i]

    # -- text ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ordinary ids of text: no BOS, no special token from the text itself."""
        return self.encoder.encode_batch([text])[0]

    def decode(self, ids: list[int]) -> str:
        return self.encoder.decode(ids)

    def prompt_ids(self, text: str) -> list[int]:
        """A plain (non-chat) prompt: BOS when the tokenizer adds one, then the text."""
        return ([self.bos_id] if self.add_bos else []) + self.encode(text)

    @property
    def doc_start(self) -> int:
        """The id a scored context starts from: BOS for a model whose prompts get one, else the EOS
        that precedes every document in pretraining (lm-eval's prefix token, likewise)."""
        if self.add_bos:
            return self.bos_id
        return self.eos_ids[0] if self.eos_ids else (self.bos_id or 0)

    # -- chat ------------------------------------------------------------------------------------

    @cached_property
    def chat(self):
        """The chat template (ChatTemplate or JinjaChat), or None when the files hold none."""
        from llmctl.tokenizer.chat import END, ChatTemplate
        from llmctl.tokenizer.chat_jinja import JinjaChat

        special = self.encoder.info.special
        ours = ChatTemplate(self.tokenizer_file) if all(t in special for t in (END, "<|user|>", "<|assistant|>")) else None
        if self.chat_source is None or (ours is not None and self.chat_source == ours.jinja):
            return ours
        return JinjaChat(self.chat_source, self.tok, self.specials, self.eos_ids, self.pad_id, where=self.chat_where)

    def require_chat(self):
        if self.chat is None:
            raise UsageError(f"{self.folder}: the tokenizer has no chat template (no chat_template in "
                             "tokenizer_config.json, no llmctl chat tokens)")
        return self.chat

    def stop_ids(self, chat: bool) -> tuple[int, ...]:
        """What generation stops on: any EOS id; in a chat, the template's turn end first."""
        if not chat:
            return self.eos_ids
        return tuple(dict.fromkeys((*self.require_chat().end_ids, *self.eos_ids)))

    def speaks_chat(self, eos_ids: tuple[int, ...] | None = None) -> bool:
        """Whether a model with these files ends its answers with the template's turn end: its
        generation stops there (an instruct model's generation_config lists it among the EOS ids;
        a base model's lists only the end of text, though its files may carry a template)."""
        chat = self.chat
        return chat is not None and bool(chat.end_ids) and chat.end_ids[0] in (eos_ids or self.eos_ids)

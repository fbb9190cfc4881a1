"""`llmctl export CKPT -o DIR`: a Hugging Face model directory that transformers and vLLM load
with no edits.

    config.json              the matching class (model/hf_layout.py), bos/eos/pad ids
    model.safetensors        transformers' tensor names, in the checkpoint's dtype
    generation_config.json   the EOS ids generation stops on: for a chat model its turn end first
    tokenizer.json, tokenizer_config.json
                             bos/eos/pad strings and the chat template (llmctl's, as Jinja, for a
                             model that speaks it; an imported model's own files otherwise)

The vocabulary is cut to the model's `vocab_size` — the tokenizer's size for a model llmctl
trained — rather than the multiple of 64 the tables are padded to for the matmuls: padding rows
were never trained, and left in they take probability mass at T = 1 (and vLLM rejects ids past
the tokenizer). Cutting, not masking, because a masked row would need a logits processor on every
engine that loads the model; a cut one needs nothing.

A LoRA checkpoint (model/lora.py) exports two ways: `merge=True`, the adapters folded into its
base's weights and written as above; or `export_adapter`, a PEFT adapter folder
(adapter_config.json, adapter_model.safetensors under PEFT's names) that
`peft.PeftModel.from_pretrained` loads over the export of its base.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from llmctl.artifacts.atomic import atomic_path, directory_only, prepare_new_out
from llmctl.artifacts.checkpoint import TOKENIZER_FILES, copy_tokenizer_files, owner_artifact
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, input_ref, output_entry, write_manifest
from llmctl.errors import UsageError
from llmctl.model.hf_layout import hf_config, hf_state_dict
from llmctl.model.load import load_checkpoint
from llmctl.model.lora import LORA_FILE, peft_config, peft_state_dict
from llmctl.tokenizer.vocab import Vocab


def _token(vocab: Vocab, i: int | None) -> str | None:
    return None if i is None else vocab.tok.id_to_token(i)


def tokenizer_config(vocab: Vocab, chat: bool, max_len: int) -> dict:
    """The checkpoint's tokenizer_config.json (an imported model's) or one for llmctl's tokenizer,
    with the EOS of what the model does: a chat model's eos_token is its turn end (lm-eval and vLLM
    stop on eos_token)."""
    cfg = dict(vocab.tok_cfg) or {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
                                  "clean_up_tokenization_spaces": False}
    stops = vocab.stop_ids(chat)
    cfg.update({k: v for k, v in (("bos_token", _token(vocab, vocab.bos_id)), ("eos_token", _token(vocab, stops[0] if stops else None)),
                                  ("pad_token", _token(vocab, vocab.pad_id))) if v is not None})
    if vocab.chat_source is None and vocab.chat is not None:  # llmctl's own template, written as Jinja
        cfg["chat_template"] = vocab.chat.jinja
    return cfg


def export_hf(checkpoint: str | Path, out: Path, overwrite: bool = False, weights: str = "auto", merge: bool = False) -> Path:
    """Write `out` whole or not at all (built under a temporary name, then renamed; locked beside
    it, since a directory holding a lock file could not be renamed onto). `weights`: the
    checkpoint's EMA weights where it has them (auto), or ema / raw (artifacts/checkpoint.py).
    A LoRA checkpoint needs `merge` (its adapters folded into the base's weights)."""
    directory_only(out, "a Hugging Face model")
    if not merge and is_lora(checkpoint):
        raise UsageError(f"{checkpoint}: a LoRA checkpoint; export it with --merge (full weights) or --adapter (a PEFT adapter)")
    with output_lock(out, beside=True):
        return _export_hf(checkpoint, Path(out), overwrite, weights)


def is_lora(checkpoint: str | Path) -> bool:
    from llmctl.artifacts.checkpoint import resolve_checkpoint

    return (resolve_checkpoint(checkpoint) / LORA_FILE).is_file()


def export_adapter(checkpoint: str | Path, out: Path, overwrite: bool = False) -> Path:
    """A LoRA checkpoint's adapters as a PEFT adapter folder, whole or not at all."""
    directory_only(out, "a PEFT adapter")
    if not is_lora(checkpoint):
        raise UsageError(f"{checkpoint}: not a LoRA checkpoint (no {LORA_FILE}); --adapter exports the adapters of a --lora-rank run")
    out = Path(out)
    with output_lock(out, beside=True):
        ck = load_checkpoint(checkpoint, "raw", merged=False)
        prepare_new_out(out, overwrite)
        with atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "adapter_config.json").write_text(json.dumps(peft_config(ck.lora, ck.lora_base["path"]), indent=2) + "\n")
            save_file(peft_state_dict(ck.config, ck.lora, ck.tensors), str(tmp / "adapter_model.safetensors"),
                      metadata={"format": "pt"})
            write_manifest(tmp, Manifest(kind="hf", stage="export", config={"adapter": ck.lora.to_dict(), "base": ck.lora_base},
                                         inputs=[input_ref(owner_artifact(ck.path))],
                                         outputs=[output_entry(f, None, tmp) for f in sorted(tmp.iterdir()) if f.is_file()]))
    return out


def _export_hf(checkpoint: str | Path, out: Path, overwrite: bool, weights: str) -> Path:
    ckpt = load_checkpoint(checkpoint, weights)
    cfg = ckpt.config
    prepare_new_out(out, overwrite)
    chat = bool(ckpt.trainer_state.get("chat"))
    vocab = Vocab(ckpt.path) if ckpt.tokenizer_file is not None else None
    if vocab is not None and vocab.size > cfg.padded_vocab:
        raise UsageError(f"{ckpt.path}: the tokenizer has {vocab.size} ids, the model {cfg.padded_vocab} rows")
    if chat and vocab is None:
        raise UsageError(f"{ckpt.path}: a chat model without tokenizer.json cannot be exported with its template")
    dtype = str(ckpt.tensors["embed.weight"].dtype).removeprefix("torch.")
    hf_cfg = hf_config(cfg, cfg.vocab_size, dtype)
    gen = {}
    if vocab is not None:
        stops = list(vocab.stop_ids(chat))
        gen = {"bos_token_id": vocab.bos_id, "eos_token_id": stops[0] if len(stops) == 1 else stops,
               "pad_token_id": vocab.pad_id}
        hf_cfg.update({k: v for k, v in gen.items() if v is not None and v != []})
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
        save_file(hf_state_dict(cfg, ckpt.tensors, cfg.vocab_size), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if vocab is not None:
            copy_tokenizer_files(vocab.tokenizer_file, tmp)
            (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(vocab, chat, cfg.max_seq_len), indent=2) + "\n")
            gen_cfg = {**json.loads((vocab.folder / "generation_config.json").read_text())} if (vocab.folder / "generation_config.json").is_file() else {}
            gen_cfg.update({k: v for k, v in gen.items() if v is not None})
            (tmp / TOKENIZER_FILES[3]).write_text(json.dumps(gen_cfg, indent=2) + "\n")
        # the manifest marks the folder as llmctl's (a later --overwrite may replace it; a downloaded
        # model in its place it refuses to) and names the checkpoint it came from, for lineage
        write_manifest(tmp, Manifest(kind="hf", stage="export", config={"weights": ckpt.weights},
                                     inputs=[input_ref(owner_artifact(ckpt.path))],
                                     outputs=[output_entry(f, None, tmp) for f in sorted(tmp.iterdir()) if f.is_file()]))
    return out

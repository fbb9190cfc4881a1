"""C4's cleaning rules (Raffel et al. 2020; spec 001-data-eval §A3), as datatrove implements
them: line-level cleaning first, then document-level drops.

Lines are dropped when they hold a word over 1,000 characters, do not end in terminal
punctuation (on by default; off in the FineWeb chain, where it cost ~30% of tokens), have fewer
than 3 words, mention javascript, or mention a cookie/terms-of-use policy. Citation markers
([1], [edit], [citation needed]) are removed. The document is dropped when a kept line says
"lorem ipsum" or holds a curly bracket, or when fewer than 5 sentences remain. The kept lines
become the document's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmctl.data.filters.base import Step
from llmctl.data.filters.doc import Doc, sentence_count, tokenize

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


@dataclass
class C4(Step):
    name = "c4"
    filter_no_terminal_punct: bool = True
    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    remove_citations: bool = True
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True

    def clean(self, text: str) -> tuple[list[str], int, str | None]:
        """(kept lines, sentences in them, the document-level rule that fired or None)."""
        kept: list[str] = []
        sentences = 0
        for line in text.splitlines():
            line = line.strip()
            words = line.split()
            if self.max_word_length >= 0 and any(len(w) > self.max_word_length for w in words):
                continue
            if self.remove_citations:
                line = CITATION.sub("", line)
            if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
                continue
            if len(words) < self.min_words_per_line:
                continue
            low = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in low:
                return kept, sentences, "lorem_ipsum"
            if self.filter_javascript and "javascript" in low:
                continue
            if self.filter_curly_bracket and "{" in line:
                return kept, sentences, "curly_bracket"
            if self.filter_policy and any(p in low for p in POLICY):
                continue
            sentences += sentence_count(tokenize(line))
            kept.append(line)
        return kept, sentences, None

    def checks(self, doc: Doc):
        kept, sentences, fired = self.clean(doc.text)
        yield "lorem_ipsum", float(fired == "lorem_ipsum"), fired != "lorem_ipsum"
        yield "curly_bracket", float(fired == "curly_bracket"), fired != "curly_bracket"
        yield "sentences", sentences, fired is not None or sentences >= self.min_num_sentences
        doc.__dict__["_c4_text"] = "\n".join(kept).strip()

    def transform(self, doc: Doc) -> None:
        cleaned = doc.__dict__.get("_c4_text")
        if cleaned is None:
            cleaned = "\n".join(self.clean(doc.text)[0]).strip()
        doc.replace_text(cleaned)

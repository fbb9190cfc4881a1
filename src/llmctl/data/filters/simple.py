"""Steps that look at one signal each: language, URL, runs of repeated n-grams; and the PII
formatter, which rewrites text instead of dropping documents."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

import numpy as np

from llmctl.data.filters.base import Step
from llmctl.data.filters.doc import Doc
from llmctl.data.urlfilter import UrlFilter
from llmctl.errors import UsageError


@dataclass
class Language(Step):
    """Keep a document whose top language is a target with probability >= threshold (spec §A2,
    FineWeb: en, 0.65). Uses the `lang`/`lang_score` columns crawl-extract writes; documents
    without them (foreign data) are scored with lid.176 here."""

    name = "language"
    languages: list = field(default_factory=lambda: ["en"])
    threshold: float = 0.65
    langid_model: str = ""

    def _lang(self, doc: Doc) -> tuple[str, float]:
        lang, score = doc.row.get("lang"), doc.row.get("lang_score")
        if lang is None or score is None:
            from llmctl.data import langid

            model = langid.load(langid.find_model(self.langid_model or None))
            lang, score = langid.predict(model, [doc.text])[0]
            doc.row["lang"], doc.row["lang_score"] = lang, score
        return lang, float(score)

    def checks(self, doc: Doc):
        lang, score = self._lang(doc)
        yield "lang", float(lang in self.languages), not self.languages or lang in self.languages
        yield "lang_score", score, score >= self.threshold


@dataclass
class Url(Step):
    """The crawl-extract URL filter (domain blocklist, banned URL words) on the `url` column."""

    name = "url"
    blocklist_files: list = field(default_factory=list)
    banned_words_files: list = field(default_factory=list)

    def __post_init__(self):
        self._filter = UrlFilter.from_files(self.blocklist_files, self.banned_words_files)

    def checks(self, doc: Doc):
        url = doc.row.get("url")
        if url is None and "url" not in doc.row:
            raise UsageError("the url step needs a 'url' column")
        blocked = self._filter.blocked(url or "")
        yield "blocked", float(blocked is not None), blocked is None


def max_ngram_repeats(tokens: list[str], max_n: int = 13) -> int:
    """The most consecutive repeats of any 1..max_n token n-gram ("a b a b a b" -> 3 for n=2).

    A run where token i equals token i+n for L positions in a row is a block of period n spanning
    L + n tokens, i.e. (L + n) // n repeats of the n-gram."""
    if not tokens:
        return 0
    _, ids = np.unique(np.asarray(tokens, dtype=object).astype(str), return_inverse=True)
    best = 1
    for n in range(1, min(max_n, len(ids) // 2) + 1):
        eq = ids[:-n] == ids[n:]
        if not eq.any():
            continue
        # longest run of True in eq
        padded = np.concatenate(([0], eq.astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(padded))
        longest = int((edges[1::2] - edges[0::2]).max())
        best = max(best, (longest + n) // n)
    return best


@dataclass
class RepeatedNgrams(Step):
    """OLMo's stability filter (spec §A3, L1276): drop documents with a run of >= 32 repeats of
    any n-gram of 1 to 13 tokens (base64-like strings, "255, 255, 255" runs; linked to loss
    spikes). Tokens here are the shared word split."""

    name = "repeated_ngrams"
    min_repeats: int = 32
    max_n: int = 13

    def checks(self, doc: Doc):
        repeats = max_ngram_repeats(doc.words, self.max_n)
        yield "max_repeats", repeats, repeats < self.min_repeats


EMAIL = re.compile(r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}\b")
IPV4 = re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")


@dataclass
class Pii(Step):
    """Replace e-mail addresses and public IPv4 addresses with placeholders (a formatter: it
    never drops a document). Private, loopback and documentation addresses are left alone."""

    name = "pii"
    emails: bool = True
    ips: bool = True
    email_replacement: str = "email@example.com"
    ip_replacement: str = "192.0.2.1"  # TEST-NET-1, reserved for documentation (RFC 5737)

    def transform(self, doc: Doc) -> None:
        text = doc.text
        if self.emails and "@" in text:
            text = EMAIL.sub(self.email_replacement, text)
        if self.ips:
            text = IPV4.sub(lambda m: self.ip_replacement if ipaddress.ip_address(m.group(0)).is_global else m.group(0), text)
        if text != doc.text:
            doc.replace_text(text)

"""filter side by side with datatrove (DESIGN §7, issue 4).

    make bench-setup
    .venv-bench/bin/python benchmarks/filter.py [--docs DIR] [--repeat N]

One run, one docs artifact, the same cores, interleaved repeats:
  datatrove  ParquetReader -> GopherRepetitionFilter -> GopherQualityFilter
             -> C4QualityFilter(filter_no_terminal_punct=False) -> FineWebQualityFilter -> JsonlWriter
             (default English word tokenizer = spaCy's blank "en"; one exclusion writer per filter)
  llmctl     llmctl filter DOCS -o OUT --config <the same four steps> --workers N --keep-rejected
each with 1 and 2 workers. Both sides run as a child process timed from the outside, so interpreter
start-up and imports count on both sides alike. Then the decisions are compared document by
document (by `id`): kept/dropped, the first failing rule, and the text of kept documents (C4 drops
lines). Every disagreement is listed with the statistic as each side computes it: datatrove's is
recomputed here with datatrove's own helpers and tokenizer, llmctl's with llmctl's own steps.
The tables go to stdout and into benchmarks/RESULTS.md (## filter).

Input: the docs `llmctl crawl-extract` makes from ../shared/data/web/pages-a.warc.gz, unless
--docs names a docs artifact (a folder of part-*.parquet).
"""

from __future__ import annotations

import sys
from pathlib import Path

import argparse
import datetime
import difflib
import glob
import gzip
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile

from common import DEFAULT_WARC, LLMCTL, REPO, cpu_name, datatrove_tasks_with_docs, make_docs, first_difference, pct, read_parts, timed, write_results  # noqa: E402  (benchmarks/common.py)

WORKERS = (1, 2)
STEPS = ("gopher_repetition", "gopher_quality", "c4", "fineweb")

# The llmctl config: the four steps with their defaults (the published thresholds, which are also
# datatrove's defaults), C4 without its terminal-punctuation line rule, as in the FineWeb chain.
LLMCTL_CONFIG = """\
# written by benchmarks/filter.py: datatrove's GopherRepetition -> GopherQuality
# -> C4QualityFilter(filter_no_terminal_punct=False) -> FineWebQuality, default thresholds
[[steps]]
name = "gopher_repetition"

[[steps]]
name = "gopher_quality"

[[steps]]
name = "c4"
filter_no_terminal_punct = false

[[steps]]
name = "fineweb"
"""

# datatrove's drop reasons -> llmctl's statistic names (the `reason` column is "<step>.<statistic>")
DT_REASONS = {
    "gopher_short_doc": "n_words",
    "gopher_long_doc": "n_words",
    "gopher_below_avg_threshold": "avg_word_length",
    "gopher_above_avg_threshold": "avg_word_length",
    "gopher_too_many_hashes": "hash_ratio",
    "gopher_too_many_ellipsis": "ellipsis_ratio",
    "gopher_too_many_bullets": "bullet_lines",
    "gopher_too_many_end_ellipsis": "ellipsis_lines",
    "gopher_below_alpha_threshold": "alpha_words",
    "gopher_enough_stop_words": "stop_words",
    "too_few_sentences": "sentences",
}


def dt_reason(step: str, reason: str | None) -> str:
    """datatrove's filter_reason in llmctl's words: ('gopher_repetition', 'duplicated_5_n_grams')
    -> 'gopher_repetition.dup_5_gram'."""
    reason = reason or "?"
    reason = DT_REASONS.get(reason, reason)
    reason = re.sub(r"^duplicated_(\d+)_n_grams$", r"dup_\1_gram", reason)
    return f"{step}.{reason}"


# ---------------------------------------------------------------------------------------------
# input



# ---------------------------------------------------------------------------------------------
# datatrove side


def datatrove_pipeline(docs: str, out: str) -> list:
    """The pipeline a datatrove user writes for this job: its filters with their defaults."""
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import JsonlWriter

    def excluded(step):  # dropped docs, with metadata["filter_reason"], one folder per filter
        return JsonlWriter(os.path.join(out, "excluded", step))

    return [
        ParquetReader(docs, glob_pattern="part-*.parquet", recursive=False, text_key="text", id_key="id"),
        GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition")),
        GopherQualityFilter(exclusion_writer=excluded("gopher_quality")),
        C4QualityFilter(filter_no_terminal_punct=False, exclusion_writer=excluded("c4")),
        FineWebQualityFilter(exclusion_writer=excluded("fineweb")),
        JsonlWriter(os.path.join(out, "output")),
    ]


def datatrove_child(docs: str, out: str, workers: int) -> None:
    """Runs inside the timed child process."""
    from datatrove.executor import LocalPipelineExecutor

    # a user asking for N workers gives N tasks; datatrove shares the part files out among the tasks
    LocalPipelineExecutor(datatrove_pipeline(docs, out), tasks=workers, workers=workers, logging_dir=os.path.join(out, "logs")).run()


def run_datatrove(docs: str, out: str, workers: int, env: dict) -> float:
    cmd = [sys.executable, __file__, "--datatrove-child", docs, out, str(workers)]
    return timed(cmd, env, out + ".log")


def read_jsonl(pattern: str):
    for path in sorted(glob.glob(pattern)):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)


def read_datatrove(out: str) -> dict[str, dict]:
    """id -> {kept, reason, text}: kept docs from output/, dropped ones from each filter's exclusions."""
    res = {}
    for d in read_jsonl(os.path.join(out, "output", "*.jsonl.gz")):
        res[d["id"]] = dict(kept=True, reason=None, text=d["text"])
    for step in STEPS:
        for d in read_jsonl(os.path.join(out, "excluded", step, "*.jsonl.gz")):
            res[d["id"]] = dict(kept=False, reason=dt_reason(step, d["metadata"].get("filter_reason")), text=d["text"])
    return res



# ---------------------------------------------------------------------------------------------
# llmctl side


def run_llmctl(docs: str, out: str, workers: int, env: dict) -> float:
    cmd = [str(LLMCTL), "filter", docs, "-o", out, "--config", env["BENCH_FILTER_CONFIG"], "--workers", str(workers),
           "--keep-rejected", "--overwrite", "--quiet", "--json"]  # fmt: skip
    return timed(cmd, env, out + ".log")


def read_llmctl(out: str) -> dict[str, dict]:
    res = {}
    for r in read_parts(out):
        res[r["id"]] = dict(kept=True, reason=None, text=r["text"])
    for r in read_parts(os.path.join(out, "rejected")):
        res[r["id"]] = dict(kept=False, reason=r.get("reason"), text=r["text"])
    return res


# ---------------------------------------------------------------------------------------------
# timing


def measure(docs: str, repeat: int, tmp: str, tools: tuple[str, ...]) -> tuple[dict, dict]:
    """Median seconds per (tool, workers); runs interleaved so drift in machine load hits all alike.
    Returns (seconds, output dir of the last run) keyed by (tool, workers)."""
    config = os.path.join(tmp, "filter.toml")
    Path(config).write_text(LLMCTL_CONFIG)
    runners = {"datatrove": run_datatrove, "llmctl": run_llmctl}
    envs = {"datatrove": dict(os.environ, HF_HUB_OFFLINE="1"), "llmctl": dict(os.environ, BENCH_FILTER_CONFIG=config)}
    times, outs = {}, {}
    for r in range(repeat):
        for workers in WORKERS:
            for tool in tools:
                out = os.path.join(tmp, f"{tool}-w{workers}-r{r}")
                sec = runners[tool](docs, out, workers, envs[tool])
                times.setdefault((tool, workers), []).append(sec)
                if (tool, workers) in outs and outs[(tool, workers)] != out:
                    shutil.rmtree(outs[(tool, workers)], ignore_errors=True)  # keep only the last output
                outs[(tool, workers)] = out
                print(f"  run {r + 1}/{repeat}  {tool:9s} workers={workers}  {sec:6.2f} s", file=sys.stderr)
    return {k: statistics.median(v) for k, v in times.items()}, outs


# ---------------------------------------------------------------------------------------------
# the statistics, as each side computes them (for the agreement check and the explanations)


def nan_ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


class DatatroveStats:
    """datatrove's statistics for one document, computed with datatrove's own helpers and filter
    objects (their thresholds), in the order its filters test them, without stopping at the first
    failure. Yields (step, statistic, value, passes, condition). `c4_text` is the text C4 leaves.

    This mirrors the filter() methods of datatrove 0.10.1; `check_reproduces` verifies it against the
    reasons datatrove's own run gave, document by document."""

    def __init__(self):
        from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

        self.rep = GopherRepetitionFilter()
        self.qual = GopherQualityFilter()
        self.c4 = C4QualityFilter(filter_no_terminal_punct=False)
        self.fw = FineWebQualityFilter()
        self._words: dict[str, list[str]] = {}

    def words(self, text: str) -> list[str]:
        from datatrove.utils.text import split_into_words

        if text not in self._words:
            if len(self._words) > 64:
                self._words.clear()
            self._words[text] = split_into_words(text, self.rep.language)
        return self._words[text]

    def sentences(self, line: str) -> int:
        from datatrove.utils.text import split_into_sentences

        return len(split_into_sentences(line, self.c4.language))

    def chain(self, text: str):
        """All steps' statistics, each step on the text the previous ones leave (C4 rewrites it)."""
        out = list(self.gopher_repetition(text)) + list(self.gopher_quality(text))
        c4 = list(self.c4_stats(text))
        out += [s[:5] for s in c4]
        c4_ok = all(s[3] for s in c4)
        self.c4_text = c4[-1][5] if c4_ok else text
        out += list(self.fineweb(self.c4_text))
        return out

    def gopher_repetition(self, text: str):
        from datatrove.pipeline.filters.gopher_repetition_filter import find_all_duplicate, find_duplicates, find_top_duplicate, get_n_grams

        f, s = self.rep, "gopher_repetition"
        yield s, "empty", float(not text), bool(text), "text not empty"
        if not text:
            return
        paragraphs = f.paragraph_exp.split(text.strip())
        n, chars = find_duplicates(paragraphs)
        yield s, "dup_para_frac", n / len(paragraphs), not n / len(paragraphs) > f.dup_para_frac, f"≤ {f.dup_para_frac}"
        yield s, "dup_para_char_frac", chars / len(text), not chars / len(text) > f.dup_para_char_frac, f"≤ {f.dup_para_char_frac}"
        lines = f._line_splitter.split(text)
        n, chars = find_duplicates(lines)
        yield s, "dup_line_frac", n / len(lines), not n / len(lines) > f.dup_line_frac, f"≤ {f.dup_line_frac}"
        yield s, "dup_line_char_frac", chars / len(text), not chars / len(text) > f.dup_line_char_frac, f"≤ {f.dup_line_char_frac}"
        words = self.words(text)
        for n, frac in f.top_n_grams:
            grams = get_n_grams(words, n)
            v = find_top_duplicate(grams) / len(text) if grams else 0.0
            yield s, f"top_{n}_gram", v, not v > frac, f"≤ {frac}"
        for n, frac in f.dup_n_grams:
            v = find_all_duplicate(words, n) / len(text)
            yield s, f"dup_{n}_gram", v, not v > frac, f"≤ {frac}"

    def gopher_quality(self, text: str):
        from datatrove.utils.text import PUNCTUATION_SET

        f, s = self.qual, "gopher_quality"
        words = self.words(text)
        n_words = len(words)
        content = [w for w in words if any(ch not in PUNCTUATION_SET for ch in w)]
        n = len(content)
        yield s, "n_words", n, not n < f.min_doc_words, f"≥ {f.min_doc_words}"
        yield s, "n_words", n, not n > f.max_doc_words, f"≤ {f.max_doc_words}"
        avg = nan_ratio(sum(map(len, content)), n)
        yield s, "avg_word_length", avg, not avg < f.min_avg_word_length, f"≥ {f.min_avg_word_length}"
        yield s, "avg_word_length", avg, not avg > f.max_avg_word_length, f"≤ {f.max_avg_word_length}"
        v = nan_ratio(text.count("#"), n_words)
        yield s, "hash_ratio", v, not v > f.max_symbol_word_ratio, f"≤ {f.max_symbol_word_ratio}"
        v = nan_ratio(text.count("...") + text.count("…"), n_words)
        yield s, "ellipsis_ratio", v, not v > f.max_symbol_word_ratio, f"≤ {f.max_symbol_word_ratio}"
        lines = text.splitlines()
        v = nan_ratio(sum(ln.lstrip().startswith("•") or ln.lstrip().startswith("-") for ln in lines), len(lines))
        yield s, "bullet_lines", v, not v > f.max_bullet_lines_ratio, f"≤ {f.max_bullet_lines_ratio}"
        v = nan_ratio(sum(ln.rstrip().endswith("...") or ln.rstrip().endswith("…") for ln in lines), len(lines))
        yield s, "ellipsis_lines", v, not v > f.max_ellipsis_lines_ratio, f"≤ {f.max_ellipsis_lines_ratio}"
        v = nan_ratio(sum(any(c.isalpha() for c in w) for w in words), n_words)
        yield s, "alpha_words", v, not v < f.max_non_alpha_words_ratio, f"≥ {f.max_non_alpha_words_ratio}"
        v = len(f.stop_words.intersection(set(words)))
        yield s, "stop_words", v, not v < f.min_stop_words, f"≥ {f.min_stop_words}"

    def c4_lines(self, text: str) -> list[tuple[str, str, int]]:
        """C4QualityFilter's line loop: (line, what happened to it, its sentences if kept)."""
        from datatrove.pipeline.filters.c4_filters import CITATION_REGEX, POLICY_SUBSTRINGS

        f, res = self.c4, []
        for line in text.splitlines():
            line = line.strip()
            words = line.split()
            if f.max_word_length != -1 and any(len(w) > f.max_word_length for w in words):
                res.append((line, "too_long_word", 0))
                continue
            if f.remove_citations:
                line = CITATION_REGEX.sub("", line)
            assert not f.filter_no_terminal_punct
            if len(words) < f.min_words_per_line:
                res.append((line, "too_few_words", 0))
                continue
            low = line.lower()
            if f.filter_lorem_ipsum and "lorem ipsum" in low:
                res.append((line, "lorem_ipsum", 0))  # drops the document
                continue
            if f.filter_javascript and "javascript" in low:
                res.append((line, "javascript", 0))
                continue
            if f.filter_curly_bracket and "{" in line:
                res.append((line, "curly_bracket", 0))  # drops the document
                continue
            if f.filter_policy and any(p in low for p in POLICY_SUBSTRINGS):
                res.append((line, "policy", 0))
                continue
            res.append((line, "kept", self.sentences(line)))
        return res

    def c4_stats(self, text: str):
        """(step, statistic, value, passes, condition, cleaned text): the document-level drops in the
        order the line loop meets them, then the sentence count."""
        f, s = self.c4, "c4"
        lines = self.c4_lines(text)
        doc_drops = [what for _, what, _ in lines if what in ("lorem_ipsum", "curly_bracket")]
        sents = sum(n for _, what, n in lines if what == "kept")
        cleaned = "\n".join(ln for ln, what, _ in lines if what == "kept").strip()
        order = list(dict.fromkeys(doc_drops)) + [x for x in ("lorem_ipsum", "curly_bracket") if x not in doc_drops]
        for what in order:
            yield s, what, float(what in doc_drops), what not in doc_drops, "absent", cleaned
        yield s, "sentences", sents, not sents < f.min_num_sentences, f"≥ {f.min_num_sentences}", cleaned

    def fineweb(self, text: str):
        from datatrove.pipeline.filters.gopher_repetition_filter import find_duplicates

        f, s = self.fw, "fineweb"
        lines = [ln for ln in text.split("\n") if ln.strip() != ""]
        yield s, "empty", float(not lines), bool(lines), "a non-blank line"
        if not lines:
            return
        v = sum(1 for ln in lines if ln.endswith(f.stop_chars)) / len(lines)
        yield s, "line_punct_ratio", v, not v < f.line_punct_thr, f"≥ {f.line_punct_thr}"
        v = sum(1 for ln in lines if len(ln) <= f.short_line_length) / len(lines)
        yield s, "short_line_ratio", v, not v > f.short_line_threshold, f"≤ {f.short_line_threshold}"
        v = find_duplicates(lines)[1] / len(text.replace("\n", ""))
        yield s, "char_dup_ratio", v, not v > f.char_duplicates_ratio, f"≤ {f.char_duplicates_ratio}"
        v = nan_ratio(text.count("\n"), len(self.words(text)))
        yield s, "list_ratio", v, not v > f.new_line_ratio, f"≤ {f.new_line_ratio}"


def first_failure(stats) -> str | None:
    return next((f"{s[0]}.{s[1]}" for s in stats if not s[3]), None)


class LlmctlStats:
    """llmctl's statistics for one document, from its own filter steps (the `llmctl.data.filters`
    API: build_step / all_stats / transform), run in the benchmark's process."""

    def __init__(self, config: str):
        import importlib
        import pkgutil
        import tomllib

        import llmctl.data.filters as pkg

        for m in pkgutil.iter_modules(pkg.__path__):  # the modules register their steps on import
            importlib.import_module(f"{pkg.__name__}.{m.name}")
        from llmctl.data.filters import base, doc

        self.base, self.doc_mod = base, doc
        self.steps = [base.build_step(spec) for spec in tomllib.loads(config)["steps"]]

    def words(self, text: str) -> list[str]:
        return self.doc_mod.Doc(text).words

    def chain(self, text: str) -> tuple[dict, str | None, str]:
        """({(step, statistic): value}, first failure, text after the steps that passed);
        `self.passes` gets {(step, statistic): passes} (every step runs, as in DatatroveStats)."""
        doc = self.doc_mod.Doc(text)
        stats, first, self.passes = {}, None, {}
        for step in self.steps:
            failed = None
            for stat, value, ok in step.checks(doc):  # what base.all_stats drains
                stats[(step.name, stat)] = float(value)
                self.passes[(step.name, stat)] = self.passes.get((step.name, stat), True) and bool(ok)
                if not ok and failed is None:
                    failed = stat
            if failed:
                first = first or f"{step.name}.{failed}"
            else:
                step.transform(doc)
        return stats, first, doc.text


# ---------------------------------------------------------------------------------------------
# agreement



def decision(r: dict | None) -> str:
    if r is None:
        return "missing"
    return "kept" if r["kept"] else f"dropped `{r['reason']}`"


def fmt(v) -> str:
    if v is None:
        return "?"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4f}".rstrip("0").rstrip(".") if v != int(v) or abs(v) < 1 else f"{int(v)}"
    return str(v)


def token_diff(a: list[str], b: list[str], limit: int = 6) -> str:
    """The first few places where two tokenizations differ: spaCy ['do', "n't"] / llmctl ["don't"]."""
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out, n = [], 0
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        n += 1
        if len(out) < limit:
            out.append(f"{[x[:40] for x in a[i1:i2][:4]]!r}→{[x[:40] for x in b[j1:j2][:4]]!r}")
    more = f" (+{n - limit} more)" if n > limit else ""
    return "; ".join(out) + more if out else "same tokens"


def short_diff(a: str, b: str, width: int = 120, before: int = 40) -> str:
    d = first_difference(a, b, width, before)
    return f"datatrove {d[0]!r} / llmctl {d[1]!r}" if d else "(equal)"


WORD_STATS = {"n_words", "avg_word_length", "hash_ratio", "ellipsis_ratio", "alpha_words", "stop_words", "list_ratio"}


def explain(text: str, dts: DatatroveStats, lls: LlmctlStats | None, dt_r: dict, ll_r: dict) -> list[str]:
    """Concrete reasons for one disagreement: each disputed statistic on both sides, with the
    threshold, and where the two tokenizations (or sentence counts, or C4 lines) differ."""
    dt_stats = dts.chain(text)
    dt_c4_text = dts.c4_text
    ll_stats, ll_first, ll_text = ({}, None, None)
    if lls is not None:
        try:
            ll_stats, ll_first, ll_text = lls.chain(text)
        except Exception as e:  # the llmctl API moved: still report the decisions
            ll_stats = {("error", repr(e)): None}
    disputed = [r for r in (dt_r.get("reason"), ll_r.get("reason")) if r]  # none: both kept, texts differ
    lines, shown = [], set()
    for reason in dict.fromkeys(disputed):
        step, stat = reason.split(".", 1)
        dt_vals = [s for s in dt_stats if s[0] == step and s[1] == stat]
        dt_v = dt_vals[0][2] if dt_vals else None
        cond = " and ".join(dict.fromkeys(s[4] for s in dt_vals)) if dt_vals else "?"
        ll_v = ll_stats.get((step, stat))
        lines.append(f"`{reason}` ({cond}): datatrove {fmt(dt_v)}, llmctl {fmt(ll_v)}")
        the_text = dt_c4_text if step == "fineweb" else text
        if (stat in WORD_STATS or stat.startswith(("top_", "dup_")) and stat.endswith("_gram")) and the_text not in shown:
            shown.add(the_text)
            a, b = dts.words(the_text), (lls.words(the_text) if lls else [])
            lines.append(f"words: spaCy {len(a)}, llmctl {len(b)}; {token_diff(a, b)}")
        if stat == "sentences" and lls is not None:
            lines += sentence_diff(text, dts, lls)
    if dt_r["kept"] and ll_r["kept"] and dt_r["text"] != ll_r["text"]:
        lines.append("text after C4: " + short_diff(dt_r["text"], ll_r["text"]))
        dropped = {ln for ln, what, _ in dts.c4_lines(text) if what != "kept"}
        only_ll = [ln for ln in dt_r["text"].split("\n") if ln not in set(ll_r["text"].split("\n"))]
        only_dt = [ln for ln in ll_r["text"].split("\n") if ln not in set(dt_r["text"].split("\n"))]
        for ln in only_ll[:3]:
            lines.append(f"line only llmctl drops: {ln[:100]!r}")
        for ln in only_dt[:3]:
            why = next((what for l2, what, _ in dts.c4_lines(text) if l2 == ln), "?") if ln in dropped else "?"
            lines.append(f"line only datatrove drops ({why}): {ln[:100]!r}")
    if ll_text is not None and ll_first != ll_r.get("reason"):  # the harness and the CLI disagree
        lines.append(f"(llmctl's Python steps give {ll_first}, its CLI {ll_r.get('reason')})")
    return lines


def sentence_diff(text: str, dts: DatatroveStats, lls: LlmctlStats, limit: int = 4) -> list[str]:
    """Lines C4 keeps whose sentence count differs: spaCy's sentencizer vs llmctl's count."""
    count = getattr(lls.doc_mod, "sentence_count", None)
    if count is None:
        return []
    out, n = [], 0
    for line, what, dt_n in dts.c4_lines(text):
        if what != "kept":
            continue
        ll_n = count(lls.doc_mod.Doc(line).words)
        if ll_n != dt_n:
            n += 1
            if len(out) < limit:
                out.append(f"line sentences spaCy {dt_n} / llmctl {ll_n}: {line[:100]!r}")
    return out + ([f"(+{n - limit} more lines)"] if n > limit else [])


def check_reproduces(inputs: list[dict], dt: dict, dts: DatatroveStats, lls: LlmctlStats | None):
    """Does DatatroveStats give the reason (and C4 text) datatrove's own run gave, for every doc?
    On the way, compares the two word splits on every input text (spaCy's vs llmctl's)."""
    from collections import Counter

    good, bad = 0, []
    tok = dict(same=0, docs=0, spacy=0, llmctl=0, diffs=Counter(), rules={})
    rules = tok["rules"]  # (step, statistic) -> [datatrove fails, llmctl fails, differ, examples]
    for row in inputs:
        r = dt.get(row["id"])
        if r is None:
            continue
        stats = dts.chain(row["text"])
        if lls is not None:
            dt_pass = {}
            for st in stats:
                dt_pass[(st[0], st[1])] = dt_pass.get((st[0], st[1]), True) and st[3]
            dt_val = {(st[0], st[1]): st[2] for st in stats}
            try:
                ll_val = lls.chain(row["text"])[0]
                for key in dict.fromkeys(list(dt_pass) + list(lls.passes)):
                    a, b = dt_pass.get(key), lls.passes.get(key)
                    rules.setdefault(key, [0, 0, 0, [], 0, 0])
                    rules[key][0] += a is False
                    rules[key][1] += b is False
                    dv, lv = dt_val.get(key), ll_val.get(key)
                    if dv is not None and lv is not None:
                        rules[key][5] += 1
                        rules[key][4] += (math.isnan(dv) and math.isnan(lv)) or math.isclose(dv, lv, rel_tol=1e-9, abs_tol=1e-12)
                    if a != b:
                        rules[key][2] += 1
                        rules[key][3].append((row["id"], dt_val.get(key), ll_val.get(key), a, b))
            except Exception as e:
                print(f"llmctl statistics failed on {row['id']}: {e!r}", file=sys.stderr)
            a, b = dts.words(row["text"]), lls.words(row["text"])
            tok["docs"] += 1
            tok["same"] += a == b
            tok["spacy"] += len(a)
            tok["llmctl"] += len(b)
            if a != b:
                for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
                    if op != "equal":
                        tok["diffs"][(tuple(x[:40] for x in a[i1:i2][:4]), tuple(x[:40] for x in b[j1:j2][:4]))] += 1
        first = first_failure(stats)
        ok = first == r["reason"] and (not r["kept"] or dts.c4_text == r["text"])
        good += ok
        if not ok:
            bad.append(f"{row['id']}: datatrove {r['reason']}, recomputed {first}")
    return good, len(inputs), bad, tok


def agreement(inputs: list[dict], dt: dict, dt2: dict, llm: dict | None, llm2: dict | None, config: str):
    """The checks table, the per-step funnel and every disagreement (llmctl 1 worker vs datatrove 1)."""
    from collections import Counter

    ids = [r["id"] for r in inputs]
    text = {r["id"]: r["text"] for r in inputs}
    url = {r["id"]: r.get("url", "") for r in inputs}
    dts = DatatroveStats()
    lls = None
    if llm is not None:
        try:
            lls = LlmctlStats(config)
        except Exception as e:  # llmctl's Python API is not there (yet): decisions only
            print(f"llmctl statistics unavailable: {e!r}", file=sys.stderr)
    good, total, bad, tok = check_reproduces(inputs, dt, dts, lls)
    n = {
        "input docs": str(len(ids)),
        "datatrove: kept / dropped": f"{sum(dt[i]['kept'] for i in ids if i in dt)} / {sum(not dt[i]['kept'] for i in ids if i in dt)}",
        "datatrove 1 vs 2 workers: same decision, reason, text": pct(sum(dt.get(i) == dt2.get(i) for i in ids), len(ids)),
        "datatrove's reasons reproduced by this script's recomputation": pct(good, total),
    }
    funnel = Counter((r["reason"] or "kept").split(".")[0] for r in dt.values())
    funnel_ll = Counter()
    disagreements = []
    if llm is not None:
        both_drop = [i for i in ids if i in dt and i in llm and not dt[i]["kept"] and not llm[i]["kept"]]
        both_keep = [i for i in ids if i in dt and i in llm and dt[i]["kept"] and llm[i]["kept"]]
        funnel_ll = Counter((r["reason"] or "kept").split(".")[0] for r in llm.values())
        n |= {
            "llmctl: kept / dropped": f"{sum(llm[i]['kept'] for i in ids if i in llm)} / {sum(not llm[i]['kept'] for i in ids if i in llm)}",
            "llmctl docs missing from its output": str(sum(i not in llm for i in ids)),
            "llmctl 1 vs 2 workers: same decision, reason, text": pct(sum(llm.get(i) == llm2.get(i) for i in ids), len(ids)),
            "**kept/dropped agreement**": "**" + pct(sum(i in llm and llm[i]["kept"] == dt[i]["kept"] for i in ids), len(ids)) + "**",
            "**same first failing rule** (both drop)": "**" + pct(sum(llm[i]["reason"] == dt[i]["reason"] for i in both_drop), len(both_drop)) + "**",
            "same step (both drop)": pct(sum(llm[i]["reason"].split(".")[0] == dt[i]["reason"].split(".")[0] for i in both_drop), len(both_drop)),
            "**identical text** (both keep; C4 line cleaning)": "**" + pct(sum(llm[i]["text"] == dt[i]["text"] for i in both_keep), len(both_keep)) + "**",
        }
        for i in ids:
            a, b = dt.get(i), llm.get(i)
            # the same decision and reason, and for kept docs the same text (a dropped doc's text is
            # whatever the step saw, which each tool may store differently)
            if a and b and a["kept"] == b["kept"] and a["reason"] == b["reason"] and (not a["kept"] or a["text"] == b["text"]):
                continue
            if b is None:
                disagreements.append((i, url[i], a, b, ["missing from llmctl's output"]))
                continue
            try:
                why = explain(text[i], dts, lls, a, b)
            except Exception as e:
                why = [f"(could not explain: {e!r})"]
            disagreements.append((i, url[i], a, b, why))
    if tok["docs"]:
        n["words: same split as spaCy (input texts)"] = pct(tok["same"], tok["docs"])
        n["words: spaCy / llmctl, all input texts"] = f"{tok['spacy']} / {tok['llmctl']} ({100 * (tok['llmctl'] / tok['spacy'] - 1):+.2f}%)"
    steps = list(STEPS) + ["kept"]
    funnel_md = ["| step | datatrove drops | llmctl drops |", "|---|---|---|"]
    funnel_md += [f"| {s} | {funnel[s]} | {funnel_ll[s] if llm is not None else '-'} |" for s in steps]
    if bad:
        disagreements.append(("(harness)", "", None, None, ["recomputation differs from datatrove's run:"] + bad[:10]))
    if tok["rules"]:
        head = ("Rule by rule: every step on every input document (not only those the chain lets through), "
                "so rules that the chain rarely reaches are compared too; C4's output feeds FineWeb's rules "
                "where C4 passes. *Same value*: the statistic itself is equal on both sides.\n\n"
                "| rule | datatrove fails | llmctl fails | pass/fail differs | same value |\n|---|---|---|---|---|")
        rows_md = [f"| `{s}.{r}` | {v[0]} | {v[1]} | {'**' + str(v[2]) + '**' if v[2] else 0} | {pct(v[4], v[5])} |"
                   for (s, r), v in tok["rules"].items() if any(v[:3]) or v[4] != v[5]]
        never = [f"`{s}.{r}`" for (s, r), v in tok["rules"].items() if not (any(v[:3]) or v[4] != v[5])]
        if never:
            rows_md.append(f"\nNo document fails, on either side, and the value is the same everywhere: {', '.join(never)}.")
        ex = []
        for (s, r), v in tok["rules"].items():
            for i, dv, lv, a, b in v[3][:3]:
                ex.append(f"{s}.{r}  {i} {url[i][:90]}: datatrove {fmt(dv)} ({'pass' if a else 'fail' if a is False else '-'}), "
                          f"llmctl {fmt(lv)} ({'pass' if b else 'fail' if b is False else '-'})")
            if len(v[3]) > 3:
                ex.append(f"{s}.{r}  (+{len(v[3]) - 3} more)")
        funnel_md = funnel_md + ["", head] + rows_md
        if ex:
            funnel_md += ["", "Rule-by-rule differences (first 3 per rule):", "", "```"] + ex + ["```"]
    tok_md = ""
    if tok["diffs"]:
        tok_md = "Most frequent word-split differences on the input texts (spaCy → llmctl, occurrences):\n\n```\n"
        tok_md += "\n".join(f"{v:4d}  {list(a)!r} → {list(b)!r}" for (a, b), v in tok["diffs"].most_common(12)) + "\n```\n"
    return n, "\n".join(funnel_md), disagreements, tok_md


def disagreement_md(disagreements) -> str:
    kinds = {}
    for i, u, a, b, _ in disagreements:
        key = f"datatrove {decision(a).replace('`', '')} / llmctl {decision(b).replace('`', '')}"
        kinds[key] = kinds.get(key, 0) + 1
    out = [f"Every disagreement ({len(disagreements)}):", ""]
    if len(kinds) > 1:
        out += ["| datatrove / llmctl | docs |", "|---|---|"] + [f"| {k} | {v} |" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])] + [""]
    for i, u, a, b, why in disagreements:
        out.append(f"- `{i}` {u}  \n  datatrove: {decision(a)}; llmctl: {decision(b)}")
        out += [f"  - {w}" for w in why]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# report



def versions() -> dict:
    from importlib.metadata import version

    llm = subprocess.run([str(LLMCTL), "--version"], capture_output=True, text=True).stdout.strip()
    return {"datatrove": version("datatrove"), "spacy": version("spacy"), "llmctl": llm or f"llmctl {version('llmctl')}"}


def table(times: dict, docs: int, dt_tasks: dict) -> str:
    lines = ["| workers | datatrove docs/s | llmctl docs/s | llmctl / datatrove | datatrove tasks with input |", "|---|---|---|---|---|"]
    for w in WORKERS:
        dt = docs / times[("datatrove", w)]
        if ("llmctl", w) in times:
            lm = docs / times[("llmctl", w)]
            lines.append(f"| {w} | {dt:.1f} | {lm:.1f} | **{lm / dt:.2f}×** | {dt_tasks[w]} |")
        else:
            lines.append(f"| {w} | {dt:.1f} | - | - | {dt_tasks[w]} |")
    return "\n".join(lines)



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", help="a docs artifact (default: crawl-extract of pages-a.warc.gz, made once)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--datatrove-only", action="store_true", help="test the harness without llmctl filter (datatrove vs itself)")
    ap.add_argument("--workdir", help="keep every output here (default: a temporary folder, removed)")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not update RESULTS.md")
    ap.add_argument("--datatrove-child", nargs=3, metavar=("DOCS", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.datatrove_child:
        docs, out, workers = args.datatrove_child
        return datatrove_child(docs, out, int(workers))

    load_before = os.getloadavg()[0]  # the machines are shared: say how busy this one was
    tmp_obj = None if args.workdir else tempfile.TemporaryDirectory(prefix="bench-filter-")
    tmp = args.workdir or tmp_obj.name
    os.makedirs(tmp, exist_ok=True)
    try:
        docs = os.path.abspath(args.docs) if args.docs else make_docs(tmp)
        inputs = read_parts(docs)
        tools = ("datatrove",) if args.datatrove_only else ("datatrove", "llmctl")
        print(f"timing on {docs} ({len(inputs)} docs), {args.repeat} repeats", file=sys.stderr)
        times, outs = measure(docs, args.repeat, tmp, tools)
        dt, dt2 = read_datatrove(outs[("datatrove", 1)]), read_datatrove(outs[("datatrove", 2)])
        dt_tasks = {w: datatrove_tasks_with_docs(outs[("datatrove", w)], "Parquet") for w in WORKERS}
        if args.datatrove_only:  # the harness against itself: datatrove 2 workers plays llmctl
            llm, llm2 = dt2, dt
        else:
            llm, llm2 = read_llmctl(outs[("llmctl", 1)]), read_llmctl(outs[("llmctl", 2)])
        print("checking agreement", file=sys.stderr)
        agree, funnel, disagreements, tok_md = agreement(inputs, dt, dt2, llm, llm2, LLMCTL_CONFIG)
    finally:
        if tmp_obj:
            tmp_obj.cleanup()

    load_after = os.getloadavg()[0]
    speed = table(times, len(inputs), dt_tasks)
    agree_md = "\n".join(["| check | result |", "|---|---|"] + [f"| {k} | {v} |" for k, v in agree.items()])
    v = versions()
    cmd = " ".join([".venv-bench/bin/python", "benchmarks/filter.py"] + sys.argv[1:])
    src = f"`llmctl crawl-extract {os.path.relpath(DEFAULT_WARC, REPO)}`"
    if args.docs:
        src = f"`{os.path.relpath(docs, REPO) if Path(docs).is_relative_to(REPO.parent) else docs}`"
    config = "\n".join(ln for ln in LLMCTL_CONFIG.splitlines() if not ln.startswith("#"))
    section = f"""## filter

`{cmd}` — {datetime.date.today()}, `nproc` = {len(os.sched_getaffinity(0))} ({cpu_name()}),
input: the {len(inputs)} docs of {src}, median of {args.repeat} interleaved runs, wall clock per whole
process, 1-min load average {load_before:.2f} before / {load_after:.2f} after.
datatrove {v['datatrove']} (spaCy {v['spacy']} blank `en` tokenizer), {v['llmctl']}.
datatrove: `ParquetReader → GopherRepetitionFilter() → GopherQualityFilter() →
C4QualityFilter(filter_no_terminal_punct=False) → FineWebQualityFilter() → JsonlWriter`, an exclusion
writer on each filter; llmctl: `llmctl filter DOCS -o OUT --config filter.toml --workers N --keep-rejected`
with

```toml
{config.strip()}
```

{speed}

{agree_md}

{funnel}

"""
    if tok_md:
        section += tok_md + "\n"
    if args.datatrove_only:
        section = section.replace("| llmctl", "| datatrove (2 workers)")
    section += disagreement_md(disagreements) if disagreements else "No disagreements.\n"
    print(section)
    if not args.no_write:
        write_results("filter", section)


if __name__ == "__main__":
    main()

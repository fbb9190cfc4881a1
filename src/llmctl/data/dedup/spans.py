"""dedup's span phases: what --substring and --sentences cut from the documents that survived
document-level dedup, and how the filter phase applies it.

They run after the clusters phase (the documented order: URL, exact, MinHash, then spans), so a
document removed whole is never a span's first occurrence. Each phase is a set of resumable tasks
whose files live under OUT/_work/:

  substring   units/NNNNN  one task per source (references first): each surviving document's
                           units (substring.py) -> layout.npz: the shard plan under --memory
              repeats/A-B  one task per shard pair: later copies in shard B (substring.py)
              cuts/NNNNN   one task per input file: its cut byte ranges, row by row
  sentences   windows/NNNNN  one task per source: the n-sentence window keys (sentences.py)
              sentdup.npz    every window seen in an earlier document

The filter phase's SpanCuts gives, per row, the UTF-8 byte ranges to cut (removed_spans), cuts
them (or, --annotate-only, only marks them) and drops a document left under --min-doc-words.
Document numbers are global and in input order, so every worker count gives the same result.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmctl.artifacts.docs import DocsSource, read_source
from llmctl.data.dedup import substring
from llmctl.data.dedup.workfiles import save_npy, save_npz
from llmctl.runtime.executor import Task, run_tasks

SPANS_TYPE = pa.list_(pa.list_(pa.int64(), 2))  # [[start, end], ...] UTF-8 byte offsets in the text as read
LENGTH_BUCKETS = (100, 1_000, 10_000)  # bytes: the span table's buckets
TOP_SPANS = 20


def _sentences():
    """sentences.py, imported when a sentence method runs (it loads the word splitter's rule tables)."""
    from llmctl.data.dedup import sentences

    return sentences


def _surviving_texts(source: DocsSource, removed_by: np.ndarray | None):
    """(row, text) of each document a span method sees, rows numbered as the sign and filter
    phases number them (empty and damaged rows left out the same way)."""
    row = 0
    for batch in read_source(source, skip_empty=True):
        for text in batch.column("text").to_pylist():
            if removed_by is None or not removed_by[row]:
                yield row, text or ""
            row += 1


def _removed_by(work: Path, index: int | None) -> np.ndarray | None:
    if index is None:  # a reference file: nothing of it was deduplicated, all of it is seen
        return None
    with np.load(work / "clusters" / f"{index:05d}.npz") as z:
        return z["removed_by"]


@dataclass
class UnitSource:
    """A file the span phases read: a reference (input None) or an input file (its index)."""

    source: dict
    input: int | None


# ---------------------------------------------------------------------------------------------
# substring


@dataclass
class _Units:
    work: Path
    unit: str
    sources: list[UnitSource]

    def __call__(self, task: Task, report) -> dict:
        meta = self.work / "units" / f"{task.index:05d}.npz"
        if not meta.exists():
            src = self.sources[task.index]
            rows, texts = [], []
            for row, text in _surviving_texts(DocsSource(**src.source), _removed_by(self.work, src.input)):
                rows.append(row)
                texts.append(text)
            enc = substring.encode(texts, self.unit)
            save_npy(self.work / "units" / f"{task.index:05d}.units.npy", enc.pop("units"))
            save_npz(meta, rows=np.array(rows, dtype=np.int64), **enc)
        report(task.weight)
        return {}


def _load_units(work: Path, k: int) -> tuple[np.ndarray, dict]:
    units = np.load(work / "units" / f"{k:05d}.units.npy", mmap_mode="r")
    with np.load(work / "units" / f"{k:05d}.npz") as z:
        return units, {name: z[name] for name in z.files}


@dataclass
class _Repeats:
    work: Path
    unit: str
    min_len: int

    def __call__(self, task: Task, report) -> dict:
        path = self.work / "repeats" / f"{task.name}.npy"
        if not path.exists():
            a, b = task.payload["a"], task.payload["b"]
            with np.load(self.work / "layout.npz") as z:
                shard_units, where = z["shard_units"], z["where"]
            parts = [self._shard(where, a)] if a != b else []
            region = sum(len(p) for p in parts)
            parts.append(self._shard(where, b))
            units = np.concatenate(parts)
            sep = units == (substring.SEP_BYTE if self.unit == "bytes" else substring.SEP_TOKEN)
            found = substring.later_copies(units, sep, region, self.min_len)
            base = int(np.sum(shard_units[:b]))  # the shard's first unit in the corpus
            save_npy(path, found - region + base)
        report(1)
        return {}

    def _shard(self, where: np.ndarray, s: int) -> np.ndarray:
        """Shard s's units: the [lo, hi) unit ranges of each source file it holds."""
        pieces = []
        for k, lo, hi in where[where[:, 0] == s][:, 1:]:
            units, _ = _load_units(self.work, int(k))
            pieces.append(np.asarray(units[lo:hi]))
        return np.concatenate(pieces)


@dataclass
class _Cuts:
    """One input file's cut byte ranges, from the repeats of every shard it overlaps."""

    work: Path
    unit: str

    def __call__(self, task: Task, report) -> dict:
        path = self.work / "cuts" / f"{task.payload['input']:05d}.npz"
        if not path.exists():
            k = task.payload["k"]
            units, meta = _load_units(self.work, k)
            with np.load(self.work / "layout.npz") as z:
                file_base = int(z["file_units"][:k].sum())
            found = [np.load(self.work / "repeats" / f"{name}.npy") for name in task.payload["repeats"]]
            iv = substring.merge(np.concatenate(found)) if found else np.zeros((0, 2), np.int64)
            iv = iv[(iv[:, 1] > file_base) & (iv[:, 0] < file_base + len(units))] - file_base
            starts = meta["starts"]
            doc = np.searchsorted(starts, iv[:, 0], side="right") - 1
            rows, lo, hi = [], [], []
            for d, s, e in zip(doc.tolist(), iv[:, 0].tolist(), iv[:, 1].tolist()):
                if self.unit == "bytes":
                    s, e = substring.snap_utf8(units, s, e)
                    s, e = s - int(starts[d]), e - int(starts[d])
                else:
                    s, e = int(meta["byte_start"][s]), int(meta["byte_end"][e - 1])
                if e > s:
                    rows.append(int(meta["rows"][d]))
                    lo.append(s)
                    hi.append(e)
            save_npz(path, rows=np.array(rows, np.int64), start=np.array(lo, np.int64), end=np.array(hi, np.int64))
        report(1)
        return {}


def substring_phase(cfg, work: Path, sources: list[UnitSource], workers: int | None, progress, fail) -> None:
    (work / "units").mkdir(parents=True, exist_ok=True)
    (work / "repeats").mkdir(exist_ok=True)
    (work / "cuts").mkdir(exist_ok=True)
    tasks = [Task(k, f"units-{k:05d}", None, weight=1) for k in range(len(sources))]
    progress.start(len(tasks), "files", "dedup: substring units")
    fail(run_tasks(_Units(work, cfg.unit, sources), tasks, workers=workers, progress=progress), "substring units")
    progress.finish()

    layout = work / "layout.npz"
    if not layout.exists():
        doc_units = []
        for k in range(len(sources)):
            with np.load(work / "units" / f"{k:05d}.npz") as z:
                doc_units.append(np.diff(z["starts"]))
        per_doc = np.concatenate(doc_units) if doc_units else np.zeros(0, np.int64)
        shards = substring.plan_shards(per_doc, substring.shard_cap(cfg.memory_bytes, cfg.unit))
        # where: (shard, source, first unit, end unit) of each piece of a source inside a shard
        doc_first = np.concatenate(([0], np.cumsum([len(d) for d in doc_units]))).astype(np.int64)
        where = []
        for s, (lo, hi) in enumerate(shards):
            for k, units in enumerate(doc_units):
                a, b = max(lo, doc_first[k]), min(hi, doc_first[k + 1])
                if a < b:
                    starts = np.concatenate(([0], np.cumsum(units)))
                    where.append((s, k, int(starts[a - doc_first[k]]), int(starts[b - doc_first[k]])))
        shard_units = np.array([int(per_doc[lo:hi].sum()) for lo, hi in shards], dtype=np.int64)
        file_units = np.array([int(u.sum()) for u in doc_units], dtype=np.int64)
        save_npz(layout, where=np.array(where, dtype=np.int64).reshape(-1, 4), shard_units=shard_units, file_units=file_units)
    with np.load(layout) as z:
        where, shard_units = z["where"], z["shard_units"]

    pairs = substring.shard_pairs(len(shard_units))
    tasks = [Task(i, f"{a:04d}-{b:04d}", {"a": a, "b": b}, weight=1) for i, (a, b) in enumerate(pairs)]
    progress.start(len(tasks), "shard pairs", f"dedup: substring repeats ({len(shard_units)} shards)")
    fail(run_tasks(_Repeats(work, cfg.unit, cfg.min_len), tasks, workers=workers, progress=progress), "substring repeats")
    progress.finish()

    cut_tasks = []
    for k, src in enumerate(sources):
        if src.input is None:
            continue
        mine = set(where[where[:, 1] == k][:, 0].tolist())
        cut_tasks.append(Task(len(cut_tasks), f"cuts-{src.input:05d}", {"input": src.input, "k": k, "repeats": [t.name for t in tasks if t.payload["b"] in mine]}))
    progress.start(len(cut_tasks), "files", "dedup: substring cuts")
    fail(run_tasks(_Cuts(work, cfg.unit), cut_tasks, workers=workers, progress=progress), "substring cuts")
    progress.finish()


# ---------------------------------------------------------------------------------------------
# sentences


@dataclass
class _Windows:
    work: Path
    n_sentences: int
    sources: list[UnitSource]

    def __call__(self, task: Task, report) -> dict:
        path = self.work / "windows" / f"{task.index:05d}.npz"
        if not path.exists():
            src = self.sources[task.index]
            keys, rows = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
            for row, text in _surviving_texts(DocsSource(**src.source), _removed_by(self.work, src.input)):
                k, _ = _sentences().window_keys(text, self.n_sentences)
                keys.append(k)
                rows.append(np.full(len(k), row, np.int64))
            save_npz(path, keys=np.concatenate(keys), rows=np.concatenate(rows))
        report(1)
        return {}


def sentences_phase(cfg, work: Path, sources: list[UnitSource], workers: int | None, progress, fail) -> None:
    (work / "windows").mkdir(parents=True, exist_ok=True)
    tasks = [Task(k, f"windows-{k:05d}", None) for k in range(len(sources))]
    progress.start(len(tasks), "files", "dedup: sentence windows")
    fail(run_tasks(_Windows(work, cfg.n_sentences, sources), tasks, workers=workers, progress=progress), "sentence windows")
    progress.finish()
    out = work / "sentdup.npz"
    if out.exists():
        return
    keys, docs, sizes = [], [], []
    base = 0
    for k in range(len(sources)):
        with np.load(work / "windows" / f"{k:05d}.npz") as z:
            keys.append(z["keys"])
            docs.append(z["rows"] + base)  # rows of later files after every row of earlier ones
            sizes.append(len(z["keys"]))
            base += int(z["rows"].max()) + 1 if len(z["rows"]) else 0
    dup = _sentences().duplicate_windows(np.concatenate(keys), np.concatenate(docs)) if keys else np.zeros(0, bool)
    bounds = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    save_npz(out, dup=dup, bounds=bounds)


# ---------------------------------------------------------------------------------------------
# the filter phase's side


class SpanCuts:
    """The cuts of one input file, row by row, and the counts of what was cut."""

    def __init__(self, cfg, work: Path, index: int, source_k: int):
        self.cfg = cfg
        self.sub: dict[int, list[tuple[int, int]]] = {}
        if cfg.substring:
            with np.load(work / "cuts" / f"{index:05d}.npz") as z:
                for r, s, e in zip(z["rows"].tolist(), z["start"].tolist(), z["end"].tolist()):
                    self.sub.setdefault(r, []).append((s, e))
        self.win_rows = self.win_dup = None
        if cfg.sentences:
            with np.load(work / "sentdup.npz") as z:
                lo, hi = z["bounds"][source_k], z["bounds"][source_k + 1]
                self.win_dup = z["dup"][lo:hi]
            with np.load(work / "windows" / f"{source_k:05d}.npz") as z:
                self.win_rows = z["rows"]
        self.counts: dict = {m: {"docs_cut": 0, "spans": 0, "bytes": 0} for m in ("substring", "sentences") if getattr(cfg, m)}
        self.counts.update(docs_dropped_short=0, bytes_in=0, by_length={}, top={})
        self._top: Counter = Counter()

    def spans(self, row: int, text: str) -> dict[str, list[tuple[int, int]]]:
        """Byte ranges each method cuts from this row's text."""
        out = {}
        if self.cfg.substring:
            out["substring"] = self.sub.get(row, [])
        if self.cfg.sentences:
            lo, hi = np.searchsorted(self.win_rows, [row, row + 1])
            mask = self.win_dup[lo:hi]
            if mask.any():
                sent = _sentences().sentence_spans(text)
                chars = _sentences().removed_char_spans(text, sent, mask, self.cfg.n_sentences)
                out["sentences"] = char_to_byte_spans(text, chars)
            else:
                out["sentences"] = []
        return out

    def apply(self, row: int, text: str) -> tuple[str, list[list[int]], str | None, str]:
        """(text after the cut, removed_spans, the method to blame if the document is now too
        short else None, the removed text joined by newlines)."""
        data = substring.utf8(text)
        self.counts["bytes_in"] += len(data)
        by_method = self.spans(row, text)
        spans = substring.merge(np.array([s for v in by_method.values() for s in v], dtype=np.int64).reshape(-1, 2))
        if not len(spans):
            return text, [], None, ""
        for m, v in by_method.items():
            if v:
                self.counts[m]["docs_cut"] += 1
                self.counts[m]["spans"] += len(v)
                self.counts[m]["bytes"] += int(sum(e - s for s, e in v))
        kept, removed, pos = [], [], 0
        for s, e in spans.tolist():
            kept.append(data[pos:s])
            removed.append(data[s:e])
            pos = e
            bucket = next((f"<{b:,}" for b in LENGTH_BUCKETS if e - s < b), f">={LENGTH_BUCKETS[-1]:,}")
            self.counts["by_length"][bucket] = self.counts["by_length"].get(bucket, 0) + 1
        kept.append(data[pos:])
        for piece in removed:
            self._top[piece[:120].decode("utf-8", "replace")] += 1
        new = b"".join(kept).decode("utf-8", "surrogatepass")
        blame = None
        if not self.cfg.annotate_only and self._too_short(text, new, by_method):
            self.counts["docs_dropped_short"] += 1
            blame = max(by_method, key=lambda m: sum(e - s for s, e in by_method[m]))
        return new, spans.tolist(), blame, "\n".join(p.decode("utf-8", "surrogatepass") for p in removed)

    def _too_short(self, text: str, new: str, by_method: dict) -> bool:
        """A cut document is dropped when nothing but blanks is left, or under --min-doc-words
        words; one the sentence method cut, also under 3 sentences (datatrove's
        SentenceDedupFilter, whose output the sentence method reproduces)."""
        if not new.strip():
            return True
        if by_method.get("sentences"):
            return not _sentences().keep_document(text, new, self.cfg.min_doc_words)
        return bool(self.cfg.min_doc_words) and _sentences().word_count(new) < self.cfg.min_doc_words

    def finish(self) -> dict:
        self.counts["top"] = dict(self._top.most_common(TOP_SPANS * 5))
        return self.counts


def char_to_byte_spans(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if text.isascii():
        return [(s, e) for s, e in spans]
    return [(len(substring.utf8(text[:s])), len(substring.utf8(text[:e]))) for s, e in spans]


def length_buckets(spans: dict) -> list[tuple[str, int]]:
    """The span table's by-length buckets in size order (a manifest's JSON sorts them as text)."""
    return sorted((spans.get("by_length") or {}).items(), key=lambda kv: (kv[0].startswith(">"), int(kv[0].strip("<>=").replace(",", ""))))


def top_spans(spans: dict, n: int = TOP_SPANS) -> list[tuple[str, int]]:
    """The most repeated cut spans, most copies first."""
    return sorted((spans.get("top") or {}).items(), key=lambda kv: -kv[1])[:n]


def trim_top(counts: dict) -> None:
    """The manifest keeps the TOP_SPANS most repeated cut spans (each task sent its top 100)."""
    top = counts.get("spans", {}).get("top")
    if top:
        counts["spans"]["top"] = dict(top_spans(counts["spans"]))


def unit_sources(inputs: list[DocsSource], references: list[DocsSource]) -> list[UnitSource]:
    return [UnitSource(asdict(s), None) for s in references] + [UnitSource(asdict(s), i) for i, s in enumerate(inputs)]

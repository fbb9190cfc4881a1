"""decontam: find (and remove or flag) training documents that share word n-grams with eval items.

Spec 001-data-eval §A12. The method is GPT-3's: a training document is contaminated by an eval
task when it contains one of the task's word 13-grams (`ngram`; Llama 3 used 8). The report says,
per task, how many eval items appear in the training data and their share: the figure that decides
whether to report a clean-subset score, and the one Tülu 3 thresholds (a training set overlapping
more than 2% of an eval's items is dropped: `threshold`).

What is compared
- Words: `decontam_words` — lowercase, accents and punctuation stripped, like dedup's
  `normalized_words`, but digits are KEPT: dedup folds every digit to 0 so that "12 apples" and
  "34 apples" count as the same sentence, which for decontamination would flag every arithmetic
  word problem that shares a template with a test question but has other numbers.
- Eval items: `item_texts` turns each record into one or more passages, the question/context
  followed by an answer or by each choice (the way the item would appear written out in a web
  page or a dataset dump). Fields, by schema:
    generic multiple choice  context + each of choices
    generic generative       prompt + answer
    GSM8K                    question + answer (calculator annotations <<...>> removed)
    HellaSwag                ctx (or ctx_a + ctx_b) + each of endings ([title]-style tags removed)
    ARC                      question.stem (or question) + each choice's text
    PIQA                     goal + sol1, goal + sol2
    Winogrande               sentence with "_" replaced by option1, by option2
    MMLU                     question + each of choices
    anything else with text  text
  An item's n-grams are those of all its passages (context n-grams shared by its choices count
  once). Passages are never concatenated with each other.
- Short items: a passage with fewer than n words (but at least one) becomes ONE gram of all its
  words, matched against every run of that many words in the documents; short questions are not
  silently skipped. The report counts them (`short_items`): a 4-word passage is weak evidence.
- A document is contaminated by an item when it holds at least min(min_overlap, the item's
  n-gram count) distinct n-grams of the item (min_overlap = 1: any shared n-gram, GPT-3).

How it runs
- The eval n-grams are hashed once (64-bit word hashes from blake2b, polynomial n-gram hashes
  with the length folded into the seed, so a 5-word gram and a 13-gram hash apart) into a sorted
  array with, for each n-gram, the items it comes from. The index is saved to a temporary .npz
  that each worker loads once.
- The docs are scanned one input file per task through the usual sharded driver (workers,
  resume, `-o -`, --keep-rejected): per batch, every window's hash is looked up with one
  `searchsorted`. `mode = "remove"` drops contaminated docs (reason `decontam.<task>`, the first
  task in --against order; rejected rows also get `contaminated_tasks`); `mode = "flag"` keeps
  every doc and adds `contaminated` (bool) and `contaminated_tasks` (list of task names).
- `report_only` writes no docs: OUT holds the manifest and decontam.json (kind
  `decontam-report`). Otherwise decontam.json is written next to the docs (it is not a docs part
  and is not listed in `outputs`). The full report (with the indices of the contaminated items,
  for a clean-subset evaluation) also goes to `report_path` when given.

The per-shard figures travel in the manifest counts (`_items`, `_ngrams`: item / n-gram number ->
documents), so a resumed run or an Arrow-stream output still produces the whole report; they are
folded into `counts.tasks` and dropped before the final manifest is written.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
import tempfile
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import regex

from llmctl.artifacts.docs import STDIO, DocsSource, ShardWriter, part_name, read_source, resolve_docs_inputs, row_count, source_schema, spool_stdin
from llmctl.artifacts.manifest import Manifest, file_sha256, input_ref, output_entry, write_manifest
from llmctl.errors import UsageError
from llmctl.eval.taskfile import read_records, where
from llmctl.runtime.executor import Task
from llmctl.runtime.progress import Progress
from llmctl.runtime.options import RunOptions
from llmctl.runtime.sharded import run_sharded

STAGE = "decontam"
REPORT_KIND = "decontam-report"
REPORT_FILE = "decontam.json"
MODES = ("remove", "flag")
TASK_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz", ".parquet")
SPLIT_NAMES = ("test", "train", "validation", "valid", "val", "dev", "eval")


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


# ---------------------------------------------------------------------------------------------
# Words and hashes

_MARKS = regex.compile(r"\p{Mn}+")  # combining marks: the accents NFKD splits off
_PUNCT = re.compile(r"[^\w\s]|_")


def decontam_words(text: str) -> list[str]:
    """The words of `text`: lowercased, accents and punctuation stripped, digits kept."""
    text = text.lower()
    if not text.isascii():  # accents only exist outside ASCII
        text = _MARKS.sub("", unicodedata.normalize("NFKD", text))
    return _PUNCT.sub(" ", text).split()


_P = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplying by it loses nothing mod 2^64
_WORD_CACHE: dict[str, int] = {}
_CACHE_MAX = 2_000_000


def _word_hash(w: str) -> int:
    return int.from_bytes(hashlib.blake2b(w.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def word_hashes(words: list[str]) -> np.ndarray:
    """Stable 64-bit hashes (the same in every process, unlike hash()), as uint64."""
    cache = _WORD_CACHE
    if len(cache) > _CACHE_MAX:
        cache.clear()
    for w in set(words).difference(cache):
        cache[w] = _word_hash(w)
    return np.fromiter(map(cache.__getitem__, words), dtype=np.uint64, count=len(words))


def _seed(length: int) -> np.uint64:
    return np.uint64((length * 0xC2B2AE3D27D4EB4F + 0x165667B19E3779F9) % (1 << 64))


def window_hashes(w: np.ndarray, length: int) -> np.ndarray:
    """The hash of w[s:s+length] for every s (uint64 arithmetic wraps mod 2^64)."""
    m = len(w) - length + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    h = np.full(m, _seed(length), dtype=np.uint64)
    for j in range(length):
        h *= _P
        h += w[j : j + m]
    return h


def _concat_words(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, starts): text i's word hashes are hashes[starts[i]:starts[i + 1]]."""
    words: list[str] = []
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    for i, t in enumerate(texts):
        ws = decontam_words(t or "")
        words += ws
        starts[i + 1] = starts[i] + len(ws)
    return word_hashes(words), starts


# ---------------------------------------------------------------------------------------------
# Eval items


_CALC = re.compile(r"<<[^<>]*>>")
_TAG = re.compile(r"\[[a-z ]+\]", re.I)  # HellaSwag's WikiHow [title], [header], [step] tags


def _str(v) -> str | None:
    return v if isinstance(v, str) and v.strip() else None


def _join(*parts) -> str:
    return " ".join(p for p in parts if p)


def _choices(rec: dict, at: str) -> list[str] | None:
    """Choice texts from the shapes in use: a list of strings, a list of {text}, or {text: [...]}."""
    for key in ("choices", "endings", "options"):
        v = rec.get(key)
        if v is None:
            continue
        if isinstance(v, dict) and isinstance(v.get("text"), list):
            v = v["text"]
        if not isinstance(v, list):
            raise UsageError(f"{at}: '{key}' must be a list, got {type(v).__name__}")
        out = []
        for c in v:
            if isinstance(c, dict):
                c = c.get("text")
            if isinstance(c, (int, float)) and not isinstance(c, bool):
                c = str(c)
            if not isinstance(c, str):
                raise UsageError(f"{at}: '{key}' holds a {type(c).__name__}, expected text")
            out.append(c)
        return out
    return None


def record_passages(rec: dict, at: str) -> list[str]:
    """The passages of one eval record (see the module docstring for the fields)."""
    # Winogrande: the blank filled with each option
    if _str(rec.get("sentence")) and "option1" in rec:
        s = rec["sentence"]
        opts = [str(rec[k]) for k in ("option1", "option2") if rec.get(k) is not None]
        return [s.replace("_", o, 1) if "_" in s else _join(s, o) for o in opts] or [s]
    # PIQA
    if _str(rec.get("goal")):
        sols = [rec[k] for k in ("sol1", "sol2") if _str(rec.get(k))]
        return [_join(rec["goal"], s) for s in sols] or [rec["goal"]]
    # the question / context
    q = rec.get("question")
    if isinstance(q, dict):  # native ARC: {"stem", "choices": [{"text", "label"}]}
        stem = q.get("stem")
        if not _str(stem):
            raise UsageError(f"{at}: 'question' has no 'stem' text")
        return [_join(stem, c) for c in (_choices(q, at) or [])] or [stem]
    ctx = _str(rec.get("context")) or _str(rec.get("ctx")) or _join(_str(rec.get("ctx_a")), _str(rec.get("ctx_b"))) or None
    if ctx is not None and ("ctx" in rec or "ctx_a" in rec):
        ctx = _TAG.sub(" ", ctx)
    ctx = ctx or _str(q) or _str(rec.get("prompt")) or _str(rec.get("query")) or _str(rec.get("problem")) or _str(rec.get("input"))
    choices = _choices(rec, at)
    if choices:
        if "endings" in rec:
            choices = [_TAG.sub(" ", c) for c in choices]
        return [_join(ctx, c) for c in choices]
    answer = rec.get("answer", rec.get("solution", rec.get("target")))
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)  # a generative item's numeric answer (MMLU's index went with its choices)
    answer = _CALC.sub("", answer) if isinstance(answer, str) else None
    if ctx is not None:
        return [_join(ctx, answer)]
    if _str(rec.get("text")):
        return [rec["text"]]
    keys = ", ".join(k for k in rec if k != "_line") or "none"
    raise UsageError(
        f"{at}: no eval text found (expected one of context/choices, prompt/answer, question/answer, ctx/endings, "
        f"goal/sol1/sol2, sentence/option1/option2, text; the record has: {keys})"
    )


def item_texts(records: list[dict], path: str | Path = "") -> list[list[str]]:
    """One list of passages per eval record (read with taskfile.read_records); a record with no
    recognizable text field raises UsageError naming file:line."""
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise UsageError(f"{where(path, {}, i)}: expected an object, got {type(rec).__name__}")
        out.append(record_passages(rec, where(path, rec, i)))
    return out


@dataclass
class EvalTask:
    name: str
    path: str
    passages: list[list[str]]
    lines: list[int | None]

    @classmethod
    def load(cls, name: str, path: str) -> EvalTask:
        records = read_records(path)
        if not records:
            raise UsageError(f"task file {path} holds no items")
        return cls(name, path, item_texts(records, path), [r.get("_line") for r in records])


def task_name(path: Path) -> str:
    """The file name without extensions, with its folder in front when it is only a split name
    (gsm8k/test.jsonl -> gsm8k-test)."""
    stem = path.name
    for suf in sorted(TASK_SUFFIXES, key=len, reverse=True):
        if stem.lower().endswith(suf):
            stem = stem[: -len(suf)]
            break
    if re.match(rf"^({'|'.join(SPLIT_NAMES)})([-_.]|$)", stem, re.I) and path.resolve().parent.name:
        return f"{path.resolve().parent.name}-{stem}"
    return stem


def resolve_task_files(args: list[str]) -> list[tuple[str, str]]:
    """(name, path) per task file, in order: paths, directories (their task files), globs,
    comma-separated lists, or NAME=PATH to name a task."""
    out: list[tuple[str, str]] = []
    for arg in (a for given in args for a in given.split(",") if a):
        name = None
        if "=" in arg and not Path(arg).exists():
            name, arg = arg.split("=", 1)
            if not re.fullmatch(r"[\w.+-]+", name):
                raise UsageError(f"task name {name!r} (in --against NAME=PATH) may use letters, digits, . _ + - only")
        matches = sorted(glob.glob(arg)) if glob.has_magic(arg) else [arg]
        if not matches:
            raise UsageError(f"no task file matches {arg!r}")
        files = []
        for m in matches:
            p = Path(m)
            if p.is_dir():
                files += sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.lower().endswith(TASK_SUFFIXES) and not f.name.startswith("."))
            elif p.is_file():
                files.append(m)
            else:
                raise UsageError(f"task file not found: {m}")
        if not files:
            raise UsageError(f"no task files (.jsonl, .jsonl.gz, .parquet) in {arg}")
        if name and len(files) > 1:
            raise UsageError(f"--against {name}=... names one task but {arg} holds {len(files)} files")
        out += [(name or task_name(Path(f)), f) for f in files]
    if not out:
        raise UsageError("give the eval task files to check against with --against")
    seen: dict[str, str] = {}
    for name, f in out:
        if name in seen:
            raise UsageError(f"two task files are both named {name!r} ({seen[name]}, {f}); name them with --against NAME=PATH")
        seen[name] = f
    return out


# ---------------------------------------------------------------------------------------------
# The index of eval n-grams


@dataclass
class EvalIndex:
    """keys: sorted unique gram hashes; key_ptr/key_items: the items of key k are
    key_items[key_ptr[k]:key_ptr[k + 1]]; item_task: task number per item; item_grams: distinct
    grams per item; need: grams a doc must share with the item; lengths: gram lengths in use."""

    keys: np.ndarray
    key_ptr: np.ndarray
    key_items: np.ndarray
    item_task: np.ndarray
    item_grams: np.ndarray
    need: np.ndarray
    lengths: np.ndarray
    item_short: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def prefilter(self) -> tuple[np.ndarray, np.uint64]:
        """A table of bools over the top bits of the hashes, true where some key falls: about 32
        slots per key (at most 2^27), so one lookup rejects ~97% of the windows that are no key."""
        if getattr(self, "_table", None) is None:
            bits = int(min(27, max(16, np.ceil(np.log2(max(len(self.keys), 1) * 32)))))
            shift = np.uint64(64 - bits)
            table = np.zeros(1 << bits, dtype=bool)
            table[self.keys >> shift] = True
            self._table = (table, shift)
        return self._table

    def save(self, path: Path) -> None:
        np.savez(path, **{k: getattr(self, k) for k in self.__dataclass_fields__})

    @classmethod
    def load(cls, path: str | Path) -> EvalIndex:
        with np.load(path) as z:
            return cls(**{k: z[k] for k in cls.__dataclass_fields__})


def build_index(tasks: list[EvalTask], ngram: int, min_overlap: int) -> EvalIndex:
    grams, items, item_task, short = [], [], [], []
    lengths = {ngram}  # the n-gram length plus the lengths of short passages
    first_item = 0
    for t_no, task in enumerate(tasks):
        flat = [p for ps in task.passages for p in ps]
        p_item = np.repeat(np.arange(len(task.passages), dtype=np.int64) + first_item, [len(ps) for ps in task.passages])
        w, starts = _concat_words(flat)
        counts = np.diff(starts)
        # full windows that stay inside their passage
        h = window_hashes(w, ngram)
        if len(h):
            ends = np.repeat(starts[1:], counts)[: len(h)]
            ok = np.arange(len(h)) + ngram <= ends
            grams.append(h[ok])
            items.append(np.repeat(p_item, counts)[: len(h)][ok])
        # short passages: one gram of all their words
        is_short = (counts > 0) & (counts < ngram)
        short_lengths = np.unique(counts[is_short]).tolist()
        lengths.update(short_lengths)
        for length in short_lengths:
            ps = np.flatnonzero(is_short & (counts == length))
            grams.append(window_hashes(w, length)[starts[ps]])
            items.append(p_item[ps])
        item_short = np.zeros(len(task.passages), bool)
        item_short[p_item[is_short] - first_item] = True
        short.append(item_short)
        item_task.append(np.full(len(task.passages), t_no, np.int32))
        first_item += len(task.passages)
    g = np.concatenate(grams) if grams else np.zeros(0, np.uint64)
    it = np.concatenate(items) if items else np.zeros(0, np.int64)
    pairs = np.unique(np.stack([g, it.astype(np.uint64)], axis=1), axis=0) if len(g) else np.zeros((0, 2), np.uint64)
    keys, key_start = np.unique(pairs[:, 0], return_index=True)
    key_ptr = np.append(key_start, len(pairs)).astype(np.int64)
    key_items = pairs[:, 1].astype(np.int64)
    item_grams = np.bincount(key_items, minlength=first_item).astype(np.int64)
    return EvalIndex(
        keys=keys.astype(np.uint64),
        key_ptr=key_ptr,
        key_items=key_items,
        item_task=np.concatenate(item_task) if item_task else np.zeros(0, np.int32),
        item_grams=item_grams,
        need=np.minimum(item_grams, min_overlap),
        lengths=np.array(sorted(lengths), dtype=np.int64),
        item_short=np.concatenate(short) if short else np.zeros(0, bool),
    )


def match_docs(index: EvalIndex, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The eval grams and items each text holds.

    Returns (gram_doc, gram_key, item_doc, item): distinct (doc, n-gram number) pairs found, and
    the (doc, item) pairs where the doc holds at least `need` of the item's grams."""
    empty = np.zeros(0, np.int64)
    if not len(index.keys) or not texts:
        return empty, empty, empty, empty
    w, starts = _concat_words(texts)
    counts = np.diff(starts)
    doc_of = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
    end_of = np.repeat(starts[1:], counts)
    docs, keys = [], []
    last = len(index.keys) - 1
    table, shift = index.prefilter()
    for length in index.lengths.tolist():
        h = window_hashes(w, length)
        if not len(h):
            continue
        s = np.flatnonzero(table[h >> shift])  # one lookup rules out almost every window
        pos = np.minimum(np.searchsorted(index.keys, h[s]), last)
        found = index.keys[pos] == h[s]
        s, pos = s[found], pos[found]
        inside = s + length <= end_of[s]  # the window stays inside its document
        docs.append(doc_of[s[inside]])
        keys.append(pos[inside])
    if not docs or not sum(len(d) for d in docs):
        return empty, empty, empty, empty
    combined = np.unique(np.concatenate(docs) * len(index.keys) + np.concatenate(keys))
    gram_doc, gram_key = combined // len(index.keys), combined % len(index.keys)
    # each (doc, gram) pair -> (doc, item) for every item the gram belongs to
    lo, hi = index.key_ptr[gram_key], index.key_ptr[gram_key + 1]
    n = hi - lo
    offsets = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    items = index.key_items[np.repeat(lo, n) + offsets]
    n_items = len(index.item_task)
    pair, held = np.unique(np.repeat(gram_doc, n) * n_items + items, return_counts=True)
    item_doc, item = pair // n_items, pair % n_items
    hit = held >= index.need[item]
    return gram_doc, gram_key, item_doc[hit], item[hit]


# ---------------------------------------------------------------------------------------------
# One shard

_INDEX_CACHE: dict[str, EvalIndex] = {}


def _index(path: str) -> EvalIndex:
    if path not in _INDEX_CACHE:
        _INDEX_CACHE.clear()
        _INDEX_CACHE[path] = EvalIndex.load(path)
    return _INDEX_CACHE[path]


def _with_column(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    names = batch.schema.names
    if name in names:
        cols = [values if n == name else batch.column(n) for n in names]
        return pa.RecordBatch.from_arrays(cols, names=names)
    return pa.RecordBatch.from_arrays(list(batch.columns) + [values], names=names + [name])


def _add_fields(schema: pa.Schema, fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    for name, typ in fields:
        if name in schema.names:
            schema = schema.set(schema.get_field_index(name), pa.field(name, typ))
        else:
            schema = schema.append(pa.field(name, typ))
    return schema


TASKS_TYPE = pa.list_(pa.string())


@dataclass
class _ShardFn:
    cfg: DecontamConfig
    index_path: str
    task_names: list[str]

    def __call__(self, task: Task, out: Path, report) -> dict:
        return decontam_shard(task, out, report, self.cfg, _index(self.index_path), self.task_names)


def decontam_shard(task: Task, out: Path, report, cfg: DecontamConfig, index: EvalIndex, names: list[str]) -> dict:
    source = DocsSource(**task.payload)
    writing = not cfg.report_only
    flag = cfg.mode == "flag"
    outputs: list[str] = []
    writer = rej = None
    if writing:
        schema = source_schema(source)
        if flag:
            schema = _add_fields(schema, [("contaminated", pa.bool_()), ("contaminated_tasks", TASKS_TYPE)])
        outputs.append(f"{task.name}.parquet")
        writer = ShardWriter(out / outputs[0], schema)
        if cfg.keep_rejected and not flag:
            rej_schema = _add_fields(schema, [("reason", pa.string()), ("contaminated_tasks", TASKS_TYPE)])
            outputs.append(f"rejected/{task.name}.parquet")
            rej = ShardWriter(out / outputs[1], rej_schema)
    n_in = n_out = n_hit = chars_in = chars_hit = 0
    by_task: dict[str, dict] = {}
    rejected: dict[str, int] = {}
    item_docs: dict[str, int] = {}
    gram_docs: dict[str, int] = {}
    try:
        for batch in read_source(source, columns=None if writing else []):
            texts = batch.column("text").to_pylist()
            gram_doc, gram_key, item_doc, item = match_docs(index, texts)
            # per doc: the tasks it is contaminated by, in --against order
            doc_tasks: dict[int, list[str]] = {}
            for d, t in sorted(set(zip(item_doc.tolist(), index.item_task[item].tolist()))):
                doc_tasks.setdefault(d, []).append(names[t])
            for k in item.tolist():
                item_docs[str(k)] = item_docs.get(str(k), 0) + 1
            for k in gram_key.tolist():
                gram_docs[str(k)] = gram_docs.get(str(k), 0) + 1
            for d, ts in doc_tasks.items():
                for t in ts:
                    by_task.setdefault(t, {"docs_hit": 0})["docs_hit"] += 1
                chars_hit += len(texts[d] or "")
            lens = [len(t or "") for t in texts]
            n_in += batch.num_rows
            chars_in += sum(lens)
            n_hit += len(doc_tasks)
            contaminated = np.zeros(batch.num_rows, bool)
            contaminated[list(doc_tasks)] = True
            if writing:
                if flag:
                    lists = pa.array([doc_tasks.get(i, []) for i in range(batch.num_rows)], TASKS_TYPE)
                    kept = _with_column(_with_column(batch, "contaminated", pa.array(contaminated)), "contaminated_tasks", lists)
                else:
                    kept = batch.filter(pa.array(~contaminated))
                    if len(doc_tasks):
                        for ts in doc_tasks.values():
                            rejected[f"decontam.{ts[0]}"] = rejected.get(f"decontam.{ts[0]}", 0) + 1
                        if rej is not None:
                            gone = sorted(doc_tasks)
                            rows = batch.take(pa.array(gone, pa.int64()))
                            rows = _with_column(rows, "reason", pa.array([f"decontam.{doc_tasks[d][0]}" for d in gone], pa.string()))
                            rows = _with_column(rows, "contaminated_tasks", pa.array([doc_tasks[d] for d in gone], TASKS_TYPE))
                            rej.write(rows)
                writer.write(kept)
                n_out += kept.num_rows
            report(batch.num_rows)
        if writer is not None:
            writer.close()
        if rej is not None:
            rej.close()
    except BaseException:
        for w in (writer, rej):
            if w is not None:
                w.abort()
        raise
    counts = {"in": n_in, **({"out": n_out} if writing else {}), "contaminated": n_hit, "chars_in": chars_in, "chars_contaminated": chars_hit, "tasks": by_task, "_items": item_docs, "_ngrams": gram_docs}
    if writing and not flag:
        counts["rejected"] = rejected
    return {"outputs": outputs, "counts": counts}


# ---------------------------------------------------------------------------------------------
# The report


def build_report(cfg: DecontamConfig, tasks: list[EvalTask], index: EvalIndex, counts: dict) -> dict:
    """Per task: items, contaminated items and their share, docs hit, n-grams and matched ones;
    and the list of contaminated items (0-based index in the task file, line, docs, coverage)."""
    item_docs = {int(k): v for k, v in counts.get("_items", {}).items()}
    matched = np.array(sorted(int(k) for k in counts.get("_ngrams", {})), dtype=np.int64)
    # distinct matched grams per item (the corpus-wide coverage Llama 3 thresholds)
    n_items = len(index.item_task)
    if len(matched):
        lo, hi = index.key_ptr[matched], index.key_ptr[matched + 1]
        n = hi - lo
        its = index.key_items[np.repeat(lo, n) + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)]
        item_matched = np.bincount(its, minlength=n_items)
    else:
        item_matched = np.zeros(n_items, np.int64)
    # grams and matched grams per task (a gram shared by two tasks counts for each)
    key_task = index.item_task[index.key_items]  # per (key, item) pair
    key_of_pair = np.repeat(np.arange(len(index.keys)), np.diff(index.key_ptr))
    task_grams = {t: len(np.unique(key_of_pair[key_task == t])) for t in range(len(tasks))}
    matched_set = np.zeros(len(index.keys), bool)
    matched_set[matched] = True
    task_matched = {t: len(np.unique(key_of_pair[(key_task == t) & matched_set[key_of_pair]])) for t in range(len(tasks))}
    docs_by_task = counts.get("tasks", {})
    out: dict[str, dict] = {}
    first = 0
    for t_no, task in enumerate(tasks):
        n = len(task.passages)
        rows = []
        for i in range(n):
            g = first + i
            if g in item_docs:
                grams = int(index.item_grams[g])
                rows.append({"index": i, "line": task.lines[i], "docs": item_docs[g], "ngrams": grams, "ngrams_matched": int(item_matched[g]), "coverage": round(int(item_matched[g]) / grams, 4) if grams else 0.0})
        share = len(rows) / n if n else 0.0
        out[task.name] = {
            "file": task.path,
            "items": n,
            "items_contaminated": len(rows),
            "share": round(share, 6),
            "over_threshold": share > cfg.threshold,
            "docs_hit": docs_by_task.get(task.name, {}).get("docs_hit", 0),
            "ngrams": task_grams[t_no],
            "ngrams_matched": task_matched[t_no],
            "short_items": int(index.item_short[first : first + n].sum()),
            "empty_items": int((index.item_grams[first : first + n] == 0).sum()),
            "contaminated_items": rows,
        }
        first += n
    return {
        "method": f"word {cfg.ngram}-gram overlap (GPT-3 style); a doc is contaminated by an item when it shares >= min(min_overlap, the item's n-grams) of them",
        "ngram": cfg.ngram,
        "min_overlap": cfg.min_overlap,
        "threshold": cfg.threshold,
        "mode": "report-only" if cfg.report_only else cfg.mode,
        "normalization": "lowercase, accents and punctuation stripped, digits kept",
        "docs": {k: counts.get(k, 0) for k in ("in", "out", "contaminated", "chars_in", "chars_contaminated")},
        "tasks": out,
    }


def task_summary(report: dict) -> dict:
    """The per-task figures without the item lists (what goes into the manifest counts)."""
    return {name: {k: v for k, v in t.items() if k not in ("contaminated_items", "file")} for name, t in report["tasks"].items()}


# ---------------------------------------------------------------------------------------------
# The stage


def _docs_sources(inputs: list[str], spool: str) -> list[DocsSource]:
    sources = spool_stdin(spool) if inputs == [STDIO] else resolve_docs_inputs(inputs)
    for s in sources:
        try:
            source_schema(s)
        except UsageError as e:
            if "no 'text' column" in str(e):
                raise UsageError(f"{e}; if this is a task file, give each one with --against (or quote a glob: --against 'dir/*.jsonl')") from e
            raise
    return sources


def run_decontam(
    inputs: list[str],
    out: str | None,
    cfg: DecontamConfig,
    task_files: list[str],
    options: RunOptions | None = None,
    progress: Progress | None = None,
    report_path: str | None = None,
    stdout=None,
) -> Manifest:
    """Check docs against eval task files; write the clean (or flagged) docs to `out` and the
    report (see module docstring). `out` may be None with report_only (nothing written but
    `report_path`), or `-`: the docs as an Arrow stream, or with report_only the report JSON."""
    cfg.check()
    options = options or RunOptions()
    progress = progress or Progress()
    if out is None and not cfg.report_only:
        raise UsageError("give the output with -o OUT (or use --report-only)")
    named = resolve_task_files(task_files)
    tasks = [EvalTask.load(name, path) for name, path in named]
    with tempfile.TemporaryDirectory(prefix="llmctl-decontam-") as tmp:
        sources = _docs_sources(inputs, str(Path(tmp) / "stdin"))
        index = build_index(tasks, cfg.ngram, cfg.min_overlap)
        index_path = Path(tmp) / "index.npz"
        index.save(index_path)
        config = asdict(cfg)
        config["tasks"] = {t.name: {"file": str(Path(t.path).resolve()), "sha256": file_sha256(t.path)} for t in tasks}
        tasks_list = [Task(i, part_name(i, ""), asdict(s), weight=row_count(s)) for i, s in enumerate(sources)]
        report_only_dir = cfg.report_only and (out is None or out == STDIO)
        target = str(Path(tmp) / "report") if report_only_dir else out
        refs = [input_ref(p) for p in inputs] + [{**input_ref(t.path), "task": t.name} for t in tasks]
        manifest = run_sharded(
            stage=STAGE,
            kind=REPORT_KIND if cfg.report_only else "docs",
            out=target,
            tasks=tasks_list,
            fn=_ShardFn(cfg, str(index_path), [t.name for t in tasks]),
            config=config,
            inputs=refs,
            opts=options,
            progress=progress,
            stdout=stdout,
            unit="docs",
        )
        streaming = target == STDIO
        complete = streaming or (Path(target) / "manifest.json").exists()
        report = build_report(cfg, tasks, index, manifest.counts)
        for k in ("_items", "_ngrams"):
            manifest.counts.pop(k, None)
        manifest.counts["tasks"] = task_summary(report)
        if not complete:  # a --shard-index slice: the report waits for the job that finishes last
            return manifest
        text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
        if report_path:
            _write_atomic(Path(report_path), text)
        if cfg.report_only and out == STDIO:
            (stdout or sys.stdout).write(text)
            (stdout or sys.stdout).flush()
        if not streaming:
            _write_atomic(Path(target) / REPORT_FILE, text)
            if cfg.report_only:
                manifest.outputs = [output_entry(Path(target) / REPORT_FILE, sum(len(t["contaminated_items"]) for t in report["tasks"].values()), Path(target))]
            write_manifest(target, manifest)
        return manifest


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


__all__ = ["DecontamConfig", "run_decontam", "item_texts", "decontam_words", "build_index", "match_docs", "EvalIndex", "EvalTask", "resolve_task_files", "build_report"]

"""tokenize: train a tokenizer on docs; encode docs into token shards; report on a tokenizer.

Encoding keeps what bits per byte needs (spec 001-data-eval §A9: BPB = (tokens/bytes) x
loss / ln 2, with the UTF-8 bytes of the unnormalized text; special tokens count 0 bytes): the
manifest records documents, tokens and bytes. `split` with `val_fraction` sends each document
to train or val by a seeded hash of its id, so the two splits are disjoint by document and the
same whatever the sharding. `keep_columns` records docs columns per document beside the tokens
(`tokens-NNNNN.meta.parquet`, one row per document in `.idx` order): what a mixture upsamples by
(train/mixture.py), e.g. dedup's `dup_cluster_size`. Both read docs on stdin (`-`): training
streams it (the text is held in memory anyway), encoding spools it to Parquet parts its workers
can share.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from llmctl.artifacts.docs import DocsSource, ReadLog, STDIO, open_docs_inputs, read_source, resolve_docs_inputs, source_schemas
from llmctl.artifacts.docs_write import ShardWriter
from llmctl.artifacts.atomic import atomic_path, prepare_new_out, write_bytes
from llmctl.artifacts.lock import output_lock
from llmctl.artifacts.manifest import Manifest, error_place, file_sha256, input_ref, write_manifest
from llmctl.artifacts.tokens import META_SUFFIX, TokenShardWriter, token_dtype
from llmctl.tokenizer import bpe
from llmctl.hashing import h64
from llmctl.errors import UsageError
from llmctl.runtime.progress import Progress

if TYPE_CHECKING:
    from llmctl.runtime.executor import Task
    from llmctl.runtime.options import RunOptions

STAGE = "tokenize"


# ---------------------------------------------------------------------------------------------
# train


def train_tokenizer(inputs: list[str], out: str, cfg: bpe.TrainTokenizerConfig, progress: Progress | None = None) -> Manifest:
    if out == STDIO:
        raise UsageError("a tokenizer is written to a directory, not to '-'")
    with output_lock(out):
        return _train_tokenizer(inputs, out, cfg, progress)


def _train_tokenizer(inputs: list[str], out: str, cfg: bpe.TrainTokenizerConfig, progress: Progress | None) -> Manifest:
    progress = progress or Progress()
    t0 = time.perf_counter()
    prepare_new_out(out, cfg.overwrite, own=("tokenizer.json",))  # written before the manifest
    stream = open_docs_inputs(inputs, skip_empty=True) if inputs == [STDIO] else None  # hashed as it is read
    sources = resolve_docs_inputs(inputs) if stream is None else []
    source_schemas(sources)  # a file without a string text column is a usage error, before any work
    log = stream.log if stream is not None else ReadLog()
    # Raw input files are hashed for the manifest while the text is read and the trainer runs
    # (hashlib drops the GIL): on a large Parquet file that is seconds off the critical path.
    with ThreadPoolExecutor(1) as pool:
        refs = pool.submit(lambda: [input_ref(p) for p in inputs] if stream is None else None)
        batches = stream.batches if stream is not None else (b for s in sources for b in read_source(s, columns=[], log=log, skip_empty=True))
        column = pa.chunked_array([b.column("text") for b in batches], pa.string())
        lengths = pc.utf8_length(column).fill_null(0).to_pylist()  # characters, as Python's len
        keep = bpe.sample_indices(lengths, cfg.max_chars, cfg.seed)
        if not keep:
            raise UsageError("no text to train a tokenizer on")
        sample = column.take(keep).to_pylist()  # only the sampled documents become Python strings
        progress.start(None, "", "tokenize train")
        tok = bpe.train(sample, cfg)
        progress.finish()
        input_refs = refs.result() or stream.refs(inputs)
    for e in log.errors:
        progress.log(f"tokenize train: skipped damage in {error_place(e)}: {e['error']}")
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / "tokenizer.json"
    with atomic_path(path) as tmp:
        tok.save(str(tmp))
    meta = bpe.info(tok, path)
    config = asdict(cfg)
    config.update(vocab_size_actual=meta.vocab_size, special=meta.special, eos_id=meta.eos_id)
    m = Manifest(
        kind="tokenizer",
        stage="tokenize train",
        config=config,
        inputs=input_refs,
        outputs=[{"file": "tokenizer.json", "rows": None, "bytes": path.stat().st_size, "sha256": file_sha256(path)}],
        counts={"docs": len(column), "docs_sampled": len(keep), "chars_sampled": sum(lengths[i] for i in keep), "vocab_size": meta.vocab_size, **log.counts()},
        errors=log.errors,
        wall_seconds=round(time.perf_counter() - t0, 3),
    )
    write_manifest(out, m)
    return m


# ---------------------------------------------------------------------------------------------
# encode


@dataclass
class TokenizeConfig:
    tokenizer: str = ""
    split: str | None = None  # None: every document; "train" / "val": that side of the split
    val_fraction: float = 0.0
    seed: int = 0
    batch_docs: int = 1024
    keep_columns: list[str] = field(default_factory=list)  # docs columns recorded per document

    def check(self) -> None:
        if "text" in self.keep_columns:
            raise UsageError("--keep-column text: the text is what the tokens hold; keep other columns")
        if len(set(self.keep_columns)) != len(self.keep_columns):
            raise UsageError(f"--keep-column: a column given twice ({', '.join(self.keep_columns)})")
        if not self.tokenizer:
            raise UsageError("--tokenizer is required (a tokenizer.json or a `tokenize train` output)")
        if self.split not in (None, "train", "val"):
            raise UsageError("--split must be train or val")
        if self.split and not 0 < self.val_fraction < 1:
            raise UsageError("--split needs --val-fraction between 0 and 1")


def in_val(doc_id: str, fraction: float, seed: int) -> bool:
    return h64(f"{seed}\0{doc_id}") / 2**64 < fraction


@dataclass
class _Encode:
    cfg: TokenizeConfig
    tokenizer_path: str
    threads: int

    def __call__(self, task: Task, out: Path, report) -> dict:
        cfg = self.cfg
        enc = bpe.encoder(self.tokenizer_path, threads=self.threads)
        bin_name, idx_name = f"{task.name}.bin", f"{task.name}.idx"
        n_bytes = skipped = 0
        log = ReadLog()  # damaged spots and text-less rows the reader leaves out: this shard's to report
        kept: list[pa.Table] = []  # the --keep-column values of the shard's documents, in order
        with TokenShardWriter(out / bin_name, out / idx_name, enc.info.eos_id, token_dtype(enc.info.vocab_size)) as shard:
            for batch in read_source(DocsSource(**task.payload), columns=list(cfg.keep_columns), log=log, skip_empty=True):
                texts = batch.column("text")
                mask = None
                if cfg.split:
                    keep = [(cfg.split == "val") == in_val(i, cfg.val_fraction, cfg.seed) for i in batch.column("id").to_pylist()]
                    skipped += keep.count(False)
                    mask = pa.array(keep, pa.bool_())
                    texts = texts.filter(mask)
                if cfg.keep_columns:
                    kept.append(_kept(batch, cfg.keep_columns, mask))
                n_bytes += pc.sum(pc.binary_length(texts)).as_py() or 0  # UTF-8 bytes, counted in Arrow
                strings = [t or "" for t in texts.to_pylist()]
                for start in range(0, len(strings), cfg.batch_docs):
                    shard.add(enc.encode_arrays(strings[start : start + cfg.batch_docs]))
                report(batch.num_rows)
            outputs = [{"file": bin_name, "rows": shard.n_tokens}, {"file": idx_name, "rows": shard.n_docs}]
            if cfg.keep_columns:
                outputs.append({"file": _write_kept(out / f"{task.name}{META_SUFFIX}", kept, cfg.keep_columns), "rows": shard.n_docs})
        return {
            "outputs": outputs,
            "counts": {"docs": shard.n_docs, "tokens": shard.n_tokens, "bytes": n_bytes, "other_split": skipped, **log.counts()},
            "errors": log.errors,
        }


def _kept(batch: pa.RecordBatch, columns: list[str], mask) -> pa.Table:
    """The kept columns of a batch's documents (a column this file lacks is nulls)."""
    names = batch.schema.names
    table = pa.table({c: batch.column(c) if c in names else pa.nulls(batch.num_rows) for c in columns})
    return table.filter(mask) if mask is not None else table


def _write_kept(path: Path, kept: list[pa.Table], columns: list[str]) -> str:
    """Write a shard's kept columns atomically, one row per document; returns the file name."""
    table = pa.concat_tables(kept, promote_options="permissive") if kept else pa.table({c: pa.nulls(0) for c in columns})
    with ShardWriter(path, table.schema) as w:
        w.write(table)
    return path.name


def _check_kept_columns(sources: list[DocsSource], columns: list[str]) -> None:
    """Every readable input must hold each --keep-column (a typo is exit 2, before any work)."""
    from llmctl.artifacts.docs import source_schemas

    for source, schema in zip(sources, source_schemas(sources)):
        if schema is None:
            continue  # a file that does not open: its task logs it as damage
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise UsageError(f"{source.path}: no column {missing[0]!r} to keep (columns: {', '.join(schema.names)})")


def run_tokenize(inputs: list[str], out: str, cfg: TokenizeConfig, opts: RunOptions | None = None, progress: Progress | None = None) -> Manifest:
    # imported here, not at the top: `tokenize train` needs no process pool and starts faster
    from llmctl.runtime.executor import default_workers
    from llmctl.runtime.options import RunOptions
    from llmctl.runtime.sharded import run_sharded
    from llmctl.runtime.stage import stage_run

    cfg.check()
    opts = opts or RunOptions()
    if out == STDIO:
        raise UsageError("token shards are written to a directory, not to '-'")
    with stage_run(opts, "llmctl-tokenize-in-") as run:
        sources, refs = run.read_inputs(inputs)
        if cfg.keep_columns:
            _check_kept_columns(sources, cfg.keep_columns)
        tasks = run.tasks(name=lambda i: f"tokens-{i:05d}", key=run.stream_key)  # a resumed run reuses shards of this stream only
        workers = opts.workers or default_workers()
        # fewer shards than workers still use every core: tiktoken's threads work inside a shard
        threads = max(1, workers // max(1, min(workers, len(tasks))))
        # built once here, before the workers fork, so that they inherit it instead of each loading it
        enc = bpe.encoder(cfg.tokenizer, threads)
        meta, tok_path = enc.info, Path(enc.info.path)
        if meta.eos_id is None:
            raise UsageError(f"{tok_path} has no end-of-text special token to separate documents")
        config = asdict(cfg)
        config.update(tokenizer=str(tok_path.resolve()), dtype=token_dtype(meta.vocab_size).str, vocab_size=meta.vocab_size, eos_id=meta.eos_id, special=meta.special, encoder="tiktoken" if enc.fast is not None else "tokenizers")

        def finish(m: Manifest) -> None:  # before the manifest is written: it says the artifact is whole
            write_bytes(Path(out) / "tokenizer.json", tok_path.read_bytes())  # the artifact carries its tokenizer
            c = m.counts
            c["tokens_per_byte"] = round(c["tokens"] / c["bytes"], 6) if c.get("bytes") else None

        return run_sharded(stage=STAGE, kind="tokens", out=out, tasks=tasks, fn=_Encode(cfg, cfg.tokenizer, threads), config=config,
                           inputs=refs + [input_ref(str(tok_path))], opts=opts, progress=progress, unit="docs", finish=finish)


# ---------------------------------------------------------------------------------------------
# report


def report(tokenizer_path: str, sample: list[str] | None = None, max_docs: int = 2000, top: int = 15) -> dict:
    """Bytes and characters per token, per-language premium, longest tokens, specials, usage."""
    tok, p = bpe.load(tokenizer_path)
    meta = bpe.info(tok, p)
    enc = bpe.Encoder(str(p))
    vocab = tok.get_vocab(with_added_tokens=True)
    inv = {i: t for t, i in vocab.items()}
    to_byte = {c: b for b, c in bpe._byte_to_unicode().items()}

    def token_bytes(t: str) -> bytes:
        try:
            return bytes(to_byte[c] for c in t)
        except KeyError:
            return t.encode()

    longest = sorted((i for i in inv if inv[i] not in meta.special), key=lambda i: (-len(token_bytes(inv[i])), i))[:top]
    out: dict = {
        "tokenizer": str(p),
        "vocab_size": meta.vocab_size,
        "special_tokens": meta.special,
        "eos_id": meta.eos_id,
        "encoder": "tiktoken" if enc.fast is not None else "tokenizers",
        "longest_tokens": [{"id": i, "text": token_bytes(inv[i]).decode("utf-8", "replace"), "bytes": len(token_bytes(inv[i]))} for i in longest],
    }
    if sample:
        docs = open_docs_inputs(sample)
        rows = [r for b in docs.batches for r in b.select([c for c in ("text", "lang") if c in b.schema.names]).to_pylist()][:max_docs]
        texts = [r.get("text") or "" for r in rows]
        ids = enc.encode_batch(texts)
        n_tok = sum(map(len, ids))
        n_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        n_chars = sum(map(len, texts))
        used = len({i for doc in ids for i in doc})
        out.update(
            sample_docs=len(texts),
            bytes_per_token=round(n_bytes / n_tok, 4) if n_tok else None,
            chars_per_token=round(n_chars / n_tok, 4) if n_tok else None,
            vocab_used=used,
            vocab_utilization=round(used / meta.vocab_size, 4),
        )
        if any("lang" in r for r in rows):
            per: dict[str, list[int]] = {}
            for r, d in zip(rows, ids):
                acc = per.setdefault(r.get("lang") or "?", [0, 0, 0])
                acc[0] += 1
                acc[1] += len(d)
                acc[2] += len(r.get("text") or "")
            en = per.get("en")
            en_rate = en[1] / en[2] if en and en[2] else None
            out["languages"] = {
                lang: {"docs": n, "tokens_per_char": round(t / c, 4) if c else None, "premium_vs_en": round((t / c) / en_rate, 3) if c and en_rate else None}
                for lang, (n, t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])
            }
        out["most_common"] = [{"id": i, "text": token_bytes(inv[i]).decode("utf-8", "replace"), "count": n} for i, n in Counter(i for d in ids for i in d).most_common(top)]
    return out

"""The pipe has ends: a WARC on stdin into crawl-extract, docs on stdin into tokenize, and a
whole crawl-extract | filter | dedup | tokenize pipeline equal to the same chain on disk."""

import glob
import hashlib
import io
import itertools
import os
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, DATA, llmctl
from llmctl.artifacts.manifest import read_manifest
from llmctl.artifacts.stdin import StdinReader
from llmctl.config import build_config, preset
from llmctl.data.dedup.run import DedupConfig, run_dedup
from llmctl.data.crawl.extract import STAGE as EXTRACT, ExtractConfig, run_crawl_extract
from llmctl.data.filter import FilterConfig, run_filter
from llmctl.data.tokenize import TokenizeConfig, run_tokenize, train_tokenizer
from llmctl.tokenizer.bpe import TrainTokenizerConfig
from llmctl.data.crawl.warc import WarcError, iter_records, iter_window, sniff_head
from llmctl.data.crawl.warcstream import WarcStream
from llmctl.errors import UsageError
from llmctl.runtime.options import RunOptions
from llmctl.runtime.split import byte_ranges

EXAMPLE = CRAWL / "CC-EXAMPLE-00000.warc.gz"


def rows(out) -> list[dict]:
    parts = sorted(glob.glob(str(Path(out) / "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist()


def without_path(rs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "warc_path"} for r in rs]


def members(data: bytes) -> list[int]:
    """Offsets of the gzip members of a well-formed multi-member file."""
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        d = zlib.decompressobj(31)
        d.decompress(data[pos:])
        pos = len(data) - len(d.unused_data)
    return offsets


def damaged_example(size: int = 1_150_000, corrupt_at: int = 1_060_000) -> bytes:
    """About `size` bytes of the example crawl's first file, with a corrupt member after
    `corrupt_at` and a truncated end."""
    data = bytearray(EXAMPLE.read_bytes())
    offs = members(bytes(data))
    mid = next(o for o in offs if o > corrupt_at)
    data[mid + 40 : mid + 60] = b"\x00" * 20  # inside the deflate data: the member fails to inflate
    return bytes(data[: next(o for o in offs if o > size) + 100])  # cut inside a member


def summary(items) -> list[tuple]:
    return [("error", i.offset, i.message) if isinstance(i, WarcError) else ("record", i.offset, i.record.rec_headers.get_header("WARC-Record-ID")) for i in items]


def file_cut(path: Path, chunk: int) -> list[list[tuple]]:
    return [summary(iter_records(str(path), s, e)) for s, e in byte_ranges(path.stat().st_size, chunk)]


def stream_cut(data: bytes, chunk: int, tmp) -> tuple[list[list[tuple]], list[int]]:
    """Records per window of `data` read as a stream, and the bytes read when each window came."""
    src = StdinReader(io.BytesIO(data))
    read_at, windows = [], []
    for t in WarcStream(src, str(tmp), starts=itertools.count(0, chunk)):
        read_at.append(src.bytes)
        p = t.payload
        windows.append(summary(iter_window(p["data"], p["start"], p["fmt"])))
    return windows, read_at


# ---------------------------------------------------------------------------------------------
# WARC on stdin: cut where a file is cut


@pytest.mark.parametrize("name", ["damaged gzip", "plain", "pages-corrupt-middle.warc.gz"])
def test_stream_windows_hold_the_records_of_the_file_ranges(tmp_path, name):
    chunk = 64 << 10
    if name == "damaged gzip":
        path = tmp_path / "damaged.warc.gz"
        path.write_bytes(damaged_example())
    elif name == "plain":  # the example crawl uncompressed, record after record
        path = tmp_path / "plain.warc"
        data = EXAMPLE.read_bytes()
        path.write_bytes(b"".join(zlib.decompressobj(31).decompress(data[a:b]) for a, b in zip(members(data), members(data)[1:] + [len(data)])))
        chunk = 256 << 10
    else:
        path = DATA / "warc-bad" / name
        if not path.exists():
            pytest.skip("shared data not available")
    data = path.read_bytes()
    windows, read_at = stream_cut(data, chunk, tmp_path)
    ranges = file_cut(path, chunk)
    assert windows == ranges  # the same records, and the same damage at the same offsets, per task
    assert sum(len(w) for w in windows) > 100 and len(windows) > 4
    if name != "plain":
        assert any(e[0] == "error" for w in windows for e in w)
    # one reader, front to back, never far ahead: window k is handed out once its end was found
    for k, got in enumerate(read_at[:-1]):
        assert got <= (k + 2) * chunk + (2 << 20)


def test_crawl_extract_from_stdin_equals_the_file_with_damage(tmp_path):
    path = tmp_path / "damaged.warc.gz"
    path.write_bytes(damaged_example(300_000, 150_000))  # (many windows: the pipeline test, below)
    cfg = build_config(ExtractConfig, EXTRACT, preset(EXTRACT, None), {})
    disk = run_crawl_extract([str(path)], str(tmp_path / "disk"), cfg, RunOptions(workers=2))
    with open(path, "rb") as f:  # and another worker count: the cut depends on the bytes alone
        stream = run_crawl_extract(["-"], str(tmp_path / "stream"), cfg, RunOptions(workers=1), stdin=f)
    assert without_path(rows(tmp_path / "stream")) == without_path(rows(tmp_path / "disk"))
    assert {r["warc_path"] for r in rows(tmp_path / "stream")} == {"-"}
    assert stream.counts == disk.counts and disk.counts["errors"] == 2
    assert [(e["offset"], e["error"]) for e in stream.errors] == [(e["offset"], e["error"]) for e in disk.errors]
    assert {e["file"] for e in stream.errors} == {"-"}
    assert [o["file"] for o in stream.outputs] == [o["file"] for o in disk.outputs]
    data = path.read_bytes()
    assert stream.inputs == [{"path": "-", "kind": "stream", "format": "warc.gz", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    m = read_manifest(tmp_path / "stream")
    assert m.inputs == stream.inputs


@pytest.mark.parametrize("name", ["example.arc.gz", "bad.arc", "example-trunc.warc", "example-wrong-chunks.warc.gz", "example-bad.warc.gz.bad"])
def test_every_format_from_stdin_equals_the_file(tmp_path, name):
    path = DATA / "warc-bad" / name
    if not path.exists():
        pytest.skip("shared data not available")
    disk = run_crawl_extract([str(path)], str(tmp_path / "disk"), ExtractConfig(), RunOptions(workers=1))
    with open(path, "rb") as f:
        stream = run_crawl_extract(["-"], str(tmp_path / "stream"), ExtractConfig(), RunOptions(workers=1), stdin=f)
    got, want = rows(tmp_path / "stream"), rows(tmp_path / "disk")
    fmt = sniff_head(path.read_bytes()[:4096])
    if fmt in ("arc", "arc.gz"):  # no record ids in ARC: a row is named by its place, FILE@OFFSET
        assert [r["id"] for r in want] == [f"{name}@{r['warc_offset']}" for r in want]
        assert [r["id"] for r in got] == [f"-@{r['warc_offset']}" for r in got]
        got, want = ([dict(r, id=None) for r in x] for x in (got, want))
    assert without_path(got) == without_path(want)
    assert stream.counts == disk.counts
    assert [(e["offset"], e["error"]) for e in stream.errors] == [(e["offset"], e["error"]) for e in disk.errors]
    assert stream.inputs[0]["format"] == fmt


def test_a_resumed_stream_reuses_its_shards_and_refuses_other_bytes(tmp_path):
    data = EXAMPLE.read_bytes()
    small = data[: members(data)[300]]  # ~280 KB of whole members
    out = str(tmp_path / "out")
    first = run_crawl_extract(["-"], out, ExtractConfig(), RunOptions(workers=1), stdin=io.BytesIO(small))
    again = run_crawl_extract(["-"], out, ExtractConfig(), RunOptions(workers=1), stdin=io.BytesIO(small))
    assert again.counts == first.counts and again.inputs == first.inputs
    other = data[: members(data)[250]]
    with pytest.raises(UsageError, match="other input bytes|other bytes on stdin"):
        run_crawl_extract(["-"], out, ExtractConfig(), RunOptions(workers=1), stdin=io.BytesIO(other))


def test_stdin_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="cannot be combined"):
        run_crawl_extract(["-", str(EXAMPLE)], str(tmp_path / "a"), ExtractConfig())
    with pytest.raises(UsageError, match="read by one job"):
        run_crawl_extract(["-"], str(tmp_path / "b"), ExtractConfig(), RunOptions(num_shards=2), stdin=io.BytesIO(EXAMPLE.read_bytes()[:50_000]))
    p = llmctl("tokenize", "-", str(tmp_path), "-o", tmp_path / "t", "-t", "x")
    assert p.returncode == 2 and len(p.stderr.decode().splitlines()) == 1 and "'-' (stdin)" in p.stderr.decode()


# ---------------------------------------------------------------------------------------------
# The whole pipe


def tokens_of(out: Path) -> tuple[bytes, list[int]]:
    """All token bytes of an artifact and its document starts, as one sequence (the shards are
    cut per input part, which a stream does not carry)."""
    blob, starts, base = b"", [], 0
    dtype = np.dtype(read_manifest(out).config["dtype"])
    for b in sorted(out.glob("tokens-*.bin")):
        data = b.read_bytes()
        starts += [base + int(s) for s in np.fromfile(b.with_suffix(".idx"), dtype=np.int64)]
        blob += data
        base += len(data) // dtype.itemsize
    return blob, starts


def test_pipeline_through_stdin_equals_the_chain_on_disk(tmp_path):
    warcs = sorted(CRAWL.glob("*.warc.gz"))
    crawl = tmp_path / "crawl.warc.gz"  # what `cat` sends: the files back to back, valid multi-member gzip
    crawl.write_bytes(b"".join(p.read_bytes() for p in warcs))
    assert members(crawl.read_bytes())[0] == 0 and sniff_head(crawl.read_bytes()[:4096]) == "warc.gz"

    # two of FineWeb's filter steps: the full chain would double this test's time for no more insight
    steps = tmp_path / "filter.toml"
    steps.write_text('[[steps]]\nname = "language"\nlanguages = ["en"]\n\n[[steps]]\nname = "gopher_quality"\n')

    # on disk, in process (the library calls the CLI makes)
    ex = build_config(ExtractConfig, EXTRACT, preset(EXTRACT, None), {})
    run_crawl_extract([str(crawl)], str(tmp_path / "docs"), ex, RunOptions(workers=2))
    run_filter([str(tmp_path / "docs")], str(tmp_path / "filtered"), build_config(FilterConfig, "filter", str(steps), {}), RunOptions(workers=2))
    run_dedup([str(tmp_path / "filtered")], str(tmp_path / "dedup"), build_config(DedupConfig, "dedup", None, {"url": True, "exact": True, "minhash": True}), RunOptions(workers=2))
    train_tokenizer([str(tmp_path / "dedup")], str(tmp_path / "tok"), TrainTokenizerConfig(vocab_size=512))
    tok_cfg = {"tokenizer": str(tmp_path / "tok"), "split": "train", "val_fraction": 0.1}
    run_tokenize([str(tmp_path / "dedup")], str(tmp_path / "tokens"), TokenizeConfig(**tok_cfg), RunOptions(workers=2))

    # the same through pipes, `-` at every joint; tee keeps two of the streams for the checks below
    py = shlex.quote(sys.executable)
    L = f"{py} -m llmctl"
    t = lambda name: shlex.quote(str(tmp_path / name))  # noqa: E731
    cmd = (
        f"set -o pipefail; cat {' '.join(shlex.quote(str(p)) for p in warcs)}"
        f" | {L} crawl-extract - -o - -q --workers 2 | tee {t('extract.arrow')}"
        f" | {L} filter - -o - -q --workers 2 --config {t('filter.toml')}"
        f" | {L} dedup - -o - -q --url --exact --minhash --workers 2 | tee {t('dedup.arrow')}"
        f" | {L} tokenize - -o {t('piped')} -q -t {t('tok')} --split train --val-fraction 0.1 --workers 2"
        f" && {L} tokenize train - -o {t('tok-piped')} -v 512 -q < {t('dedup.arrow')}"
    )
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr.decode()

    # crawl-extract from stdin = crawl-extract of the file holding the same bytes
    extracted = pa.ipc.open_stream((tmp_path / "extract.arrow").read_bytes()).read_all().to_pylist()
    assert without_path(extracted) == without_path(rows(tmp_path / "docs"))
    assert {r["warc_path"] for r in extracted} == {"-"} and len(extracted) > 1000
    # the tokens, document by document and byte for byte, and the counts
    assert tokens_of(tmp_path / "piped") == tokens_of(tmp_path / "tokens")
    piped, disk = read_manifest(tmp_path / "piped"), read_manifest(tmp_path / "tokens")
    for k in ("docs", "tokens", "bytes", "other_split", "tokens_per_byte"):
        assert piped.counts[k] == disk.counts[k], k
    assert piped.config == disk.config
    dedup = (tmp_path / "dedup.arrow").read_bytes()
    stdin_ref = {"path": "-", "kind": "stream", "format": "arrow", "bytes": len(dedup), "sha256": hashlib.sha256(dedup).hexdigest()}
    assert piped.inputs[0] == stdin_ref
    # tokenize train from stdin trains the same tokenizer
    assert (tmp_path / "tok-piped" / "tokenizer.json").read_bytes() == (tmp_path / "tok" / "tokenizer.json").read_bytes()
    assert read_manifest(tmp_path / "tok-piped").inputs == [stdin_ref]
    tree = llmctl("lineage", tmp_path / "piped", check=True).stdout.decode()
    assert f"stdin (arrow, {len(dedup):,} bytes) sha256:{stdin_ref['sha256'][:12]}" in tree


def test_tokenize_from_stdin_resumes_only_the_same_stream(tmp_path, monkeypatch):
    def stream(texts):
        t = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts})
        buf = io.BytesIO()
        with pa.ipc.new_stream(buf, t.schema) as w:
            w.write_table(t)
        return buf.getvalue()

    def tokenize(data):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        return run_tokenize(["-"], str(tmp_path / "tokens"), TokenizeConfig(tokenizer=str(tmp_path / "tok")), RunOptions(workers=1))

    texts = [f"document number {i} says hello {i * 7}" for i in range(50)]
    (tmp_path / "docs.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in texts))
    train_tokenizer([str(tmp_path / "docs.jsonl")], str(tmp_path / "tok"), TrainTokenizerConfig(vocab_size=300))
    first = tokenize(stream(texts))
    assert first.counts["docs"] == 50 and first.inputs[0]["sha256"] == hashlib.sha256(stream(texts)).hexdigest()
    assert tokenize(stream(texts)).counts == first.counts  # resumed: the same stream, its shard reused
    with pytest.raises(UsageError, match="other input bytes|other bytes on stdin"):
        tokenize(stream(texts[:40]))

"""`llmctl sample`: a seeded bottom-k sample of docs (data/sample.py), and `sample --warc`, a WARC
cut to its first N responses (data/crawl/warccut.py)."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import RecordingProgress, llmctl, shared_file
from llmctl.data.crawl.warc import WarcError, iter_records
from llmctl.data.crawl.warccut import WarcCutConfig, run_warc_cut
from llmctl.data.sample import BottomK, SampleConfig, row_keys, run_sample
from test_bad_input import cli, done, usage_error
from test_pipes import members

ROWS = 500


def _table(n: int = ROWS) -> pa.Table:
    return pa.table({"id": [f"doc-{i}" for i in range(n)], "text": [f"the text of document {i}" for i in range(n)],
                     "url": [f"https://example.com/{i}" for i in range(n)]})


def _ids(out) -> list[str]:
    return pq.read_table(out / "part-00000.parquet").column("id").to_pylist()


def _expected(n: int, seed: int, rows: int = ROWS) -> list[str]:
    """The bottom-k sample by brute force: the n smallest (key, place), in input order."""
    ids = pa.array([f"doc-{i}" for i in range(rows)])
    keys = row_keys(ids, seed, 0)
    best = sorted(sorted(range(rows), key=lambda i: (int(keys[i]), i))[:n])
    return [f"doc-{i}" for i in best]


@pytest.fixture()
def docs(tmp_path):
    t = _table()
    pq.write_table(t, tmp_path / "small_groups.parquet", row_group_size=7)
    pq.write_table(t, tmp_path / "one_group.parquet")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in t.to_pylist()))
    return tmp_path


def _stream(table: pa.Table, batch: int) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=batch):
            w.write_batch(b)
    return sink.getvalue()


# ---------------------------------------------------------------------------------------------
# docs


def test_the_sample_is_the_bottom_k_whatever_the_batching(docs, tmp_path):
    want = _expected(20, 7)
    got = {}
    for name in ("small_groups.parquet", "one_group.parquet", "docs.jsonl"):
        m = run_sample([str(docs / name)], str(tmp_path / f"out-{name}"), SampleConfig(n=20, seed=7))
        assert m.counts == {"in": ROWS, "out": 20, "errors": 0}
        got[name] = _ids(tmp_path / f"out-{name}")
    for batch in (1, 3, 64, 10_000):  # an Arrow stream on stdin, cut into batches of each size
        out = tmp_path / f"stream-{batch}"
        run_sample(["-"], str(out), SampleConfig(n=20, seed=7), stdin=io.BytesIO(_stream(_table(), batch)))
        got[f"stream {batch}"] = _ids(out)
    assert all(ids == want for ids in got.values()), got
    # the selector alone, fed the same rows in batches of every shape
    table = _table()
    for sizes in ([ROWS], [1] * ROWS, [13, 250, 1, 236], [41] * 12 + [8]):
        k = BottomK(20, 7)
        start = 0
        for size in sizes:
            k.feed(table.slice(start, size).to_batches()[0])
            start += size
        assert [i for b in k.result() for i in b.column("id").to_pylist()] == want


def test_seeds_differ_and_the_sample_is_consistent_on_a_part(docs, tmp_path):
    samples = {}
    for seed in (0, 1, 2):
        run_sample([str(docs / "one_group.parquet")], str(tmp_path / f"s{seed}"), SampleConfig(n=30, seed=seed))
        samples[seed] = _ids(tmp_path / f"s{seed}")
    assert len({tuple(s) for s in samples.values()}) == 3
    # rows keep their input order and columns
    t = pq.read_table(tmp_path / "s0" / "part-00000.parquet")
    assert t.column_names == ["id", "text", "url"]
    places = [int(i.split("-")[1]) for i in samples[0]]
    assert places == sorted(places) and t.column("text").to_pylist() == [f"the text of document {p}" for p in places]
    # keyed by id: the sample of a part of the corpus holds the corpus sample's rows that are in it
    half = _table().filter(pa.array([i % 2 == 0 for i in range(ROWS)]))
    pq.write_table(half, tmp_path / "half.parquet")
    run_sample([str(tmp_path / "half.parquet")], str(tmp_path / "h"), SampleConfig(n=30, seed=0))
    in_half = [i for i in samples[0] if int(i.split("-")[1]) % 2 == 0]
    assert set(in_half) <= set(_ids(tmp_path / "h"))


def test_n_past_the_input_keeps_every_row_and_empty_input(docs, tmp_path):
    m = run_sample([str(docs / "small_groups.parquet")], str(tmp_path / "all"), SampleConfig(n=10_000))
    assert m.counts == {"in": ROWS, "out": ROWS, "errors": 0}
    assert _ids(tmp_path / "all") == [f"doc-{i}" for i in range(ROWS)]
    pq.write_table(_table(0), tmp_path / "empty.parquet")
    m = run_sample([str(tmp_path / "empty.parquet")], str(tmp_path / "none"), SampleConfig(n=5))
    assert m.counts == {"in": 0, "out": 0, "errors": 0}
    assert pq.read_table(tmp_path / "none" / "part-00000.parquet").num_rows == 0
    (tmp_path / "empty.jsonl").write_text("")
    s = done(cli("sample", tmp_path / "empty.jsonl", "-n", "3", "-o", tmp_path / "none2", "--json"))
    assert s["counts"]["out"] == 0


def test_stream_out_equals_the_artifact(docs, tmp_path):
    run_sample([str(docs / "docs.jsonl")], str(tmp_path / "a"), SampleConfig(n=12, seed=3))
    out = io.BytesIO()
    m = run_sample([str(docs / "docs.jsonl")], "-", SampleConfig(n=12, seed=3), stdout=out)
    assert m.counts["out"] == 12
    streamed = pa.ipc.open_stream(out.getvalue()).read_all()
    assert streamed.equals(pq.read_table(tmp_path / "a" / "part-00000.parquet"))
    # and through a pipe: sample | head, stdin to stdout
    out2 = io.BytesIO()
    run_sample(["-"], "-", SampleConfig(n=12, seed=3), stdin=io.BytesIO(out.getvalue()), stdout=out2)
    assert pa.ipc.open_stream(out2.getvalue()).read_all().equals(streamed)


def test_bad_n_is_one_line_and_nothing_is_written(docs, tmp_path):
    for value in ("0", "-1", "2.5", str(2**70)):
        usage_error(cli("sample", docs / "one_group.parquet", "-n", value, "-o", tmp_path / "o"), "-n")
    usage_error(cli("sample", docs / "one_group.parquet", "--seed", "-1", "-o", tmp_path / "o"), "--seed")
    usage_error(cli("sample", "--warc", docs / "one_group.parquet", "-n", "0", "-o", tmp_path / "o"), "-n")
    assert not (tmp_path / "o").exists()


def test_rerun_is_a_no_op_and_another_seed_is_refused(docs, tmp_path):
    out = tmp_path / "s"
    first = run_sample([str(docs / "one_group.parquet")], str(out), SampleConfig(n=9, seed=4))
    part = out / "part-00000.parquet"
    before = part.stat().st_mtime_ns
    progress = RecordingProgress()
    again = run_sample([str(docs / "one_group.parquet")], str(out), SampleConfig(n=9, seed=4), progress)
    assert again.counts == first.counts and part.stat().st_mtime_ns == before
    assert any("nothing to do" in m for m in progress.messages)
    usage_error(cli("sample", docs / "one_group.parquet", "-n", "9", "--seed", "5", "-o", out), "another config")
    done(cli("sample", docs / "one_group.parquet", "-n", "9", "--seed", "5", "-o", out, "--overwrite", "-q"))
    assert _ids(out) == _expected(9, 5)


def test_damaged_docs_are_counted(tmp_path):
    lines = [json.dumps({"id": f"d{i}", "text": f"text {i}"}) for i in range(20)]
    lines[3], lines[11] = '{"id": "broken", "text": ', "\xff not json"
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    s = done(cli("sample", tmp_path / "bad.jsonl", "-n", "100", "-o", tmp_path / "o", "--json"))
    assert s["counts"] == {"in": 18, "out": 18, "errors": 2}
    r = cli("sample", tmp_path / "bad.jsonl", "-n", "100", "-o", tmp_path / "o2", "--strict", "-q")
    assert r.code == 1 and "--strict" in r.err, r.why()


# ---------------------------------------------------------------------------------------------
# --warc


def _responses(path) -> int:
    return sum(1 for it in iter_records(str(path)) if not isinstance(it, WarcError) and it.record.rec_type == "response")


def test_warc_cut_of_pages_a_is_a_prefix_crawl_extract_reads_with_n_responses(tmp_path):
    src = shared_file("web/pages-a.warc.gz")
    n = 4
    s = done(cli("sample", "--warc", src, "-n", n, "-o", tmp_path / "cut", "--json"))
    assert s["counts"]["responses"] == n and s["counts"]["errors"] == 0
    part = tmp_path / "cut" / "part-00000.warc.gz"
    cut, original = part.read_bytes(), src.read_bytes()
    assert original[: len(cut)] == cut  # byte for byte: the original's first members
    assert len(cut) in members(src.read_bytes()) + [src.stat().st_size] and len(cut) < len(original)
    m = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert m["kind"] == "warc" and m["inputs"][0]["sha256"] and m["outputs"][0]["file"] == "part-00000.warc.gz"
    # each response came with its request before it and its metadata after it
    types = [it.record.rec_type for it in iter_records(str(part))]
    assert types == ["warcinfo"] + ["request", "response", "metadata"] * n
    x = done(cli("crawl-extract", tmp_path / "cut", "-o", tmp_path / "docs", "--workers", "1", "--json"))
    xm = json.loads((tmp_path / "docs" / "manifest.json").read_text())
    assert xm["counts"]["records"] - xm["counts"]["skipped"]["not_response"] == n == x["counts"]["in"]
    assert xm["counts"]["errors"] == 0
    # the same cut on stdout is the same bytes, which crawl-extract reads on stdin; a rerun into OUT does nothing
    piped = llmctl("sample", "--warc", src, "-n", n, "-o", "-", "-q", check=True).stdout
    assert piped == cut
    streamed = llmctl("crawl-extract", "-", "-o", tmp_path / "docs2", "--workers", "1", "-q", input=piped, check=True)
    assert streamed.returncode == 0 and json.loads((tmp_path / "docs2" / "manifest.json").read_text())["counts"]["in"] == n
    before = part.stat().st_mtime_ns
    r = cli("sample", "--warc", src, "-n", n, "-o", tmp_path / "cut")
    assert r.code == 0 and "nothing to do" in r.err and part.stat().st_mtime_ns == before, r.why()
    usage_error(cli("sample", "--warc", src, "-n", n, "--seed", "1", "-o", tmp_path / "c2"), "--seed")


def test_warc_cut_to_stdout_is_the_part(tmp_path):
    src = shared_file("web/pages-a.warc.gz")
    out = io.BytesIO()
    m = run_warc_cut([str(src)], "-", WarcCutConfig(n=2), stdout=out)
    assert m.counts["responses"] == 2 and src.read_bytes().startswith(out.getvalue())
    run_warc_cut([str(src)], str(tmp_path / "c"), WarcCutConfig(n=2))
    assert (tmp_path / "c" / "part-00000.warc.gz").read_bytes() == out.getvalue()


def test_warc_cut_past_the_file_and_over_several_files(tmp_path):
    src = shared_file("warc-bad/example.warc.gz")
    total = _responses(src)
    m = run_warc_cut([str(src), str(src)], str(tmp_path / "c"), WarcCutConfig(n=total + 1))
    assert m.counts["responses"] == total + 1 and [o["file"] for o in m.outputs] == ["part-00000.warc.gz", "part-00001.warc.gz"]
    assert (tmp_path / "c" / "part-00000.warc.gz").read_bytes() == src.read_bytes()  # a file with fewer: all of it
    m = run_warc_cut([str(src)], str(tmp_path / "d"), WarcCutConfig(n=1000))
    assert m.counts["responses"] == total and m.counts["errors"] == 0


@pytest.mark.parametrize("name", ["pages-corrupt-middle.warc.gz", "pages-truncated.warc.gz"])
def test_damaged_warc_stops_the_cut_before_the_damage(name, tmp_path):
    src = shared_file(f"warc-bad/{name}")
    damage = next(it.offset for it in iter_records(str(src)) if isinstance(it, WarcError))
    before = 0
    for it in iter_records(str(src)):
        if isinstance(it, WarcError):
            break
        before += it.record.rec_type == "response"
    s = done(cli("sample", "--warc", src, "-n", "100000", "-o", tmp_path / "c", "--json"))
    assert s["counts"]["responses"] == before and s["counts"]["errors"] == 1
    assert s["errors"][0]["offset"] == damage and name in s["errors"][0]["file"]
    cut = (tmp_path / "c" / "part-00000.warc.gz").read_bytes()
    assert len(cut) == damage and src.read_bytes()[:damage] == cut
    assert _responses(tmp_path / "c" / "part-00000.warc.gz") == before
    assert not [it for it in iter_records(str(tmp_path / "c" / "part-00000.warc.gz")) if isinstance(it, WarcError)]
    r = cli("sample", "--warc", src, "-n", "100000", "-o", tmp_path / "strict", "--strict")
    assert r.code == 1 and "Traceback" not in r.err and "--strict" in r.err.strip().splitlines()[-1], r.why()


def test_warc_cut_of_odd_inputs_is_counted_never_a_traceback(tmp_path):
    arc = shared_file("warc-bad/example.arc.gz")
    good = shared_file("warc-bad/example.warc.gz")
    s = done(cli("sample", "--warc", arc, good, "-n", "1", "-o", tmp_path / "c", "--json"))
    assert s["counts"]["responses"] == 1 and s["counts"]["errors"] == 1 and "ARC" in s["errors"][0]["error"]
    garbage = tmp_path / "garbage.warc.gz"
    garbage.write_bytes(b"garbage garbage\n")
    s = done(cli("sample", "--warc", garbage, "-n", "1", "-o", tmp_path / "g", "--json"))
    assert s["counts"]["responses"] == 0 and s["counts"]["errors"] == 1
    usage_error(cli("sample", "--warc", tmp_path / "nope.warc.gz", "-n", "1", "-o", tmp_path / "n"), "not found")
    usage_error(cli("sample", "--warc", "-", "-n", "1", "-o", tmp_path / "n"), "stdin")
    for bad in shared_file("warc-bad/example.warc.gz").parent.iterdir():  # every damaged sample file: 0 or 2, one line
        r = cli("sample", "--warc", bad, "-n", "3", "-o", tmp_path / f"b-{bad.name}", "-q")
        assert r.code in (0, 2) and "Traceback" not in r.err, r.why()
        if r.code == 2:
            usage_error(r)

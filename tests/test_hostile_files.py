"""Hostile files among good ones (docs/design.md §3, "Bad input never loses good data"): every
docs reader given an input folder that holds, beside good rows, a file whose name is not UTF-8,
a FIFO, a socket, a symbolic link loop, a file that does not read, or a JSONL line over the
line limit amid good lines, ends in exit 0 with the hostile entry counted and named (the name
that is not UTF-8 is read), every good row in its output, no traceback and no hang; a folder
holding nothing readable is exit 2 in one line.

Cases run in this process through `llmctl.cli.main` under an alarm, with `--workers 1` (tasks
run here too), so the line limit is set small for them; one case reads a real 40 MB line at the
default limit, the issue's reproduction."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import llmctl.artifacts.jsonl as jsonl
from llmctl.artifacts.docs import DocsSource, ReadLog, read_source
from test_bad_input import cli as run_cli

WORDS = "river mill grain town baskets bridge market morning bread stone wall lantern teapot kettle map ink".split()


def texts(n: int, seed: int) -> list[str]:
    """Texts that differ in their words (dedup's normalization drops digits)."""
    return [" ".join(random.Random(seed * 1000 + i).choices(WORDS, k=14)) + "." for i in range(n)]


GOOD_ROWS = 7  # good.parquet in every case folder
LIMIT = 4096  # MAX_LINE_BYTES for the matrix: the long line is 3x over it


def cli(*args, timeout: int = 60) -> tuple[int | str, str, str]:
    """`llmctl ARGS` in this process (test_bad_input's harness: a hang fails the test, a traceback
    is code "traceback"): (exit code, stdout, stderr)."""
    r = run_cli(*args, timeout=timeout)
    return r.code, r.out, r.err


def unreadable(path: Path) -> str:
    """A regular file whose bytes do not read. Not root: mode 000. Root reads any mode, so a link
    to /proc/self/mem stands in: a regular file whose read at byte 0 fails with EIO."""
    if os.geteuid() != 0:
        path.write_text(json.dumps({"text": "never read"}) + "\n")
        path.chmod(0)
        return "mode 000"
    path.symlink_to("/proc/self/mem")
    return "EIO"


def long_line_jsonl(path: Path, over: int) -> None:
    """3 good lines, one JSON line of `over` bytes, 3 good lines."""
    good = [json.dumps({"text": t}).encode() for t in texts(6, 99)]
    huge = b'{"text": "' + b"a" * (over - 12) + b'"}'
    assert len(huge) == over
    path.write_bytes(b"\n".join(good[:3] + [huge] + good[3:]) + b"\n")


NON_UTF8 = b"part-\xe9.parquet"

# case -> (what to put beside good.parquet, good rows the case folder holds, entries counted as skipped)
CASES = {
    "non_utf8_name": (lambda d: pq.write_table(pa.table({"text": texts(3, 1)}), open(os.fsencode(d) + b"/" + NON_UTF8, "wb")), 3, 0),
    "fifo": (lambda d: os.mkfifo(d / "pipe.jsonl"), 0, 1),
    "socket": (lambda d: SOCKETS.append(_bind(d / "sock.parquet")), 0, 1),
    "symlink_loop": (lambda d: (d / "loop.parquet").symlink_to("loop.parquet"), 0, 1),
    "unreadable": (lambda d: unreadable(d / "unread.jsonl"), 0, 1),
    "long_line": (lambda d: long_line_jsonl(d / "long.jsonl", 3 * LIMIT), 6, 1),
}
SOCKETS: list[socket.socket] = []


def _bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    out = {}
    for name, (put, _, _) in CASES.items():
        d = root / name
        d.mkdir()
        pq.write_table(pa.table({"text": texts(GOOD_ROWS, 0)}), d / "good.parquet")
        put(d)
        out[name] = d
    nothing = root / "nothing_readable"  # only what is never read
    nothing.mkdir()
    os.mkfifo(nothing / "pipe.jsonl")
    SOCKETS.append(_bind(nothing / "sock.parquet"))
    (nothing / "loop.parquet").symlink_to("loop.parquet")
    out["nothing_readable"] = nothing
    (root / "tasks.jsonl").write_text(json.dumps({"prompt": "What is 2 + 2?", "answer": "4"}) + "\n")
    (root / "filter.toml").write_text('[[steps]]\nname = "c4"\n')
    docs_dir = root / "tokdocs"
    docs_dir.mkdir()
    pq.write_table(pa.table({"text": texts(200, 5)}), docs_dir / "docs.parquet")
    assert cli("tokenize", "train", docs_dir / "docs.parquet", "-o", root / "tok", "--vocab-size", "300", "--quiet")[0] == 0
    out.update(root=root, tasks=root / "tasks.jsonl", filter=root / "filter.toml", tok=root / "tok")
    yield out
    for s in SOCKETS:
        s.close()


def commands(f, out: Path) -> dict[str, list]:
    """Every docs reader: the command line reading IN and writing under `out`."""
    return {
        "cat": ["cat", "IN", "-o", out / "cat"],
        "head": ["head", "-n", "1000", "IN", "-o", out / "head"],
        "inspect": ["inspect", "IN"],
        "filter": ["filter", "IN", "-o", out / "filter", "--config", f["filter"], "--annotate-only", "--workers", "1"],
        "dedup": ["dedup", "IN", "-o", out / "dedup", "--exact", "--workers", "1"],
        "decontam": ["decontam", "IN", "--against", f["tasks"], "-o", out / "decontam", "--workers", "1"],
        "tokenize": ["tokenize", "IN", "-o", out / "tokenize", "-t", f["tok"], "--workers", "1"],
        "tokenize train": ["tokenize", "train", "IN", "-o", out / "tokenize-train", "--vocab-size", "300"],
    }


def rows_written(out: Path) -> int:
    """Rows of the kept parts of a docs artifact, from the parts themselves."""
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return sum(pq.read_metadata(out / o["file"]).num_rows for o in m["outputs"] if not o["file"].startswith("rejected/"))


def test_every_docs_reader_on_every_hostile_file(folders, tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", LIMIT)
    tally = {"cases": 0, "exit 0": 0, "exit 2": 0, "tracebacks": 0, "signals": 0}  # a hang fails the test in cli()
    failures = []
    for case, (_, extra_rows, skips) in CASES.items():
        rows = GOOD_ROWS + extra_rows
        for command, argv in commands(folders, tmp_path / case).items():
            code, out, err = cli(*[folders[case] if a == "IN" else a for a in argv], "--json")
            tally["cases"] += 1
            tally["tracebacks"] += code == "traceback" or "Traceback" in err
            tally["signals"] += isinstance(code, int) and code >= 128
            if code != 0 or "Traceback" in err:
                failures.append(f"{command} on {case}: exit {code}\n{err[-2000:]}")
                continue
            tally["exit 0"] += 1
            s = json.loads(out)
            got = (s["rows"], s["error_count"]) if command == "inspect" else (
                s["counts"]["docs" if command.startswith("tokenize") else "out"], s["counts"]["errors"])
            if got != (rows, skips):
                failures.append(f"{command} on {case}: (rows, skipped) {got}, not {(rows, skips)}")
                continue
            if command in ("cat", "head", "filter", "dedup", "decontam"):
                written = rows_written(tmp_path / case / command.replace(" ", "-"))
                if written != rows:
                    failures.append(f"{command} on {case}: {written} rows written, not {rows}")
            if skips and command != "inspect":  # named: in the summary's errors and in a log line
                named = [e["file"] for e in s["errors"]]
                if len(named) != skips or not all(Path(n).parent == folders[case] for n in named):
                    failures.append(f"{command} on {case}: errors {s['errors']}")
                if "skipped damage in" not in err:
                    failures.append(f"{command} on {case}: no log line names the skip\n{err}")
    assert tally == {"cases": 48, "exit 0": 48, "exit 2": 0, "tracebacks": 0, "signals": 0}, "\n\n".join(failures)
    assert not failures, "\n\n".join(failures)


def test_a_folder_of_nothing_readable_is_one_line_exit_2_for_every_docs_reader(folders, tmp_path):
    for command, argv in commands(folders, tmp_path).items():
        code, out, err = cli(*[folders["nothing_readable"] if a == "IN" else a for a in argv])
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (command, code, err)
        assert "not opened" in err or "loop" in err, (command, err)


def test_a_name_that_is_not_utf8_is_read_and_shown_as_its_bytes(folders, tmp_path):
    code, out, err = cli("cat", folders["non_utf8_name"], "-o", tmp_path / "c", "--quiet")
    assert code == 0, err
    ids = pq.read_table(tmp_path / "c" / "part-00000.parquet").column("id").to_pylist()
    assert ids[GOOD_ROWS:] == ["part-\\xe9.parquet/0", "part-\\xe9.parquet/1", "part-\\xe9.parquet/2"]
    typed = os.fsdecode(os.fsencode(folders["non_utf8_name"]) + b"/" + NON_UTF8)  # as a shell hands it over
    code, out, err = cli("cat", typed, "-o", tmp_path / "typed", "--quiet")
    assert code == 0, err
    manifest = (tmp_path / "typed" / "manifest.json").read_bytes().decode("utf-8")  # strict UTF-8
    assert json.loads(manifest)["inputs"][0]["path"].endswith("part-\\xe9.parquet")


def test_a_path_typed_alone_must_be_a_file_and_a_glob_counts_what_it_matches(folders, tmp_path):
    for typed, words in ((folders["fifo"] / "pipe.jsonl", "a FIFO"), (folders["socket"] / "sock.parquet", "a socket"),
                         (folders["symlink_loop"] / "loop.parquet", "loop")):
        code, out, err = cli("cat", typed, "-o", tmp_path / typed.name)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, (typed, err)
    code, out, err = cli("cat", f"{folders['fifo']}/*", "-o", tmp_path / "glob", "--json")
    s = json.loads(out)
    assert code == 0 and s["counts"]["out"] == GOOD_ROWS and s["counts"]["errors"] == 1, err
    assert s["errors"][0]["file"].endswith("pipe.jsonl") and "FIFO" in s["errors"][0]["error"]


def test_links_follow_one_rule(tmp_path):
    """A link is read when it ends at a regular file; inside an input folder a link to a folder
    is not descended, and a link that dangles is counted; a folder typed through a link is read."""
    real = tmp_path / "real"
    real.mkdir()
    pq.write_table(pa.table({"text": texts(4, 2)}), real / "a.parquet")
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"text": texts(GOOD_ROWS, 0)}), d / "good.parquet")
    (d / "to_file.parquet").symlink_to(real / "a.parquet")
    (d / "to_folder").symlink_to(real)
    (d / "dangling.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    code, out, err = cli("cat", d, "-o", tmp_path / "c", "--json")
    s = json.loads(out)
    assert code == 0 and s["counts"]["out"] == GOOD_ROWS + 4, err
    assert sorted((Path(e["file"]).name, e["error"].split(" (")[0]) for e in s["errors"]) == [
        ("dangling.jsonl", "a dangling symbolic link"), ("to_folder", "a symbolic link to a folder")]
    code, out, err = cli("cat", d / "to_folder", "-o", tmp_path / "typed", "--json")
    assert code == 0 and json.loads(out)["counts"]["out"] == 4, err


def test_a_40mb_line_loses_nothing_after_it(tmp_path):
    """The issue's reproduction at the default limit: 3 good lines, a 40 MB line, 3 good lines."""
    long_line_jsonl(tmp_path / "x.jsonl", 40_000_000)
    code, out, err = cli("cat", tmp_path / "x.jsonl", "-o", tmp_path / "c", "--json")
    s = json.loads(out)
    assert code == 0 and s["counts"]["out"] == 6 and s["counts"]["errors"] == 1, err
    e = s["errors"][0]
    assert e["line"] == 4 and "40000000 bytes" in e["error"], e
    assert rows_written(tmp_path / "c") == 6
    ids = pq.read_table(tmp_path / "c" / "part-00000.parquet").column("id").to_pylist()
    assert ids == ["x.jsonl/0", "x.jsonl/1", "x.jsonl/2", "x.jsonl/4", "x.jsonl/5", "x.jsonl/6"]  # the file's row numbers


@pytest.mark.parametrize("gz", [False, True])
def test_the_line_limit_is_exact_and_holds_in_gzip(tmp_path, monkeypatch, gz):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 100)

    def line(n: int) -> bytes:
        return b'{"text": "' + b"b" * (n - 12) + b'"}'

    body = b"\n".join([line(100), line(101), line(100), line(250), line(99)])  # the last without a newline
    path = tmp_path / ("x.jsonl.gz" if gz else "x.jsonl")
    path.write_bytes(gzip.compress(body) if gz else body)
    log = ReadLog()
    batches = list(read_source(DocsSource(str(path), "jsonl", path.name), log=log))
    assert [len(t) for b in batches for t in b.column("text").to_pylist()] == [88, 88, 87]
    assert [(e["line"], e["offset"]) for e in log.errors] == [(2, 101), (4, 304)]
    assert "a line of 101 bytes, over the 100-byte limit" in log.errors[0]["error"]
    assert [i for b in batches for i in b.column("id").to_pylist()] == [f"{path.name}/{r}" for r in (0, 2, 4)]


def test_crawl_extract_and_inspect_list_a_warc_folder_by_the_same_rule(tmp_path):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    d = tmp_path / "warcs"
    d.mkdir()
    with open(d / "a.warc.gz", "wb") as f:
        w = WARCWriter(f, gzip=True)
        for i, t in enumerate(texts(3, 7)):
            html = f"<html><head><title>Page {i}</title></head><body><article><h1>Page {i}</h1><p>{t} {t} {t}</p></article></body></html>"
            headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(f"https://a.example/{i}", "response", payload=io.BytesIO(html.encode()), http_headers=headers))
    (open(os.fsencode(d) + b"/b-\xe9.warc.gz", "wb")).write((d / "a.warc.gz").read_bytes())
    os.mkfifo(d / "c.warc.gz")
    (d / "d.warc.gz").symlink_to("d.warc.gz")
    code, out, err = cli("crawl-extract", d, "-o", tmp_path / "x", "--workers", "1", "--json")
    assert code == 0 and "Traceback" not in err, err
    s = json.loads(out)
    assert s["counts"]["records"] == 6 and s["counts"]["errors"] == 2, s
    assert [(Path(e["file"]).name, e["error"]) for e in s["errors"]] == [
        ("c.warc.gz", "a FIFO, not a regular file: not opened"), ("d.warc.gz", "a symbolic link loop")]
    paths = {p for part in sorted((tmp_path / "x").glob("part-*.parquet")) for p in pq.read_table(part).column("warc_path").to_pylist()}
    assert {Path(p).name for p in paths} == {"a.warc.gz", "b-\\xe9.warc.gz"}, s["counts"]  # both read, the odd name shown
    code, out, err = cli("inspect", d, "--json")
    s = json.loads(out)
    assert code == 0 and s["files"] == 2 and s["records"]["response"] == 6 and s["error_count"] == 2, (err, s)
    code, out, err = cli("crawl-extract", d / "c.warc.gz", "-o", tmp_path / "y")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "a FIFO" in err, err

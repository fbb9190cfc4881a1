"""The CLI as a user meets it: exit codes, one-line errors, pipes between commands."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import llmctl


def make_docs(tmp_path, n=7):
    p = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(n)], "text": [f"text {i} é" for i in range(n)], "extra": list(range(n))}), p)
    return p


def test_version_and_help():
    assert llmctl("--version", check=True).stdout.decode().startswith("llmctl ")
    out = llmctl("--help", check=True).stdout.decode()
    for cmd in ("inspect", "lineage", "cat", "head"):
        assert cmd in out


def test_usage_errors_exit_2_with_one_line_and_no_traceback(tmp_path):
    for args in (["cat"], ["cat", "x"], ["cat", tmp_path / "missing.parquet", "-o", tmp_path / "o"], ["head", "--bogus"], ["inspect", tmp_path / "nope"], ["lineage", tmp_path]):
        p = llmctl(*args)
        err = p.stderr.decode()
        assert p.returncode == 2, (args, err)
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1 and err.startswith("llmctl: error: "), err


def test_existing_output_needs_overwrite(tmp_path):
    src = make_docs(tmp_path)
    llmctl("cat", src, "-o", tmp_path / "o", check=True)
    p = llmctl("cat", src, "-o", tmp_path / "o")
    assert p.returncode == 2 and "--overwrite" in p.stderr.decode()
    llmctl("cat", src, "-o", tmp_path / "o", "--overwrite", check=True)


def test_cat_pipe_head_pipe(tmp_path):
    src = make_docs(tmp_path)
    llmctl("cat", src, "-o", tmp_path / "a", "--quiet", check=True)
    stream = llmctl("cat", tmp_path / "a", "-o", "-", check=True).stdout
    head = llmctl("head", "-n", "5", "-", "-o", tmp_path / "b", input=stream, check=True)
    assert head.stdout == b""
    got = pq.read_table(tmp_path / "b" / "part-00000.parquet").to_pylist()
    assert [r["id"] for r in got] == ["d0", "d1", "d2", "d3", "d4"] and got[0]["extra"] == 0
    info = json.loads(llmctl("inspect", tmp_path / "b", "--json", check=True).stdout)
    assert info["kind"] == "docs" and info["rows"] == 5 and info["stage"] == "head"
    tree = json.loads(llmctl("lineage", tmp_path / "b", "--json", check=True).stdout)
    assert tree["stage"] == "head" and tree["inputs"] == [{"path": "-", "kind": "stream"}]


def test_json_summary_and_stream_inspect(tmp_path):
    src = make_docs(tmp_path)
    summary = json.loads(llmctl("--json", "cat", src, "-o", tmp_path / "a", check=True).stdout)
    assert summary["counts"] == {"in": 7, "out": 7}
    stream = llmctl("cat", src, "-o", "-", "--quiet", check=True).stdout
    info = json.loads(llmctl("inspect", "-", "--json", input=stream, check=True).stdout)
    assert info["rows"] == 7 and info["schema"]["extra"] == "int64"


def test_stdin_that_is_not_a_stream_is_a_usage_error():
    p = llmctl("head", "-n", "1", "-", "-o", "-", input=b"hello, not arrow")
    assert p.returncode == 2 and "not an Arrow IPC stream" in p.stderr.decode()

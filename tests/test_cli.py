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
    """The same command again over its finished output is a no-op (exit 0); another command, or the
    same one with another config, needs --overwrite."""
    src = make_docs(tmp_path)
    llmctl("cat", src, "-o", tmp_path / "o", check=True)
    before = {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}
    p = llmctl("cat", src, "-o", tmp_path / "o")
    assert p.returncode == 0 and "nothing to do" in p.stderr.decode(), p.stderr.decode()
    assert {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()} == before
    for other in (["head", "-n", "2", src], ["cat", src, "--rows-per-part", "7"]):
        p = llmctl(*other, "-o", tmp_path / "o")
        assert p.returncode == 2 and "--overwrite" in p.stderr.decode(), p.stderr.decode()
    assert {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()} == before
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
    assert summary["counts"] == {"in": 7, "out": 7, "errors": 0}
    stream = llmctl("cat", src, "-o", "-", "--quiet", check=True).stdout
    info = json.loads(llmctl("inspect", "-", "--json", input=stream, check=True).stdout)
    assert info["rows"] == 7 and info["schema"]["extra"] == "int64"


def test_stdin_that_is_not_a_stream_is_a_usage_error():
    p = llmctl("head", "-n", "1", "-", "-o", "-", input=b"hello, not arrow")
    assert p.returncode == 2 and "not an Arrow IPC stream" in p.stderr.decode()


# The command line's own wiring: run-control flags declared once, eval's default preset.

RUN_CONTROL = ["--workers", "--shard-index", "--num-shards", "--overwrite", "--strict", "--executor", "--ray-address", "--cpus-per-task", "--memory-per-task"]


def _command(*path):
    import typer

    from llmctl.cli import app

    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def test_run_control_flags_are_the_same_on_every_stage():
    stages = {("crawl-extract",): RUN_CONTROL, ("filter", "run"): RUN_CONTROL, ("decontam",): RUN_CONTROL,
              ("dedup",): [f for f in RUN_CONTROL if f not in ("--shard-index", "--num-shards")],
              ("tokenize", "run"): RUN_CONTROL, ("embed",): RUN_CONTROL}  # tokenize skips damaged input too
    seen = {}
    for path, expected in stages.items():
        params = [p for p in _command(*path).params if p.opts[0] in RUN_CONTROL]
        assert [p.opts[0] for p in params] == expected, path
        for p in params:  # same help and default wherever a flag appears
            assert seen.setdefault(p.opts[0], (p.help, p.default)) == (p.help, p.default), (path, p.opts)


def test_run_control_errors_are_usage_errors(tmp_path):
    src = make_docs(tmp_path)
    for args, message in ((["--shard-index", "2", "--num-shards", "2"], "--shard-index 2 must be below --num-shards 2"),
                          (["--executor", "spark"], "--executor must be one of local, ray, not 'spark'"),
                          (["--memory-per-task", "4G"], "--memory-per-task needs --executor ray")):
        p = llmctl("decontam", src, "--against", src, "-o", tmp_path / "o", *args)
        err = p.stderr.decode()
        assert p.returncode == 2 and err.strip() == f"llmctl: error: {message}", err


def test_eval_default_preset_is_the_flag_defaults():
    import tomllib

    from conftest import ROOT

    preset = tomllib.loads((ROOT / "stages" / "eval" / "default.toml").read_text())
    flags = {p.name: p.default for p in _command("eval", "run").params}
    flags["pass_k"] = flags["pass_k"] or [1]  # no --pass-k: pass@1
    assert preset == {k: flags[k] for k in preset}
    assert set(flags) - set(preset) == {"checkpoint", "output", "task", "config", "limit", "extract", "overwrite", "quiet", "json_"}  # no --extract: each family's rule

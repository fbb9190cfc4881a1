"""Bad input, stage by stage (README, "Conventions every stage keeps"): every command given a
missing path, an empty file or directory, a 0-row or 0-byte Parquet file, no or a non-string
text column, null texts, an undecodable or broken JSONL line, a corrupt manifest, the wrong
artifact kind, a truncated token shard, a bad TOML file, an unknown or ill-typed --set, or a
zero or negative number ends in exit 0 with what it skipped counted, or exit 2 with one line on
stderr — never a traceback, never a hang.

Most cases run in this process through `llmctl.cli.main` (the function `python -m llmctl` runs:
the same exit codes and stderr, without an interpreter start per case) under an alarm; the
truncated token shard under train and eval runs as real processes, as a user would meet it."""

from __future__ import annotations

import gc
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import ROOT
from llmctl.bounds import BOUNDS
from llmctl.cli import main
from llmctl.data.filter import FilterConfig, run_filter
from llmctl.runtime.options import RunOptions

# a one-layer model of 32 wide that trains 2 steps of 128 tokens: what a case needs of a checkpoint
TINY_TRAIN = ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.d_ff=64",
              "--set", "model.max_seq_len=32", "--seq-len", "32", "--batch-tokens", "128", "--micro-batch", "4",
              "--max-tokens", "256", "--threads", "1"]

# ---------------------------------------------------------------------------------------------
# running commands


@dataclass
class Run:
    args: tuple
    code: int | str
    out: str
    err: str

    def why(self) -> str:
        return f"llmctl {' '.join(map(str, self.args))} -> {self.code}\n{self.err}"


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def cli(*args, timeout: int = 60) -> Run:
    """`llmctl ARGS` in this process: exit code, stdout, stderr. An exception escaping main()
    is what a user would see as a traceback: it is returned as code "traceback"."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str = 0
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _Hang:
        pytest.fail(f"llmctl {' '.join(map(str, args))} did not finish in {timeout} s")
    except BaseException:
        code = "traceback"
        err.write("Traceback (most recent call last):\n" + traceback.format_exc())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        gc.unfreeze()  # main() freezes what exists, for a process that ends after one command
    return Run(args, code, out.getvalue(), err.getvalue())


def usage_error(r: Run, *words: str) -> None:
    assert r.code == 2, r.why()
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.why()
    for w in words:
        assert w in r.err, r.why()


def done(r: Run) -> dict | None:
    """Exit 0, no traceback; the --json summary when there is one."""
    assert r.code == 0 and "Traceback" not in r.err, r.why()
    return json.loads(r.out) if r.out.strip().startswith("{") else None


# ---------------------------------------------------------------------------------------------
# the bad inputs

WORDS = "river mill grain town baskets bridge market morning bread stone wall lantern teapot kettle map ink".split()
# 47 texts that differ in their words, not only in their digits (which dedup's normalization drops)
GOOD = [" ".join(random.Random(i).choices(WORDS, k=14)) + "." for i in range(47)]


def _jsonl_with(bad: list[bytes], where: list[int]) -> bytes:
    lines = [json.dumps({"text": t}).encode() for t in GOOD]
    for line, at in sorted(zip(bad, where), key=lambda x: x[1]):  # `where`: 0-based line numbers in the result
        lines.insert(at, line)
    return b"\n".join(lines) + b"\n"


BAD_UTF8 = b'{"text": "caf\xe9 \xff"}'
LONE_SURROGATE = b'{"text": "half a pair \\ud800 here"}'
BROKEN_JSON = b'{"text": "no closing brace"'


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    good = pa.table({"text": GOOD[:10]})
    paths = {}

    def put(name, write):
        paths[name] = d / name
        write(paths[name])

    put("missing.parquet", lambda p: None)
    put("empty.jsonl", lambda p: p.write_bytes(b""))
    put("emptydir", lambda p: p.mkdir())
    put("zero_rows.parquet", lambda p: pq.write_table(good.slice(0, 0), p))
    put("zero_bytes.parquet", lambda p: p.write_bytes(b""))
    put("no_text.parquet", lambda p: pq.write_table(pa.table({"body": GOOD[:3]}), p))
    put("int_text.parquet", lambda p: pq.write_table(pa.table({"text": [1, 2, 3]}), p))
    put("null_texts.parquet", lambda p: pq.write_table(pa.table({"text": GOOD[:3] + [None, ""]}), p))
    put("bad_utf8.jsonl", lambda p: p.write_bytes(_jsonl_with([BAD_UTF8], [5])))
    put("broken_json.jsonl", lambda p: p.write_bytes(_jsonl_with([BROKEN_JSON], [20])))
    put("three_bad.jsonl", lambda p: p.write_bytes(_jsonl_with([BAD_UTF8, LONE_SURROGATE, BROKEN_JSON], [3, 17, 40])))

    def mixed(p):  # one good file among a corrupt and an empty one
        p.mkdir()
        pq.write_table(good, p / "a.parquet")
        (p / "b.parquet").write_bytes(b"PAR1 this was never a parquet file PAR1")
        (p / "c.parquet").write_bytes(b"")

    put("mixed", mixed)
    # artifacts: a good docs artifact, one whose manifest is not JSON
    assert cli("cat", d / "null_texts.parquet", "-o", d / "docs_artifact", "--quiet").code == 0
    paths["docs_artifact"] = d / "docs_artifact"
    put("corrupt_manifest", lambda p: shutil.copytree(d / "docs_artifact", p))
    (paths["corrupt_manifest"] / "manifest.json").write_text('{"kind": "docs", "stage": ')
    put("bad.toml", lambda p: p.write_text("ngram = \n"))
    put("tasks.jsonl", lambda p: p.write_text("\n".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(5)) + "\n"))
    put("filter.toml", lambda p: p.write_text('[[steps]]\nname = "c4"\n'))
    return paths


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tokenizer, a tokens artifact and a one-step checkpoint, for the stages downstream."""
    d = tmp_path_factory.mktemp("model")
    rng = random.Random(0)
    words = "the river mill grain town baskets carried old stone bridge market morning bread".split()
    pq.write_table(pa.table({"text": [" ".join(rng.choice(words) for _ in range(60)) for _ in range(200)]}), d / "docs.parquet")
    done(cli("tokenize", "train", d / "docs.parquet", "-o", d / "tok", "--vocab-size", "300", "--quiet"))
    done(cli("tokenize", d / "docs.parquet", "-o", d / "tokens", "-t", d / "tok", "--workers", "1", "--quiet"))
    small = TINY_TRAIN
    done(cli("train", d / "tokens", "-o", d / "run", *small, "--quiet"))
    # a copy of the tokens whose first shard lost its last bytes
    shutil.copytree(d / "tokens", d / "truncated")
    shard = d / "truncated" / "tokens-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-3])
    return {"tok": d / "tok", "tokens": d / "tokens", "run": d / "run", "truncated": d / "truncated", "small": small}


# ---------------------------------------------------------------------------------------------
# every docs reader x every bad docs input


def docs_stages(inputs, model, out):
    """stage -> the command line reading docs from IN (substituted) and writing under `out`."""
    return {
        "cat": ["cat", "IN", "-o", out / "cat"],
        "head": ["head", "-n", "1000", "IN", "-o", out / "head"],
        "sample": ["sample", "-n", "1000", "IN", "-o", out / "sample"],
        "inspect": ["inspect", "IN"],
        "filter": ["filter", "IN", "-o", out / "filter", "--config", inputs["filter.toml"], "--annotate-only", "--workers", "1"],
        "dedup": ["dedup", "IN", "-o", out / "dedup", "--exact", "--workers", "1"],
        "decontam": ["decontam", "IN", "--against", inputs["tasks.jsonl"], "-o", out / "decontam", "--workers", "1"],
        "tokenize": ["tokenize", "IN", "-o", out / "tokenize", "-t", model["tok"], "--workers", "1"],
        "tokenize train": ["tokenize", "train", "IN", "-o", out / "tokenize-train", "--vocab-size", "300"],
    }


# input -> what every docs stage must do: ("usage", words in the message) or ("ok", rows, errors)
DOCS_CASES = {
    "missing.parquet": ("usage", "not found"),
    "emptydir": ("usage", "no documents"),
    "zero_bytes.parquet": ("usage", "unreadable"),
    "no_text.parquet": ("usage", "no 'text' column"),
    "int_text.parquet": ("usage", "not strings"),
    "corrupt_manifest": ("usage", "corrupt manifest"),
    "empty.jsonl": ("ok", 0, 0),
    "zero_rows.parquet": ("ok", 0, 0),
    "null_texts.parquet": ("ok", 3, 0),  # cat, head, sample and inspect copy the 2 text-less rows: 5
    "bad_utf8.jsonl": ("ok", 47, 1),
    "broken_json.jsonl": ("ok", 47, 1),
    "three_bad.jsonl": ("ok", 47, 3),
    "mixed": ("ok", 10, 2),
}
COPIERS = ("cat", "head", "sample", "inspect")


def _rows(stage: str, summary: dict) -> int:
    c = summary["counts"]
    return summary["rows"] if stage == "inspect" else c["docs"] if stage.startswith("tokenize") else c["out"]


def test_every_docs_stage_on_every_bad_docs_input(inputs, model, tmp_path):
    for name, expect in DOCS_CASES.items():
        for stage, argv in docs_stages(inputs, model, tmp_path / name.replace(".", "_")).items():
            r = cli(*[inputs[name] if a == "IN" else a for a in argv], "--json")
            if expect[0] == "usage" or (stage == "tokenize train" and expect[1] == 0):
                usage_error(r, *(expect[1:] if expect[0] == "usage" else ["no text"]))
                continue
            summary = done(r)
            rows, errors = expect[1], expect[2]
            if stage in COPIERS and name == "null_texts.parquet":
                rows = 5
            if stage == "inspect":
                assert summary["rows"] == rows and summary["error_count"] == errors, (name, summary)
                continue
            assert _rows(stage, summary) == rows, (name, stage, summary["counts"])
            assert summary["counts"]["errors"] == errors and len(summary["errors"]) == errors, (name, stage, summary)
            if stage not in COPIERS and stage != "tokenize train":
                skipped = summary["counts"]["skipped"]
                assert skipped == ({"null_text": 1, "empty_text": 1} if name == "null_texts.parquet" else {"null_text": 0, "empty_text": 0}), (name, stage)


def test_damage_is_named_in_a_log_line_and_strict_fails(inputs, tmp_path):
    r = cli("filter", inputs["three_bad.jsonl"], "-o", tmp_path / "f", "--config", inputs["filter.toml"], "--workers", "1")
    done(r)
    logged = [ln for ln in r.err.splitlines() if "skipped damage" in ln]
    assert len(logged) == 3 and "three_bad.jsonl line 4 (byte" in logged[0], r.err
    for argv in (["filter", inputs["mixed"], "-o", tmp_path / "s", "--config", inputs["filter.toml"], "--workers", "1"],
                 ["cat", inputs["three_bad.jsonl"], "-o", tmp_path / "c"],
                 ["tokenize", inputs["bad_utf8.jsonl"], "-o", tmp_path / "t", "-t", tmp_path / "nope.json"]):
        r = cli(*argv, "--strict", "--quiet")
        if argv[0] == "tokenize":  # a usage error still comes first
            usage_error(r, "tokenizer not found")
            continue
        assert r.code == 1 and "Traceback" not in r.err and "--strict" in r.err.strip().splitlines()[-1], r.why()


# ---------------------------------------------------------------------------------------------
# the units: 47 good docs and 3 bad lines; a good and a corrupt Parquet file; any --workers


def test_47_good_lines_and_3_bad_give_47_rows_and_3_errors_whatever_the_workers(inputs, tmp_path):
    cfg = FilterConfig(steps=[{"name": "c4"}], annotate_only=True)  # keeps every row it reads
    runs = {w: run_filter([str(inputs["three_bad.jsonl"]), str(inputs["mixed"])], str(tmp_path / f"w{w}"), cfg, RunOptions(workers=w))
            for w in (1, 2)}
    m = runs[1]
    assert m.counts["out"] == 47 + 10 and m.counts["errors"] == 5
    where = [(Path(e["file"]).name, e.get("line")) for e in m.errors]
    assert where == [("three_bad.jsonl", 4), ("three_bad.jsonl", 18), ("three_bad.jsonl", 41), ("b.parquet", None), ("c.parquet", None)]
    assert all(e["error"] for e in m.errors) and "offset" in m.errors[0]
    rows = pq.read_table(tmp_path / "w1" / "part-00000.parquet").column("id").to_pylist()
    assert len(rows) == 47 and rows[3] == "three_bad.jsonl/4"  # ids keep the file's row numbers past a bad line
    assert m.errors == runs[2].errors and m.counts == runs[2].counts
    for o in m.outputs:
        assert (tmp_path / "w1" / o["file"]).read_bytes() == (tmp_path / "w2" / o["file"]).read_bytes()
    assert [o["file"] for o in m.outputs] == ["part-00000.parquet", "part-00001.parquet"]  # nothing for the unreadable files


# ---------------------------------------------------------------------------------------------
# manifests, artifact kinds, token shards, checkpoints


def test_corrupt_manifest_and_wrong_kind_everywhere(inputs, model, tmp_path):
    bad = inputs["corrupt_manifest"]
    for argv in (["lineage", bad], ["inspect", bad], ["train", bad, "-o", tmp_path / "t"],
                 ["eval", model["run"], "-o", tmp_path / "e", "-t", f"loss:{bad}"]):
        usage_error(cli(*argv), "corrupt manifest")
    run = tmp_path / "run"
    shutil.copytree(model["run"], run)
    (run / "manifest.json").write_text("[1, 2")
    for argv in (["lineage", run], ["inspect", run]):
        usage_error(cli(*argv), "corrupt manifest")
    # eval reads the checkpoint, not the run's manifest: it may finish
    r = cli("eval", run, "-o", tmp_path / "e2", "-t", f"gen:{inputs['tasks.jsonl']}", "--max-new-tokens", "2", "--quiet")
    assert r.code in (0, 2) and "Traceback" not in r.err and (r.code == 0 or len(r.err.strip().splitlines()) == 1), r.why()
    docs = inputs["docs_artifact"]
    usage_error(cli("train", docs, "-o", tmp_path / "t2"), "docs artifact, not tokens")
    usage_error(cli("filter", model["tokens"], "-o", tmp_path / "f"), "tokens artifact, not docs")
    usage_error(cli("eval", model["run"], "-o", tmp_path / "e3", "-t", f"loss:{docs}"), "docs artifact, not tokens")
    for argv in (["eval", docs, "-o", tmp_path / "e4", "-t", f"loss:{model['tokens']}"], ["export", docs, "-o", tmp_path / "hf"],
                 ["rl", docs, "--prompts", inputs["tasks.jsonl"], "-o", tmp_path / "rl2"], ["generate", docs, "-p", "hi"]):
        usage_error(cli(*argv))
    for argv in (["export", tmp_path / "nope", "-o", tmp_path / "hf2"], ["import", tmp_path / "nope", "-o", tmp_path / "ck"],
                 ["import", inputs["emptydir"], "-o", tmp_path / "ck2"], ["lineage", tmp_path / "nope"],
                 ["inspect", tmp_path / "nope"], ["train", tmp_path / "nope", "-o", tmp_path / "t3"]):
        usage_error(cli(*argv))
    hf = tmp_path / "hfbad"
    hf.mkdir()
    (hf / "config.json").write_text("{not json")
    usage_error(cli("import", hf, "-o", tmp_path / "ck3"))


def test_truncated_token_shard_in_train_and_eval_is_one_line(model, tmp_path):
    """Real processes, side by side: the shards are memory-mapped, as a user's run maps them."""
    env = {**os.environ, "COLUMNS": "200"}
    cmds = [["train", model["truncated"], "-o", tmp_path / "t", *model["small"]],
            ["eval", model["run"], "-o", tmp_path / "e", "-t", f"loss:{model['truncated']}"]]
    procs = [subprocess.Popen([sys.executable, "-m", "llmctl", *map(str, c)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for c in cmds]
    for c, p in zip(cmds, procs):
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"llmctl {c[0]} on a truncated shard hung")
        usage_error(Run(tuple(c), p.returncode, "", err.decode()), "tokens-00000.bin", "truncated")
    assert not (tmp_path / "t").exists() and not (tmp_path / "e").exists()  # refused before any output


# ---------------------------------------------------------------------------------------------
# configs: bad TOML, --set


def test_bad_toml_and_set_values(inputs, model, tmp_path):
    toml = inputs["bad.toml"]
    tasks = inputs["tasks.jsonl"]
    for argv in (["crawl-extract", inputs["emptydir"], "-o", tmp_path / "c", "--config", toml],
                 ["filter", inputs["mixed"], "-o", tmp_path / "f", "--config", toml],
                 ["dedup", inputs["mixed"], "-o", tmp_path / "d", "--config", toml],
                 ["decontam", inputs["mixed"], "--against", tasks, "-o", tmp_path / "x", "--config", toml],
                 ["train", model["tokens"], "-o", tmp_path / "t", "--config", toml],
                 ["eval", model["run"], "-o", tmp_path / "e", "-t", f"gen:{tasks}", "--config", toml],
                 ["rl", model["run"], "--prompts", tasks, "-o", tmp_path / "r", "--config", toml],
                 ["plan", "--model", toml]):
        usage_error(cli(*argv), "invalid TOML")
    typed = tmp_path / "typed.toml"
    typed.write_text('[model]\nn_layers = "abc"\n[train]\nlr = -1\n')
    usage_error(cli("train", model["tokens"], "-o", tmp_path / "t", "--config", typed), "[model] n_layers: expected int, got 'abc'")
    usage_error(cli("plan", "--model", typed), "[model] n_layers: expected int, got 'abc'")
    typed.write_text('[model]\nn_layers = 2\n[train]\nlr = -1\n')
    usage_error(cli("train", model["tokens"], "-o", tmp_path / "t", "--config", typed), "[train] lr must be > 0, got -1")
    ranged = tmp_path / "ranged.toml"
    ranged.write_text("bands = 0\nminhash = true\n")
    usage_error(cli("dedup", inputs["mixed"], "-o", tmp_path / "d", "--config", ranged), "bands must be >= 1, got 0")
    tr = ["train", model["tokens"], "-o", tmp_path / "t"]
    for sets, words in ((["model.n_layers=abc"], ["--set model.n_layers", "expected int", "'abc'"]),
                        (["model.n_layers=2.5"], ["--set model.n_layers", "expected int", "2.5"]),
                        (["train.lr=fast"], ["--set train.lr", "expected float", "'fast'"]),
                        (["model.bogus=1"], ["--set model.bogus", "unknown key"]),
                        (["train.bogus=1"], ["--set train.bogus", "unknown key"]),
                        (["n_layers=2"], ["expected model.KEY=VALUE"]),
                        (["train.checkpoint_every=0"], ["--set train.checkpoint_every must be >= 1, got 0"])):
        usage_error(cli(*tr, *[x for s in sets for x in ("--set", s)]), *words)


# ---------------------------------------------------------------------------------------------
# numbers: every numeric flag of every command is bounded, and out of bounds is one line

# command path -> (the bounds table its flags are checked against, the arguments it needs besides)
COMMANDS = {
    ("cat",): ("CatConfig", ["IN", "-o", "OUT"]),
    ("head",): ("CatConfig", ["IN", "-o", "OUT"]),
    ("sample",): ("SampleConfig", ["IN", "-o", "OUT"]),
    ("inspect",): ("inspect", ["IN"]),
    ("crawl-extract",): ("ExtractConfig", ["IN", "-o", "OUT"]),
    ("dedup",): ("DedupConfig", ["IN", "-o", "OUT", "--exact"]),
    ("embed",): ("EmbedConfig", ["IN", "-o", "OUT"]),
    ("annotate",): ("AnnotateConfig", ["IN", "-o", "OUT", "--checkpoint", "RUN"]),
    ("filter", "run"): ("FilterConfig", ["IN", "-o", "OUT"]),
    ("filter", "train-classifier"): ("TrainClassifierConfig", ["--positive", "IN", "--negative", "IN", "-o", "OUT"]),
    ("filter", "stats"): ("filter stats", ["IN", "-o", "OUT"]),
    ("decontam",): ("DecontamConfig", ["IN", "--against", "TASKS", "-o", "OUT"]),
    ("tokenize", "run"): ("TokenizeConfig", ["IN", "-o", "OUT", "-t", "TOK"]),
    ("tokenize", "train"): ("TrainTokenizerConfig", ["IN", "-o", "OUT"]),
    ("train",): ("TrainConfig", ["TOKENS", "-o", "OUT"]),
    ("eval", "run"): ("EvalConfig", ["RUN", "-o", "OUT", "-t", "gen:TASKS"]),
    ("generate",): ("generate", ["RUN", "-p", "hi"]),
    ("rl",): ("RLConfig", ["RUN", "--prompts", "TASKS", "-o", "OUT"]),
    ("plan", "run"): ("plan", ["--model", "tiny"]),
    ("plan", "fit"): ("plan fit", ["RUN", "-o", "OUT"]),
    ("plan", "ladder"): ("plan ladder", ["TOKENS", "-o", "OUT", "--size", "32x1", "--size", "64x1", "--budget", "1e9"]),
    ("best-of-n",): ("BestOfNConfig", ["RUN", "--prompts", "TASKS", "-o", "OUT"]),
    ("serve",): ("serve", ["RUN"]),
}
RUN_CONTROL = {"workers", "shard_index", "num_shards", "cpus_per_task"}  # RunOptions validates them
KEY = {("head",): {"n": "limit"}, ("train",): {"val_fraction": "sft"}}  # a parameter named otherwise than its field
TABLE = {("filter", "train-classifier"): {"threshold": "TrainRegressionConfig"}}  # a flag of the command's other mode
ANY_VALUE = {("rl",): {"format_reward"}, ("best-of-n",): {"min_reward"}}  # a penalty, a threshold: any number makes sense
LORA = {"lora_rank": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout"}  # every trainer's --lora-*: LoraConfig's keys


def numeric_flags():
    import typer

    from llmctl.cli import app

    root = typer.main.get_command(app)
    for path in COMMANDS:
        cmd = root
        for name in path:
            cmd = cmd.commands[name]
        for p in cmd.params:
            td = str(getattr(p, "type_descriptor", ""))
            if "int" in td or "float" in td:
                yield path, p


def _bad_value(path, p):
    """A value out of the flag's range (None: every value is allowed)."""
    if p.name in RUN_CONTROL or p.name in ANY_VALUE.get(path, ()):
        return None
    table, _ = COMMANDS[path]
    if p.name in LORA:
        table = "LoraConfig"
    table = TABLE.get(path, {}).get(p.name, table)
    key = LORA.get(p.name) or KEY.get(path, {}).get(p.name, p.name)
    b = BOUNDS.get("sft" if key == "sft" else table, {}).get("val_fraction" if key == "sft" else key)
    if b is None and getattr(p, "min", None) is not None:
        return p.min - 1
    assert b is not None, f"{' '.join(path)} {p.opts[0]}: a numeric flag with no range in llmctl.bounds.BOUNDS"
    if b.lo is not None:
        return b.lo if b.lo_open else b.lo - 1
    return b.hi + 1


def test_every_numeric_flag_out_of_range_is_one_line(inputs, model, tmp_path):
    fill = {"IN": inputs["mixed"], "OUT": tmp_path / "out", "TASKS": inputs["tasks.jsonl"], "gen:TASKS": f"gen:{inputs['tasks.jsonl']}",
            "TOK": model["tok"], "TOKENS": model["tokens"], "RUN": model["run"]}
    checked = 0
    for path, p in numeric_flags():
        bad = _bad_value(path, p)
        if bad is None:
            continue
        value = str(int(bad)) if "int" in str(p.type_descriptor) else str(bad)
        argv = [*path, *[fill.get(a, a) for a in COMMANDS[path][1]], p.opts[0], value]
        if p.name == "pass_k":
            argv += ["--samples", "2", "--temperature", "1"]
        r = cli(*argv)
        usage_error(r, p.opts[0])
        checked += 1
    assert checked >= 85  # the walk found the flags (87 when written)


def test_the_cases_of_issue_20(inputs, model, tmp_path):
    """The measured ones: each used to loop, run the wrong thing, or exit 0 having done nothing."""
    tasks = inputs["tasks.jsonl"]
    for argv, words in (
        (["cat", inputs["mixed"], "-o", tmp_path / "c", "--rows-per-part", "0"], ["--rows-per-part must be >= 1, got 0"]),
        (["train", model["tokens"], "-o", tmp_path / "t", "--max-steps", "0"], ["--max-steps must be >= 1, got 0"]),
        (["train", model["tokens"], "-o", tmp_path / "t", "--max-steps", "-1"], ["--max-steps must be >= 1, got -1"]),
        (["train", model["tokens"], "-o", tmp_path / "t", "--lr", "-1"], ["--lr must be > 0, got -1.0"]),
        (["train", model["tokens"], "-o", tmp_path / "t", "--checkpoint-every", "0"], ["--checkpoint-every must be >= 1, got 0"]),
        (["rl", model["run"], "--prompts", tasks, "-o", tmp_path / "r", "--prompts-per-step", "0"], ["--prompts-per-step must be >= 1"]),
        (["rl", model["run"], "--prompts", tasks, "-o", tmp_path / "r", "--max-new-tokens", "0"], ["--max-new-tokens must be >= 1"]),
        (["eval", model["run"], "-o", tmp_path / "e", "-t", f"gen:{tasks}", "--shots", "-2"], ["--shots must be >= 0, got -2"]),
    ):
        usage_error(cli(*argv), *words)
    assert not any((tmp_path / n).exists() for n in ("c", "t", "r", "e"))


def test_crawl_extract_bad_inputs(inputs, tmp_path):
    usage_error(cli("crawl-extract", tmp_path / "nope.warc.gz", "-o", tmp_path / "a"), "not found")
    usage_error(cli("crawl-extract", inputs["emptydir"], "-o", tmp_path / "b"))
    empty = tmp_path / "empty.warc.gz"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.warc.gz"
    garbage.write_bytes(b"garbage garbage\n")
    s = done(cli("crawl-extract", empty, garbage, "-o", tmp_path / "c", "--workers", "1", "--json"))
    assert s["counts"]["out"] == 0 and s["counts"]["errors"] == 1 and s["errors"][0]["file"].endswith("garbage.warc.gz")


def test_the_reader_keeps_what_lies_around_the_damage(tmp_path):
    """A Parquet row group whose page header is garbage costs that group only; a .jsonl.gz cut in
    the middle keeps the lines before the cut; a line that changes a column's JSON type is one
    bad line (pyarrow would refuse the file)."""
    from llmctl.artifacts.docs import DocsSource, ReadLog, read_source

    def read(path, fmt):
        log = ReadLog()
        ids = [i for b in read_source(DocsSource(str(path), fmt, path.name), log=log) for i in b.column("id").to_pylist()]
        return ids, log.errors

    p = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(500)]}), p, row_group_size=100, compression="none")
    at = pq.ParquetFile(p).metadata.row_group(2).column(0).data_page_offset
    data = bytearray(p.read_bytes())
    data[at : at + 8] = b"\xff" * 8
    p.write_bytes(bytes(data))
    ids, errors = read(p, "parquet")
    assert ids == [f"groups.parquet/{i}" for i in list(range(200)) + list(range(300, 500))]
    assert [(e["row"], e["rows"]) for e in errors] == [(200, 100)]

    import gzip

    whole = gzip.compress(b"".join(json.dumps({"text": f"line {i}"}).encode() + b"\n" for i in range(3000)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    ids, errors = read(cut, "jsonl")
    assert len(ids) > 1000 and ids == [f"cut.jsonl.gz/{i}" for i in range(len(ids))]
    assert len(errors) == 1 and "the rest of the file was not read" in errors[0]["error"]

    typed = tmp_path / "typed.jsonl"
    typed.write_text("\n".join(json.dumps({"text": "a b" if i != 2 else 7, "meta": {"x": 1}}) for i in range(5)) + "\n")
    ids, errors = read(typed, "jsonl")
    assert ids == ["typed.jsonl/0", "typed.jsonl/1", "typed.jsonl/3", "typed.jsonl/4"]
    assert errors[0]["line"] == 3 and "'text' is a JSON number where earlier rows have a string" in errors[0]["error"]


def test_every_shipped_preset_is_within_the_bounds():
    from llmctl.config import build_config
    from llmctl.data.dedup.run import DedupConfig
    from llmctl.data.crawl.extract import ExtractConfig
    from llmctl.data.filter import FilterConfig
    from llmctl.eval.runner import EvalConfig
    from llmctl.rl.config import RLConfig
    from llmctl.train.config import load_run_config

    stages = ROOT / "stages"
    for stage, cls in (("rl", RLConfig), ("eval", EvalConfig), ("dedup", DedupConfig), ("crawl-extract", ExtractConfig), ("filter", FilterConfig)):
        for f in sorted((stages / stage).glob("*.toml")):
            build_config(cls, stage, str(f))
    presets = sorted((stages / "train").glob("*.toml"))
    assert len(presets) >= 5
    for f in presets:
        load_run_config(str(f), {})

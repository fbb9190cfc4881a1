"""Every number a command takes, hostile (issue 30): every command × every numeric option (found by
walking the CLI, so a new flag is in the matrix by itself) × {nan, inf, -inf, 1e30, 2^70, 0, -1},
and every key of every range table given through `--set` or a TOML file the same values. Each case
ends in exit 0 or in exit 2 with one line naming the flag (or the key), never a traceback, a signal
or a hang. A value a command admits (0 for "0 = off", -1 for a format penalty) runs for real, on
tiny inputs with small other settings, so admitting it is shown to be safe, not assumed.

The cases run in this process through `llmctl.cli.main`, under an alarm (test_bad_input's harness);
a signal below Python (a Rust panic, a SIGSEGV) would end the test run itself."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
import signal
import sys
import threading
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmctl.bounds import BOUNDS
from test_bad_input import TINY_TRAIN, cli, done, usage_error

VALUES = ("nan", "inf", "-inf", "1e30", str(2**70), "0", "-1")
WORDS = "river mill grain town baskets bridge market morning bread stone wall lantern teapot kettle map ink".split()



@pytest.fixture(scope="module", autouse=True)
def one_click_command():
    """typer builds the whole click command tree on every `main()` (0.1 s); the matrix runs
    hundreds of commands, so it builds it once (click commands are made to be invoked again)."""
    import functools

    import typer

    real = typer.main.get_command
    typer.main.get_command = functools.lru_cache(maxsize=None)(real)
    yield
    typer.main.get_command = real


# ---------------------------------------------------------------------------------------------
# tiny inputs


def _warc(path) -> None:
    """Two HTML responses in a gzip-per-record WARC: enough for crawl-extract to do its work."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        for i in range(2):
            body = f"<html><body><p>{' '.join(random.Random(i).choices(WORDS, k=80))}.</p></body></html>".encode()
            http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(f"https://example.com/{i}", "response", payload=io.BytesIO(body), http_headers=http))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Docs, an annotated filter artifact, a WARC, tasks, a tokenizer, tokens and a one-step
    checkpoint of a 32-token context: every command's input, each small enough that an admitted
    value runs in a second or two."""
    d = tmp_path_factory.mktemp("numbers")
    texts = [" ".join(random.Random(i).choices(WORDS, k=40)) + "." for i in range(60)]
    pq.write_table(pa.table({"text": texts}), d / "docs.parquet")
    _warc(d / "tiny.warc.gz")
    (d / "tasks.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(4)))
    (d / "filter.toml").write_text('[[steps]]\nname = "c4"\n')
    (d / "pairs.jsonl").write_text("".join(json.dumps({"prompt": f"river {i}?", "chosen": "mill", "rejected": "stone"}) + "\n"
                                           for i in range(4)))
    done(cli("filter", d / "docs.parquet", "-o", d / "annotated", "--config", d / "filter.toml", "--annotate-only", "--workers", "1", "-q"))
    done(cli("tokenize", "train", d / "docs.parquet", "-o", d / "tok", "--vocab-size", "300", "-q"))
    done(cli("tokenize", d / "docs.parquet", "-o", d / "tokens", "-t", d / "tok", "--workers", "1", "-q"))
    small = TINY_TRAIN
    done(cli("train", d / "tokens", "-o", d / "run", *small, "-q"))
    return {"dir": d, "small": small}


def _fit_ladder(d) -> list:
    """plan fit's input: nine finished runs (manifests only, losses from the Chinchilla law), made once."""
    from test_plan_fit import fake_ladder

    root = d / "fit-ladder"
    return sorted(root.iterdir()) if root.exists() else fake_ladder(root)


def base_args(path: tuple[str, ...], t: dict, out) -> list:
    """The command with its inputs and small settings; the option under test is appended (the
    last occurrence of an option wins)."""
    d = t["dir"]
    docs, tasks = d / "docs.parquet", d / "tasks.jsonl"
    return {
        ("inspect",): [d / "annotated"],
        ("cat",): [docs, "-o", out],
        ("head",): [docs, "-o", out],
        ("sample",): [docs, "-o", out],
        ("crawl-extract",): [d / "tiny.warc.gz", "-o", out, "--workers", "1"],
        ("dedup",): [docs, "-o", out, "--exact", "--workers", "1"],
        ("embed",): [docs, "-o", out, "--workers", "1"],
        ("annotate",): [docs, "-o", out, "--checkpoint", d / "run", "--max-tokens", "2", "--workers", "1"],
        ("train",): [d / "tokens", "-o", out, *t["small"]],
        ("plan", "run"): ["--model", "tiny"],
        ("plan", "fit"): [*_fit_ladder(d), "-o", out, "--bootstrap", "3"],
        ("plan", "ladder"): [d / "tokens", "-o", out, "--size", "32x1", "--size", "64x1", "--budget", "1e9", "--min-tpp", "0.001",
                             "--max-tpp", "1e6"],
        ("decontam",): [docs, "--against", tasks, "-o", out, "--workers", "1"],
        ("generate",): [d / "run", "-p", "the river", "--max-new-tokens", "2"],
        ("serve",): [d / "run"],
        ("rl",): [d / "run", "--prompts", tasks, "-o", out, "--steps", "1", "--prompts-per-step", "1", "-G", "2",
                  "--max-new-tokens", "2", "--headroom-limit", "0", "--device", "cpu"],
        ("filter", "run"): [docs, "-o", out, "--config", d / "filter.toml", "--annotate-only"],
        ("filter", "train-classifier"): ["--positive", docs, "--negative", d / "annotated", "-o", out, "--dim", "8", "--epoch", "1", "--bucket", "1000"],
        ("filter", "stats"): [d / "annotated", "-o", out],
        ("tokenize", "run"): [docs, "-o", out, "-t", d / "tok", "--workers", "1"],
        ("tokenize", "train"): [docs, "-o", out, "--vocab-size", "300"],
        ("eval", "run"): [d / "run", "-o", out, "-t", f"gen:{tasks}", "--limit", "2", "--max-new-tokens", "2"],
        ("best-of-n",): [d / "run", "--prompts", tasks, "-o", out, "-n", "2", "--max-new-tokens", "2", "--limit", "1",
                         "--device", "cpu"],
        **{(pref,): [d / "run", "--pairs", d / "pairs.jsonl", "-o", out, "--seq-len", "32", "--batch-pairs", "2",
                     "--micro-batch", "2", "--max-steps", "1", "--threads", "1", "--device", "cpu"] for pref in ("dpo", "train-rm")},
    }[path]


# ---------------------------------------------------------------------------------------------
# the walk


def _commands(cmd=None, path=()):
    if cmd is None:
        import typer

        from llmctl.cli import app

        cmd = typer.main.get_command(app)
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def _kind(p) -> str | None:
    """'int' or 'float' for a numeric option (a list of them too), else None."""
    annotation = str(getattr(getattr(p, "type_descriptor", None), "annotation", ""))
    return "float" if "float" in annotation else "int" if "int" in annotation else None


def numeric_options() -> dict[tuple[str, ...], list]:
    """command path -> its numeric options, for every command of the CLI."""
    return {path: opts for path, cmd in _commands() if (opts := [p for p in cmd.params if _kind(p)])}


NUMERIC = numeric_options()
QUIET = {path: ["-q"] if any(p.name == "quiet" for p in cmd.params) else [] for path, cmd in _commands()}
TALLY: Counter = Counter()


def _check(r, path, p, value) -> str:
    """The outcome of one case, asserted: 'ok' (exit 0) or 'usage' (exit 2, one line naming the
    option and, for a non-finite or overwide number, why)."""
    assert r.code != "traceback" and "Traceback" not in r.err, r.why()
    assert r.code in (0, 2), r.why()
    if r.code == 0:
        return "ok"
    usage_error(r)
    line = r.err.strip()
    assert any(o in line for o in p.opts), r.why()
    parser = "Invalid value for" in line  # the option's own min/max, checked by the parser first
    if _kind(p) == "float" and value in ("nan", "inf", "-inf"):
        assert "must be finite" in line or parser, r.why()
    if value == str(2**70) and _kind(p) == "int":
        assert "2^63-1" in line or "at most" in line or parser, r.why()
    return "usage"


@contextlib.contextmanager
def stopped_once_serving():
    """`llmctl serve` given a port it admits (0: a free one) serves until a signal, as a server
    does: SIGTERM once its "serving … on http://…" line is out, and it stops with exit 0."""
    finished = threading.Event()

    def watch():
        while not finished.wait(0.05):
            err = sys.stderr  # cli() has it redirected into a StringIO while the command runs
            if " on http://" in getattr(err, "getvalue", str)():
                os.kill(os.getpid(), signal.SIGTERM)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        finished.set()
        watcher.join()


@pytest.mark.parametrize("path", sorted(NUMERIC), ids=" ".join)
def test_every_numeric_option_of_every_command(path, tiny, tmp_path):
    for p in NUMERIC[path]:
        for i, value in enumerate(VALUES):
            out = tmp_path / f"{p.name}-{i}"
            argv = [*path, *base_args(path, tiny, out), p.opts[0], value, *QUIET[path]]
            with stopped_once_serving() if path == ("serve",) else contextlib.nullcontext():
                r = cli(*argv, timeout=120)
            outcome = _check(r, path, p, value)
            TALLY[outcome] += 1
            if outcome == "usage" and path != ("inspect",) and "-o" in argv:
                assert not out.exists() or not any(out.iterdir()), f"{r.why()}\nrefused, yet {out} was written"


# ---------------------------------------------------------------------------------------------
# the same values in --set and TOML files: every key of every range table

# the range table -> the command whose config holds it, how a key is given to it, and the
# arguments it needs besides
CONFIGS = {
    "ModelConfig": ("train", "set:model"),
    "TrainConfig": ("train", "set:train"),
    "ExtractConfig": ("crawl-extract", "toml"),
    "DedupConfig": ("dedup", "toml"),
    "DecontamConfig": ("decontam", "toml"),
    "EvalConfig": ("eval", "toml"),
    "RLConfig": ("rl", "toml"),
}


SMALL_SETS = [x for kv in ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.max_seq_len=32",
                            "train.seq_len=32", "train.batch_tokens=128", "train.micro_batch=4", "train.max_tokens=256",
                            "train.threads=1") for x in ("--set", kv)]


SMALL_TOML = {"eval": {"limit": "2", "max_new_tokens": "2"},
              "rl": {"steps": "1", "prompts_per_step": "1", "group_size": "2", "max_new_tokens": "2", "headroom_limit": "0", "device": '"cpu"'}}


def _toml(value: str) -> str:
    return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(value, value)


def test_every_key_of_every_config_from_set_and_toml(tiny, tmp_path):
    from llmctl.config import build_config
    from llmctl.data.crawl.extract import ExtractConfig
    from llmctl.data.decontam.config import DecontamConfig
    from llmctl.data.dedup.run import DedupConfig
    from llmctl.eval.runner import EvalConfig
    from llmctl.model.config import ModelConfig
    from llmctl.rl.config import RLConfig
    from llmctl.train.config import TrainConfig

    classes = {c.__name__: c for c in (ModelConfig, TrainConfig, ExtractConfig, DedupConfig, DecontamConfig, EvalConfig, RLConfig)}
    runs = Counter()
    for table, (command, how) in CONFIGS.items():
        cls = classes[table]
        hints = {f.name: f.type for f in dataclasses.fields(cls)}
        for key in BOUNDS[table]:
            for i, value in enumerate(VALUES):
                out = tmp_path / f"{table}-{key}-{i}"
                if how.startswith("set:"):  # the small settings as --set too, so the later one wins
                    path, given = ("train",), [*SMALL_SETS, "--set", f"{how[4:]}.{key}={value}"]
                else:  # the small settings in the file too (a flag would win over the key)
                    f = tmp_path / f"{table}-{key}-{i}.toml"
                    settings = {**SMALL_TOML.get(command, {}), key: _toml(value)}
                    f.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
                    path, given = {"eval": ("eval", "run")}.get(command, (command,)), ["--config", f]
                base = base_args(path, tiny, out)
                if path in (("train",), ("eval", "run"), ("rl",)):
                    base = base[:base.index("-o") + 2] + (["-t", base[base.index("-t") + 1]] if "-t" in base else [])
                argv = [*path, *base, *given, *QUIET[path]]
                r = cli(*argv, timeout=120)
                assert r.code != "traceback" and "Traceback" not in r.err, r.why()
                assert r.code in (0, 2), r.why()
                runs["ok" if r.code == 0 else "usage"] += 1
                if r.code == 2:
                    usage_error(r, key)
                    if "float" in str(hints[key]) and value in ("nan", "inf", "-inf"):
                        assert "must be finite" in r.err, r.why()
                else:  # admitted and run: never a non-finite number
                    assert value not in ("nan", "inf", "-inf"), r.why()
    TALLY.update({f"config {k}": v for k, v in runs.items()})
    assert runs["usage"] > 0 and runs["ok"] > 0


# ---------------------------------------------------------------------------------------------
# the measured ones of issue 30, each with the reason its error gives


def test_the_cases_of_issue_30(tiny, tmp_path):
    d = tiny["dir"]
    train = ["train", d / "tokens", "-o", tmp_path / "t", *tiny["small"]]
    tasks = d / "tasks.jsonl"
    lr_inf = tmp_path / "lr.toml"
    lr_inf.write_text("[model]\nn_layers = 1\n[train]\nlr = inf\n")
    for argv, words in (
        ([*train, "--lr", "inf"], ["--lr must be finite, got inf"]),
        ([*train, "--lr", "1e30"], ["--lr must be at most 10"]),
        ([*train, "--set", "train.lr=inf"], ["--set train.lr must be finite"]),
        ([*train, "--set", "model.rope_base=inf"], ["--set model.rope_base must be finite"]),
        (["train", d / "tokens", "-o", tmp_path / "t", "--config", lr_inf], ["[train] lr must be finite"]),
        ([*train, "--max-epochs", "inf"], ["--max-epochs must be finite"]),
        (["train", "--data", f"a={d / 'tokens'}:inf", "-o", tmp_path / "t", *tiny["small"]], ["weight must be finite"]),
        ([*train, "--seed", str(2**70)], ["--seed must be at most 2^63-1"]),
        ([*train, "--max-tokens", str(10**30)], ["--max-tokens must be at most 2^63-1"]),
        ([*train, "--threads", "100000000"], ["--threads must be at most", "cores"]),
        (["head", "-n", str(10**30), d / "docs.parquet", "-o", tmp_path / "h"], ["-n must be at most 2^63-1"]),
        (["cat", d / "docs.parquet", "-o", tmp_path / "c", "--rows-per-part", str(10**20)], ["--rows-per-part must be at most 2^63-1"]),
        (["tokenize", "train", d / "docs.parquet", "-o", tmp_path / "tt", "--vocab-size", str(10**12)], ["--vocab-size must be at most 16777216"]),
        (["rl", d / "run", "--prompts", tasks, "-o", tmp_path / "r", "--temperature", "inf"], ["--temperature must be finite"]),
        (["rl", d / "run", "--prompts", tasks, "-o", tmp_path / "r", "--clip-high", "inf"], ["--clip-high must be finite"]),
        (["rl", d / "run", "--prompts", tasks, "-o", tmp_path / "r", "--format-reward", "nan"], ["--format-reward must be finite"]),
        (["rl", d / "run", "--prompts", tasks, "-o", tmp_path / "r", "--max-new-tokens", "1000000"], ["at most the context length 32"]),
        (["eval", d / "run", "-o", tmp_path / "e", "-t", f"gen:{tasks}", "--temperature", "inf"], ["--temperature must be finite"]),
        (["eval", d / "run", "-o", tmp_path / "e", "-t", f"gen:{tasks}", "--shots", "1000000000"], ["--shots must be at most the context length 32"]),
        (["eval", d / "run", "-o", tmp_path / "e", "-t", f"gen:{tasks}", "--max-new-tokens", "1000000"], ["--max-new-tokens must be at most the context length 32"]),
        (["generate", d / "run", "-p", "hi", "--max-new-tokens", "1000000"], ["--max-new-tokens must be at most the context length 32"]),
        (["crawl-extract", d / "tiny.warc.gz", "-o", tmp_path / "x", "--timeout", "inf"], ["--timeout must be finite"]),
        (["decontam", d / "docs.parquet", "--against", tasks, "-o", tmp_path / "dc", "--ngram", "1000000000"], ["--ngram must be at most 1000"]),
        (["dedup", d / "docs.parquet", "-o", tmp_path / "dd", "--minhash", "--partitions", "1000000000"], ["--partitions must be at most 4096"]),
        (["plan", "--model", "tiny", "--gpus", str(10**20)], ["--gpus must be at most"]),
        (["crawl-extract", "-", "-o", tmp_path / "w", "--workers", str(2**63)], ["--workers must be at most 2^63-1"]),
        # sizes that multiply into one allocation, against the machine's memory
        ([*train, "--set", "model.d_model=65536", "--set", "model.n_heads=512"], ["parameters", "GiB of memory of this machine"]),
        (["filter", "train-classifier", "--positive", d / "docs.parquet", "--negative", d / "annotated", "-o", tmp_path / "fc",
          "--bucket", str(10**12), "--dim", "1000"], ["--bucket", "GiB of memory of this machine"]),
    ):
        usage_error(cli(*argv), *words)
    assert not any((tmp_path / n).exists() for n in ("t", "h", "c", "tt", "r", "e", "x", "dc", "dd", "w", "fc"))


def test_a_default_past_the_context_is_cut_to_it(tiny, tmp_path):
    """The commands' own generation budgets (eval 256, generate 64) exceed the 32-token context of
    the tiny model: the default is cut to the context, not refused."""
    d = tiny["dir"]
    s = done(cli("generate", d / "run", "-p", "the river", "--json"))
    assert all(g["tokens"] <= 32 for g in s) if isinstance(s, list) else True
    done(cli("eval", d / "run", "-o", tmp_path / "e", "-t", f"gen:{d / 'tasks.jsonl'}", "--limit", "1", "-q"))
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert '"max_new_tokens": 32' in json.dumps(results)


def test_the_local_pool_is_capped_by_the_cores(monkeypatch):
    """--workers past the cores forks no more processes than the cores (a stream used to fork them all)."""
    from llmctl.runtime import executor

    sizes = []
    real = executor.ProcessPoolExecutor

    def pool(n, **kw):
        sizes.append(n)
        return real(n, **kw)

    monkeypatch.setattr(executor, "ProcessPoolExecutor", pool)
    monkeypatch.setattr(executor, "default_workers", lambda: 2)
    tasks = (executor.Task(i, f"t{i}", i) for i in range(6))
    results = executor.run_tasks(_square, tasks, workers=100)
    assert [r.stats["n"] for r in results] == [i * i for i in range(6)]
    assert sizes == [2]


def _square(task, report):
    return {"n": task.payload * task.payload}


def test_matrix_counts():
    """Runs last in this file (pytest keeps file order): the sizes the issue asks for."""
    total = sum(v for k, v in TALLY.items())
    if not total:
        pytest.skip("the matrix did not run in this session")
    print(f"\nnumeric matrix: {dict(TALLY)}; {total} cases, 0 tracebacks, 0 signals, 0 hangs")

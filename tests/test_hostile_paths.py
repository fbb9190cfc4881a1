"""Artifacts closed over themselves, and outputs that only replace llmctl's own (issue 30).

An artifact names its own files: a docs or tokens manifest's `outputs[].file`, a run's
`checkpoints/latest`, a tokens manifest's `config.tokenizer` (followed only when the artifact has
no tokenizer.json). Each must stay inside the artifact, by its name and after following links;
a hand-made one that points elsewhere (`../other/part.parquet`, an absolute path, a link out) is
one line, exit 2, naming the file and the field — and the planted rows are never copied.

`--overwrite` empties an OUT only when llmctl wrote it (its manifest, a sharded stage's
`.shards/`, or only the entries the command itself writes before its manifest); a folder holding
anything else is refused with one line naming what is there, through a symlink too, and every one
of its files is still there afterwards. `-o -` is refused where the output is a folder, and no
folder named `-` is made.

Every case runs in this process through `llmctl.cli.main` under an alarm (a hang fails the test),
on one small tokenizer, tokens artifact, docs artifact and one-step run made once."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import ROOT
from test_bad_input import Run, cli, done, usage_error

# ---------------------------------------------------------------------------------------------
# running commands


def refused(r: Run, *words: str) -> None:
    """Exit 2 with one line on stderr holding `words`, no traceback."""
    usage_error(r, *words)


def ok(r: Run) -> None:
    done(r)


# ---------------------------------------------------------------------------------------------
# the artifacts

WORDS = "the river mill grain town baskets carried old stone bridge market morning bread".split()
PLANTED = "PLANTED ROW FROM OUTSIDE THE ARTIFACT"
SMALL = ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.d_ff=64",
         "--set", "model.max_seq_len=32", "--seq-len", "32", "--batch-tokens", "128", "--micro-batch", "4",
         "--max-tokens", "256", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tokenizer, docs and tokens artifacts, a one-step run, its export, prompts and chats."""
    d = tmp_path_factory.mktemp("hostile")
    rng = random.Random(0)
    pq.write_table(pa.table({"text": [" ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(120)]}), d / "docs.parquet")
    ok(cli("tokenize", "train", d / "docs.parquet", "-o", d / "tok", "--vocab-size", "300", "--quiet"))
    ok(cli("tokenize", d / "docs.parquet", "-o", d / "tokens", "-t", d / "tok", "--workers", "1", "--quiet"))
    ok(cli("cat", d / "docs.parquet", "-o", d / "docs", "--quiet"))
    ok(cli("train", d / "tokens", "-o", d / "run", *SMALL))
    ok(cli("export", d / "run", "-o", d / "hf"))
    (d / "sums.jsonl").write_text("".join(json.dumps({"question": f"What is {a} plus 1?", "answer": f"#### {a + 1}"}) + "\n"
                                          for a in range(4)))
    (d / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                            {"role": "assistant", "content": "hello"}]}) + "\n")
    (d / "filter.toml").write_text('[[steps]]\nname = "c4"\n')
    (d / "outside").mkdir()
    pq.write_table(pa.table({"text": [PLANTED] * 3}), d / "outside" / "part-00000.parquet")
    return d


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def edit_manifest(art: Path, change) -> None:
    m = json.loads((art / "manifest.json").read_text())
    change(m)
    (art / "manifest.json").write_text(json.dumps(m))


def planted_anywhere(folder: Path) -> bool:
    """Whether any Parquet file under `folder` holds the planted rows."""
    for f in folder.rglob("*.parquet") if folder.exists() else []:
        if PLANTED in pq.read_table(f).to_pandas().to_string():
            return True
    return False


# ---------------------------------------------------------------------------------------------
# manifests and links that point outside the artifact


def docs_readers(base: Path, out: Path) -> dict[str, list]:
    """command -> its argv reading docs from IN (substituted), writing under `out`."""
    return {
        "cat": ["cat", "IN", "-o", out / "cat"],
        "head": ["head", "-n", "1000", "IN", "-o", out / "head"],
        "inspect": ["inspect", "IN", "--json"],
        "filter": ["filter", "IN", "-o", out / "filter", "--config", base / "filter.toml", "--workers", "1"],
        "dedup": ["dedup", "IN", "-o", out / "dedup", "--exact", "--workers", "1"],
        "decontam": ["decontam", "IN", "--against", ROOT / "examples/tasks/arithmetic.jsonl", "-o", out / "decontam", "--workers", "1"],
        "tokenize": ["tokenize", "IN", "-o", out / "tokenize", "-t", base / "tok", "--workers", "1"],
        "tokenize train": ["tokenize", "train", "IN", "-o", out / "tokenize-train", "--vocab-size", "300"],
    }


def test_a_docs_manifest_naming_a_file_outside_the_artifact_is_refused_by_every_reader(base, tmp_path):
    """`outputs[].file` as `../other/part.parquet`, as an absolute path, and a listed part that is
    a link out of the artifact: every docs reader stops with one line naming manifest.json and
    the field, and no output anywhere holds the planted rows."""
    arts = {}
    arts["dotdot"] = copy(base / "docs", tmp_path / "dotdot")
    edit_manifest(arts["dotdot"], lambda m: m["outputs"].append({**m["outputs"][0], "file": "../../outside/part-00000.parquet"}))
    arts["absolute"] = copy(base / "docs", tmp_path / "absolute")
    edit_manifest(arts["absolute"], lambda m: m["outputs"].append({**m["outputs"][0], "file": str(base / "outside" / "part-00000.parquet")}))
    arts["link"] = copy(base / "docs", tmp_path / "link")
    (arts["link"] / "part-00000.parquet").unlink()
    (arts["link"] / "part-00000.parquet").symlink_to(base / "outside" / "part-00000.parquet")
    words = {"dotdot": ["manifest.json", "outputs[1].file", "leaves the artifact"],
             "absolute": ["manifest.json", "outputs[1].file", "absolute"],
             "link": ["manifest.json", "outputs[0].file", "a link to"]}
    cases = 0
    for shape, art in arts.items():
        out = tmp_path / f"out-{shape}"
        for name, argv in docs_readers(base, out).items():
            r = cli(*[art if a == "IN" else a for a in argv])
            refused(r, *words[shape])
            assert PLANTED not in r.out, (shape, name)
            cases += 1
        assert not planted_anywhere(out), shape
    assert cases == 24


def test_a_tokens_manifest_naming_shards_outside_is_refused_by_train_and_eval(base, tmp_path):
    """A tokens manifest naming `../…/tokens-00000.bin` (or its .idx, or a .meta.parquet), an
    absolute shard, or a shard that is a link out: train and eval's loss task stop with one
    line, and no run is made."""
    def renamed(suffix, to):
        def change(m):
            for o in m["outputs"]:
                if o["file"].endswith(suffix):
                    o["file"] = to(o["file"])
        return change

    other = copy(base / "tokens", tmp_path / "other")
    shapes = {
        "bin ..": (renamed(".bin", lambda f: f"../other/{f}"), "leaves the artifact"),
        "idx ..": (renamed(".idx", lambda f: f"../other/{f}"), "leaves the artifact"),
        "meta ..": (lambda m: m["outputs"].append({"file": "../other/tokens-00000.meta.parquet", "rows": 1}), "leaves the artifact"),
        "bin absolute": (renamed(".bin", lambda f: str(other / f)), "absolute"),
    }
    cases = 0
    for i, (shape, (change, word)) in enumerate(shapes.items()):
        art = copy(base / "tokens", tmp_path / f"t{i}")
        edit_manifest(art, change)
        refused(cli("train", art, "-o", tmp_path / f"run{i}", *SMALL), "manifest.json", "outputs[", word)
        refused(cli("eval", base / "run", "-t", f"loss:{art}", "-o", tmp_path / f"eval{i}"), "manifest.json", "outputs[", word)
        assert not (tmp_path / f"run{i}" / "checkpoints").exists() and not (tmp_path / f"eval{i}" / "results.json").exists()
        cases += 2
    link = copy(base / "tokens", tmp_path / "link")
    (link / "tokens-00000.bin").unlink()
    (link / "tokens-00000.bin").symlink_to(other / "tokens-00000.bin")
    refused(cli("train", link, "-o", tmp_path / "runlink", *SMALL), "manifest.json", "tokens-00000.bin", "a link to")
    refused(cli("eval", base / "run", "-t", f"loss:{link}", "-o", tmp_path / "evallink"), "a link to")
    assert cases + 2 == 10


def test_a_tokens_manifest_naming_a_tokenizer_outside_is_refused(base, tmp_path):
    """A tokens artifact without its own tokenizer.json whose manifest's `config.tokenizer` names
    /etc/shadow, another artifact's tokenizer or `../`: train stops with one line naming the
    field, before reading it. (With the artifact's own tokenizer.json there, config.tokenizer is
    only where it came from, and is never read.)"""
    for i, named in enumerate(["/etc/shadow", str(base / "tok" / "tokenizer.json"), "../tok/tokenizer.json"]):
        art = copy(base / "tokens", tmp_path / f"t{i}")
        (art / "tokenizer.json").unlink()
        edit_manifest(art, lambda m: m["config"].update(tokenizer=named))
        refused(cli("train", art, "-o", tmp_path / f"run{i}", *SMALL), "manifest.json config.tokenizer", repr(named))
        assert not (tmp_path / f"run{i}" / "checkpoints").exists()
    art = copy(base / "tokens", tmp_path / "own")
    edit_manifest(art, lambda m: m["config"].update(tokenizer="/etc/shadow"))
    ok(cli("train", art, "-o", tmp_path / "run-own", *SMALL))
    assert (tmp_path / "run-own" / "checkpoints" / "latest").is_file()


def test_a_latest_pointer_out_of_its_checkpoints_folder_is_refused(base, tmp_path):
    """`checkpoints/latest` holding `../../other/…`, an absolute path, a nested path, or naming a
    step directory that is a link out: export, eval, generate and train --resume stop with one
    line naming the `latest` file; nothing is exported."""
    other = copy(base / "run", tmp_path / "other")
    step = next((other / "checkpoints").glob("step-*")).name
    shapes = {"dotdot": f"../../other/checkpoints/{step}", "absolute": str(other / "checkpoints" / step),
              "nested": f"{step}/../{step}", "link": "step-999999"}
    cases = 0
    for shape, pointer in shapes.items():
        run = copy(base / "run", tmp_path / shape)
        if shape == "link":
            (run / "checkpoints" / pointer).symlink_to(other / "checkpoints" / step)
        (run / "checkpoints" / "latest").write_text(pointer + "\n")
        for argv in (["export", run, "-o", tmp_path / f"hf-{shape}"],
                     ["eval", run, "-t", f"loss:{base / 'tokens'}", "-o", tmp_path / f"eval-{shape}"],
                     ["generate", run, "-p", "the river", "--max-new-tokens", "2"],
                     ["train", base / "tokens", "-o", run, "--resume", *SMALL]):
            refused(cli(*argv), "checkpoints/latest" if shape != "link" else "a link to")
            cases += 1
        assert not (tmp_path / f"hf-{shape}").exists()
    assert cases == 16


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_a_checkpoint_file_that_links_out_is_refused(base, tmp_path, name):
    """A checkpoint is closed over itself too: its weights, config or tokenizer a link to a file
    elsewhere (another run's, here) is one line naming the file, for export, eval and generate."""
    other = copy(base / "run", tmp_path / "other")
    run = copy(base / "run", tmp_path / "run")
    step = next((run / "checkpoints").glob("step-*"))
    (step / name).unlink()
    (step / name).symlink_to(next((other / "checkpoints").glob("step-*")) / name)
    for argv in (["export", run, "-o", tmp_path / "hf"],
                 ["eval", run, "-t", f"loss:{base / 'tokens'}", "-o", tmp_path / "eval"],
                 ["generate", run, "-p", "the river", "--max-new-tokens", "2"]):
        refused(cli(*argv), name, "a link to")
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------
# --overwrite replaces only llmctl's own outputs


def foreign(folder: Path) -> dict[str, bytes]:
    """A folder llmctl never wrote: notes, a subfolder, and files named like some of llmctl's."""
    (folder / "sub").mkdir(parents=True)
    files = {"notes.txt": b"my notes", "sub/data.csv": b"a,b\n1,2\n", "config.json": b'{"mine": true}',
             "tokenizer.json": b"{}", "part-00000.parquet": b"not llmctl's"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def intact(folder: Path, files: dict[str, bytes]) -> bool:
    return all((folder / n).is_file() and (folder / n).read_bytes() == data for n, data in files.items())


def overwriters(base: Path) -> dict[str, list]:
    """Every command that takes --overwrite -> its argv without -o."""
    return {
        "cat": ["cat", base / "docs.parquet"],
        "head": ["head", "-n", "5", base / "docs.parquet"],
        "crawl-extract": ["crawl-extract", ROOT / "examples/crawl/CC-EXAMPLE-00000.warc.gz", "--workers", "1"],
        "filter": ["filter", base / "docs", "--config", base / "filter.toml", "--workers", "1"],
        "filter train-classifier": ["filter", "train-classifier", "--positive", base / "docs", "--negative", base / "docs.parquet"],
        "dedup": ["dedup", base / "docs", "--exact", "--workers", "1"],
        "decontam": ["decontam", base / "docs", "--against", ROOT / "examples/tasks/arithmetic.jsonl", "--workers", "1"],
        "tokenize": ["tokenize", base / "docs", "-t", base / "tok", "--workers", "1"],
        "tokenize train": ["tokenize", "train", base / "docs", "--vocab-size", "300"],
        "train": ["train", base / "tokens", *SMALL],
        "eval": ["eval", base / "run", "-t", f"loss:{base / 'tokens'}"],
        "rl": ["rl", base / "run", "--prompts", base / "sums.jsonl", "--steps", "1", "--prompts-per-step", "2", "-G", "2",
               "--max-new-tokens", "2", "--headroom-limit", "0", "--device", "cpu"],
        "export": ["export", base / "run"],
        "import": ["import", base / "hf"],
    }


def test_overwrite_refuses_a_folder_llmctl_did_not_write(base, tmp_path):
    """Every command with --overwrite, given a folder of someone's files (directly and through a
    symlink) or a plain file as OUT: one line naming what is there, and every file still there."""
    cases = 0
    for name, argv in overwriters(base).items():
        key = name.replace(" ", "-")
        target = tmp_path / f"mine-{key}"
        files = foreign(target)
        link = tmp_path / f"link-{key}"
        link.symlink_to(target)
        for out in (target, link):
            refused(cli(*argv, "-o", out, "--overwrite"), "llmctl did not write", "notes.txt", "sub")
            assert intact(target, files), (name, out)
            cases += 1
        plain = tmp_path / f"file-{key}"
        plain.write_text("keep me")
        refused(cli(*argv, "-o", plain, "--overwrite"), str(plain))
        assert plain.read_text() == "keep me", name
        cases += 1
    assert cases == 3 * 14


def test_overwrite_still_replaces_llmctl_outputs(base, tmp_path):
    """What --overwrite is for: a finished artifact, a run, an export and an import are replaced; so
    is an output an interrupted command left (cat's parts without a manifest, a sharded stage's
    .shards/), an OUT through a symlink to one, and an empty folder."""
    cat = tmp_path / "cat"
    ok(cli("cat", base / "docs.parquet", "-o", cat, "--quiet"))
    ok(cli("cat", base / "docs.parquet", "-o", cat, "--quiet", "--overwrite"))
    (cat / "manifest.json").unlink()
    (cat / "README.md").unlink()  # killed after a part, before the card and the manifest
    ok(cli("cat", base / "docs.parquet", "-o", cat, "--quiet", "--overwrite"))
    (tmp_path / "to-cat").symlink_to(cat)
    ok(cli("head", "-n", "3", base / "docs.parquet", "-o", tmp_path / "to-cat", "--quiet", "--overwrite"))
    assert json.loads((cat / "manifest.json").read_text())["counts"]["out"] == 3
    dedup = tmp_path / "dedup"
    ok(cli("dedup", base / "docs", "--exact", "--workers", "1", "-o", dedup, "--quiet"))
    (dedup / "manifest.json").unlink()  # left with its .shards/ markers
    ok(cli("dedup", base / "docs", "--exact", "--workers", "1", "-o", dedup, "--quiet", "--overwrite"))
    (tmp_path / "empty").mkdir()
    ok(cli("tokenize", "train", base / "docs", "--vocab-size", "300", "-o", tmp_path / "empty", "--quiet", "--overwrite"))
    run = copy(base / "run", tmp_path / "run")
    (run / "plots").mkdir()  # something beside a finished run stays: only the run's own entries go
    ok(cli("train", base / "tokens", "-o", run, "--overwrite", *SMALL))
    assert (run / "plots").is_dir() and (run / "manifest.json").is_file()
    ok(cli("export", base / "run", "-o", tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / "manifest.json").read_text())["stage"] == "export"
    ok(cli("export", base / "run", "-o", tmp_path / "hf", "--overwrite"))
    ok(cli("import", tmp_path / "hf", "-o", tmp_path / "ck"))
    ok(cli("import", tmp_path / "hf", "-o", tmp_path / "ck", "--overwrite"))


# ---------------------------------------------------------------------------------------------
# -o - where a command cannot stream


def test_dash_output_is_refused_where_the_output_is_a_folder(base, tmp_path, monkeypatch):
    """`-o -` for a command whose output is a folder is one line, exit 2, and no folder named `-`
    appears (export used to replace an existing one even without --overwrite)."""
    monkeypatch.chdir(tmp_path)
    folders = {
        "train": ["train", base / "tokens", *SMALL],
        "train --sft": ["train", "--sft", base / "chats.jsonl", "--init", base / "run", *SMALL[10:]],
        "eval": ["eval", base / "run", "-t", f"loss:{base / 'tokens'}"],
        "rl": overwriters(base)["rl"],
        "export": ["export", base / "run"],
        "import": ["import", base / "hf"],
        "plot": ["plot", base / "run"],
        "filter stats": ["filter", "stats", base / "docs"],
        "filter train-classifier": overwriters(base)["filter train-classifier"],
        "tokenize": ["tokenize", base / "docs", "-t", base / "tok"],
        "tokenize train": ["tokenize", "train", base / "docs", "--vocab-size", "300"],
        "report": ["report", base / "run"],
    }
    for name, argv in folders.items():
        r = cli(*argv, "-o", "-")
        refused(r)
        assert "'-'" in r.err or "-o -" in r.err, r.why()
        assert not (tmp_path / "-").exists(), name
    (tmp_path / "-").mkdir()
    (tmp_path / "-" / "notes.txt").write_text("mine")
    for name in ("export", "import"):
        refused(cli(*folders[name], "-o", "-"), "'-'")
        refused(cli(*folders[name], "-o", "-", "--overwrite"), "'-'")
        assert sorted(os.listdir(tmp_path / "-")) == ["notes.txt"], name


# ---------------------------------------------------------------------------------------------
# a tokenizer.json that is not one


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b"\xff\xfe"], ids=["empty", "not-json", "a-list", "not-utf8"])
def test_a_tokenizer_json_that_is_empty_or_not_json_is_one_line(base, tmp_path, body):
    """The tokenizer.json of a tokens artifact train reads, of a checkpoint eval reads, of the
    folder `train --sft --tokenizer` and `tokenize -t` name: empty, not JSON, not an object or
    not UTF-8 is one line naming the file (train used to end in a JSONDecodeError traceback)."""
    tokens = copy(base / "tokens", tmp_path / "tokens")
    (tokens / "tokenizer.json").write_bytes(body)
    refused(cli("train", tokens, "-o", tmp_path / "run", *SMALL), str(tokens / "tokenizer.json"))
    run = copy(base / "run", tmp_path / "ck")
    for f in (run / "checkpoints").glob("step-*/tokenizer.json"):
        f.write_bytes(body)
    refused(cli("eval", run, "-t", f"loss:{base / 'tokens'}", "-o", tmp_path / "eval"), "tokenizer.json")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes(body)
    refused(cli("train", "--sft", base / "chats.jsonl", "--tokenizer", tok, "-o", tmp_path / "sft", *SMALL), str(tok / "tokenizer.json"))
    refused(cli("tokenize", base / "docs", "-t", tok, "-o", tmp_path / "t", "--workers", "1"), str(tok / "tokenizer.json"))

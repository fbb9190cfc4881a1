"""tokenize: training, tiktoken/tokenizers parity, shards, the reader, splits, edge cases."""

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import llmctl, shared_file
from llmctl.artifacts.tokens import TokenDataset, token_dtype
from llmctl.tokenizer import bpe
from llmctl.data.tokenize import TokenizeConfig, run_tokenize, train_tokenizer
from llmctl.errors import UsageError
from llmctl.runtime.options import RunOptions

TEXTS = [
    "The river runs past the old mill. It's 1234567 steps away!",
    "Grüße aus Köln — naïve café, déjà vu.",
    "日本語のテキストと中文文本。",
    "emoji 🚀🔥👩‍👩‍👧 and flags 🇩🇪",
    "combining: e\u0301 a\u0308 and controls \x01\x02\t\r\n end",
    "spaces    and\n\n\nnewlines\r\n",
    "I'll say: don't <|endoftext|> <|user|> that.",
    "",
]


def random_unicode(rng: random.Random, n: int) -> str:
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F), (0x300, 0x36F), (0x0, 0x1F)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    rng = random.Random(0)
    corpus = TEXTS * 20 + [random_unicode(rng, 300) for _ in range(50)] + [" ".join(rng.choice(["river", "mill", "stone", "bridge", "market", "the", "of"]) for _ in range(200)) for _ in range(100)]
    pq.write_table(pa.table({"text": corpus}), d / "corpus.parquet")
    train_tokenizer([str(d / "corpus.parquet")], str(d / "tok"), bpe.TrainTokenizerConfig(vocab_size=600))
    return d


def test_special_tokens_are_reserved_first_in_a_fixed_order(tok_dir):
    tok, p = bpe.load(str(tok_dir / "tok"))
    meta = bpe.info(tok, p)
    assert meta.special["<|endoftext|>"] == 0 and meta.special["<|user|>"] == 2 and meta.special["<|assistant|>"] == 3
    assert sorted(meta.special.values()) == list(range(16))
    assert meta.vocab_size <= 600


def test_roundtrip_and_tiktoken_matches_tokenizers(tok_dir):
    enc = bpe.Encoder(str(tok_dir / "tok" / "tokenizer.json"))
    assert enc.fast is not None
    plain = bpe.ordinary(enc.tok)
    rng = random.Random(1)
    texts = TEXTS + [random_unicode(rng, rng.randint(0, 400)) for _ in range(300)]
    fast = enc.encode_batch(texts)
    slow = [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]
    assert fast == slow
    for t, ids in zip(texts, fast):
        assert enc.decode(ids) == t


def test_text_that_looks_special_stays_text(tok_dir):
    enc = bpe.Encoder(str(tok_dir / "tok"))
    ids = enc.encode_batch(["say <|endoftext|> now"])[0]
    assert 0 not in ids and enc.decode(ids) == "say <|endoftext|> now"
    texts = ["<|endoftext|>", "a<|endoftext|>b <|user|><|endoftext|>", "<|endoftext|", "é<|end|>中"]
    assert enc.encode_batch(texts) == [enc.fast.encode_ordinary(t) for t in texts]


def test_threads_and_lone_surrogates_give_the_same_ids(tok_dir):
    rng = random.Random(2)
    texts = TEXTS + [random_unicode(rng, rng.randint(0, 300)) for _ in range(100)]
    one = bpe.Encoder(str(tok_dir / "tok"), threads=1).encode_arrays(texts)
    two = bpe.Encoder(str(tok_dir / "tok"), threads=2).encode_arrays(texts)  # the thread-pool path
    assert all(a.dtype == np.uint32 and np.array_equal(a, b) for a, b in zip(one, two)) and len(one) == len(two)
    enc = bpe.Encoder(str(tok_dir / "tok"))
    assert enc.encode_batch(["a\ud800b"]) == [enc.fast.encode_ordinary("a\ud800b")]  # replaced, not an error


def test_sample_indices_is_seeded_within_budget_and_skips_empty():
    lengths = [0, 5, 7, 0, 3, 9, 4] * 50
    assert bpe.sample_indices([0, 2, 0, 3], 100, 0) == [1, 3]  # everything fits: every non-empty doc
    keep = bpe.sample_indices(lengths, 200, seed=1)
    assert keep == bpe.sample_indices(lengths, 200, seed=1) != bpe.sample_indices(lengths, 200, seed=2)
    assert keep == sorted(keep) and all(lengths[i] for i in keep) and sum(lengths[i] for i in keep) <= 200


def test_write_shard_takes_lists_or_arrays(tmp_path):
    from llmctl.artifacts.tokens import TokenShardWriter, write_shard

    docs = [[5, 6, 7], [], [65535, 1]]
    got = [write_shard(tmp_path / f"{k}.bin", tmp_path / f"{k}.idx", d, 9, np.dtype("<u2")) for k, d in (("l", docs), ("a", [np.array(x, np.uint32) for x in docs]))]
    assert got == [(3, 8), (3, 8)]
    assert np.fromfile(tmp_path / "a.bin", "<u2").tolist() == [5, 6, 7, 9, 9, 65535, 1, 9]
    assert np.fromfile(tmp_path / "a.idx", "<i8").tolist() == [0, 4, 5]
    for ext in ("bin", "idx"):
        assert (tmp_path / f"l.{ext}").read_bytes() == (tmp_path / f"a.{ext}").read_bytes()
    assert write_shard(tmp_path / "e.bin", tmp_path / "e.idx", [], 9, np.dtype("<u2")) == (0, 0)
    with pytest.raises(RuntimeError):  # a failed shard leaves nothing behind, not even temporaries
        with TokenShardWriter(tmp_path / "f.bin", tmp_path / "f.idx", 9, np.dtype("<u2")) as shard:
            shard.add(docs)
            raise RuntimeError("encoder failed")
    assert not list(tmp_path.glob("*f.*"))


def test_same_input_same_tokenizer_json(tok_dir, tmp_path):
    train_tokenizer([str(tok_dir / "corpus.parquet")], str(tmp_path / "again"), bpe.TrainTokenizerConfig(vocab_size=600))
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (tok_dir / "tok" / "tokenizer.json").read_bytes()


def test_loads_in_transformers(tok_dir):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tok" / "tokenizer.json"))
    assert fast.decode(fast("The river runs.")["input_ids"]) == "The river runs."


def test_shards_manifest_counts_and_reader(tok_dir, tmp_path):
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS * 3 + ["x" * (10 << 20)])]
    for part in range(2):
        chunk = docs[part::2]
        pq.write_table(pa.table({"id": [d["id"] for d in chunk], "text": [d["text"] for d in chunk]}), tmp_path / f"in{part}.parquet")
    ins = [str(tmp_path / "in0.parquet"), str(tmp_path / "in1.parquet")]
    cfg = TokenizeConfig(tokenizer=str(tok_dir / "tok"))
    m = run_tokenize(ins, str(tmp_path / "w2"), cfg, RunOptions(workers=2))
    run_tokenize(ins, str(tmp_path / "w1"), cfg, RunOptions(workers=1))
    for name in ("tokens-00000.bin", "tokens-00001.bin", "tokens-00000.idx"):
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()
    enc = bpe.Encoder(str(tok_dir / "tok"))
    ordered = [d for d in docs[0::2] + docs[1::2] if d["text"]]  # an empty text is skipped and counted
    assert m.counts["skipped"] == {"null_text": 0, "empty_text": 3} and m.counts["errors"] == 0
    expected = enc.encode_batch([d["text"] for d in ordered])
    ds = TokenDataset(tmp_path / "w2")
    assert ds.n_docs == len(ordered) == m.counts["docs"]
    assert ds.n_tokens == sum(len(e) + 1 for e in expected) == m.counts["tokens"]
    assert m.counts["bytes"] == sum(len(d["text"].encode()) for d in ordered)
    assert m.config["dtype"] == "<u2" and (tmp_path / "w2" / "tokenizer.json").exists()
    for i, e in enumerate(expected):
        assert ds.doc(i).tolist() == e
    flat = [t for e in expected for t in e + [0]]
    assert ds.window(0, ds.n_tokens).tolist() == flat
    off = ds.shard_offset[1] - 3  # a window across the shard boundary
    assert ds.window(int(off), 7).tolist() == flat[off : off + 7]


def test_train_val_split_is_disjoint_and_complete(tok_dir, tmp_path):
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(200)], "text": [f"document {i}" for i in range(200)]}), tmp_path / "in.parquet")
    kw = dict(tokenizer=str(tok_dir / "tok"), val_fraction=0.1, seed=3)
    tr = run_tokenize([str(tmp_path / "in.parquet")], str(tmp_path / "train"), TokenizeConfig(split="train", **kw), RunOptions(workers=1))
    va = run_tokenize([str(tmp_path / "in.parquet")], str(tmp_path / "val"), TokenizeConfig(split="val", **kw), RunOptions(workers=1))
    assert tr.counts["docs"] + va.counts["docs"] == 200 and 5 <= va.counts["docs"] <= 40


def test_dtype_switches_at_65536():
    assert token_dtype(65536) == np.dtype("<u2") and token_dtype(65537) == np.dtype("<u4")


def test_empty_documents_and_usage_errors(tok_dir, tmp_path):
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["", None]}), tmp_path / "e.parquet")
    m = run_tokenize([str(tmp_path / "e.parquet")], str(tmp_path / "o"), TokenizeConfig(tokenizer=str(tok_dir / "tok")), RunOptions(workers=1))
    assert m.counts["docs"] == 0 and m.counts["tokens"] == 0  # rows without text are skipped and counted
    assert m.counts["skipped"] == {"null_text": 1, "empty_text": 1}
    with pytest.raises(UsageError, match="no text"):
        train_tokenizer([str(tmp_path / "e.parquet")], str(tmp_path / "t"), bpe.TrainTokenizerConfig(vocab_size=600))
    with pytest.raises(UsageError, match="--tokenizer"):
        run_tokenize([str(tmp_path / "e.parquet")], str(tmp_path / "x"), TokenizeConfig(), RunOptions())
    p = llmctl("tokenize", tmp_path / "e.parquet", "-o", tmp_path / "y", "--tokenizer", tmp_path / "nope.json")
    assert p.returncode == 2 and "tokenizer not found" in p.stderr.decode()


def test_pages_a_parity(tmp_path):
    """On real pages: tiktoken's ids equal the tokenizers ids on every document."""
    from llmctl.data.crawl.extract import ExtractConfig, run_crawl_extract

    run_crawl_extract([str(shared_file("warc-bad/pages-corrupt-middle.warc.gz"))], str(tmp_path / "docs"), ExtractConfig(), RunOptions(workers=2))
    train_tokenizer([str(tmp_path / "docs")], str(tmp_path / "tok"), bpe.TrainTokenizerConfig(vocab_size=2000))
    enc = bpe.Encoder(str(tmp_path / "tok"))
    texts = [t for t in pq.read_table(sorted((tmp_path / "docs").glob("part-*.parquet"))[0]).column("text").to_pylist()]
    import glob as g

    texts = [t for f in sorted(g.glob(str(tmp_path / "docs" / "part-*.parquet"))) for t in pq.read_table(f).column("text").to_pylist()]
    assert enc.encode_batch(texts) == [e.ids for e in bpe.ordinary(enc.tok).encode_batch(texts, add_special_tokens=False)]

"""Shared by tests/test_dpo.py and tests/test_reward_model.py: a tiny chat checkpoint (a BPE
tokenizer with llmctl's chat tokens, trained on a grammar-made corpus, and a random 2-layer model)
and preference pairs over it: name the subject of a sentence (chosen) or another subject (rejected)."""

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from llmctl.artifacts.checkpoint import save_checkpoint
from llmctl.data.tokenize import train_tokenizer
from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer
from llmctl.tokenizer import bpe

SUBJECTS = ["the miller", "a farmer", "the old bridge", "my sister", "the river", "our market"]
VERBS = ["carries", "watches", "builds", "sells", "remembers", "crosses"]
OBJECTS = ["grain to town", "the stone wall", "twelve baskets", "the morning bread", "a red boat"]


def sentence(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(SUBJECTS)
    return f"{s.capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)}.", s


def make_checkpoint(d, seed: int = 0):
    """(checkpoint dir, tokenizer.json) of a random tiny chat model."""
    rng = random.Random(0)
    texts = [" ".join(sentence(rng)[0] for _ in range(12)) for _ in range(200)]
    pq.write_table(pa.table({"text": texts}), d / "docs.parquet")
    train_tokenizer([str(d / "docs.parquet")], str(d / "tok"), bpe.TrainTokenizerConfig(vocab_size=300))
    tok = d / "tok" / "tokenizer.json"
    cfg = ModelConfig(vocab_size=300, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=64)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    save_checkpoint(d / "ck", 0, cfg, model.state_dict(), {"step": 0, "chat": True}, tokenizer_file=tok)
    return d / "ck", tok


def pair_records(n: int, seed: int = 1) -> list[dict]:
    """Pairs in the three shapes: strings, TRL's conversational, UltraFeedback's whole conversations."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s, subject = sentence(rng)
        wrong = rng.choice([x for x in SUBJECTS if x != subject])
        prompt = f"Name the subject. {s}"
        if i % 3 == 0:
            out.append({"prompt": prompt, "chosen": subject, "rejected": wrong})
        elif i % 3 == 1:
            out.append({"prompt": [{"role": "user", "content": prompt}],
                        "chosen": [{"role": "assistant", "content": subject}],
                        "rejected": [{"role": "assistant", "content": wrong}]})
        else:
            user = {"role": "user", "content": prompt}
            out.append({"prompt": prompt, "chosen": [user, {"role": "assistant", "content": subject}],
                        "rejected": [user, {"role": "assistant", "content": wrong}]})
    return out


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def train_config(**kw):
    from llmctl.train.config import TrainConfig

    base = dict(seq_len=64, batch_tokens=64 * 8, micro_batch=4, lr=3e-3, weight_decay=0.0, threads=1, eval_every=0,
                warmup_tokens=0, cooldown_frac=0.0, checkpoint_every=1000, device="cpu")
    return TrainConfig(**{**base, **kw})


def metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"val"' not in x]


def final_weights(run) -> dict:
    from llmctl.model.load import load_checkpoint

    return load_checkpoint(run / "checkpoints").tensors

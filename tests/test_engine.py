"""The generation engine (model/generate.py, scheduler.py, kv_pool.py, sampling.py): continuous
batching, shared prefixes and paged KV memory change speed and memory, never a row's tokens."""

import math

import pytest
import torch
import torch.nn.functional as F

from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.generate import Engine, EngineConfig, SamplingParams
from llmctl.model.sampling import row_seed
from llmctl.model.scheduler import Request, Scheduler
from llmctl.model.transformer import Transformer

STOP = 7  # a stop id the random model emits now and then


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return Transformer(ModelConfig(vocab_size=48, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, max_seq_len=256)).eval()


def encode(s: str) -> list[int]:
    return [ord(ch) % 40 + 8 for ch in s]


def decode(ids: list[int]) -> str:
    return "".join(chr(65 + i % 26) for i in ids)


def engine(model, **config) -> Engine:
    return Engine(model, encode, decode, stop_ids=(STOP,), pad_id=0, config=EngineConfig(**config))


PROMPTS = ["a", "The river runs past the old mill", "xyz xyz xyz xyz xyz xyz xyz xyz xyz", "Q", "", "hello there",
           "The river runs past the old mill and on"]


def test_greedy_equals_the_uncached_reference_on_mixed_lengths(model):
    params = SamplingParams(max_new_tokens=20, stop=("QQ",))
    ref = engine(model).generate(PROMPTS, params, use_cache=False)
    for cfg in ({}, {"block_size": 4}, {"block_size": 4, "max_rows": 2}, {"block_size": 4, "kv_tokens": 64}):
        got = engine(model, **cfg).generate(PROMPTS, params)
        assert [(g.ids, g.text, g.finish, g.stop_id) for g in got] == [(g.ids, g.text, g.finish, g.stop_id) for g in ref], cfg
        for a, b in zip(got, ref):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert {g.finish for g in ref} >= {"length"}


def test_sampled_rows_do_not_depend_on_their_batch_mates(model):
    """Same seed → same tokens whatever shares the pool: 1, 7 or 64 rows at once, in any order."""
    prompts = [PROMPTS[i % len(PROMPTS)] + "x" * (i % 5) for i in range(24)]
    seeds = [row_seed(5, i) for i in range(24)]
    params = SamplingParams(max_new_tokens=16, temperature=0.9, top_k=20, top_p=0.9)
    runs = [[g.ids for g in engine(model, max_rows=rows, block_size=4).generate(prompts, params, seeds=seeds)]
            for rows in (1, 7, 64)]
    assert runs[0] == runs[1] == runs[2]
    alone = [engine(model).generate([p], params, seeds=[s])[0].ids for p, s in zip(prompts[:6], seeds[:6])]
    assert alone == runs[0][:6]
    backwards = engine(model).generate(prompts[::-1], params, seeds=seeds[::-1])
    assert [g.ids for g in backwards] == runs[0][::-1]
    ref = engine(model).generate(prompts[:6], params, use_cache=False, seeds=seeds[:6])
    assert [g.ids for g in ref] == runs[0][:6]
    assert runs[0] != [g.ids for g in engine(model).generate(prompts, params, seeds=[s + 1 for s in seeds])]


def test_group_samples_share_one_prefill_and_equal_unshared_rows(model):
    prompt, G = encode("What is 12 + 30? Think, then answer."), 8
    seeds = [row_seed(1, j) for j in range(G)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    e = engine(model, block_size=4)
    shared = e.generate([prompt] * G, params, seeds=seeds)
    assert e.stats["shared_prefill_rows"] == G - 1 and e.stats["prefill_tokens"] == len(prompt)
    unshared = [engine(model).generate([prompt], params, seeds=[s])[0] for s in seeds]
    assert [g.ids for g in shared] == [g.ids for g in unshared]
    assert len({tuple(g.ids) for g in shared}) > 1  # they are samples, not copies


def test_a_shared_few_shot_prefix_is_computed_once(model):
    fewshot = "Q: 1+1? A: 2. Q: 2+2? A: 4. Q: 3+3? A: 6. "
    prompts = [fewshot + f"Q: {a}+{a}? A:" for a in range(5, 11)]
    params = SamplingParams(max_new_tokens=6)
    e = engine(model, block_size=4, max_rows=1)  # one at a time: each later prompt finds the prefix cached
    got = e.generate(prompts, params)
    assert [g.ids for g in got] == [g.ids for g in engine(model).generate(prompts, params, use_cache=False)]
    full = len(encode(fewshot)) // 4 * 4
    assert e.stats["prefix_hit_tokens"] >= (len(prompts) - 1) * full
    assert e.stats["prefill_tokens"] < sum(len(encode(p)) for p in prompts) - (len(prompts) - 1) * full + 1


def test_preemption_under_a_small_kv_budget_keeps_every_row(model):
    prompts = [p + "!" for p in PROMPTS] * 3
    seeds = [row_seed(9, i) for i in range(len(prompts))]
    params = SamplingParams(max_new_tokens=40, temperature=1.0)
    roomy = engine(model, block_size=4).generate(prompts, params, seeds=seeds)
    tight = engine(model, block_size=4, kv_tokens=96)
    got = tight.generate(prompts, params, seeds=seeds)
    assert tight.stats["preemptions"] > 0
    assert [g.ids for g in got] == [g.ids for g in roomy]
    assert tight.stats["peak_kv_bytes"] <= 96 * tight.model.cfg.n_layers * 2 * 2 * 16 * 4
    with pytest.raises(UsageError, match="KV"):
        engine(model, block_size=4, kv_tokens=16).generate(["a long prompt here"], params)


def test_kv_memory_follows_the_tokens_in_flight(model):
    cfg = model.cfg
    per_token = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4
    prompts = [encode("x" * (3 + i)) for i in range(16)]
    params = SamplingParams(max_new_tokens=120, temperature=1.0)
    e = engine(model, block_size=8)
    gens = e.generate(prompts, params, seeds=[row_seed(2, i) for i in range(16)])
    lived = sum(math.ceil((len(p) + len(g.ids) + 1) / 8) * 8 for p, g in zip(prompts, gens))
    assert 0 < e.stats["peak_kv_bytes"] <= lived * per_token
    static = len(prompts) * (max(map(len, prompts)) + params.max_new_tokens) * per_token  # the static batcher's
    if any(g.finish == "eos" for g in gens):
        assert e.stats["peak_kv_bytes"] < static


def test_policy_logprobs_are_the_trainers_at_the_temperature(model):
    params = SamplingParams(max_new_tokens=30, temperature=0.7, top_p=0.8)
    prompts = PROMPTS[:4] * 4
    gens = engine(model).generate(prompts, params, seeds=list(range(16)))
    checked_stop = False
    for g in gens:
        completion = g.ids + ([g.stop_id] if g.finish == "eos" else [])
        assert len(g.policy_logprobs) == len(completion)
        seq = (g.prompt_ids or [0]) + completion
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([seq[:-1]])).float()[0, :, :48] / 0.7, -1)
        start = len(g.prompt_ids or [0]) - 1
        want = [logp[start + t, tok].item() for t, tok in enumerate(completion)]
        assert g.policy_logprobs == pytest.approx(want, abs=1e-4)
        # top-p renormalizes the sampling distribution: its log-probs are at least the policy's
        assert all(a >= b - 1e-5 for a, b in zip(g.logprobs, g.policy_logprobs))
        checked_stop |= g.finish == "eos"
    assert checked_stop


def test_requests_arriving_mid_flight_and_aborts(model):
    """The server's path: requests join between steps and leave on abort; every finished row equals
    the offline call, and an abort gives its blocks back."""
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    e = engine(model, block_size=4)
    s = Scheduler(e, e.config)
    done, streamed = {}, {}

    def step():
        for u in s.step():
            streamed.setdefault((u.request_id, u.index), []).extend(u.new_ids)
            if u.done:
                done[(u.request_id, u.index)] = u.done

    s.add(Request("a", encode("first prompt"), params, [1, 2, 3]))
    step()
    s.add(Request("b", encode("second one"), params, [4]))
    s.add(Request("c", encode("to be dropped"), params, [5, 6]))
    step()
    s.abort("c")
    while s.has_work():
        step()
    assert set(done) == {("a", 0), ("a", 1), ("a", 2), ("b", 0)}
    offline = e.generate([encode("first prompt")] * 3 + [encode("second one")], params, seeds=[1, 2, 3, 4])
    assert [done[k].ids for k in [("a", 0), ("a", 1), ("a", 2), ("b", 0)]] == [g.ids for g in offline]
    assert all(streamed[k] == done[k].ids for k in done)  # the streamed tokens are the row's, each once
    assert s.pool.in_use == len(s.pool.cached)  # only the prefix cache still holds blocks


def test_nucleus_without_a_full_sort_keeps_what_the_sorted_definition_keeps():
    """filter_logits looks for a row's nucleus among its top 32 / 256 tokens before sorting it whole:
    the kept set is the sorted definition's (Holtzman et al. 2020), computed exactly (float64), for
    peaked and flat rows alike, with top-k before it."""
    from llmctl.model.sampling import filter_logits

    torch.manual_seed(0)
    for scale in (0.2, 1.0, 4.0, 12.0):  # flat rows need the full sort, peaked ones the top 32
        x = torch.randn(40, 600) * scale
        for k, p in ((0, 0.9), (0, 0.5), (25, 0.95), (300, 0.99), (5, 1.0)):
            got = filter_logits(x, torch.full((40,), k), torch.full((40,), p)) > float("-inf")
            z = x.double()
            if k:
                z = z.masked_fill(z < torch.topk(z, k, dim=-1).values[:, -1:], float("-inf"))
            ranked, order = torch.sort(z, descending=True, dim=-1)
            probs = ranked.softmax(-1)
            kept_sorted = (probs.cumsum(-1) - probs < p) & (ranked > float("-inf")) if p < 1 else ranked > float("-inf")
            want = torch.zeros_like(got).scatter(-1, order, kept_sorted)
            assert torch.equal(got, want), (scale, k, p)
    mixed = filter_logits(x, torch.tensor([0, 3] * 20), torch.tensor([0.9, 1.0] * 20))  # each row its own settings
    assert torch.equal(mixed[1::2] > float("-inf"), filter_logits(x[1::2], torch.full((20,), 3), torch.ones(20)) > float("-inf"))


def test_the_pools_evictable_count_follows_every_step(model):
    """BlockPool.available() reads a running count of cached blocks nothing else holds (a scan of the
    prefix cache re-hashed every key each admission); through prefix hits, samples sharing blocks,
    preemption, aborts and eviction the count stays the one a scan gives."""
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    e = engine(model, block_size=4, kv_tokens=96)
    s = Scheduler(e, e.config)
    pool, evicted = s.pool, 0
    shared = "Q: 1+1? A: 2. Q: 2+2? A: 4. "

    def step():
        nonlocal evicted
        before = len(pool.cached)
        s.step()
        evicted += len(pool.cached) < before
        assert pool.evictable == sum(1 for b in pool.key_of if pool.refs[b] == 1)

    for k in range(12):
        s.add(Request(str(k), encode(shared + "xyz" * k), params, [k, k + 100][: 1 + k % 2]))
        if k == 6:
            s.abort("5")
        if k % 2:
            step()
    while s.has_work():
        step()
    assert pool.evictable == len(pool.cached) > 0  # nothing runs: every cached block can go
    assert s.stats["prefix_hit_tokens"] > 0 and s.stats["preemptions"] > 0 and evicted > 0

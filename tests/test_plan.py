"""`llmctl plan`: every formula against the worked numbers of the spec.

Oracles: ../shared/spec/001-compute-appendix.md §C (C0-C15), 001-arch-optim-scaling.md §C
(C1, C13, C29-C31, C35), 001-systems-ops.md §A2 and §B 13, 19-21, 51. Rounding follows the
spec's printed digits.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import llmctl
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.plan import arch_from_hf, from_model_config, load_preset, load_table, lookup, plan
from llmctl.plan import arithmetic as ar
from llmctl.torchrt.hardware import read_table

GIB = 2**30


def llama_hf(d, L, h, hkv, ff, V=128_256, tied=False, mt="llama", **kw):
    return {"model_type": mt, "hidden_size": d, "num_hidden_layers": L, "num_attention_heads": h,
            "num_key_value_heads": hkv, "intermediate_size": ff, "vocab_size": V,
            "tie_word_embeddings": tied, "max_position_embeddings": 8192, **kw}


LLAMA3_8B = llama_hf(4096, 32, 32, 8, 14_336)
LLAMA3_70B = llama_hf(8192, 80, 64, 8, 28_672)
LLAMA3_405B = llama_hf(16_384, 126, 128, 8, 53_248)
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "vocab_size": 129_280, "hidden_size": 7168, "intermediate_size": 18_432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "topk_method": "noaux_tc", "tie_word_embeddings": False, "max_position_embeddings": 163_840,
    "num_nextn_predict_layers": 1,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral", "vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 14_336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "tie_word_embeddings": False, "max_position_embeddings": 32_768,
}
GPT2_SMALL = {"model_type": "gpt2", "vocab_size": 50_257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024}


@pytest.fixture(scope="module")
def l8():
    return arch_from_hf(LLAMA3_8B, "llama3-8b")


@pytest.fixture(scope="module")
def l70():
    return arch_from_hf(LLAMA3_70B, "llama3-70b")


@pytest.fixture(scope="module")
def l405():
    return arch_from_hf(LLAMA3_405B, "llama3-405b")


# -- parameters (compute §C0, scaling §C1) ----------------------------------------------------


def test_llama3_parameter_counts(l8, l70, l405):
    assert (l8.n_params, l70.n_params, l405.n_params) == (8_030_261_248, 70_553_706_496, 405_853_388_800)
    assert l8.blocks[0].params == 218_112_000
    assert l8.n_matmul == 7_504_924_672
    assert l8.embedding + l8.head == 1_050_673_152
    assert arch_from_hf({**LLAMA3_8B, "vocab_size": 128_000}).n_params == 8_028_164_096
    r = plan(l8, tokens=1e9)
    bb = r["params"]["block_breakdown"]
    assert (bb["q_o"], bb["k_v"], bb["mlp"], bb["norms_and_other"]) == (33_554_432, 8_388_608, 176_160_768, 8192)
    assert round(bb["mlp_share"], 3) == 0.808
    assert round(r["params"]["vocab_share"], 3) == 0.131
    assert round(plan(l405, tokens=1e9)["params"]["vocab_share"], 3) == 0.010
    # Kaplan's 12·L·d² on the 8B (compute §B1: 6.44B vs 6.98B actual)
    assert round(r["params"]["kaplan_12Ld2"] / 1e9, 2) == 6.44


def test_olmo2_gpt2_and_the_fineweb_preset():
    olmo7 = arch_from_hf(llama_hf(4096, 32, 32, 32, 11_008, V=100_352, mt="olmo2"))
    olmo13 = arch_from_hf(llama_hf(5120, 40, 40, 40, 13_824, V=100_352, mt="olmo2"))
    assert (olmo7.n_params, olmo13.n_params) == (7_298_617_344, 13_716_198_400)
    gpt2 = arch_from_hf(GPT2_SMALL)
    assert gpt2.n_params == 124_439_808 and gpt2.tied
    arch, train = load_preset("fineweb-0.5b")
    assert arch.n_params == 489_288_960 and train["seq_len"] == 2048


def test_presets_agree_with_model_config():
    """plan's dense counts and FLOPs are ModelConfig's, for every shipped preset."""
    for name in ("tiny", "small", "gpt2-124m", "fineweb-0.5b"):
        arch, train = load_preset(name)
        cfg = arch.model_config
        assert arch.n_params == cfg.n_params() and arch.n_matmul == cfg.n_params_matmul()
        assert arch.kv_elements_per_layer * arch.n_layers * 2 == cfg.kv_cache_bytes_per_token()
        r = plan(arch, train=train)
        assert r["flops"]["per_token"]["training"] == pytest.approx(cfg.flops_per_token(train["seq_len"], causal=True))
        assert r["flops"]["per_token"]["full"] == pytest.approx(cfg.flops_per_token(train["seq_len"], causal=False))
        assert r["flops"]["tokens"] == train["max_tokens"]


def test_moe_counts_deepseek_v3_and_mixtral():
    v3 = arch_from_hf(DEEPSEEK_V3)
    assert v3.n_params == 671_026_419_200 and v3.n_active == 37_552_297_472
    assert v3.n_matmul == 36_625_618_432  # activated, input table out (compute §C0)
    assert v3.kv_elements_per_layer * v3.n_layers * 2 == 70_272  # MLA cache (compute §C11)
    assert any("multi-token" in n for n in v3.notes)
    # compute §C6: 6·36.63B = 219.8 GFLOPs + causal attention at 4,096 = 30.7 -> 250.5 GFLOPs/token
    pt = plan(v3, seq_len=4096, tokens=1e9)["flops"]["per_token"]
    assert round(6 * v3.n_matmul / 1e9, 1) == 219.8
    assert round(pt["attention_flops"] / 1e9, 1) == 30.7 and round(pt["training"] / 1e9, 1) == 250.5
    mx = arch_from_hf(MIXTRAL_8X7B)  # Mistral's published 46.7B total, 12.9B active
    assert (mx.n_params, mx.n_active) == (46_702_792_704, 12_879_925_248)
    # memory follows total parameters, FLOPs activated ones (compute §B1b)
    r = plan(mx, tokens=1e9, seq_len=4096)
    assert r["memory"]["weights"] == 2 * mx.n_params
    assert r["flops"]["per_token"]["6N_matmul"] == 6 * mx.n_matmul


def _hf_numel(cfg) -> int:
    import torch
    import transformers

    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(cfg)
    # DeepSeek-V3's score-correction bias is a persistent buffer in transformers, a tensor in the checkpoint
    return sum(p.numel() for p in m.parameters()) + sum(b.numel() for n, b in m.named_buffers() if "e_score_correction_bias" in n)


@pytest.mark.parametrize("kind,kw", [
    ("MixtralConfig", dict(intermediate_size=96, num_local_experts=5, num_experts_per_tok=2)),
    ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=2, decoder_sparse_step=2)),
    ("Qwen3MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, head_dim=24, num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1])),
    ("OlmoeConfig", dict(intermediate_size=32, num_experts=6, num_experts_per_tok=2)),
    ("DeepseekV3Config", dict(intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1)),
    ("DeepseekV2Config", dict(intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1)),
    ("Olmo2Config", dict(intermediate_size=96)),
    ("Qwen2Config", dict(intermediate_size=96, vocab_size=1001, tie_word_embeddings=True)),
    ("Qwen3Config", dict(intermediate_size=96, head_dim=32)),
    ("LlamaConfig", dict(intermediate_size=96, attention_bias=True, mlp_bias=True)),
    ("MistralConfig", dict(intermediate_size=96, head_dim=32)),
])
def test_counts_match_transformers_modules(kind, kw):
    """compute §B1: "Apply the formula to config.json, then sum numel() over the checkpoint."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    base = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
    cfg = getattr(transformers, kind)(**{**base, **kw})
    assert arch_from_hf(cfg.to_dict()).n_params == _hf_numel(cfg)


def test_gpt2_matches_transformers():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    assert arch_from_hf(cfg.to_dict()).n_params == _hf_numel(cfg)


# -- FLOPs (compute §C2-C4, §C10) -------------------------------------------------------------


def gflops(arch, s, **kw):
    return plan(arch, seq_len=s, tokens=1e9, **kw)["flops"]["per_token"]


def test_llama3_8b_flops_per_token(l8):
    pt = gflops(l8, 8192)
    assert round(pt["training"] / 1e9, 2) == 51.47
    assert round(pt["attention_flops"] / 1e9, 2) == 6.44  # 12·32·32·128·4,096.5
    assert round(pt["6N"] / 1e9, 2) == 48.18 and round(pt["6N_matmul"] / 1e9, 2) == 45.03
    assert round(pt["attention_share"], 3) == 0.125
    assert round(1 - pt["6N_matmul"] / pt["full"], 3) == 0.222
    p128 = gflops(l8, 131_072)
    assert round(p128["training"] / 1e9, 1) == 148.1 and round(p128["training"] / pt["training"], 2) == 2.88
    assert round(p128["attention_share"], 3) == 0.696 and round(1 - p128["6N_matmul"] / p128["full"], 3) == 0.821
    # Table 1.3 rows: query projection 2·8,192·4,096·4,096 on 8,192 tokens (C1)
    assert f"{2 * 8192 * 4096 * 4096:.2e}" == "2.75e+11"


@pytest.mark.parametrize("which,n6,k8,k128,causal8,full8", [
    ("l70", 423.3, 449.2, 932.4, 0.072, 0.134),
    ("l405", 2435.1, 2524.0, 4046.0, 0.040, 0.077),
])
def test_table_1_4(which, n6, k8, k128, causal8, full8, request):
    arch = request.getfixturevalue(which)
    pt, p128 = gflops(arch, 8192), gflops(arch, 131_072)
    assert round(pt["6N"] / 1e9, 1) == n6
    assert round(pt["training"] / 1e9, 1) == k8 and round(p128["training"] / 1e9, 1) == k128
    assert round(pt["attention_share"], 3) == causal8 and round(1 - pt["6N_matmul"] / pt["full"], 3) == full8


def test_attention_crossover(l8, l70, l405):
    """compute §B3: causal attention equals all other FLOPs at about 57K, 106K, 196K tokens."""
    got = [round(gflops(a, 8192)["attention_crossover_seq_len"] / 1000) for a in (l8, l70, l405)]
    assert got == [57, 106, 196]


def test_405b_attention_overheads(l405):
    """compute §C4: 405B at 8K costs 1.036x 6N per token with causal attention, 1.078x full."""
    pt = gflops(l405, 8192)
    assert round(pt["causal"] / pt["6N"], 3) == 1.036 and round(pt["full"] / pt["6N"], 3) == 1.078


def test_decode_flops_table_1_9(l8, l70, l405):
    for arch, w, a8, a128 in ((l8, 15.0, 4.3, 68.7), (l70, 139.0, 21.5, 343.6), (l405, 807.5, 67.6, 1082.3)):
        i8 = plan(arch, seq_len=8192, tokens=1e9)["inference"]
        i128 = plan(arch, seq_len=131_072, tokens=1e9)["inference"]
        assert round(i8["decode_weight_flops"] / 1e9, 1) == w
        assert round(i8["decode_attention_flops"] / 1e9, 1) == a8
        assert round(i128["decode_attention_flops"] / 1e9, 1) == a128


def test_6nd_table_1_5():
    assert f"{ar.training_flops(6 * 175e9, 300e9):.3g}" == "3.15e+23"
    assert f"{ar.training_flops(6 * 70e9, 1.4e12):.3g}" == "5.88e+23"
    assert f"{ar.training_flops(6 * 405e9, 15.6e12):.3g}" == "3.79e+25"  # spec prints 3.80e25 from N = 405.85B
    assert f"{6 * 405.853e9 * 15.6e12:.3g}" == "3.8e+25"


# -- time, cost, utilization (compute §C5, §C6, §C14) ----------------------------------------


def test_time_llama3_405b(l405):
    r = plan(l405, flops=3.8e25, gpus=16_384, gpu="h100", mfu=0.41, seq_len=8192)
    t = r["time"]
    assert f"{t['seconds']:.3g}" == "5.72e+06" and round(t["days"]) == 66
    assert round(t["gpu_hours"] / 1e6, 1) == 26.0
    # with causal attention counting on 15.6T tokens (the calculator default) -> 69 days
    r2 = plan(l405, tokens=15.6e12, gpus=16_384, mfu=0.41, seq_len=8192)
    assert round(r2["time"]["days"]) == 69
    # cost at $2/GPU-hour on the card's 30.84M hours (C14)
    assert round(ar.cost(30.84e6, 2) / 1e6, 1) == 61.7


def test_time_llama3_8b_and_megatron_gpt3(l8):
    r = plan(l8, tokens=15e12, gpus=1024, mfu=0.4, attention="none", count_input_embedding=True)
    assert f"{r['flops']['training']:.3g}" == "7.23e+23"
    assert round(r["time"]["days"], 1) == 20.6 and round(r["time"]["gpu_hours"] / 1e3) == 507
    assert round(ar.training_seconds(8 * 300e9 * 175e9, 1024, 140e12, 1.0) / 86400, 1) == 33.9


def test_gpt2_small_nanogpt_count():
    """compute §C5: GPT-2 124M on 10B tokens = 8.55e18 FLOPs (nanoGPT: 6·(N - wpe) + full
    attention), 95 min on 8 A100 at 60% MFU."""
    r = plan(arch_from_hf(GPT2_SMALL), tokens=10e9, gpus=8, gpu="a100", mfu=0.6, seq_len=1024, attention="full")
    assert f"{r['flops']['training']:.3g}" == "8.55e+18"
    assert round(r["time"]["seconds"] / 60) == 95
    assert round(r["checkpoints"]["bytes"] / 1e9, 1) == 1.7  # ops §A2: GPT-2 1.7 GB


def test_reservation_step_and_throughput(l70, l405):
    assert f"{ar.reservation_flops(2048, 989.5e12, 0.4, 30 * 86400, 0.9):.3g}" == "1.89e+24"
    r = plan(l405, tokens=1e9, gpus=16_384, batch_tokens=16_777_216, seq_len=8192, attention="none", count_input_embedding=True,
             mfu=400e12 / 989.5e12)
    assert round(r["time"]["step_seconds"], 1) == 6.2
    # 70B shape at 8K, 40% MFU: 811 tokens/s/GPU PaLM-style (6N + 12·L·s·d), 935 with 6N only
    full = plan(l70, tokens=1e9, seq_len=8192, attention="full", count_input_embedding=True)
    none = plan(l70, tokens=1e9, seq_len=8192, attention="none", count_input_embedding=True)
    assert round(full["time"]["tokens_per_second_per_gpu"]) == 811
    assert round(none["time"]["tokens_per_second_per_gpu"]) == 935


def test_days_budget(l70):
    """ops §B 51: 2,048 H100 x 30 days at 40% MFU, ETTR 0.9 -> 1.89e24 FLOPs, 1,474,560 GPU-hours."""
    r = plan(l70, days=30, gpus=2048, mfu=0.4, ettr=0.9, seq_len=8192)
    assert f"{r['flops']['training']:.3g}" == "1.89e+24"
    assert round(r["time"]["gpu_hours"] / 0.9) == 1_474_560


def test_implied_utilization(l8, l70, l405):
    """compute §C6: 3.8e25 over 30.84M H100-hours -> 0.346; 0.358 counting causal attention at 8K;
    8B and 70B on 15T tokens from the card's hours (6N): 13.9% and 25.5%."""
    assert round(ar.implied_utilization(3.8e25, 30.84e6, 989.5e12), 3) == 0.346
    r = plan(l405, tokens=15.6e12, seq_len=8192, reported_gpu_hours=30.84e6)
    assert round(r["time"]["implied_utilization"], 3) == 0.358
    for arch, hours, u in ((l8, 1.46e6, 0.139), (l70, 7.0e6, 0.255)):
        r = plan(arch, tokens=15e12, attention="none", count_input_embedding=True, reported_gpu_hours=hours)
        assert round(r["time"]["implied_utilization"], 3) == u


# -- memory (compute §C7-C9, §C12) -------------------------------------------------------------


def test_model_states_table_1_7(l8, l70, l405):
    for arch, g2, g16, g20 in ((l8, 16.06, 128.5, 160.6), (l70, 141.1, 1128.9, 1411.1), (l405, 811.7, 6493.7, 8117.1)):
        n = arch.n_params
        assert round(2 * n / 1e9, 2 if g2 < 100 else 1) == g2
        assert round(sum(ar.model_state_bytes(n, ar.get_recipe("bf16-adamw"), 0, 1).values()) / 1e9, 1) == g16
        assert round(sum(ar.model_state_bytes(n, ar.get_recipe("bf16-adamw-fp32grad"), 0, 1).values()) / 1e9, 1) == g20


def test_zero_70b_on_64_gpus(l70):
    r = plan(l70, tokens=1e9, gpus=64, zero=1)
    z = r["memory"]["states_by_zero_stage"]
    assert [round(z[k] / 1e9, 1) for k in "0123"] == [1128.9, 295.4, 156.5, 17.6]
    assert round(r["memory"]["weights"] / 1e9 + r["memory"]["grads"] / 1e9, 1) == 282.2
    assert round(r["memory"]["optimizer"] / 1e9, 1) == 13.2
    # ZeRO paper case: 7.5B on 64 GPUs -> 120, 31.4, 16.6, 1.9 GB
    rec = ar.get_recipe("bf16-adamw")
    assert [round(sum(ar.model_state_bytes(7.5e9, rec, z_, 64).values()) / 1e9, 1) for z_ in range(4)] == [120.0, 31.4, 16.6, 1.9]


def test_activations_table_1_8(l8, l70, l405):
    r = plan(l8, tokens=1e9, seq_len=8192, micro_batch=1)
    per = r["memory"]["activation_bytes_per_token_layer"]
    assert per["none"] == 167_936 and round(per["none"] / 4096, 1) == 41.0
    got = {m: round(v * 8192 * 32 / GIB, 1) for m, v in per.items()}
    assert got == {"none": 41.0, "norms": 37.0, "swiglu": 27.0, "selective": 23.0, "block": 2.0}
    assert round(r["memory"]["activations"] / 1e9, 1) == 44.0
    for arch, gib in ((l70, 202.5), (l405, 602.4)):
        assert round(plan(arch, tokens=1e9, seq_len=8192)["memory"]["activations"] / GIB, 1) == gib
    # logits at 8K: 1.96 + 3.91 GiB; without FlashAttention add 128 GiB (C8)
    assert round(2 * 8192 * l8.vocab / GIB, 2) == 1.96 and round(4 * 8192 * l8.vocab / GIB, 2) == 3.91
    assert round(r["memory"]["logits"] / 1e9, 1) == 6.3
    assert round(r["memory"]["no_flash_attention_extra"] / GIB) == 128
    # GPT-3 (h 96, s 2,048, d 12,288) without FlashAttention: 2.67 GiB per layer per sequence
    assert round(ar.gpt_activation_bytes_per_token_layer(12_288, 96, 2048, flash=False) * 2048 / GIB, 2) == 2.67


def test_real_peak_llama3_8b_zero3(l8):
    """compute §C9: ZeRO-3 over 8 H100, one 8,192-token sequence per GPU -> 68.8 GB at step 2,
    58.7 at step 1; recompute norms + SwiGLU 49.4; full recompute ~27 (figure 26.9)."""
    base = dict(tokens=1e9, seq_len=8192, micro_batch=1, zero=3, gpus=8, gpu="h100")
    m = plan(l8, **base)["memory"]
    assert round(m["states"] / 1e9, 2) == 16.06 and round(m["zero3_gathered_layers"] / 1e9, 2) == 0.87
    assert round(m["peak"] / 1e9, 1) == 68.8 and round(m["step1"] / 1e9, 1) == 58.7
    assert not m["fits"]  # above the 64 GB line
    assert round(plan(l8, recompute="selective", **base)["memory"]["peak"] / 1e9, 1) == 49.4
    full = plan(l8, recompute="block", **base)["memory"]
    assert round(full["peak"] / 1e9, 1) == 26.9 and full["fits"]
    assert plan(l8, recompute="full", **base)["memory"]["peak"] == full["peak"]  # block's old name


def test_inference_weights_table_1_10(l405):
    inf = plan(l405, tokens=1e9)["inference"]
    assert round(inf["weights_bf16"] / 1e9, 1) == 811.7 and round(inf["weights_fp8"] / 1e9, 1) == 405.9


# -- KV cache (compute §C11, scaling §C13) ----------------------------------------------------


def test_kv_cache(l8, l70, l405):
    kv = lambda a, s=8192: plan(a, tokens=1e9, seq_len=s)["inference"]  # noqa: E731
    assert kv(l8)["kv_cache_bytes_per_token"] == 131_072
    assert kv(l8)["kv_cache_bytes_per_sequence"] == GIB
    assert kv(l8, 131_072)["kv_cache_bytes_per_sequence"] == 16 * GIB
    assert kv(l70)["kv_cache_bytes_per_token"] == 327_680 and kv(l70, 131_072)["kv_cache_bytes_per_sequence"] == 40 * GIB
    assert kv(l405)["kv_cache_bytes_per_token"] == 516_096 and round(kv(l405, 131_072)["kv_cache_bytes_per_sequence"] / GIB) == 63
    mha70 = arch_from_hf({**LLAMA3_70B, "num_key_value_heads": 64})
    mqa70 = arch_from_hf({**LLAMA3_70B, "num_key_value_heads": 1})
    assert kv(mha70)["kv_cache_bytes_per_token"] == 2_621_440 and kv(mqa70)["kv_cache_bytes_per_token"] == 40_960
    opt13 = from_model_config(ModelConfig(vocab_size=50_272, n_layers=40, d_model=5120, n_heads=40), "opt-13b-shape", "test")
    assert kv(opt13)["kv_cache_bytes_per_token"] == 819_200
    assert kv(arch_from_hf(DEEPSEEK_V3))["kv_cache_bytes_per_token"] == 70_272


# -- Chinchilla (scaling §A11, §C29-C31, §C35) --------------------------------------------------


@pytest.mark.parametrize("c,key,n,d", [
    (1e24, "besiroglu", 96, 1.74), (1e24, "original", 41, 4.04), (1e24, "unrounded", 52, 3.21),
    (1e25, "besiroglu", 312, 5.34), (3.8e25, "besiroglu", 619, 10.2), (1.04e24, "besiroglu", 98, 1.77),
])
def test_compute_optimal(c, key, n, d):
    n_opt, d_opt = ar.compute_optimal(c, ar.get_constants(key))
    assert round(n_opt / 1e9) == n
    assert round(d_opt / 1e12, 2 if d < 10 else 1) == d


def test_chinchilla_rules_and_gamma():
    assert round(ar.compute_optimal(1e24, ar.CHINCHILLA["besiroglu"])[0] / 1e9, 1) == 95.9
    n, d = ar.twenty_tokens_rule(1e24)
    assert round(n / 1e9) == 91 and round(d / 1e12, 2) == 1.83
    n, d = ar.twenty_tokens_rule(3.8e25)
    assert round(n / 1e9) == 563 and round(d / 1e12, 1) == 11.3
    assert round(ar.CHINCHILLA["besiroglu"].gamma, 3) == 0.178
    assert round(ar.CHINCHILLA["unrounded"].gamma, 3) == 0.155
    c = ar.CHINCHILLA["besiroglu"]
    assert ar.optimal_tokens_for_params(95.9e9, c) == pytest.approx(1.74e12, rel=0.01)


def overtraining_compute_factor(kappa: float, alpha: float) -> float:
    """C_needed/C_opt = cosh((α/2)·ln κ)^(2/α), κ = (D/N)/(D/N)_opt (scaling §A11 L3089-3093,
    compute §F L8883: α/2 = 0.15 gives 1.04x at κ 2, 1.5x at 10, 4.4x at 100)."""
    return math.cosh(alpha / 2 * math.log(kappa)) ** (2 / alpha)


def test_missizing_and_overtraining():
    c = ar.CHINCHILLA["besiroglu"]
    waste = [round(100 * (1 - ar.missizing_compute_fraction(rho, c))) for rho in (2, 4, 10, 0.5, 0.25)]
    assert waste == [16, 49, 82, 16, 48]
    # scaling §C35: α/2 = 0.15 -> 1.04 / 1.15 / 1.48 / 2.3 / 4.4 at κ 2 / 4 / 10 / 30 / 100
    got = [overtraining_compute_factor(k, 0.3) for k in (2, 4, 10, 30, 100)]
    assert [round(g, 2) for g in got[:3]] == [1.04, 1.15, 1.48] and [round(g, 1) for g in got[3:]] == [2.3, 4.4]


def test_plan_names_constants_and_penalty(l8):
    r = plan(l8, tokens=15e12)
    ch = r["chinchilla"]
    assert ch["constants"] == "besiroglu" and "Besiroglu" in ch["constants_name"]
    assert round(ch["tokens_per_param"]) == 1868  # "Llama 3 8B is ~1,870 tokens/param"
    assert ch["compute_waste"] > 0.5 and ch["loss_penalty"] > 0
    # at the optimum the plan wastes nothing
    assert ar.missizing_compute_fraction(1.0, ar.CHINCHILLA["original"]) == pytest.approx(1.0)
    r2 = plan(l8, tokens=1e12, constants="original")
    assert r2["chinchilla"]["constants"] == "original" and r2["chinchilla"]["E"] == 1.69


# -- checkpoints and failures (ops §A2, §B 13, 19-21, 51) -------------------------------------


def test_checkpoint_sizes(l8, l70, l405):
    sizes = [plan(a, tokens=1e9)["checkpoints"]["bytes"] for a in (l8, l70, l405)]
    assert [round(sizes[0] / 1e12, 2), round(sizes[1] / 1e12, 2), round(sizes[2] / 1e12, 2)] == [0.11, 0.99, 5.68]
    assert round(16 * l405.n_params / 1e12, 2) == 6.49
    # a 0.99 TB checkpoint written in 15 s needs 66 GB/s (ops §B 51)
    assert round(plan(l70, tokens=1e9, ckpt_write_s=15)["checkpoints"]["write_bandwidth_needed"] / 1e9) == 66


def test_young_interval_and_waste():
    tau = ar.young_interval(3.25, 10_800)
    assert round(tau) == 265 and round(100 * ar.checkpoint_waste(tau, 3.25, 10_800), 2) == 2.45
    assert round(1 - ar.checkpoint_waste(tau, 3.25, 10_800, 600), 3) == 0.920
    tau = ar.young_interval(300, 11_124)
    assert round(tau, -1) == 2580 and round(ar.checkpoint_waste(tau, 300, 11_124), 2) == 0.23
    assert round(1 - ar.checkpoint_waste(tau, 300, 11_124, 600), 2) == 0.71


def test_mttf_and_kokolis_ettr():
    assert round(ar.mttf_seconds(2048, 6.5) / 3600, 2) == 1.80
    assert round(ar.mttf_seconds(1, 3.79) / 86400) == 264
    assert round(ar.mttf_seconds(256, 3.79) / 3600, 1) == 24.7
    assert round(ar.mttf_seconds(2048, 3.79) / 3600, 2) == 3.09
    for write, rate, ettr in ((300, 6.5, 0.740), (10, 6.5, 0.921), (300, 1.0, 0.898)):
        m = ar.mttf_seconds(1500, rate)
        tau = ar.young_interval(write, m)
        assert round(ar.expected_ettr(tau, write, m, 300), 3) == ettr


def test_plan_checkpoint_section(l70):
    """ops §B 51: 2,048 H100 (256 nodes at 3.79) -> MTTF 24.7 h; 5-min writes -> τ* 122 min,
    waste 8.9%, ETTR 0.915; 15 s writes -> 27 min, 2.5%."""
    r = plan(l70, days=30, gpus=2048, ckpt_write_s=300, restart_s=600, seq_len=8192)
    ck = r["checkpoints"]
    assert round(ck["mttf_hours"], 1) == 24.7
    assert round(ck["young_interval_seconds"] / 60) == 122 and round(ck["waste"], 3) == 0.089 and round(ck["ettr"], 3) == 0.915
    assert r["time"]["ettr"] == ck["ettr"]  # --days without --ettr uses the estimate
    ck = plan(l70, tokens=1e9, gpus=2048, ckpt_write_s=15, restart_s=600)["checkpoints"]
    assert round(ck["young_interval_seconds"] / 60) == 27 and round(ck["waste"], 3) == 0.025
    assert plan(l70, tokens=1e9, mttf_hours=3)["checkpoints"]["mttf_source"] == "--mttf"


# -- hardware (compute §D) ---------------------------------------------------------------------


def test_hardware_table_and_ridges():
    t = load_table()
    ridge = {k: round(lookup(k, t).ridge) for k in ("a100", "h100", "h200", "b200", "mi300x")}
    assert ridge == {"a100": 153, "h100": 295, "h200": 206, "b200": 281, "mi300x": 247}
    assert lookup("H100-SXM", t).key == "h100"
    for k in ("l4", "t4", "tpu-v5p", "gaudi3"):
        assert k in t
    assert round(t["tpu-v5p"].memory_bytes / 1e9) == 102  # 95 GiB
    with pytest.raises(UsageError, match="unknown accelerator"):
        lookup("h1000", t)


def test_hardware_file(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text('[my-npu]\nname = "My NPU"\nbf16_tflops = 500\nmemory_gb = 64\nbandwidth_tbs = 2.0\n\n'
                 '[h100]\nname = "H100 at a lower clock"\nbf16_tflops = 800\nmemory_gb = 80\nbandwidth_tbs = 3.35\n')
    t = load_table(f)
    assert t["my-npu"].bf16_flops == 500e12 and t["h100"].bf16_flops == 800e12 and "b200" in t
    bad = tmp_path / "bad.toml"
    bad.write_text('[x]\nbf16_sparse_tflops = 2000\nmemory_gb = 80\nbandwidth_tbs = 3\n')
    with pytest.raises(UsageError, match="dense peaks"):
        read_table(bad)
    bad.write_text('[x]\nbf16_tflops = -1\nmemory_gb = 80\nbandwidth_tbs = 3\n')
    with pytest.raises(UsageError, match="positive"):
        read_table(bad)


# -- configs that cannot exist, bad budgets ----------------------------------------------------


@pytest.mark.parametrize("hf,msg", [
    ({**LLAMA3_8B, "num_attention_heads": 30, "hidden_size": 4000}, "must divide hidden_size"),
    ({**LLAMA3_8B, "num_key_value_heads": 7}, "must divide num_attention_heads"),
    ({**LLAMA3_8B, "hidden_size": 0}, "positive"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "intermediate_size"}, "intermediate_size"),
    ({**MIXTRAL_8X7B, "num_experts_per_tok": 9}, "exceeds"),
    ({**LLAMA3_8B, "model_type": "jamba", "num_experts": 16}, "not supported"),
])
def test_impossible_hf_configs(hf, msg):
    with pytest.raises(UsageError, match=msg):
        arch_from_hf(hf)


def test_bad_budgets(l8):
    with pytest.raises(UsageError, match="one budget"):
        plan(l8, tokens=1e9, flops=1e20)
    for kw in (dict(mfu=1.5), dict(mfu=0), dict(gpus=0), dict(tokens=-1), dict(recipe="lion"), dict(zero=4),
               dict(recompute="half"), dict(attention="sparse"), dict(constants="kaplan"), dict(gpu="h1000")):
        with pytest.raises(UsageError):
            plan(l8, **{"tokens": 1e9, **kw})


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_json_fineweb():
    p = llmctl("plan", "--model", "fineweb-0.5b", "--tokens", "10e9", "--gpus", "8", "--gpu", "h100", "--json", check=True)
    r = json.loads(p.stdout)
    assert r["params"]["total"] == 489_288_960
    assert r["flops"]["tokens"] == 10e9 and r["time"]["gpus"] == 8 and r["hardware"]["key"] == "h100"
    assert r["chinchilla"]["constants"] == "besiroglu"
    assert r["memory"]["recipe"] == "bf16-adamw" and r["time"]["steps"] == pytest.approx(10e9 / 524_288)
    assert math.isclose(r["time"]["gpu_hours"], r["flops"]["training"] / (989.5e12 * 0.4 * 3600))


def test_cli_text_report_names_constants():
    p = llmctl("plan", "--model", "stages/train/tiny.toml", "--tokens", "1e8", "--chinchilla-constants", "original", check=True)
    out = p.stdout.decode()
    for s in ("parameters", "memory per GPU", "Chinchilla", "original constants", "Hoffmann", "Young", "KV cache"):
        assert s in out, s
    assert p.stderr == b""


def test_cli_hf_config_moe_and_hardware_file(tmp_path):
    cfg = tmp_path / "deepseek-v3" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(DEEPSEEK_V3))
    hw = tmp_path / "hw.toml"
    hw.write_text('[h800x]\nname = "H800 test"\nbf16_tflops = 989.5\nmemory_gb = 80\nbandwidth_tbs = 3.35\n')
    r = json.loads(llmctl("plan", "--hf-config", cfg, "--tokens", "14.8e12", "--gpus", "2048", "--gpu", "h800x",
                          "--hardware-file", hw, "--seq-len", "4096", "--json", check=True).stdout)
    assert r["model"]["name"] == "deepseek-v3" and r["params"]["active"] == 37_552_297_472
    assert r["hardware"]["name"] == "H800 test"
    listing = json.loads(llmctl("plan", "--list-gpus", "--json", check=True).stdout)
    assert listing["h100"]["bf16_flops"] == 989.5e12


def test_cli_bad_config_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nvocab_size = 1000\nn_layers = 2\nd_model = 100\nn_heads = 7\n")
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({**LLAMA3_8B, "num_attention_heads": 30, "hidden_size": 4000}))
    cases = [
        ["plan", "--model", bad],
        ["plan", "--hf-config", hf],
        ["plan", "--model", "no-such-preset"],
        ["plan"],
        ["plan", "--model", "tiny", "--tokens", "1e9", "--flops", "1e20"],
        ["plan", "--model", "tiny", "--gpu", "h1000"],
        ["plan", "--model", "tiny", "--zero", "5"],
        ["plan", "--hf-config", tmp_path / "missing.json"],
    ]
    for args in cases:
        p = llmctl(*args)
        err = p.stderr.decode()
        assert p.returncode == 2, (args, err)
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1 and err.startswith("llmctl: error: "), err
    assert "n_heads (7) must divide d_model (100)" in llmctl("plan", "--model", bad).stderr.decode()

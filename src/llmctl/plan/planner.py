"""`plan()`: the arithmetic of one run, from a model and a budget, as a plain dict (and its rendering).

The sections follow the spec's checklist before launch (001-systems-ops §A7 and
001-compute-appendix §E): parameters, FLOPs, time and cost, memory per GPU, inference, Chinchilla
sizing, checkpoints. Every number is computed by a function of `arithmetic`; assumed values are
labelled "illustrative" in `assumptions`.
"""

from __future__ import annotations

import math
from typing import Any

from llmctl.errors import UsageError
from llmctl.model.flops import training_flops_per_token
from llmctl.plan import arithmetic as ar
from llmctl.torchrt.hardware import Hardware, load_table, lookup
from llmctl.plan.arch import Arch

DEFAULT_PRICE = 2.0  # $/GPU-hour, DeepSeek's assumption (compute §D: illustrative)
DEFAULT_FAILURE_RATE = 3.79  # failures per 1,000 node-days, Llama 3 (ops §B 13)
DEFAULT_WRITE_S = 30.0  # checkpoint stall δ (illustrative)
DEFAULT_RESTART_S = 600.0  # restart R: the spec's 10-minute example (ops §B 19, illustrative)


def _positive(name: str, v: float | None, allow_zero: bool = False) -> None:
    if v is None:
        return
    if not isinstance(v, (int, float)) or math.isnan(v) or math.isinf(v) or v < 0 or (v == 0 and not allow_zero):
        raise UsageError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {v}")


def plan(
    arch: Arch,
    *,
    train: dict[str, Any] | None = None,
    tokens: float | None = None,
    flops: float | None = None,
    days: float | None = None,
    gpus: int = 1,
    gpu: str | Hardware = "h100",
    hardware_file: str | None = None,
    mfu: float = 0.4,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    batch_tokens: int | None = None,
    recipe: str = "bf16-adamw",
    zero: int = 0,
    price: float = DEFAULT_PRICE,
    mttf_hours: float | None = None,
    failure_rate: float = DEFAULT_FAILURE_RATE,
    gpus_per_node: int = 8,
    ckpt_write_s: float = DEFAULT_WRITE_S,
    restart_s: float = DEFAULT_RESTART_S,
    ettr: float | None = None,
    constants: str = "besiroglu",
    attention: str = "causal",
    count_input_embedding: bool = False,
    recompute: str = "none",
    fused_loss: bool = False,
    reported_gpu_hours: float | None = None,
) -> dict[str, Any]:
    """The plan of training `arch` on `tokens` (or `flops`, or `gpus` for `days`), as a dict.

    Token budget, in order: `tokens`; D = flops / C_token; D from what `gpus` deliver in `days`
    (C = p·F·MFU·T·ETTR, ops §A7 step 1); the preset's [train] max_tokens; the compute-optimal D
    for the model's N under `constants` (scaling §A11)."""
    train = train or {}
    given = [k for k, v in (("--tokens", tokens), ("--flops", flops), ("--days", days)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"give one budget, not {' and '.join(given)}")
    for name, v in (("--tokens", tokens), ("--flops", flops), ("--days", days), ("--mfu", mfu),
                    ("--mttf", mttf_hours), ("--failure-rate", failure_rate), ("--ckpt-write-s", ckpt_write_s),
                    ("--gpu-hours", reported_gpu_hours), ("--ettr", ettr)):
        _positive(name, v)
    _positive("--price", price, allow_zero=True)
    _positive("--restart-s", restart_s, allow_zero=True)
    if mfu > 1:
        raise UsageError(f"--mfu is a fraction of peak (0-1], got {mfu}")
    if ettr is not None and ettr > 1:
        raise UsageError(f"--ettr is a fraction (0-1], got {ettr}")
    if gpus < 1 or gpus_per_node < 1:
        raise UsageError(f"--gpus and --gpus-per-node must be at least 1, got {gpus}, {gpus_per_node}")
    hw = gpu if isinstance(gpu, Hardware) else lookup(gpu, load_table(hardware_file))
    rec = ar.get_recipe(recipe)
    recompute = ar.recompute_mode(recompute)
    cst = ar.get_constants(constants)
    s = int(seq_len or train.get("seq_len") or arch.max_seq_len)
    b = int(micro_batch or train.get("micro_batch") or 1)
    B = batch_tokens or train.get("batch_tokens")
    for name, v in (("--seq-len", s), ("--micro-batch", b), ("--batch-tokens", B)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise UsageError(f"{name} must be a positive integer, got {v}")
    notes = list(arch.notes)
    if s > arch.max_seq_len:
        notes.append(f"sequence length {s:,} exceeds the model's max_seq_len {arch.max_seq_len:,}")
    L, d, N = arch.n_layers, arch.d_model, arch.n_params
    F = hw.bf16_flops

    # -- parameters (compute §B1, §B1b) --------------------------------------------------------
    params: dict[str, Any] = {
        "total": N, "active": arch.n_active, "embedding": arch.embedding, "head": arch.head,
        "position_embedding": arch.position_embedding, "final_norm": arch.final_norm,
        "non_embedding": arch.non_embedding, "matmul": arch.n_matmul,
        "vocab_share": (arch.embedding + arch.head) / N,
        "blocks": [{"kind": bl.kind, "count": bl.count, "params": bl.params, "active": bl.active} for bl in arch.blocks],
    }
    if arch.family == "llama":
        hd = arch.d_qk
        attn_qo, attn_kv = 2 * d * arch.n_heads * hd, 2 * d * arch.n_kv_heads * hd
        mlp = 3 * d * int(arch.d_ff)
        block = arch.blocks[0].params
        params["block_breakdown"] = {"q_o": attn_qo, "k_v": attn_kv, "mlp": mlp, "norms_and_other": block - attn_qo - attn_kv - mlp,
                                     "mlp_share": mlp / block}
    kaplan = 12 * L * d * d  # Kaplan's N ≈ 12·L·d² (compute §B1)
    params["kaplan_12Ld2"] = kaplan

    # -- FLOPs (compute §B3, §B4) --------------------------------------------------------------
    input_tables = (0 if arch.tied else arch.embedding) + arch.position_embedding
    n_mm = arch.n_matmul + (input_tables if count_input_embedding else 0)
    fpt = training_flops_per_token(n_mm, L, arch.attn_dim, s, attention)
    attn = fpt - 6 * n_mm
    per_token = {
        "convention": f"6·N_matmul{' + input tables' if count_input_embedding else ''}"
                      + {"causal": " + causal attention ((s+1)/2)", "full": " + full attention (s)", "none": " (attention not counted)"}[attention],
        "attention": attention, "count_input_embedding": count_input_embedding, "seq_len": s,
        "training": fpt, "attention_flops": attn, "attention_share": attn / fpt,
        "6N": 6 * arch.n_active, "6N_matmul": 6 * arch.n_matmul,
        "causal": training_flops_per_token(arch.n_matmul, L, arch.attn_dim, s, "causal"),
        "full": training_flops_per_token(arch.n_matmul, L, arch.attn_dim, s, "full"),
        "attention_crossover_seq_len": ar.attention_crossover_seq_len(arch.n_matmul, L, arch.attn_dim),
    }

    # -- checkpoints and failures (ops §A2), needed for --days --------------------------------
    if mttf_hours is not None:
        M = mttf_hours * 3600
        mttf_source = "--mttf"
    else:
        nodes = math.ceil(gpus / gpus_per_node)
        M = ar.mttf_seconds(nodes, failure_rate)
        mttf_source = f"{failure_rate:g} failures per 1,000 node-days over {nodes:,} node(s) of {gpus_per_node} GPUs"
    tau = ar.young_interval(ckpt_write_s, M)
    ettr_est = max(0.0, ar.expected_ettr(tau, ckpt_write_s, M, restart_s))
    run_ettr = ettr if ettr is not None else ettr_est

    # -- budget ---------------------------------------------------------------------------------
    n_chin = arch.n_active  # Chinchilla counts all (activated) parameters, head and embeddings in (scaling §A11)
    if tokens is not None:
        D, budget = float(tokens), "--tokens"
    elif flops is not None:
        D, budget = flops / fpt, "--flops (D = C / C_token)"
    elif days is not None:
        C_res = ar.reservation_flops(gpus, F, mfu, days * ar.SECONDS_PER_DAY, run_ettr)
        D, budget = C_res / fpt, f"{gpus:,} x {hw.key} for {days:g} days at MFU {mfu:g}, ETTR {run_ettr:.3f}"
    elif train.get("max_tokens"):
        D, budget = float(train["max_tokens"]), "[train] max_tokens of the preset"
    else:
        D, budget = ar.optimal_tokens_for_params(n_chin, cst), f"compute-optimal for N ({cst.key} constants)"
    C = float(flops) if flops is not None else ar.training_flops(fpt, D)
    flops_out = {"per_token": per_token, "tokens": D, "budget": budget, "training": C,
                 "training_6ND": 6 * arch.n_active * D, "pf_days": C / ar.PF_DAY}

    # -- time and cost (compute §B5, §B8, §B17) -------------------------------------------------
    secs = ar.training_seconds(C, gpus, F, mfu)
    gh = ar.gpu_hours(C, F, mfu)
    tps = ar.tokens_per_second(gpus, F, mfu, fpt)
    time_out: dict[str, Any] = {
        "gpus": gpus, "gpu": hw.key, "peak_flops": F, "mfu": mfu, "achieved_flops_per_gpu": F * mfu,
        "seconds": secs, "days": secs / ar.SECONDS_PER_DAY, "gpu_hours": gh,
        "price_per_gpu_hour": price, "cost": ar.cost(gh, price),
        "tokens_per_second": tps, "tokens_per_second_per_gpu": tps / gpus,
        "ettr": run_ettr, "wall_days_with_failures": secs / run_ettr / ar.SECONDS_PER_DAY if run_ettr > 0 else math.inf,
    }
    if hw.power_w:
        time_out["energy_kwh_at_tdp"] = ar.energy_joules(gh, hw.power_w) / 3.6e6
    if B:
        time_out["batch_tokens"] = B
        time_out["steps"] = D / B
        time_out["step_seconds"] = ar.step_seconds(fpt, B, gpus, F * mfu)
        per_fwd = gpus * b * s
        time_out["grad_accumulation"] = B / per_fwd
        if B % per_fwd:
            notes.append(f"batch {B:,} tokens is not a multiple of gpus x micro-batch x seq_len = {per_fwd:,}")
    if reported_gpu_hours:
        time_out["reported_gpu_hours"] = reported_gpu_hours
        time_out["implied_utilization"] = ar.implied_utilization(C, reported_gpu_hours, F)

    # -- memory per GPU (compute §B9-B13), data parallel over all GPUs -------------------------
    states = ar.model_state_bytes(N, rec, zero, gpus)
    zero_table = {str(z): sum(ar.model_state_bytes(N, rec, z, gpus).values()) for z in range(4)}
    e = ar.activation_bytes_per_element(rec)
    if arch.family == "gpt2":
        act_modes = {"none": e / 2 * ar.gpt_activation_bytes_per_token_layer(d, arch.n_heads, s), "block": e * d}
        if recompute not in act_modes:
            raise UsageError(f"--recompute {recompute} does not apply to GPT-2 blocks (none or block)")
    else:
        act_modes = {m: e * ar.activation_elements_per_token_layer(d, arch.attn_dim, arch.kv_attn_width, arch.d_ff, m)
                     for m in ar.RECOMPUTE_MODES}
    act = act_modes[recompute] * s * b * L
    core_recomputed = recompute in ("selective", "block")
    logits = 0.0 if fused_loss else ar.logits_bytes(s, b, arch.vocab)
    biggest_block = max(bl.params for bl in arch.blocks)
    window = ar.ZERO3_WINDOW_LAYERS * biggest_block * 2 if zero == 3 else 0.0
    peak = sum(states.values()) + act + logits + window + ar.CUDA_CONTEXT_BYTES
    moments = states["optimizer"] * (rec.optimizer - rec.master) / rec.optimizer if rec.optimizer else 0.0
    memory = {
        "recipe": rec.name, "recipe_note": rec.note, "bytes_per_param": rec.bytes_per_param,
        "zero": zero, "data_parallel": gpus, "micro_batch": b, "seq_len": s, "recompute": recompute,
        "activation_bytes_per_element": e,
        "fused_loss": fused_loss, **states, "states": sum(states.values()), "states_by_zero_stage": zero_table,
        "activation_bytes_per_token_layer": act_modes, "activations": act, "logits": logits,
        "zero3_gathered_layers": window, "cuda_context": ar.CUDA_CONTEXT_BYTES, "peak": peak,
        "step1": peak - moments - states["grads"],
        # the T×T probabilities an explicit (non-flash) attention keeps, unless the core is recomputed
        "no_flash_attention_extra": 0.0 if core_recomputed else ar.no_flash_extra_bytes_per_layer(arch.n_heads, s, b, e) * L,
        "hbm": hw.memory_bytes, "hbm_fraction": peak / hw.memory_bytes,
        "fits": peak <= ar.HBM_SAFE_FRACTION * hw.memory_bytes,
    }

    # -- inference (compute §B14, §B15) ---------------------------------------------------------
    kv = ar.kv_cache_bytes_per_token(L, arch.kv_elements_per_layer, 2)
    w_fl, a_fl = ar.decode_flops_per_token(arch.n_matmul, L, arch.attn_dim, s)
    inference = {
        "kv_cache_bytes_per_token": kv, "kv_cache_bytes_per_sequence": kv * s,
        "kv_cache_bytes_per_token_fp8": ar.kv_cache_bytes_per_token(L, arch.kv_elements_per_layer, 1),
        "weights_bf16": 2 * N, "weights_fp8": N,
        "decode_flops_per_token": w_fl + a_fl, "decode_weight_flops": w_fl, "decode_attention_flops": a_fl,
    }

    # -- Chinchilla (scaling §A11) -------------------------------------------------------------
    C6 = 6 * n_chin * D
    n_opt, d_opt = ar.compute_optimal(C6, cst)
    rho = n_chin / n_opt
    frac = ar.missizing_compute_fraction(rho, cst)
    n20, d20 = ar.twenty_tokens_rule(C6)
    chin = {
        "constants": cst.key, "constants_name": cst.name,
        "E": cst.E, "A": cst.A, "B": cst.B, "alpha": cst.alpha, "beta": cst.beta,
        "params_counted": n_chin, "budget_6ND": C6, "n_opt": n_opt, "d_opt": d_opt,
        "tokens_per_param_opt": d_opt / n_opt, "tokens_per_param": D / n_chin, "size_ratio": rho,
        "kappa": (D / n_chin) / (d_opt / n_opt),
        "compute_needed_fraction": frac, "compute_waste": 1 - frac,
        "loss": cst.loss(n_chin, D), "loss_opt": cst.loss(n_opt, d_opt), "loss_penalty": cst.loss(n_chin, D) - cst.loss(n_opt, d_opt),
        "rule_20_n": n20, "rule_20_d": d20,
    }
    if arch.family == "moe":
        notes.append("Chinchilla laws were fitted on dense models; N here is the activated count")
        notes.append("memory assumes every GPU holds all experts (no expert parallelism)")

    # -- checkpoints (ops §A2) -----------------------------------------------------------------
    ck_bpp = rec.weights + rec.optimizer
    ckpt: dict[str, Any] = {
        "bytes": ck_bpp * N, "bytes_per_param": ck_bpp, "mttf_seconds": M, "mttf_hours": M / 3600, "mttf_source": mttf_source,
        "write_seconds": ckpt_write_s, "restart_seconds": restart_s, "young_interval_seconds": tau,
        "waste": ar.checkpoint_waste(tau, ckpt_write_s, M, restart_s), "ettr": ettr_est,
        "expected_failures": secs / run_ettr / M if run_ettr > 0 else math.inf,
        "write_bandwidth_needed": ck_bpp * N / ckpt_write_s,
    }
    if time_out.get("step_seconds"):
        ckpt["interval_steps"] = max(1, round(tau / time_out["step_seconds"]))
    if tau > secs / run_ettr if run_ettr > 0 else False:
        notes.append("Young's interval is longer than the run: checkpoint for resumption and evaluation, not for failures")
    if ckpt_write_s > tau:
        notes.append("checkpoint writes take longer than the optimal interval: the run cannot make progress")

    assumptions = {
        "price_per_gpu_hour": "illustrative (--price)" if price == DEFAULT_PRICE else "--price",
        "cuda_context": "illustrative 1.5 GB (compute §B13)",
        "zero3_window": f"{ar.ZERO3_WINDOW_LAYERS} layers gathered (illustrative, compute §B13)",
        "checkpoint_write_seconds": "illustrative (--ckpt-write-s)" if ckpt_write_s == DEFAULT_WRITE_S else "--ckpt-write-s",
        "restart_seconds": "illustrative (--restart-s)" if restart_s == DEFAULT_RESTART_S else "--restart-s",
        "mfu": "dense BF16 peak; " + per_token["convention"],
        "memory_layout": f"data parallel over all {gpus} GPU(s) (no tensor/pipeline parallelism)",
    }
    return {
        "model": arch.summary(), "hardware": hw.summary(), "params": params, "flops": flops_out,
        "time": time_out, "memory": memory, "inference": inference, "chinchilla": chin,
        "checkpoints": ckpt, "assumptions": assumptions, "notes": notes,
    }

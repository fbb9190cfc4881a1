"""`llmctl plan`'s tables: the plan (plan/planner.py's dict) and the hardware table, for a person."""

from __future__ import annotations

import math
from typing import Any

from llmctl.cli.console import table
from llmctl.torchrt.hardware import Hardware


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _si(x: float, unit: str = "") -> str:
    for div, p in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:,.2f}{p}{unit}"
    return f"{x:,.0f}{unit}"


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.1f} MB"


def _dur(sec: float) -> str:
    if math.isinf(sec):
        return "never"
    if sec >= 2 * 86400:
        return f"{sec / 86400:,.1f} days"
    if sec >= 2 * 3600:
        return f"{sec / 3600:,.1f} h"
    if sec >= 120:
        return f"{sec / 60:,.1f} min"
    return f"{sec:,.2f} s"


def render(r: dict[str, Any]) -> list:
    """The plan as rich tables, for a person."""
    m, p, f, t, mem, inf, ch, ck, hw = (r[k] for k in ("model", "params", "flops", "time", "memory", "inference", "chinchilla", "checkpoints", "hardware"))
    shape = f"L {m['n_layers']}, d {m['d_model']:,}, heads {m['n_heads']}/{m['n_kv_heads']} ({m['attention']}), vocab {m['vocab']:,}, {'tied' if m['tied'] else 'untied'}"
    if m.get("d_ff"):
        shape += f", d_ff {m['d_ff']:,}"
    if m.get("moe"):
        mo = m["moe"]
        shape += f", MoE {mo['active']} of {mo['experts']} experts x {mo['expert_width']:,}" + (f" + shared {mo['shared_width']:,}" if mo["shared_width"] else "")
    rows = [("model", f"{m['name']} ({m['source']})"), ("shape", shape),
            ("parameters", f"{_n(p['total'])} ({_si(p['total'])})")]
    if p["active"] != p["total"]:
        rows.append(("activated per token", f"{_n(p['active'])} ({_si(p['active'])})"))
    rows += [("embedding (V·d)", _n(p["embedding"])), ("output head", _n(p["head"]) if p["head"] else "tied to the embedding")]
    if p["position_embedding"]:
        rows.append(("position embedding", _n(p["position_embedding"])))
    rows.append(("non-embedding", f"{_n(p['non_embedding'])} (Kaplan 12·L·d² = {_si(p['kaplan_12Ld2'])})"))
    for bl in p["blocks"]:
        act = f", {_n(bl['active'])} active" if bl["active"] != bl["params"] else ""
        rows.append((f"per {bl['kind']} block (x{bl['count']})", f"{_n(bl['params'])}{act}"))
    if "block_breakdown" in p:
        bb = p["block_breakdown"]
        rows.append(("  block: Q+O / K+V / MLP / norms", f"{_n(bb['q_o'])} / {_n(bb['k_v'])} / {_n(bb['mlp'])} / {_n(bb['norms_and_other'])} (MLP {bb['mlp_share']:.1%})"))
    rows += [("matmul params (N_matmul)", _n(p["matmul"])), ("vocabulary share", f"{p['vocab_share']:.1%}")]
    tables = [table("parameters", rows)]

    pt = f["per_token"]
    rows = [
        ("counting", pt["convention"]),
        (f"training FLOPs/token at {pt['seq_len']:,}", f"{pt['training'] / 1e9:,.4g} GFLOPs (attention {pt['attention_share']:.1%})"),
        ("  6N / 6·N_matmul / causal / full", " / ".join(f"{pt[k] / 1e9:,.4g}" for k in ("6N", "6N_matmul", "causal", "full")) + " GFLOPs"),
        ("  causal attention = the rest at", f"s ≈ {_n(pt['attention_crossover_seq_len'])}"),
        ("tokens (D)", f"{_si(f['tokens'])} ({f['budget']})"),
        ("training compute (C)", f"{f['training']:.3e} FLOPs ({f['pf_days']:,.1f} PF/s-days; 6ND = {f['training_6ND']:.3e})"),
    ]
    tables.append(table("compute", rows))

    rows = [
        ("hardware", f"{t['gpus']:,} x {hw['name']} ({hw['bf16_flops'] / 1e12:,.1f} TFLOP/s dense BF16, MFU {t['mfu']:.0%})"),
        ("time at steady state", f"{_dur(t['seconds'])} ({t['seconds']:.3g} s)"),
        ("GPU-hours", _n(t["gpu_hours"])),
        ("cost", f"${t['cost']:,.0f} at ${t['price_per_gpu_hour']:g}/GPU-hour"),
        ("throughput", f"{_si(t['tokens_per_second'])} tokens/s ({_n(t['tokens_per_second_per_gpu'])} per GPU)"),
    ]
    if "steps" in t:
        rows.append(("steps", f"{_n(t['steps'])} of {_n(t['batch_tokens'])} tokens, {_dur(t['step_seconds'])} each, grad accumulation {t['grad_accumulation']:g}"))
    rows.append(("with failures (ETTR)", f"{_dur(t['wall_days_with_failures'] * 86400)} (ETTR {t['ettr']:.3f})"))
    if "energy_kwh_at_tdp" in t:
        rows.append(("GPU energy at TDP", f"{t['energy_kwh_at_tdp']:,.0f} kWh (no PUE, no host)"))
    if "implied_utilization" in t:
        rows.append(("utilization implied by reported GPU-hours", f"{t['implied_utilization']:.1%} of {_n(t['reported_gpu_hours'])} h"))
    tables.append(table("time and cost", rows))

    z = mem["states_by_zero_stage"]
    rows = [
        ("recipe", f"{mem['recipe']}: {mem['bytes_per_param']:g} B/param ({mem['recipe_note']})"),
        (f"model states, ZeRO-{mem['zero']} over {mem['data_parallel']}", f"{_gb(mem['states'])} (weights {_gb(mem['weights'])}, grads {_gb(mem['grads'])}, optimizer {_gb(mem['optimizer'])})"),
        ("  by ZeRO stage 0 / 1 / 2 / 3", " / ".join(_gb(z[k]) for k in "0123")),
        ("activations / token / layer", ", ".join(f"{k} {v:,.0f} B" for k, v in mem["activation_bytes_per_token_layer"].items())),
        (f"activations ({mem['micro_batch']} x {mem['seq_len']:,} tokens, recompute {mem['recompute']})", _gb(mem["activations"])),
        ("logits" + (" (fused loss)" if mem["fused_loss"] else " (BF16 + FP32)"), _gb(mem["logits"])),
    ]
    if mem["zero"] == 3:
        rows.append(("ZeRO-3 gathered layers", _gb(mem["zero3_gathered_layers"])))
    rows += [
        ("CUDA context", _gb(mem["cuda_context"])),
        ("peak per GPU (step 2)", f"{_gb(mem['peak'])} = {mem['hbm_fraction']:.0%} of {_gb(mem['hbm'])} -> "
         + ("fits under 80%" if mem["fits"] else "does NOT fit under 80%")),
        ("  step 1 (no moments, no grads yet)", _gb(mem["step1"])),
        ("  without FlashAttention add", _gb(mem["no_flash_attention_extra"]) if mem["no_flash_attention_extra"]
         else "nothing (the attention core is recomputed)"),
    ]
    tables.append(table("memory per GPU", rows))

    rows = [
        ("KV cache per token", f"{_n(inf['kv_cache_bytes_per_token'])} B BF16 ({_n(inf['kv_cache_bytes_per_token_fp8'])} B FP8)"),
        (f"KV cache per {mem['seq_len']:,}-token sequence", _gb(inf["kv_cache_bytes_per_sequence"])),
        ("weights BF16 / FP8", f"{_gb(inf['weights_bf16'])} / {_gb(inf['weights_fp8'])}"),
        (f"decode FLOPs/token at {mem['seq_len']:,}", f"{inf['decode_flops_per_token'] / 1e9:,.4g} GFLOPs (weights {inf['decode_weight_flops'] / 1e9:,.4g}, attention {inf['decode_attention_flops'] / 1e9:,.4g})"),
    ]
    tables.append(table("inference", rows))

    rows = [
        ("constants", f"{ch['constants_name']}: E {ch['E']}, A {ch['A']}, B {ch['B']}, α {ch['alpha']}, β {ch['beta']}"),
        ("budget C = 6·N·D", f"{ch['budget_6ND']:.3e} FLOPs"),
        ("compute-optimal", f"N {_si(ch['n_opt'])}, D {_si(ch['d_opt'])} ({ch['tokens_per_param_opt']:.1f} tokens/param)"),
        ("20 tokens/param rule", f"N {_si(ch['rule_20_n'])}, D {_si(ch['rule_20_d'])}"),
        ("this plan", f"N {_si(ch['params_counted'])}, D {_si(f['tokens'])} ({ch['tokens_per_param']:.1f} tokens/param, N/N_opt {ch['size_ratio']:.3g})"),
        ("loss L(N, D) vs optimum", f"{ch['loss']:.4f} vs {ch['loss_opt']:.4f} nats (+{ch['loss_penalty']:.4f})"),
        ("mis-sizing", f"{ch['compute_waste']:.1%} of the compute wasted (an optimal model needs {ch['compute_needed_fraction']:.1%} of it)"),
    ]
    tables.append(table(f"Chinchilla sizing ({ch['constants']} constants)", rows))

    rows = [
        ("checkpoint size", f"{_gb(ck['bytes'])} ({ck['bytes_per_param']:g} B/param)"),
        ("MTTF", f"{_dur(ck['mttf_seconds'])} ({ck['mttf_source']})"),
        ("write stall δ / restart R", f"{_dur(ck['write_seconds'])} / {_dur(ck['restart_seconds'])} (write needs {_gb(ck['write_bandwidth_needed'])}/s)"),
        ("Young's interval √(2δM)", _dur(ck["young_interval_seconds"]) + (f" (every {_n(ck['interval_steps'])} steps)" if "interval_steps" in ck else "")),
        ("waste / ETTR", f"{ck['waste']:.1%} / {ck['ettr']:.3f}; expect {ck['expected_failures']:.1f} failures"),
    ]
    tables.append(table("checkpoints", rows))
    tables.append(table("assumptions", list(r["assumptions"].items())))
    if r["notes"]:
        tables.append(table("notes", [(f"{i + 1}", n) for i, n in enumerate(r["notes"])]))
    return tables


def hardware_rows(table_: dict[str, Hardware]) -> list[tuple]:
    return [(h.key, h.name, f"{h.bf16_flops / 1e12:,.1f}", f"{h.fp8_flops / 1e12:,.1f}" if h.fp8_flops else "-",
             f"{h.memory_bytes / 1e9:,.1f}", f"{h.bandwidth / 1e12:,.2f}", f"{h.ridge:,.0f}", f"{h.power_w:,.0f}" if h.power_w else "-",
             h.source) for h in table_.values()]


HARDWARE_HEADERS = ("key", "accelerator", "BF16 TFLOP/s", "FP8 TFLOP/s", "memory GB", "HBM TB/s", "ridge FLOP/B", "TDP W", "source")

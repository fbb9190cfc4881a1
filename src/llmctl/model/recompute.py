"""Activation recomputation: what a training step keeps of each block for the backward pass, and
what it computes again there instead (`train --recompute`, `rl --recompute`, `plan --recompute`).

    none       autograd keeps every tensor a block's backward reads.
    selective  each block keeps its input and the outputs of its matmuls — the Q/K/V and gate/up
               projections, the attention output, the output projection — and recomputes the cheap,
               memory-heavy rest in the backward pass: both RMSNorms and RoPE, SwiGLU's SiLU and
               product, and the attention core (scores and softmax) wherever it is materialized (the
               explicit CPU path; a flash kernel never stores it and recomputes it itself). That is
               Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
               Models" (§4: recompute the parts that take much memory and few FLOPs), together with
               the guide's "recompute both RMSNorms" and "fused SwiGLU" rows (spec
               001-compute-appendix §B11, Table 1.8 "both"): per token and layer it keeps
               2d + 2·h·d_h + 2·h_kv·d_h + 2·d_ff elements, which is what `plan --recompute selective`
               predicts. The extra work is elementwise, plus the attention scores on the explicit path.
    block      torch.utils.checkpoint around each block: only the block inputs are kept (d elements per
               token and layer), and the whole block runs forward again in the backward pass (about
               one more forward: 8N instead of 6N FLOPs a token, spec 001-compute-appendix §B7).

Selective is torch.utils.checkpoint with a policy (PyTorch's selective activation checkpointing)
that caches the matmul outputs during the forward and recomputes every other op: the cached
outputs are the ones whose recomputation would cost matmul FLOPs. The down projection's output is
not cached — it only feeds the residual sum, and the non-reentrant checkpoint stops recomputing
once the last tensor the backward needs is back, before that matmul.

Recomputation changes memory and time, never results: the same ops run on the same inputs, so the
loss and gradients equal those of `none` (tests/test_train_stability.py checks them in fp32). It
applies only where gradients are being recorded (a training forward), never under no_grad
(validation, generation, RL's reference log-probs) or with a KV cache.
"""

from __future__ import annotations

from functools import lru_cache, partial

RECOMPUTE_MODES = ("none", "selective", "block")  # plan/arithmetic.py shares the names (this module imports torch lazily)


def check_mode(mode: str, where: str = "--recompute") -> str:
    from llmctl.errors import UsageError

    if mode not in RECOMPUTE_MODES:
        raise UsageError(f"{where} must be one of {', '.join(RECOMPUTE_MODES)}, got {mode!r}")
    return mode


@lru_cache(maxsize=1)
def _ops():
    """(linear-layer ops, attention kernels that recompute the core in their own backward — their
    outputs, the attention output and the log-sum-exp, are O(T) a head), as aten overloads."""
    import torch

    aten = torch.ops.aten
    kernels = tuple(getattr(aten, name).default for name in (
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward", "_efficient_attention_forward") if hasattr(aten, name))
    return (aten.mm.default, aten.addmm.default), kernels, aten.bmm.default


def selective_policy(d_ff: int, d_model: int):
    """The policy of `selective`: cache linear-layer and attention-kernel outputs, and the attention
    output P·V of the explicit path (a bmm whose result is narrower than its reduction: T×d_h from
    T×T, where the scores q·kᵀ are T×T from T×d_h and are recomputed); recompute the rest. The
    down projection (d_ff → d_model) is left out, see the module docstring."""
    from torch.utils.checkpoint import CheckpointPolicy

    linear, kernels, bmm = _ops()
    mm = linear[0]

    def policy(ctx, op, *args, **kwargs):
        if op in linear:
            weight = args[1] if op is mm else args[2]  # F.linear's xWᵀ: the (in, out) operand
            if weight.shape[-2] == d_ff and weight.shape[-1] == d_model:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        if op in kernels:
            return CheckpointPolicy.MUST_SAVE
        if op is bmm and args[1].shape[-1] < args[0].shape[-1]:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def run_block(block, mode: str, x, cos, sin, mask, policy=None):
    """block(x, cos, sin, None, mask) under `mode`. Blocks hold no randomness (no dropout), so the
    RNG state is not saved and restored around the recomputation."""
    if mode == "none":
        return block(x, cos, sin, None, mask)
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context = _no_context if mode == "block" else partial(create_selective_checkpoint_contexts, policy)
    return checkpoint(block, x, cos, sin, None, mask, use_reentrant=False, preserve_rng_state=False,
                      context_fn=context)


def _no_context():
    from contextlib import nullcontext

    return nullcontext(), nullcontext()

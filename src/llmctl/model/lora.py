"""LoRA adapters on the decoder (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

Each targeted projection W gets y = x·Wᵀ (+ b) + (dropout(x)·Aᵀ·Bᵀ)·alpha/r with A (r × in) and
B (out × r) trainable and W frozen. A starts kaiming-uniform (a = √5, nn.Linear's own init, as
PEFT does), B at zero, so an adapted model computes exactly the base model until the first update.

Why hand-written and not PEFT's `LoraModel`: llmctl fuses Q/K/V into one `attn.qkv` Linear and
gate/up into one `mlp.gate_up` (model/transformer.py), and PEFT wraps whole nn.Linear modules, not
a slice of a fused one's output. Here a fused projection carries one (A, B) pair per targeted slice,
so the adapter of `q` maps 1:1 onto PEFT's `self_attn.q_proj` adapter of the exported model: the
same shapes, the same init, the same scaling alpha/r, and PEFT's file format on export
(`peft_state_dict`, `peft_config`: adapter_config.json + adapter_model.safetensors).

A training step (no dropout) runs each adapted projection as one matmul each way on W + (alpha/r)·B·A,
merged for the step and rebuilt in the backward (`_MergedLoRA`), with A's and B's gradients by hand;
inference, dropout and adapters-off run the unmerged form, the slices' A matrices of a fused
projection as one matmul (x·[A_q; A_k; A_v]ᵀ). Measured against PEFT on the `small` preset's
architecture: the same step time within 3% (benchmarks/RESULTS.md, lora): both are bound by the
frozen matmuls and the head, which the adapters do not change.

    LoraConfig                      rank, alpha, dropout, targets (q, k, v, o, gate, up, down)
    attach(model, cfg)              base frozen, adapters added in place (names stay the base's)
    adapters_off(model)             a context where the model computes the base (a DPO reference)
    adapter_state(model)            the adapter tensors (what a LoRA checkpoint stores)
    merge(model)                    W += (alpha/r)·B·A in place, adapters dropped: a plain model
    merged_tensors(cfg, base, ad)   the same on state dicts, for export --merge
    peft_state_dict / peft_config   the adapters under PEFT's names, its adapter_config.json
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.bounds import check_value
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# target -> (our module under a block, transformers' module under model.layers.N)
MODULES = {"q": ("attn.qkv", "self_attn.q_proj"), "k": ("attn.qkv", "self_attn.k_proj"),
           "v": ("attn.qkv", "self_attn.v_proj"), "o": ("attn.o", "self_attn.o_proj"),
           "gate": ("mlp.gate_up", "mlp.gate_proj"), "up": ("mlp.gate_up", "mlp.up_proj"),
           "down": ("mlp.down", "mlp.down_proj")}
LORA_FILE = "lora.json"  # in a LoRA checkpoint: this config and the base checkpoint's identity


@dataclass
class LoraConfig:
    """rank r, alpha (the update is scaled by alpha/r; None: alpha = r, scale 1, as PEFT's defaults
    r 8 / alpha 8), dropout on the adapter's input, the targeted projections by PEFT's short names,
    and `base_dtype`: float32, or bfloat16 to hold the frozen base in half the memory (the adapters
    and their AdamW state stay float32; train then runs under bf16 autocast)."""

    rank: int = 8
    alpha: float | None = None
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    base_dtype: str = "float32"

    def __post_init__(self):
        if isinstance(self.targets, str):
            self.targets = [t.strip() for t in self.targets.split(",") if t.strip()]
        if self.alpha is None:
            self.alpha = float(self.rank) if isinstance(self.rank, int) else self.alpha

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def check(self) -> LoraConfig:
        for key, flag in (("rank", "--lora-rank"), ("alpha", "--lora-alpha"), ("dropout", "--lora-dropout")):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (key == "rank" and not isinstance(value, int)):
                raise UsageError(f"{flag}: expected a number, got {value!r}")
            check_value("LoraConfig", key, value, flag)
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise UsageError(f"--lora-targets: unknown target(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                             f"choose among {','.join(TARGETS)}")
        if len(set(self.targets)) != len(self.targets):
            raise UsageError(f"--lora-targets: a target is given twice ({','.join(self.targets)})")
        if self.base_dtype not in ("float32", "bfloat16"):
            raise UsageError(f"lora base_dtype must be float32 or bfloat16, got {self.base_dtype!r}")
        self.targets = [t for t in TARGETS if t in self.targets]  # one order, whatever the flag's
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "lora") -> LoraConfig:
        if not isinstance(d, dict):
            raise UsageError(f"{where}: the LoRA settings must be a table, got {d!r}")
        known = {"rank", "alpha", "dropout", "targets", "base_dtype"}
        if unknown := sorted(set(d) - known):
            raise UsageError(f"{where}: unknown LoRA key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**d).check()


def slices(cfg: ModelConfig, module: str) -> dict[str, tuple[int, int]]:
    """The targets a (fused) module computes, each with its rows (start, end) of the output."""
    q, kv, ff = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff
    return {"attn.qkv": {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)},
            "attn.o": {"o": (0, cfg.d_model)}, "mlp.gate_up": {"gate": (0, ff), "up": (ff, 2 * ff)},
            "mlp.down": {"down": (0, cfg.d_model)}}[module]


class LoraLinear(nn.Module):
    """A frozen Linear plus one LoRA pair per targeted slice of its output. The base's `weight` and
    `bias` stay under their own names, so a LoRA model's state dict is the base's plus
    `lora_A.<target>` (r × in) and `lora_B.<target>` (rows × r)."""

    def __init__(self, base: nn.Linear, parts: dict[str, tuple[int, int]], cfg: LoraConfig,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.weight, self.bias = base.weight, base.bias
        self.in_features, self.out_features = base.in_features, base.out_features
        self.parts, self.rank, self.scaling = parts, cfg.rank, cfg.scaling
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        dev = base.weight.device
        self.lora_A = nn.ParameterDict({t: nn.Parameter(torch.empty(cfg.rank, self.in_features, device=dev)) for t in parts})
        self.lora_B = nn.ParameterDict({t: nn.Parameter(torch.zeros(b - a, cfg.rank, device=dev)) for t, (a, b) in parts.items()})
        self.enabled = True
        for t in parts:
            nn.init.kaiming_uniform_(self.lora_A[t], a=math.sqrt(5), generator=generator)  # PEFT's init_lora_weights=True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        names = list(self.parts)
        if self.enabled and torch.is_grad_enabled() and isinstance(self.dropout, nn.Identity) and self.lora_A[names[0]].requires_grad:
            dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
            return _MergedLoRA.apply(x, self.weight, self.bias, self.scaling, list(self.parts.values()), dtype,
                                     *(self.lora_A[t] for t in names), *(self.lora_B[t] for t in names))
        w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        b = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        y = F.linear(x, w, b)
        if not self.enabled:
            return y
        A = self.lora_A[names[0]] if len(names) == 1 else torch.cat([self.lora_A[t] for t in names])
        # every slice's r columns in one matmul, scaled while they are r wide rather than the output's width
        h = (self.dropout(x) @ A.to(x.dtype).t()) * self.scaling
        ups = [h[..., i * self.rank:(i + 1) * self.rank] @ self.lora_B[t].to(x.dtype).t() for i, t in enumerate(names)]
        if len(ups) == 1 and self.parts[names[0]] == (0, self.out_features):
            return y + ups[0]
        if not torch.is_grad_enabled():  # inference (generation, eval): each slice added in place
            for u, (lo, hi) in zip(ups, self.parts.values()):
                y[..., lo:hi] += u
            return y
        return y + torch.cat(_fill(ups, list(self.parts.values()), self.out_features, x), dim=-1)

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        w = self.weight.detach().float().clone()
        for t, (a, b) in self.parts.items():
            w[a:b] += self.scaling * (self.lora_B[t].float() @ self.lora_A[t].float())
        return w


def _fill(ups: list[torch.Tensor], rows: list[tuple[int, int]], width: int, x: torch.Tensor) -> list[torch.Tensor]:
    """The slices' updates with zeros for the rows no adapter touches (k of a q,v-only qkv)."""
    out, at = [], 0
    for (lo, hi), u in zip(rows, ups):
        if lo > at:
            out.append(x.new_zeros(*u.shape[:-1], lo - at))
        out.append(u)
        at = hi
    if at < width:
        out.append(x.new_zeros(*ups[0].shape[:-1], width - at))
    return out


def _effective_weight(weight, As, Bs, rows, scaling: float, dtype) -> torch.Tensor:
    """W + (alpha/r)·B·A on each targeted slice's rows, summed in float32, in the matmul dtype."""
    w = weight.detach().float().clone()
    for (lo, hi), A, B in zip(rows, As, Bs):
        w[lo:hi].addmm_(B.detach().float(), A.detach().float(), alpha=scaling)
    return w.to(dtype)


class _MergedLoRA(torch.autograd.Function):
    """A LoRA layer's training step without dropout, as one matmul each way: forward
    x·(W + s·B·A)ᵀ (+ b); backward ∂x = ∂y·(W + s·B·A), ∂B_t = s·∂y_tᵀ·(x·A_tᵀ), ∂A_t = s·(∂y_t·B_t)ᵀ·x.
    The unmerged form, y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ, adds two thin (rank-wide) matmuls to the forward and
    two to the backward, each reading a whole activation for r outputs; here the merge costs an
    out × in pass over W (independent of the batch), redone in the backward rather than kept, so
    no second copy of the base lives through the step. The same function, the same gradients."""

    @staticmethod
    def forward(ctx, x, weight, bias, scaling, rows, dtype, *params):
        k = len(rows)
        As, Bs = params[:k], params[k:]
        with torch.autocast(x.device.type, enabled=False):
            xd = x.to(dtype)
            y = F.linear(xd, _effective_weight(weight, As, Bs, rows, scaling, dtype),
                         None if bias is None else bias.to(dtype))
        ctx.save_for_backward(xd, weight, *params)
        ctx.scaling, ctx.rows, ctx.dtype, ctx.x_dtype = scaling, rows, dtype, x.dtype
        return y

    @staticmethod
    def backward(ctx, grad_y):
        xd, weight, *params = ctx.saved_tensors
        rows, s, dt = ctx.rows, ctx.scaling, ctx.dtype
        k = len(rows)
        As, Bs = params[:k], params[k:]
        r = As[0].shape[0]
        x2, g2 = xd.reshape(-1, xd.shape[-1]), grad_y.reshape(-1, grad_y.shape[-1]).to(dt)
        xa = x2 @ torch.cat([A.to(dt) for A in As]).t()  # (N, k·r): every slice's x·Aᵀ in one matmul
        grad_B, gb = [], []
        for i, ((lo, hi), B) in enumerate(zip(rows, Bs)):
            grad_B.append((g2[:, lo:hi].t() @ xa[:, i * r:(i + 1) * r]).mul_(s).to(B.dtype))
            gb.append(g2[:, lo:hi] @ B.to(dt))
        grad_A = [g.to(A.dtype) for g, A in zip((torch.cat(gb, 1).t() @ x2).mul_(s).split(r), As)]
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_y.to(dt) @ _effective_weight(weight, As, Bs, rows, s, dt)).to(ctx.x_dtype)
        return grad_x, None, None, None, None, None, *grad_A, *grad_B


def attach(model: nn.Module, cfg: LoraConfig, generator: torch.Generator | None = None) -> nn.Module:
    """Freeze every base parameter (in cfg.base_dtype) and put adapters on the targeted projections,
    in place; A is drawn from `generator` (default: torch's global one; seed it for a reproducible run)."""
    cfg.check()
    if any(isinstance(m, LoraLinear) for m in model.modules()):
        raise UsageError("this model already carries LoRA adapters")
    dtype = torch.bfloat16 if cfg.base_dtype == "bfloat16" else None
    for p in model.parameters():
        p.requires_grad_(False)
        if dtype is not None and p.is_floating_point():
            p.data = p.data.to(dtype)
    for block in model.layers:
        for module in dict.fromkeys(MODULES[t][0] for t in cfg.targets):
            parts = {t: r for t, r in slices(model.cfg, module).items() if t in cfg.targets}
            parent, name = module.split(".")
            owner = getattr(block, parent)
            setattr(owner, name, LoraLinear(getattr(owner, name), parts, cfg, generator))
    model.lora = cfg
    return model


def lora_layers(model: nn.Module) -> list[LoraLinear]:
    return [m for m in model.modules() if isinstance(m, LoraLinear)]


@contextmanager
def adapters_off(model: nn.Module):
    """The base model's outputs inside the block (a DPO reference without a second copy)."""
    layers = lora_layers(model)
    states = [m.enabled for m in layers]
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m, s in zip(layers, states):
            m.enabled = s


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors by name (layers.N.attn.qkv.lora_A.q, ...)."""
    return {k: v for k, v in model.state_dict().items() if is_adapter(k)}


def load_adapters(model: nn.Module, tensors: dict[str, torch.Tensor], where) -> None:
    """The adapter tensors of a LoRA checkpoint into an attached model: every name and shape checked."""
    expected = adapter_state(model)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise UsageError(f"{where}: adapters do not match lora.json (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for k, t in tensors.items():
        if t.shape != expected[k].shape:
            raise UsageError(f"{where}: adapter {k} has shape {tuple(t.shape)}, lora.json implies {tuple(expected[k].shape)}")
    model.load_state_dict(tensors, strict=False)


@torch.no_grad()
def merge(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (W += (alpha/r)·B·A, in float32) and put plain
    Linears back: the model then computes what the adapted one did, at the base's cost."""
    for block in model.layers:
        for module in ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down"):
            parent, name = module.split(".")
            owner = getattr(block, parent)
            m = getattr(owner, name)
            if isinstance(m, LoraLinear):
                lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device=m.weight.device)
                lin.weight.copy_(m.merged_weight())
                if m.bias is not None:
                    lin.bias.copy_(m.bias.float())
                setattr(owner, name, lin)
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.float()
        p.requires_grad_(True)
    if hasattr(model, "lora"):
        del model.lora
    return model


def merged_tensors(cfg: ModelConfig, lora: LoraConfig, base: dict[str, torch.Tensor],
                   adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base checkpoint's tensors with each adapter folded in (summed in float32, stored in the
    base's dtype), for export --merge and every reader of a LoRA checkpoint's full weights."""
    out = dict(base)
    for i in range(cfg.n_layers):
        for module in dict.fromkeys(MODULES[t][0] for t in lora.targets):
            key = f"layers.{i}.{module}.weight"
            w = base[key].float().clone()
            for t, (a, b) in slices(cfg, module).items():
                if t in lora.targets:
                    A, B = adapters[f"layers.{i}.{module}.lora_A.{t}"], adapters[f"layers.{i}.{module}.lora_B.{t}"]
                    w[a:b] += lora.scaling * (B.float() @ A.float())
            out[key] = w.to(base[key].dtype)  # a bf16 base exports in bf16, as it was stored
    return out


def peft_state_dict(cfg: ModelConfig, lora: LoraConfig, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our adapter tensors under PEFT's names for the exported transformers model
    (base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight, ...)."""
    out = {}
    for i in range(cfg.n_layers):
        for t in lora.targets:
            ours, theirs = MODULES[t]
            for ab in ("A", "B"):
                out[f"base_model.model.model.layers.{i}.{theirs}.lora_{ab}.weight"] = \
                    adapters[f"layers.{i}.{ours}.lora_{ab}.{t}"].float().contiguous()
    return out


def peft_config(lora: LoraConfig, base_path: str) -> dict:
    """adapter_config.json as PEFT writes it for a causal-LM LoRA adapter."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path,
            "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "bias": "none",
            "target_modules": sorted(MODULES[t][1].split(".")[1] for t in lora.targets),
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
            "inference_mode": True, "modules_to_save": None, "layers_to_transform": None}

"""MiXSE: every LoRA-adapted nn.Linear of the base becomes a MixLoRALinear whose gate mixes the
frozen experts' low-rank updates per token; only the gates train. Reading adapters, building the
mixture, its usage statistics, and loading a trained mixture back from a run's folder."""
from __future__ import annotations

import json
import math
import os

import torch
from torch import nn

from trainers import lm
from trainers.tables import DatasetError


class Usage:
    """Counts of top-k assignments per expert over valid tokens (set `mask` before each forward)."""

    def __init__(self, n_experts: int):
        self.counts = torch.zeros(n_experts, dtype=torch.float64)
        self.weights = torch.zeros(n_experts, dtype=torch.float64)
        self.mask: torch.Tensor | None = None

    def add(self, topi: torch.Tensor, w: torch.Tensor) -> None:
        if self.mask is not None and self.mask.shape == topi.shape[:-1]:
            topi, w = topi[self.mask.bool()], w[self.mask.bool()]
        self.counts += torch.bincount(topi.reshape(-1).cpu(), minlength=len(self.counts)).double()
        self.weights += w.reshape(-1, w.shape[-1]).sum(0).double().cpu()

    @staticmethod
    def _norm(v: torch.Tensor) -> list[float]:
        total = float(v.sum())
        return [float(c) / total if total else 0.0 for c in v]

    def shares(self) -> list[float]:
        return self._norm(self.counts)

    def weight_shares(self) -> list[float]:
        return self._norm(self.weights)


class MixLoRALinear(nn.Module):
    """base(x) + sum_{e in top-k(W_g x)} g_e(x) * s_e * B_e A_e x, experts frozen, only W_g trains."""

    def __init__(self, base: nn.Linear, A: torch.Tensor, B: torch.Tensor, scaling: torch.Tensor,
                 top_k: int, gate_softmax: str = "topk"):
        super().__init__()
        self.base = base
        n_experts = A.shape[0]
        self.register_buffer("lora_A", A.float(), persistent=False)        # (E, r, in)
        self.register_buffer("lora_B", B.float(), persistent=False)        # (E, out, r)
        self.register_buffer("scaling", scaling.float(), persistent=False)  # (E,)
        self.gate = nn.Linear(base.in_features, n_experts, bias=False, device=base.weight.device,
                              dtype=torch.float32)
        nn.init.normal_(self.gate.weight, std=0.02)
        self.top_k, self.gate_softmax = min(top_k, n_experts), gate_softmax
        self.usage: Usage | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        xf = x.float()
        logits = self.gate(xf)                                              # (..., E)
        topv, topi = logits.topk(self.top_k, dim=-1)
        g = topv.softmax(-1) if self.gate_softmax == "topk" else logits.softmax(-1).gather(-1, topi)
        w = torch.zeros_like(logits).scatter(-1, topi, g)                  # (..., E), gate weights
        h = torch.einsum("...i,eri->...er", xf, self.lora_A) * (w * self.scaling).unsqueeze(-1)
        delta = torch.einsum("...er,eor->...o", h, self.lora_B)
        if self.usage is not None:
            self.usage.add(topi, w.detach())
        return y + delta.to(y.dtype)


def read_adapter(path: str) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """{module name in the base model: (A (r, in), B (out, r))} and the scaling of a saved LoRA adapter."""
    from peft import LoraConfig
    from peft.utils import load_peft_weights
    cfg = LoraConfig.from_pretrained(path)
    scaling = cfg.lora_alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)
    if cfg.rank_pattern or cfg.alpha_pattern:
        raise DatasetError(f"{path}: per-module rank/alpha patterns are not supported")
    weights = load_peft_weights(path, device="cpu")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in weights.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0]
                module = module.removeprefix("base_model.model.")
                pairs.setdefault(module, {})[part] = value
    return {m: (p["lora_A"], p["lora_B"]) for m, p in pairs.items()}, scaling


def build_mixture(model: nn.Module, adapter_dirs: list[str], top_k: int, gate_softmax: str = "topk") -> list[str]:
    """Replace each LoRA-adapted nn.Linear of `model` (in place) by a MixLoRALinear over the adapters
    (expert order = adapter_dirs order); freeze everything but the gates. Returns the gated module names."""
    adapters = [read_adapter(p) for p in adapter_dirs]
    names = sorted(adapters[0][0])
    for (w, _), path in zip(adapters[1:], adapter_dirs[1:]):
        if sorted(w) != names:
            raise DatasetError(f"{path} adapts other layers than {adapter_dirs[0]}")
    for p in model.parameters():
        p.requires_grad_(False)
    scaling = torch.tensor([s for _, s in adapters])
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = getattr(parent, child)
        if not isinstance(base, nn.Linear):
            raise DatasetError(f"{name} is {type(base).__name__}, not nn.Linear")
        r = max(w[name][0].shape[0] for w, _ in adapters)
        A = torch.zeros(len(adapters), r, base.in_features)
        B = torch.zeros(len(adapters), base.out_features, r)
        for e, (w, _) in enumerate(adapters):
            a, b = w[name]
            A[e, :a.shape[0]], B[e, :, :b.shape[1]] = a.float(), b.float()
        setattr(parent, child, MixLoRALinear(base, A.to(base.weight.device), B.to(base.weight.device),
                                             scaling.to(base.weight.device), top_k, gate_softmax))
    return names


def relative_change(new: list[torch.Tensor], old: list[torch.Tensor]) -> float:
    """||new - old|| / ||old|| over all tensors together."""
    diff = sum(float(((n.detach() - o) ** 2).sum()) for n, o in zip(new, old))
    return math.sqrt(diff / max(sum(float((o ** 2).sum()) for o in old), 1e-30))


def gate_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{n}.gate.weight": m.gate.weight.detach().cpu().clone()
            for n, m in model.named_modules() if isinstance(m, MixLoRALinear)}


def mix_modules(model: nn.Module) -> list[MixLoRALinear]:
    return [m for m in model.modules() if isinstance(m, MixLoRALinear)]


@torch.no_grad()
def router_usage(model: nn.Module, batch_list: list[dict], device, n_experts: int) -> tuple[list[float], list[float]]:
    """(share of top-k assignments, share of gate weight) per expert over the batches' valid tokens
    and all gated layers; each sums to 1."""
    usage = Usage(n_experts)
    mods = mix_modules(model)
    for m in mods:
        m.usage = usage
    model.eval()
    try:
        for b in batch_list:
            b = {k: v.to(device) for k, v in b.items()}
            usage.mask = b["attention_mask"]
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    finally:
        for m in mods:
            m.usage = None
    return usage.shares(), usage.weight_shares()


def load_mixture(out_dir: str, base_model: str | None = None, device: str | torch.device = "cpu") -> nn.Module:
    """The routed model a training run saved: base + experts from out/experts + gates from router.pt."""
    with open(os.path.join(out_dir, "router.json")) as fh:
        meta = json.load(fh)
    device = torch.device(device)
    model = lm.load_base(lm.check_base_model(base_model or meta["base_model"]), device)
    build_mixture(model, [os.path.join(out_dir, "experts", d) for d in meta["experts"]],
                  meta["top_k"], meta["gate_softmax"])
    state = torch.load(os.path.join(out_dir, "router.pt"), map_location=device, weights_only=True)
    mods = dict(model.named_modules())
    expected = gate_state_dict(model)
    if set(state) != set(expected):
        raise DatasetError(f"{out_dir}/router.pt gates do not match the experts' layers")
    for key, value in state.items():
        mods[key.removesuffix(".gate.weight")].gate.weight.data.copy_(value)
    model.eval()
    return model

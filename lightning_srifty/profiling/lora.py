"""LoRA adapters in plain torch, to capture (and size) a LoRA fine-tuning run without ``peft``.

:func:`add_lora` freezes every parameter of a model and wraps the ``nn.Linear`` layers whose attribute name is one of
``targets`` (``q_proj`` and ``v_proj`` by default, as peft's default for Llama) in :class:`LoRALinear`: the frozen
layer plus a trainable low-rank update ``B @ A`` scaled by ``alpha / rank`` (A random, B zero, as in the paper, so the
wrapped model starts equal to the base). Frozen layers still save their inputs for backward where an input gradient
flows through them, which is what the capture then measures.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from predictor.exceptions import ConfigError

DEFAULT_TARGETS = ("q_proj", "v_proj")
_OWNER = "add_lora()"


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable rank-``rank`` update.

    Args:
        base: the linear layer (frozen here).
        rank: the rank of the update (>= 1).
        alpha: scale numerator: the update is ``alpha / rank * B @ A`` (default: ``2 * rank``).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float | None = None) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=device, dtype=dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device, dtype=dtype))
        if device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = (alpha if alpha is not None else 2.0 * rank) / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def add_lora(
    module: nn.Module, rank: int, targets: tuple[str, ...] = DEFAULT_TARGETS, alpha: float | None = None
) -> int:
    """Freeze ``module`` and put LoRA adapters on its linear layers named in ``targets``, in place.

    Args:
        module: the model (e.g. a transformers ``LlamaForCausalLM``, on any device, meta included).
        rank: rank of the adapters (>= 1).
        targets: attribute names of the linear layers to adapt (``q_proj``, ``v_proj``...).
        alpha: LoRA scale numerator (default ``2 * rank``).

    Returns:
        The number of layers adapted.

    Raises:
        ConfigError: ``rank`` is not a whole number >= 1, or no linear layer is named in ``targets``.
    """
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ConfigError(
            f"The 'rank' parameter of {_OWNER} must be a whole number >= 1 (e.g. 16). Got {rank!r}.",
            parameter="rank",
            value=rank,
        )
    module.requires_grad_(False)
    found = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if name in targets and isinstance(child, nn.Linear)
    ]
    if not found:
        names = sorted({n for n, c in module.named_modules() if isinstance(c, nn.Linear)} - {""})
        example = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names})[:8])
        raise ConfigError(
            f"The 'targets' parameter of {_OWNER} names no linear layer of {type(module).__name__}: got "
            f"{list(targets)}; its linear layers are called {example or 'nothing (it has none)'}.",
            parameter="targets",
            value=list(targets),
        )
    for parent, name, child in found:
        setattr(parent, name, LoRALinear(child, rank, alpha))
    return len(found)

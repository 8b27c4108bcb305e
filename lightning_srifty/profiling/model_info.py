"""Sizes that decide memory and communication: parameters, gradients, optimizer state, precision."""

from __future__ import annotations

import typing
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from predictor.documents.profile import Precision

_LEGACY_PRECISION = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}
_KNOWN_PRECISION = set(typing.get_args(Precision))


def normalize_precision(value: Any) -> str | None:
    """Lightning's precision setting in its current spelling ('16' -> '16-mixed'); None if not recognised."""
    text = str(value)
    text = _LEGACY_PRECISION.get(text, text)
    return text if text in _KNOWN_PRECISION else None


def parameter_counts(module: torch.nn.Module) -> tuple[int, int]:
    """(all parameters, trainable parameters), shared parameters counted once."""
    seen: set[int] = set()
    total = trainable = 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total, trainable


def gradient_bytes(module: torch.nn.Module) -> dict[str, int]:
    """Bytes of gradients per replica by dtype (a gradient has its parameter's dtype)."""
    out: Counter[str] = Counter()
    seen: set[int] = set()
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out[str(p.dtype).removeprefix("torch.")] += p.numel() * p.element_size()
    return dict(out)


def optimizer_state_bytes(optimizers: Iterable[torch.optim.Optimizer]) -> int:
    """Bytes held in the optimizers' state tensors (momenta, variances...)."""
    total = 0
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer wraps the real one
        for state in inner.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
    return total


def optimizer_names(optimizers: Iterable[torch.optim.Optimizer]) -> str | None:
    names = [type(getattr(o, "optimizer", o)).__name__ for o in optimizers]
    return "+".join(names) or None


def batch_size(batch: Any) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor (searching tuples, lists and dicts)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else None
    if isinstance(batch, dict):
        items: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        found = batch_size(item)
        if found is not None:
            return found
    return None

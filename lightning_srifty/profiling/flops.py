"""Counting the FLOPs of one real training step with ``torch.utils.flop_counter`` (no extra computation).

The counter is switched on for one warm-up step: from batch start to ``on_before_backward`` it counts the
forward, from there to ``on_after_backward`` the backward. That step runs slower and is never timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

# convolution_backward's arguments in schema order (grad_output, input, weight, bias_sizes, stride, padding,
# dilation, transposed, output_padding, groups, output_mask)
_CONV_BACKWARD_ARGS = ("grad_output", "input", "weight", "bias_sizes", "stride", "padding", "dilation", "transposed",
                       "output_padding", "groups", "output_mask")  # fmt: skip


def _grouped_convolution_backward(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """torch's ``convolution_backward`` FLOPs with the weight gradient counted from the weight's own shape: torch's
    formula (``torch.utils.flop_counter.conv_backward_flop``, torch 2.13) ignores groups there, so a depthwise
    convolution's weight gradient came out ``groups`` times its real work (960x for MobileNetV2's last blocks; the
    input gradient is right, its weight shape carries the groups). The weight gradient takes the forward's FLOPs:
    2 x batch x the weight's elements (``groups`` already divided out) x the pixels each weight element meets (the
    output's, the input's for a transposed convolution); torch's weight term is replaced by it, so a torch that
    counts groups itself is not corrected twice. Autograd calls it with positional arguments (the schema's order)."""
    import math

    import torch
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry[torch.ops.aten.convolution_backward]
    flops = int(formula(*args, out_val=out_val, **kwargs))
    bound = dict(zip(_CONV_BACKWARD_ARGS, args, strict=False))
    groups, mask = int(bound.get("groups") or 1), list(bound.get("output_mask") or (True, True, True))
    if groups > 1 and len(mask) > 1 and mask[1] and len(args) == len(_CONV_BACKWARD_ARGS):
        weight_only = [*args[:-1], [False, True, False]]
        torch_weight = int(formula(*weight_only, out_val=out_val))
        grad_output, x, w = bound["grad_output"], bound["input"], bound["weight"]
        pixels = math.prod((x if bound["transposed"] else grad_output).shape[2:])
        flops += 2 * x.shape[0] * w.numel() * pixels - torch_weight
    return flops


_grouped_convolution_backward._get_raw = True  # type: ignore[attr-defined]  # given the tensors, as torch's registry


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """The formulas this package counts with over torch's registry: every attention operator's
    (:func:`lightning_srifty.profiling.attention.flop_formulas`) and grouped convolutions' backward."""
    import torch

    from lightning_srifty.profiling.attention import flop_formulas as attention_formulas

    return {**attention_formulas(), torch.ops.aten.convolution_backward: _grouped_convolution_backward}


class StepFlopCounter:
    """Counts forward and backward FLOPs of one step; ``reason`` says why not when counting fails."""

    method = (
        "torch.utils.flop_counter.FlopCounterMode on one training step (attention and grouped convolutions' "
        "backward: lightning_srifty's formulas)"
    )

    def __init__(self) -> None:
        self.forward: int | None = None
        self.backward: int | None = None
        self.reason: str | None = None
        self._mode: Any = None
        self._phase: str | None = None

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start_forward(self) -> None:
        self._enter("forward")

    def start_backward(self) -> None:
        if self._phase == "forward":
            self.forward = self._exit()
            self._enter("backward")

    def finish(self) -> None:
        if self._phase == "backward":
            self.backward = self._exit()
        elif self._phase == "forward":
            self.forward = self._exit()
            self.reason = self.reason or "no backward ran inside the counted step (manual optimization?)"

    def abort(self, reason: str) -> None:
        if self._mode is not None:
            with contextlib.suppress(Exception):
                self._mode.__exit__(None, None, None)
        self._mode = self._phase = None
        self.reason = reason

    def _enter(self, phase: str) -> None:
        try:
            from torch.utils.flop_counter import FlopCounterMode

            # the operator table's formulas (every SDPA kernel, the CPU's included; causal masks; grouped
            # convolutions' weight gradient)
            mode = FlopCounterMode(display=False, custom_mapping=flop_formulas())
            mode.__enter__()
        except Exception as exc:  # noqa: BLE001 - FLOPs are optional: record why
            self.abort(f"torch's FlopCounterMode failed: {type(exc).__name__}: {exc}")
            return
        self._mode, self._phase = mode, phase

    def _exit(self) -> int | None:
        mode, self._mode, self._phase = self._mode, None, None
        try:
            mode.__exit__(None, None, None)
            return int(mode.get_total_flops())
        except Exception as exc:  # noqa: BLE001 - FLOPs are optional: record why
            self.reason = f"torch's FlopCounterMode failed: {type(exc).__name__}: {exc}"
            return None

    def per_sample(self, samples: int | None) -> dict[str, Any]:
        """The profile's ``model.flops`` section for a step of ``samples`` samples."""
        if self.reason is not None and self.forward is None:
            return {"reason": self.reason}
        if not samples:
            return {"reason": "the batch size is unknown, so FLOPs cannot be given per sample"}
        if not self.forward:
            return {"reason": self.reason or "the flop counter found no matmul/convolution in the step"}
        out: dict[str, Any] = {"forward_per_sample": self.forward / samples, "method": self.method}
        if self.backward is not None:
            out["backward_per_sample"] = self.backward / samples
            out["per_sample"] = (self.forward + self.backward) / samples
        else:
            out["reason"] = self.reason or "backward FLOPs were not counted"
        return out

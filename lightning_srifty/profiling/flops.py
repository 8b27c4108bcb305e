"""Counting the FLOPs of one real training step with ``torch.utils.flop_counter`` (no extra computation).

The counter is switched on for one warm-up step: from batch start to ``on_before_backward`` it counts the
forward, from there to ``on_after_backward`` the backward. That step runs slower and is never timed.
"""

from __future__ import annotations

import contextlib
from typing import Any


class StepFlopCounter:
    """Counts forward and backward FLOPs of one step; ``reason`` says why not when counting fails."""

    method = "torch.utils.flop_counter.FlopCounterMode on one training step (attention: lightning_srifty's formulas)"

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

            from lightning_srifty.profiling.attention import flop_formulas

            # the operator table's attention formulas (every SDPA kernel, the CPU's included; causal masks)
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

"""Attention in the operator table: the FLOPs of every SDPA kernel, and the kernel CUDA would run for a CPU one.

FLOPs (multiply and add counted as 2), for ``b`` batches, ``h`` query heads, ``d``/``d_v`` head dims and ``p`` the
(query, key) pairs the kernel computes:

- forward: ``2·b·h·p·(d + d_v)``, the two matmuls ``q @ kᵀ`` and ``P @ v`` (``4·b·h·s_q·s_k·d`` unmasked);
- backward of the fused kernels (flash, memory-efficient, cuDNN, and the CPU's flash kernel):
  ``2·b·h·p·(3·d + 2·d_v)``, five matmuls: the scores are recomputed (``q @ kᵀ``), then ``dv = Pᵀ @ do``,
  ``dP = do @ vᵀ``, ``dq = dS @ k``, ``dk = dSᵀ @ q``: 2.5 x the forward. This is the work the hardware does, the
  figure a time model needs; the MFU convention (backward = 2 x forward, "model FLOPs") leaves the recompute out.
  torch's ``flop_counter`` counts the same five matmuls;
- the unfused math path saves the probabilities and runs four matmuls backward (2 x forward); on CPU and CUDA alike
  it is recorded as the ``bmm`` kernels it decomposes into, counted by torch's formulas;
- causal (``is_causal``, or the efficient kernel's ``custom_mask_type`` 1/2): the fused kernels skip the tiles above
  the diagonal, so ``p`` counts the pairs a query attends: ``s(s+1)/2`` for ``s_q = s_k = s``, about half (torch's
  formulas ignore causality and count the full square). An explicit ``attn_mask``/``attn_bias`` is added to the
  scores, so every tile is computed; ``scale`` and dropout change no matmul;
- GQA/MQA: every query head attends its keys, so ``h`` is the query's head count, whatever the key/value heads.

The kernel CUDA runs (:func:`cuda_kernel`), after ``select_sdp_backend`` of torch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (priority flash > memory-efficient > math, on sm80+):

- flash (``can_use_flash_attention``): float16/bfloat16, no ``attn_mask``, q/k/v head dims equal and <= 256,
  ``is_causal`` only with ``s_q == s_k``, key/value heads dividing the query heads;
- memory-efficient (``can_use_mem_efficient_attention``): float32/float16/bfloat16 with any mask, q/k head dims
  equal, q and v head dims multiples of 8 (half) or 4 (float32) (``minimum_gemm_alignment``);
- math otherwise (float64, odd head dims).

torch puts cuDNN attention first on sm90/sm100 when the runtime cuDNN is newer than 9.15
(``check_prefer_cudnn_attention``): a property of the GPU and the wheel, not of the model. The capture records flash
there; cuDNN's kernel does the same FLOPs and moves the same bytes (q, k, v, out, logsumexp), so the predicted time
is the same.

A CPU step runs ``_scaled_dot_product_flash_attention_for_cpu`` (and its backward); :class:`~.ops_capture.OpRecorder`
records it under the CUDA kernel's name, with that kernel's FLOPs and argument order, and the bytes the fused kernel
moves (the tensors it reads and writes: never the ``s_q x s_k`` scores). The CPU's fused kernel has no dropout
(CPU SDPA then falls back to the unfused math path, in float32); :class:`CudaAttentionOnCpu` runs such calls with
dropout 0 in a capture, so the CPU too runs the fused kernel CUDA applies dropout in.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

FLASH, EFFICIENT, MATH = "flash", "efficient", "math"
# the ATen operators CUDA's SDPA runs for each kernel (forward, backward); math is the composite operator (the capture
# only names it when CUDA would run it while the CPU ran its fused kernel)
CUDA_OPS = {
    FLASH: (
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_flash_attention_backward.default",
    ),
    EFFICIENT: (
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_efficient_attention_backward.default",
    ),
    MATH: ("aten._scaled_dot_product_attention_math.default", "aten._scaled_dot_product_attention_math.default"),
}
CPU_FORWARD = aten._scaled_dot_product_flash_attention_for_cpu
CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward

_HALF = (torch.float16, torch.bfloat16)


def attended_pairs(s_q: int, s_k: int, causal: bool = False, *, bottom_right: bool = False) -> int:
    """(query, key) pairs a kernel computes: ``s_q x s_k``, or under a causal mask the pairs on or below the diagonal.

    torch's ``is_causal`` aligns the mask top-left (query ``i`` sees keys ``0..i``); flash-attention's own ``causal``
    and the efficient kernel's ``custom_mask_type=2`` align it bottom-right (query ``i`` sees ``0..i + s_k - s_q``).
    """
    s_q, s_k = int(s_q), int(s_k)
    if not causal or s_q <= 0 or s_k <= 0:
        return max(s_q, 0) * max(s_k, 0)
    a = 1 + (s_k - s_q if bottom_right else 0)  # query i sees min(max(i + a, 0), s_k) keys
    first = min(max(0, 1 - a), s_q)  # first query that sees a key
    full = min(max(first, s_k - a), s_q)  # first query that sees every key
    partial = (full - first) * (first + a + full - 1 + a) // 2  # sum of i + a for first <= i < full
    return partial + (s_q - full) * s_k


def forward_flops(
    b: int, h: int, s_q: int, s_k: int, d: int, d_v: int | None = None, *, pairs: int | None = None
) -> int:
    """FLOPs of an attention forward: ``q @ kᵀ`` and ``P @ v`` over ``pairs`` (default every pair)."""
    p = s_q * s_k if pairs is None else pairs
    return 2 * b * h * p * (d + (d if d_v is None else d_v))


def backward_flops(
    b: int,
    h: int,
    s_q: int,
    s_k: int,
    d: int,
    d_v: int | None = None,
    *,
    pairs: int | None = None,
    recompute: bool = True,
) -> int:
    """FLOPs of an attention backward: five matmuls when the kernel recomputes the scores (the fused kernels: 2.5 x
    the forward), four when it saved them (the math path: 2 x)."""
    p = s_q * s_k if pairs is None else pairs
    return 2 * b * h * p * ((3 if recompute else 2) * d + 2 * (d if d_v is None else d_v))


def cuda_kernel(
    dtype: torch.dtype,
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    v_shape: Sequence[int],
    *,
    has_mask: bool,
    is_causal: bool,
) -> str:
    """The SDPA kernel CUDA selects on an sm80+ GPU (``flash``, ``efficient`` or ``math``) for these inputs
    (``[..., heads, seq, dim]``); the rule and its source are in the module's docstring."""
    d, d_k, d_v = int(q_shape[-1]), int(k_shape[-1]), int(v_shape[-1])
    heads_ok = len(q_shape) < 3 or (int(k_shape[-3]) > 0 and int(q_shape[-3]) % int(k_shape[-3]) == 0)
    half = dtype in _HALF
    if (
        half
        and not has_mask
        and d == d_k == d_v
        and 0 < d <= 256
        and (not is_causal or int(q_shape[-2]) == int(k_shape[-2]))
        and heads_ok
    ):
        return FLASH
    align = 8 if half else 4
    if (half or dtype == torch.float32) and d == d_k and d > 0 and d % align == 0 and d_v % align == 0 and heads_ok:
        return EFFICIENT
    return MATH


# ---------------------------------------------------------------------------------------------------- op formulas


def _bind(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by schema name (defaults filled in)."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def _dims(t: Any, layout: str) -> tuple[int, int, int, int]:
    """(batch, heads, seq, dim) of a ``[b, h, s, d]`` (``bhsd``) or ``[b, s, h, d]`` (``bshd``) tensor."""
    shape = [int(s) for s in t.shape]
    if layout == "bshd":
        b, s, h, d = shape
    else:
        *lead, s, d = shape
        b, h = (int(torch.Size(lead[:-1]).numel()), lead[-1]) if lead else (1, 1)
    return b, h, s, d


class _Spec:
    """How to read one attention operator: its tensors' layout, whether it is a backward, where its causality is."""

    def __init__(
        self,
        layout: str = "bhsd",
        backward: bool = False,
        mask: str | None = None,
        nested: str | None = None,
        bottom_right: bool = False,
    ) -> None:
        self.layout, self.backward, self.mask, self.nested = layout, backward, mask, nested
        self.bottom_right = bottom_right

    def causal(self, bound: dict[str, Any]) -> tuple[bool, bool]:
        """(causal, aligned bottom-right)."""
        if "custom_mask_type" in bound:
            kind = int(bound.get("custom_mask_type") or 0)
            return kind in (1, 2), kind == 2
        return bool(bound.get("is_causal")), self.bottom_right


SPECS: dict[Any, _Spec] = {
    CPU_FORWARD: _Spec(mask="attn_mask"),
    CPU_BACKWARD: _Spec(backward=True, mask="attn_mask"),
    aten._scaled_dot_product_flash_attention: _Spec(),
    aten._scaled_dot_product_flash_attention_backward: _Spec(backward=True),
    aten._scaled_dot_product_efficient_attention: _Spec(mask="attn_bias"),
    aten._scaled_dot_product_efficient_attention_backward: _Spec(backward=True, mask="attn_bias"),
    aten._scaled_dot_product_cudnn_attention: _Spec(mask="attn_bias"),
    aten._scaled_dot_product_cudnn_attention_backward: _Spec(backward=True, mask="attn_bias"),
    aten._flash_attention_forward: _Spec("bshd", nested="cum_seq_q", bottom_right=True),
    aten._flash_attention_backward: _Spec("bshd", backward=True, nested="cum_seq_q", bottom_right=True),
    aten._efficient_attention_forward: _Spec("bshd", mask="bias", nested="cu_seqlens_q"),
    aten._efficient_attention_backward: _Spec("bshd", backward=True, mask="bias", nested="cu_seqlens_q"),
}


def attention_flops(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    """FLOPs of one call of an attention operator of :data:`SPECS` (the module's conventions; a CPU kernel counted
    as the CUDA kernel :func:`cuda_kernel` picks for it)."""
    packet = func._overloadpacket
    spec = SPECS[packet]
    bound = _bind(func, args, kwargs)
    if spec.nested and bound.get(spec.nested) is not None:  # jagged batches: as torch counts them (per sequence)
        from torch.utils.flop_counter import flop_registry

        return int(flop_registry[packet](*args, **kwargs, out_val=None))
    q, k, v = bound["query"], bound["key"], bound["value"]
    b, h, s_q, d = _dims(q, spec.layout)
    _, _, s_k, _ = _dims(k, spec.layout)
    d_v = int(v.shape[-1])
    causal, bottom_right = spec.causal(bound)
    fused = True
    if packet in (CPU_FORWARD, CPU_BACKWARD):
        mask = bound.get(spec.mask) if spec.mask else None
        fused = cuda_kernel(q.dtype, q.shape, k.shape, v.shape, has_mask=mask is not None, is_causal=causal) != MATH
    pairs = attended_pairs(s_q, s_k, causal and fused, bottom_right=bottom_right)
    if spec.backward:
        return backward_flops(b, h, s_q, s_k, d, d_v, pairs=pairs, recompute=fused)
    return forward_flops(b, h, s_q, s_k, d, d_v, pairs=pairs)


def kernel_params(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, list[int]]:
    """The record's ``params`` of an attention call: ``is_causal`` (and the efficient kernel's ``custom_mask_type``),
    defaults included, so the predictor knows the mask whatever the FLOPs."""
    bound = _bind(func, args, kwargs)
    causal, _ = SPECS[func._overloadpacket].causal(bound)
    out = {"is_causal": [int(causal)]}
    if "custom_mask_type" in bound:
        out["custom_mask_type"] = [int(bound.get("custom_mask_type") or 0)]
    return out


def _formula(packet: Any) -> Callable[..., int]:
    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return attention_flops(packet.default, args, kwargs)

    formula._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes the tensors, not their shapes
    return formula


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """Formulas for every attention operator, for ``FlopCounterMode(custom_mapping=...)`` and the recorder's
    registry (over torch's own, which misses the CPU kernel and causality)."""
    return {packet: _formula(packet) for packet in SPECS}


# -------------------------------------------------------------------------------------------- the CPU's kernel


def cuda_record(
    func: Any, args: Sequence[Any], kwargs: dict[str, Any], shapes: list[list[int]], dtypes: list[str]
) -> tuple[str, list[list[int]], list[str], str]:
    """A CPU attention call as the CUDA kernel's record: (operator name, shapes and dtypes in that operator's
    argument order, kernel). Only for :data:`CPU_FORWARD` and :data:`CPU_BACKWARD`."""
    backward = func._overloadpacket is CPU_BACKWARD
    bound = _bind(func, args, kwargs)
    q, k, v, mask = bound["query"], bound["key"], bound["value"], bound.get("attn_mask")
    kernel = cuda_kernel(
        q.dtype, q.shape, k.shape, v.shape, has_mask=mask is not None, is_causal=bool(bound["is_causal"])
    )
    name = CUDA_OPS[kernel][1 if backward else 0]
    if backward and kernel == EFFICIENT and mask is not None and len(shapes) == 7:
        # CPU: grad_out, q, k, v, out, logsumexp, attn_mask; CUDA: grad_out, q, k, v, attn_bias, out, logsumexp
        order = [0, 1, 2, 3, 6, 4, 5]
        shapes, dtypes = [shapes[i] for i in order], [dtypes[i] for i in order]
    return name, shapes, dtypes, kernel


def effective_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype SDPA runs ``t`` in: autocast's lower precision for a float32 input under CPU autocast (SDPA is on
    CUDA's lower-precision list), else its own."""
    if t.dtype == torch.float32 and torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return t.dtype


class CudaAttentionOnCpu(TorchFunctionMode):
    """While active, ``F.scaled_dot_product_attention`` with dropout runs with dropout 0 when CUDA would run a fused
    kernel for it: the CPU's fused kernel has no dropout (torch then falls back to the unfused math path in float32),
    CUDA's flash and memory-efficient kernels apply it on chip (same matmuls, same bytes). For captures only: the
    numbers of the step change (no attention dropout), its kernels and shapes are CUDA's. ``dropped`` counts the
    calls by dropout probability."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: Counter[float] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.nn.functional.scaled_dot_product_attention:
            with contextlib.suppress(Exception):  # an argument this cannot read: the call runs as given
                args, kwargs = self._without_dropout(args, kwargs)
        return func(*args, **kwargs)

    def _without_dropout(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        given = dict(zip(names, args)) | kwargs
        p = float(given.get("dropout_p") or 0.0)
        q, k, v = given["query"], given["key"], given["value"]
        if p <= 0.0 or q.device.type == "cuda":
            return args, kwargs
        has_mask, causal = given.get("attn_mask") is not None, bool(given.get("is_causal"))
        kernel = cuda_kernel(effective_dtype(q), q.shape, k.shape, v.shape, has_mask=has_mask, is_causal=causal)
        if kernel == MATH:
            return args, kwargs
        self.dropped[p] += 1
        if len(args) > 4:
            return (*args[:4], 0.0, *args[5:]), kwargs
        return args, {**kwargs, "dropout_p": 0.0}

    def note(self) -> str | None:
        if not self.dropped:
            return None
        calls = ", ".join(f"p={p:g} x{n}" for p, n in sorted(self.dropped.items()))
        return (
            f"attention dropout ({calls}) run at p=0 on CPU, so the step records the fused kernel CUDA runs (CUDA "
            "applies dropout inside flash/memory-efficient attention; the CPU's fused kernel has none)"
        )

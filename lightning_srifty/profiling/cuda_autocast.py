"""CUDA's autocast policy on CPU and fake tensors, so a step captured without a GPU runs the dtypes CUDA AMP would.

``torch.autocast("cuda")`` only acts on CUDA tensors, and a CPU-only torch cannot run autograd on fake CUDA tensors
(no CUDA device guard), while CPU autocast follows a different policy (it leaves ``layer_norm`` in bfloat16 and casts
``cat``/``stack``...). :func:`cuda_autocast_policy` therefore re-registers, for the duration of a ``with`` block, the
``AutocastCPU`` kernels of exactly the operators that have an ``AutocastCUDA`` kernel in this torch, with CUDA's cast
rule for each (lower precision, float32, float32 via the ``dtype`` argument, widest type), and makes the CPU-only
ones fall through. The rules are CUDA's lists of ``aten/src/ATen/autocast_mode.h``; ``tests/job/test_ops_capture.py``
checks they cover this torch's ``AutocastCUDA`` registrations exactly.

What still differs from CUDA: casts of leaf parameters are cached per block as CUDA does, but by the Python object
(the same parameter used twice in one forward is cast once, as on CUDA); ``binary_cross_entropy`` raises as on CUDA.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

LOWER_PRECISION = frozenset(
    [
        "_convolution",
        "_convolution.deprecated",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d.input",
        "conv_transpose3d.input",
        "convolution",
        "prelu",
        "addmm",
        "addmv",
        "addr",
        "matmul",
        "einsum",
        "mm",
        "mv",
        "linalg_vecdot",
        "linear",
        "addbmm",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "linalg_multi_dot",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "lstm_cell",
        "gru_cell",
        "rnn_tanh_cell",
        "rnn_relu_cell",
        "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
        "cudnn_convolution",
        "cudnn_convolution_transpose",
    ]
)
FLOAT32 = frozenset(
    [
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow.Tensor_Scalar",
        "pow.Tensor_Tensor",
        "pow.Scalar",
        "softplus",
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "frobenius_norm.dim",
        "nuclear_norm",
        "nuclear_norm.dim",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "nll_loss2d",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "upsample_nearest1d",
        "_upsample_nearest_exact1d",
        "upsample_nearest2d",
        "_upsample_nearest_exact2d",
        "upsample_nearest3d",
        "_upsample_nearest_exact3d",
        "upsample_linear1d",
        "upsample_bilinear2d",
        "_upsample_bilinear2d_aa",
        "upsample_trilinear3d",
        "upsample_bicubic2d",
        "_upsample_bicubic2d_aa",
        "norm.Scalar",
        "norm.ScalarOpt_dim",
        "rms_norm",
    ]
)
FLOAT32_VIA_DTYPE = frozenset(
    [
        "prod",
        "prod.dim_int",
        "softmax.int",
        "log_softmax.int",
        "cumprod",
        "cumsum",
        "linalg_vector_norm",
        "linalg_matrix_norm",
        "linalg_matrix_norm.str_ord",
        "sum",
        "sum.dim_IntList",
    ]
)
PROMOTE = frozenset(
    [
        "addcdiv",
        "addcmul",
        "atan2",
        "bilinear",
        "cross",
        "dot",
        "vdot",
        "grid_sampler",
        "index_put",
        "tensordot",
        "scatter_add",
    ]
)
BANNED = frozenset({"binary_cross_entropy"})

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def policy_names() -> frozenset[str]:
    """Every operator (``name`` or ``name.overload``) the emulated CUDA policy has a rule for."""
    return LOWER_PRECISION | FLOAT32 | FLOAT32_VIA_DTYPE | PROMOTE | BANNED


def _overload(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


class _Casts:
    """Casting with CUDA's eligibility rule (floating point, not float64) and its cache for leaf parameters."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def cast(self, value: Any, dtype: torch.dtype) -> Any:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point() or value.dtype in (torch.float64, dtype):
                return value
            cacheable = value.is_leaf and value.requires_grad and torch.is_autocast_cache_enabled()
            key = (id(value), dtype)
            if cacheable and key in self.cache:
                return self.cache[key]
            out = value.to(dtype)
            if cacheable:
                self.cache[key] = out
            return out
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast(v, dtype) for v in value)
        return value


def _eligible(values: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_eligible(v))
    return out


def _kernel(name: str, casts: _Casts) -> Any:
    op = _overload(name)
    if name in BANNED:

        def banned(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"torch.nn.functional.{name} is unsafe to autocast (CUDA refuses it); use "
                "binary_cross_entropy_with_logits, as CUDA autocast asks."
            )

        return banned
    dtype_index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            if name in LOWER_PRECISION:
                low = torch.get_autocast_dtype("cpu")
                args, kwargs = casts.cast(args, low), {k: casts.cast(v, low) for k, v in kwargs.items()}
            elif name in FLOAT32:
                args, kwargs = (
                    casts.cast(args, torch.float32),
                    {k: casts.cast(v, torch.float32) for k, v in kwargs.items()},
                )
            elif name in PROMOTE:
                found = _eligible(list(args) + list(kwargs.values()))
                if found:
                    wide = found[0].dtype
                    for t in found[1:]:
                        wide = torch.promote_types(wide, t.dtype)
                    args, kwargs = casts.cast(args, wide), {k: casts.cast(v, wide) for k, v in kwargs.items()}
            else:  # FLOAT32_VIA_DTYPE: reductions and softmax run in float32 when the input is lower precision
                given = kwargs.get("dtype") if dtype_index is None or len(args) <= dtype_index else args[dtype_index]
                first = _eligible(args[:1])
                if given is None and first and first[0].dtype != torch.float32:
                    if dtype_index is not None and len(args) > dtype_index:
                        args = (*args[:dtype_index], torch.float32, *args[dtype_index + 1 :])
                    else:
                        kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


def _registered(key: str) -> set[str]:
    """aten operators with a kernel for this dispatch key (``name`` or ``name.overload``)."""
    found = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    return {r.removeprefix("aten::") for r in found if r.startswith("aten::")}


@contextlib.contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """While open, CPU autocast (``torch.autocast("cpu", dtype)``) casts as CUDA autocast would.

    Process-wide for its duration (it re-registers dispatcher kernels); the previous kernels come back on exit.
    """
    casts = _Casts()
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
            cuda_ops, cpu_ops = _registered("AutocastCUDA"), _registered("AutocastCPU")
            for name in sorted(cuda_ops & policy_names()):
                lib.impl(name, _kernel(name, casts), "AutocastCPU")
            for name in sorted(cpu_ops - cuda_ops):
                lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
        yield
    finally:
        casts.cache.clear()
        lib._destroy()

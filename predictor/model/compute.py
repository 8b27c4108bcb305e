"""Compute time of one step on another GPU: a compute-bound part scaled by peak FLOPS and a memory-bound part
scaled by memory bandwidth (not the peak-FLOPS ratio alone, which overestimates tensor-core speedups up to 3.4x
on the shared measurements; the bandwidth ratio stays within +-25%).

Roofline decomposition: of a step that takes t on the source GPU, F / P (its FLOPs at the source's peak) is the
compute-bound time and scales with peak FLOPS; the rest scales with memory bandwidth. So the compute-bound share is
the achieved fraction of peak, F / (P t), when the profile counted FLOPs, else a neutral 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.catalog.gpus import GPU

DEFAULT_COMPUTE_SHARE = 0.5


def peak_tflops(gpu: GPU, precision: str, matmul_precision: str | None = None) -> float | None:
    """Dense peak for the precision the step runs in (TF32 for fp32 when torch allows it)."""
    if precision.startswith("bf16"):
        return gpu.bf16_tflops or gpu.fp16_tflops or gpu.fp32_tflops
    if precision.startswith("16") or precision.startswith("transformer-engine"):
        return gpu.fp16_tflops or gpu.fp32_tflops
    if matmul_precision in ("high", "medium") and gpu.tf32_tflops:
        return gpu.tf32_tflops
    return gpu.fp32_tflops


def crosses_tf32(src: GPU, dst: GPU, precision: str) -> bool:
    """Whether an FP32 step moves between a GPU that runs its convolutions (and, where allowed, its matmuls) on TF32
    tensor cores and one that runs them on the FP32 CUDA cores (:attr:`GPU.tf32_convolutions`). Its FLOPs then go
    to another pipe at a share of its peak that depends on the operator: on the lent H100 ResNet-50's TF32
    convolutions ran at 0.34 of the TF32 peak, XLA's TF32 dots at 0.64-0.81, against large FP32 GEMMs at 0.7-0.9 of
    the FP32 peak (NeuSight's kernels). A step's FLOPs alone do not say which operators they are, so a prediction
    across this line has its own held-out width (``cross-flops-tf32``)."""
    if precision.startswith(("bf16", "16", "transformer-engine", "64")):  # 16-bit, FP8 or FP64: no TF32 either side
        return False
    return runs_tf32(src) != runs_tf32(dst)


def tf32_kind(kind: str, src: GPU, dst: GPU, precision: str) -> str:
    """The kind of a prediction without an operator table (``cross``, ``cross-flops``, ``cross-corrected``), or its
    ``-tf32`` regime when the step crosses the TF32 line (:func:`crosses_tf32`): each has its own held-out width."""
    return f"{kind}-tf32" if crosses_tf32(src, dst, precision) else kind


def runs_tf32(gpu: GPU) -> bool:
    """Whether ``gpu`` runs FP32 convolutions on TF32 tensor cores: by its compute capability, or where a user-defined
    GPU does not state one, by whether it states a TF32 peak (what :func:`peak_tflops` prices it at)."""
    return gpu.tf32_convolutions if gpu.capability is not None else bool(gpu.tf32_tflops)


@dataclass(frozen=True)
class ComputeScale:
    ratio: float  # target time / source time
    compute_share: float
    flops_ratio: float | None
    bandwidth_ratio: float | None
    basis: str


def compute_ratio(
    src: GPU, dst: GPU, precision: str, matmul_precision: str | None = None, achieved_tflops: float | None = None
) -> ComputeScale:
    """How much longer (>1) or shorter (<1) the same step's compute takes on ``dst`` than on ``src``."""
    if src.key == dst.key:
        return ComputeScale(1.0, 1.0, 1.0, 1.0, "same GPU")
    p_src, p_dst = peak_tflops(src, precision, matmul_precision), peak_tflops(dst, precision, matmul_precision)
    flops = p_src / p_dst if p_src and p_dst else None
    bw = src.memory_bw_gbps / dst.memory_bw_gbps if src.memory_bw_gbps and dst.memory_bw_gbps else None
    if achieved_tflops is not None and p_src:
        share = min(1.0, max(0.0, achieved_tflops / p_src))
        basis = f"compute-bound share {share:.2f} from the profile's achieved {achieved_tflops:.1f} TFLOP/s"
    else:
        share = DEFAULT_COMPUTE_SHARE
        basis = "compute-bound share 0.5 (no FLOPs in the profile)"
    if flops is None:
        if bw is None:
            raise ValueError(f"no comparable specs for {src.key} and {dst.key}")
        return ComputeScale(bw, 0.0, None, bw, basis + "; peak FLOPS unknown: bandwidth ratio only")
    if bw is None:
        return ComputeScale(flops, 1.0, flops, None, basis + "; bandwidth unknown: FLOPS ratio only")
    return ComputeScale(share * flops + (1 - share) * bw, share, flops, bw, basis)

"""Sixteen-bit tensor-core GEMMs priced wave by wave from measured ceilings.

The kernel model (:mod:`predictor.model.kernels`) learned FP32 kernels; a tensor-core GEMM is not an FP32 GEMM run
faster. Against XLA's measured dot rates on H100 and B200 (``bench/xla_gemm.py``) the FP32-learned utilisation
applied to the tensor-core peak priced H100 bf16 GEMMs 1.49x too slow (median; 2x for the small ones, 1.21x for the
largest) and B200's largest 0.82x too fast. A tensor-core GEMM is priced here from what bounds it physically:

- **Waves of output tiles.** cuBLAS tiles the output in blocks of ``T_m x T_n`` (:data:`TILES`: 64-256 a side, the
  size of the CTA tiles its 16-bit kernels use; the lent H100 ran ``nvjet_sm90_hsh_192x192`` ones); each SM
  computes one tile at a time, so a GEMM takes ``ceil(tiles / SMs)`` waves of ``2 T_m T_n k`` FLOPs at the SM's
  share of the sustained rate. The library picks the tile that finishes first
  (the minimum over :data:`TILES`), and splits the contraction when the tiles alone cannot fill the SMs (split-K:
  up to ``SMs / tiles`` slices of at least :data:`SPLIT_K_MIN` of ``k``).
- **The sustained rate** is the GPU's best measured share of its dense tensor-core peak
  (:data:`MATMUL_CEILING`: the Maximum Achievable Matmul FLOPS of each GPU, a brute-force search over shapes, bf16
  inputs: stas00/ml-engineering ``compute/accelerator/README.md``). A GPU without a published ceiling takes the
  best share of its FP32 peak the kernel model gives its large FP32 GEMMs (:func:`fp32_ceiling`): the same bound
  measured on the other pipe; against the published ceilings it is within -11 % (H100) to +17 % (B300). TF32
  GEMMs are not priced here (:func:`predictor.model.ops._tensor_dense` says why); TF32 convolutions are, at the
  16-bit ceiling on the TF32 peak (:func:`predictor.model.ops.implicit_gemm_time`).
- **Memory**: never faster than moving the operands and the result once, ``bytes / bandwidth``.
- **A kernel's fixed cost in a stream** (:data:`RAMP_S`): the prologue that fills the pipeline and the epilogue that
  writes the tile, which a queued kernel pays however small (XLA's smallest dots take 5-6 us on both GPUs). 6 us
  fitted on each GPU's rows of XLA's table gives the same value on the other (leave-one-GPU-out); bounded below
  by :data:`predictor.model.kernels.MIN_KERNEL_S` and above by the GEMM launch floor.

``t = max(min over tiles of waves x tile time, bytes / bandwidth) + RAMP_S``, in-stream seconds (what a step pays;
the isolated latency adds the class's dispatch, :meth:`KernelModel.dispatch`). Fused attention keeps its own
published ceiling (:func:`predictor.model.ops.attention_ceiling`); convolutions on tensor cores are priced here as
the implicit GEMMs cuDNN runs (:func:`predictor.model.ops.implicit_gemm_time`), their FP32 CUDA-core ones by the
kernel model.
"""

from __future__ import annotations

import numpy as np

from predictor.catalog.gpus import GPU

# cuBLAS CTA tile shapes (rows x columns of the output) considered for a tensor-core GEMM
TILES = ((128, 128), (128, 256), (256, 128), (64, 128), (128, 64))
SPLIT_K_MIN = 256  # a split-K slice keeps at least this much of the contraction
RAMP_S = 6e-6  # a tensor-core GEMM kernel's fixed in-stream cost (see the module docstring)
# Maximum Achievable Matmul FLOPS as a share of the dense bf16 peak, measured (stas00/ml-engineering
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", @ b9e2972): A100 SXM 271.2 of
# 312 (torch 2.6), A100 PCIe 252.9 of 312 (2.5.1), H100 SXM 794.5 of 989 ("H200 is the same"; 2.7.0), B200 1745 of
# 2250 (2.7.1), B300 1769 of 2250 (2.9.1). Keyed by the catalog's GPU; the 40 and 80 GB boards share a die and clocks.
MATMUL_CEILING = {
    "A100-SXM-40GB": 271.2 / 312,
    "A100-SXM-80GB": 271.2 / 312,
    "A100-PCIe-40GB": 252.9 / 312,
    "A100-PCIe-80GB": 252.9 / 312,
    "H100-SXM": 794.5 / 989,
    "H200-SXM": 794.5 / 989,
    "B200-SXM": 1745.0 / 2250,
    "B300-SXM": 1769.0 / 2250,
}
# the large FP32 GEMMs whose best share of the FP32 peak stands in for an unpublished ceiling (fp32_ceiling)
_REFERENCE = {"b": np.array([1.0, 1.0, 4.0]), "m": np.array([4096.0, 8192.0, 4096.0]),
              "n": np.array([4096.0, 8192.0, 4096.0]), "k": np.array([4096.0, 8192.0, 4096.0])}  # fmt: skip


def fp32_ceiling(gpu: GPU) -> float:
    """The best share of ``gpu``'s FP32 peak the kernel model gives large FP32 GEMMs (at most 1): the ceiling of a
    GPU without a published tensor-core one (its power and memory limits, as the FP32 kernels show them). Kept on
    the kernel model it came from, so a held-out model (bench/ops_validation.py) answers with its own."""
    from predictor.model.kernels import load_kernel_model

    model = load_kernel_model()
    known: dict[GPU, float] = model.__dict__.setdefault("_tensor_ceilings", {})
    if gpu not in known:
        seconds = model.step_time("gemm", _REFERENCE, gpu)
        flops = 2.0 * _REFERENCE["b"] * _REFERENCE["m"] * _REFERENCE["n"] * _REFERENCE["k"]
        known[gpu] = float(min(1.0, np.max(flops / seconds) / (float(gpu.fp32_tflops or 0.0) * 1e12)))
    return known[gpu]


def ceiling(gpu: GPU) -> tuple[float, str]:
    """(share of the dense 16-bit tensor-core peak a GEMM sustains at best on ``gpu``, where it comes from)."""
    if gpu.key in MATMUL_CEILING:
        return MATMUL_CEILING[gpu.key], "measured (MAMF)"
    return fp32_ceiling(gpu), "the FP32 kernels' best share (no published tensor-core ceiling)"


def tensor_gemm_time(
    dims: dict[str, np.ndarray],
    gpu: GPU,
    dense_tflops: float,
    *,
    element_bytes: float = 2.0,
    moved: np.ndarray | None = None,
) -> np.ndarray:
    """In-stream seconds of 16-bit tensor-core GEMMs ``[b, m, k] @ [b, k, n]`` on ``gpu`` (see the module docstring).

    Args:
        dims: arrays ``b``, ``m``, ``n``, ``k`` (``k`` the contraction).
        gpu: needs ``sms`` and ``memory_bw_gbps``.
        dense_tflops: the dense tensor-core peak of the inputs' type (bf16 or fp16; TF32 for an FP32 convolution).
        element_bytes: bytes per element of the operands.
        moved: bytes the kernel really reads and writes, where they are not its GEMM's operands: an implicit-GEMM
            convolution reads its input, not the im2col matrix it multiplies (default: the operands and result).
    """
    b, m, n, k = (np.asarray(dims[key], dtype=float) for key in "bmnk")
    sms = float(gpu.sms or 0)
    share, _ = ceiling(gpu)
    per_sm = dense_tflops * 1e12 * share / sms
    best = np.full(np.broadcast(b, m, n, k).shape, np.inf)
    for tm, tn in TILES:
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        splits = np.clip(np.floor(sms / np.maximum(tiles, 1.0)), 1.0, np.maximum(np.floor(k / SPLIT_K_MIN), 1.0))
        waves = np.ceil(tiles * splits / sms)
        best = np.minimum(best, waves * 2.0 * tm * tn * (k / splits) / per_sm)
    nbytes = element_bytes * b * (m * k + k * n + m * n) if moved is None else np.asarray(moved, dtype=float)
    memory = nbytes / (float(gpu.memory_bw_gbps or 0) * 1e9)
    return np.where(b * m * n * k > 0, np.maximum(best, memory), 0.0) + RAMP_S

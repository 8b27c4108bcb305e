"""Step time from the profile's operator table: every ATen operator classified, predicted by the per-operator latency
model (:mod:`predictor.model.kernels`) on a GPU, and summed.

Classes and the dimensions taken from the recorded shapes:

- ``gemm``: mm, addmm, bmm, baddbmm (``b, m, n, k``); attention kernels as their two batched matmuls plus a softmax,
  scaled by the recorded FLOPs (their backward's, a causal mask's), or by the operator's name when none were recorded
  (backward 2.5 x the forward for the fused kernels);
- ``conv``: convolution and its backward (``b, cin, cout, kh, kw, h, w, stride, padding, groups``; the backward as
  the forward scaled by the recorded FLOPs); on tensor cores the implicit GEMM cuDNN runs (:func:`implicit_gemm_time`);
- ``layout``: cuDNN's NCHW <-> NHWC conversions around a convolution whose algorithm wants the other layout
  (``bytes``, ``nhwc``: the activations' layout as recorded; :func:`tensor_core_convolution` decides where);
- ``batch_norm``: element passes (``elements, passes, nhwc``; :func:`batch_norm_time`);
- ``pooling``: the bytes its kernels' window reads move (:func:`_pool`);
- ``norm``, ``softmax``: rows x columns over the last dimension(s);
- ``reduction``: sums, means, norms, losses;
- ``elementwise``: pointwise maths and activations (and their backward);
- ``memory``: copies, casts, fills, concatenation, embedding gathers and scatters, the optimizer's foreach kernels,
  and every operator the table cannot classify (bandwidth-bound; counted in the note, never dropped).

Composition: on the profiled GPU, the measured compute is scaled by the ratio of the operator sums (target /
profiled), so a systematic error of the latency model cancels; from a CPU or meta profile the sum is absolute, and
the host bounds it from below (Lightning's own step, ``LIGHTNING_STEP_S``, and eager PyTorch cannot launch faster
than ``HOST_S_PER_KERNEL`` per kernel).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from predictor.catalog.gpus import GPU
from predictor.documents.profile import OpRecord, Profile
from predictor.documents.work import profile_world
from predictor.exceptions import PredictionError
from predictor.model.tensor_gemm import RAMP_S, ceiling, fp32_ceiling, tensor_gemm_time

# Lightning's own host time per step besides the kernels it launches (its loop and hooks, the optimizer closure, the
# precision plugin, self.log and the progress bar): bench/lightning_overhead.py trains a one-parameter module with
# Trainer.fit (one self.log(prog_bar=True), as the demo logs) against the same operators in a plain loop, the batch in
# hand to the step done: 1,117 us a step more on the project's 2-core build VM (Xeon, KVM; torch 2.13, Lightning
# 2.6.6), 105 times that host's Python module call (nn.Linear's call less its operator: 16.3 - 5.7 us). Carried to the
# H100 host the kernel cost below is fitted on by its own module call (38 - 17.5 us, bench/host_dispatch.py): 2.2 ms.
# Bounds: >= 0; below the fastest host-bound step measured there (the demo CNN's 4.3 ms). Held out: the demo CNN and
# LM on the H100 (bench/host_floor.py).
LIGHTNING_STEP_MODULE_CALLS = 105.0
HOST_MODULE_CALL_S = 38e-6 - 17.5e-6  # the H100 host's nn.Linear call less a bare add (bench/host_dispatch.py)
LIGHTNING_STEP_S = LIGHTNING_STEP_MODULE_CALLS * HOST_MODULE_CALL_S
# The host's seconds per kernel of an eager Lightning step (Python, modules, autocast, the dispatcher, the launch): a
# step of many small kernels waits on the host, whatever the GPU. Measured (bench/host_floor.py) on an H100 whose host
# is a 16-vCPU Intel Xeon (family 6 model 207, KVM guest), torch 2.11: the median over six batch-1 steps of BERT-base,
# BERT-large and ResNet-50, FP32 and AMP, of the step less LIGHTNING_STEP_S per kernel (30-61 us; an upper bound, the
# GPU's few ms are in it); held out, the same models at batch 4 come out at 16.4 % and the demo CNN and LM at 4.1 %
# (the CNN 4.7 ms against 4.8 in the profile's window, 4.28 after it; 6 us and no Lightning term, the judgement it
# replaced: 89 % and 92 %; 48 us alone: 15.5 % and 33 %). Bounds: a
# bare tensor add from Python costs 17.5 us on that host (bench/host_dispatch.py), the least a kernel can cost;
# faster EC2 host cores take less, so on them the floor is conservative.
HOST_S_PER_KERNEL = 44.6e-6
# A measured step within this factor of the host's floor is taken as host-bound (its GPU share unknown): set on the
# spread of the host's cost per kernel over the six fitted steps (35-63 us about 48: +-30 %). With Lightning's step
# taken out that spread is 30-61 about 44.6 (x0.67-1.37); the band is kept: a wider one would call more measured
# steps host-bound (their ratio scaled from the model's GPU time, not the measurement) with no held-out set to check
# the change on.
HOST_BOUND_BAND = 1.3
# The most the operator model's GPU time on the profiled GPU (absolute constants) may fall short of a step the GPU
# bounds: its largest shortfalls on the held-out GPU-bound steps it was set on are 1.41x (bench/ops_validation.py's
# absolute path, BERT-base AMP on the H100) and 1.50x (the lent H100's ResNet-50 convolutions,
# bench/layout_pooling.py); 2.0 leaves a margin. A measured one-GPU step longer than this multiple of the model's GPU
# time is taken as the host's (an older PyTorch, a slower CPU, Python in the step: ryujaehun/pytorch-gpu-benchmark's
# 2021 A100 steps, PyTorch 1.7 on a 2.25 GHz EPYC, host-bound at about 63 us a kernel against HOST_S_PER_KERNEL's
# 44.6), which a GPU change does not take away, when its time per kernel is one a host can take
# (HOST_S_PER_KERNEL_MAX): the same set's ResNeXt-101 FP16 step on a TITAN RTX is 2.8x the model's GPU time at
# 166 us a kernel, a GPU the model prices too fast rather than a host. The step is then host-bound, like one
# within HOST_BOUND_BAND of the floor, and the measured micro-step (the profiled host's) is the floor on every GPU.
# Bounds: >= the largest shortfall it was set on (1.5). Scored on data nobody fitted it on: bench/cnn_zoo.py.
GPU_EXPLAINS_AT_MOST = 2.0
# The most a host can take per kernel of an eager step for a step over GPU_EXPLAINS_AT_MOST to be called the host's:
# a longer one is a GPU the model prices too fast (bench/cnn_zoo.py's ResNeXt-101 FP16 step on the TITAN RTX: 166 us
# a kernel), not a host. Judgement, flagged: 150 us, a host at under a third of the fitted one's speed
# (HOST_S_PER_KERNEL 44.6 us); the slowest host-bound steps of that set (111 us on the 2021 A100, 130 on the TITAN
# RTX's host, zero_grad's fills and the batch copy in the step) are under it. Bounds: >= HOST_S_PER_KERNEL.
HOST_S_PER_KERNEL_MAX = 150e-6
# How sharp the three thresholds above are. A measured step within a few per cent of one is no more the host's than
# the GPU's: each threshold is a ramp of this factor either side of it (in log), across which the step is read as the
# host's with a weight from 0 to 1 (:func:`host_bound_weight`), and the prediction moves between the two readings
# continuously (the micro-step on a target, the two readings' geometric blend; the host's floor, theirs, geometric:
# :func:`_gpu_part`). Set on the measured step's own spread, not fitted: a profile's run-to-run CV is
# 1-3 % (the lent H100's steps), so x1.1 is about three of its sd. Before, a step 1.7 % longer crossed
# HOST_S_PER_KERNEL_MAX and moved a T4 prediction 5.6x (a review's sweep). Bounds: > 1; below HOST_BOUND_BAND (a
# ramp wider than the band would call a step at the floor partly the GPU's).
HOST_BOUND_RAMP = 1.1
HALF = {"float16", "bfloat16", "half"}
# Element passes per SM per clock cycle of cuDNN's NCHW batch-norm kernels (batch_norm_time): fitted on the lent
# H100's ResNet-50 steps (bench/layout_pooling.py fit: forward 3 and backward 5 passes, AMP at 1,280 and FP32 at
# 640, the kernels' time); see BENCHMARKS.md "Convolutional steps priced as they run". Bounds: above 0, below
# the 4-8 single-precision loads an SM issues per cycle (its load/store units).
BN_PASSES_PER_SM_CYCLE = 1.85
# cuDNN's NCHW <-> NHWC conversions around a convolution whose algorithm wants the other layout
# (tensor_core_convolution), per step, as conversions of every forward convolution's input and output elements:
# fitted on the lent H100's two ResNet-50 steps (bench/layout_pooling.py; the conversion kernels' time, AMP at 1,280
# and FP32 at 640, over the memory model's time for one conversion): see BENCHMARKS.md "Convolutional steps priced
# as they run". Bounds: 0 (channels-last activations on tensor cores) to 3 (input and output converted in each of the
# three passes: forward, data gradient, weight gradient).
LAYOUT_CONVERSIONS = 0.97
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "half": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


_GEMM = {"mm", "addmm", "bmm", "baddbmm", "_addmm_activation"}
_ATTENTION_PREFIX = ("_scaled_dot_product", "_flash_attention", "_efficient_attention")
_CONV = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable", "mkldnn_convolution"}
_CONV_BACKWARD = {"convolution_backward", "convolution_backward_overrideable", "cudnn_convolution_backward"}
_NORM = {
    "native_layer_norm",
    "native_layer_norm_backward",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "native_batch_norm_backward",
    "cudnn_batch_norm",
    "cudnn_batch_norm_backward",
    "native_group_norm",
    "native_group_norm_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
}
_SOFTMAX = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"}
_REDUCTION = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "var",
    "std",
    "var_mean",
    "std_mean",
    "norm",
    "linalg_vector_norm",
    "prod",
    "all",
    "any",
    "nll_loss_forward",
    "nll_loss_backward",
    "nll_loss2d_forward",
    "nll_loss2d_backward",
    "mse_loss",
    "mse_loss_backward",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cumsum",
    "topk",
    "sort",
}
_MEMORY = {
    "copy",
    "copy_",
    "_to_copy",
    "clone",
    "contiguous",
    "cat",
    "stack",
    "fill",
    "fill_",
    "zero",
    "zero_",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "empty",
    "empty_like",
    "empty_strided",
    "new_zeros",
    "new_empty",
    "new_empty_strided",
    "embedding",
    "embedding_dense_backward",
    "index_select",
    "index",
    "index_put",
    "index_put_",
    "_index_put_impl_",
    "index_add",
    "gather",
    "scatter",
    "scatter_add",
    "constant_pad_nd",
    "masked_scatter",
    "slice_backward",
    "select_backward",
    "repeat",
    "roll",
    "flip",
    "tril",
    "triu",
    "arange",
    "randperm",
}
# Pooling, priced by the reads its kernels really make (:func:`_pool`), not by its tensors' bytes.
_POOL = {
    "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward",
}
_ELEMENTWISE_WORDS = frozenset(
    (
        "add",
        "sub",
        "mul",
        "div",
        "relu",
        "gelu",
        "silu",
        "tanh",
        "sigmoid",
        "threshold",
        "pow",
        "sqrt",
        "rsqrt",
        "exp",
        "log",
        "neg",
        "abs",
        "where",
        "masked",
        "clamp",
        "dropout",
        "bernoulli",
        "lerp",
        "addcmul",
        "addcdiv",
        "maximum",
        "minimum",
        "sign",
        "erf",
        "hardtanh",
        "leaky_relu",
        "elu",
        "softplus",
        "mish",
        "reciprocal",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical",
        "bitwise",
        "sin",
        "cos",
        "floor",
        "ceil",
        "round",
        "trunc",
        "rand",
        "uniform",
        "normal",
        "isnan",
        "isinf",
        "nan_to_num",
        "adam",
        "adamw",
        "sgd",
        "square",
        "hardswish",
        "hardsigmoid",
        "glu",
        "expm1",
        "log1p",
        "xlogy",
        "fmod",
        "remainder",
    )
)


def base_name(op: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``aten.add_.Tensor`` -> ``add_``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims") else parts[0]


@dataclass(frozen=True)
class Classified:
    """One record as the latency model sees it: a class, its dimensions, and how much its latency is scaled."""

    cls: str
    dims: dict[str, float]
    scale: float  # calls x (recorded FLOPs / FLOPs of the class's forward shape, for backward kernels)
    half: bool  # fp16/bf16 inputs (tensor cores for gemm/conv)
    element_bytes: float
    op: str
    extra: tuple[Classified, ...] = ()  # attention: its softmax
    dtype: str | None = None  # the first input's dtype as recorded (None: not recorded)
    phase: str = ""  # forward, backward or optimizer, as recorded


def _numel(shape: Sequence[int]) -> float:
    return float(math.prod(shape)) if shape else 1.0


def _dtype_bytes(dtype: str | None) -> float:
    return float(DTYPE_BYTES.get((dtype or "float32").replace("torch.", ""), 4))


def record_dtype(rec: OpRecord) -> str:
    """The dtype a record is sized by: its first input's, else its output's (float32 when neither is recorded)."""
    return (rec.dtypes[0] if rec.dtypes else rec.out_dtype or "float32").replace("torch.", "")


def classify(rec: OpRecord) -> Classified:
    """The class and dimensions of one record (``memory`` for anything unrecognised, by its bytes)."""
    name = base_name(rec.op)
    if not name.startswith("_"):
        name = name.rstrip("_")  # in-place variants classify as their out-of-place operator
    shapes = [list(s) for s in rec.shapes]
    dtype = record_dtype(rec)
    half = dtype in HALF
    eb = _dtype_bytes(dtype)
    total_bytes = rec.bytes_read + rec.bytes_written
    out_numel = _numel(rec.out_shapes[0]) if rec.out_shapes else (_numel(shapes[0]) if shapes else 0.0)
    try:
        if name in _GEMM:
            return _gemm(name, shapes, rec, half, eb)
        if name.startswith(_ATTENTION_PREFIX):
            return _attention(name, shapes, rec, half, eb)
        if name in _CONV or name in _CONV_BACKWARD:
            return _conv(name in _CONV_BACKWARD, shapes, rec, half, eb)
    except (IndexError, ValueError, ZeroDivisionError):
        pass  # a shape this classifier does not understand: bandwidth-bound below, with the others it cannot read
    if name in _NORM:
        return _norm(name, shapes, rec, half, eb, total_bytes)
    if name in _POOL:  # 4-D (batched 2-D pooling) by its window reads, else bandwidth-bound by its bytes
        if shapes and len(shapes[0]) == 4:
            return _pool(name, shapes, rec, half, eb)
        return Classified("memory", {"bytes": total_bytes}, rec.count, half, eb, rec.op)
    if name in _SOFTMAX:
        cols = float(shapes[0][-1]) if shapes and shapes[0] else 1.0
        rows = (_numel(shapes[0]) if shapes else 0.0) / max(cols, 1.0)
        return Classified("softmax", {"rows": rows, "cols": cols, "bytes": total_bytes}, rec.count, half, eb, rec.op)
    raw = base_name(rec.op)
    plain = raw.strip("_")
    if raw in _MEMORY:  # _to_copy (casts), before the underscore is stripped
        return Classified("memory", {"bytes": total_bytes}, rec.count, half, eb, rec.op)
    if plain in _REDUCTION or plain.rstrip("_") in _REDUCTION:
        n = _numel(shapes[0]) if shapes else 0.0
        return Classified("reduction", {"n": n, "bytes": total_bytes}, rec.count, half, eb, rec.op)
    # foreach optimizers, and GradScaler's unscale (a foreach pass over the gradients) and scale update (one scalar),
    # which a profile recorded on a GPU under 16-mixed holds
    if plain.startswith(("foreach", "amp_")) or plain in _MEMORY or plain.rstrip("_") in _MEMORY:
        return Classified("memory", {"bytes": total_bytes}, rec.count, half, eb, rec.op)
    if _ELEMENTWISE_WORDS.intersection(plain.split("_")):
        return Classified(
            "elementwise",
            {"n": out_numel, "bytes": total_bytes, "flops": float(rec.flops)},
            rec.count,
            half,
            eb,
            rec.op,
        )
    return Classified("memory", {"bytes": total_bytes}, rec.count, half, eb, rec.op + "?")


def _norm(name: str, shapes: list[list[int]], rec: OpRecord, half: bool, eb: float, total_bytes: float) -> Classified:
    """A normalisation: batch norm per channel over N x H x W (:func:`batch_norm_time`), the others over the
    normalised trailing size (the kernel model's norm network)."""
    x = shapes[0] if shapes else []
    if "batch" in name:
        # element passes: the forward reads x twice (statistics, then normalise) and writes y; the backward reads
        # x and dy twice (the reductions, then dx) and writes dx; inference reads x and writes y
        passes = 5.0 if "backward" in name else (2.0 if "no_training" in name else 3.0)
        nhwc = 1.0 if (rec.params or {}).get("channels_last") else 0.0
        dims = {"elements": _numel(x), "passes": passes, "nhwc": nhwc}
        return Classified("batch_norm", dims, rec.count, half, eb, rec.op)
    weights = [s for s in shapes[1:] if len(s) == 1]
    cols = float(weights[-1][0]) if weights else float(x[-1] if x else 1)
    rows = _numel(x) / max(cols, 1.0)
    return Classified("norm", {"rows": rows, "cols": cols, "bytes": total_bytes}, rec.count, half, eb, rec.op)


def batch_norm_time(dims: Mapping[str, np.ndarray], gpu: GPU, eb: float, model: Any) -> np.ndarray:
    """In-stream seconds of batch-norm calls: their element passes (:func:`_norm`) at the memory model's bandwidth
    in the inputs' dtype, and on NCHW activations never faster than :data:`BN_PASSES_PER_SM_CYCLE` element passes
    per SM per clock cycle. cuDNN's NCHW kernels (``bn_fw_tr_1C11_kernel_NCHW``, ``bn_bw_1C11_kernel_new``) reduce
    one channel's N x H x W strided elements per thread block and compute in fp32 whatever the input: on the lent
    H100 they moved the same elements per second in FP32 and in AMP (twice the batch, half the bytes, the same
    time per element), so their bound is the SMs' issue rate, not the bandwidth. Channels-last activations run
    PyTorch's / cuDNN's NHWC kernels, which vectorise over the contiguous channels: bandwidth-bound."""
    moved = dims["elements"] * dims["passes"] * eb
    memory = model.step_time("memory", {"bytes": moved}, gpu, element_bytes=eb)
    if not gpu.sms or not gpu.clock_mhz:
        return memory
    issue = dims["elements"] * dims["passes"] / (BN_PASSES_PER_SM_CYCLE * gpu.sms * gpu.clock_mhz * 1e6)
    return np.where(dims["nhwc"] == 1.0, memory, np.maximum(memory, issue))


def _pair(value: Sequence[int] | None, default: int) -> tuple[int, int]:
    """A pooling/convolution parameter as (height, width): one value for both, or none (``default``)."""
    if not value:
        return default, default
    return (int(value[0]), int(value[0])) if len(value) == 1 else (int(value[0]), int(value[1]))


def _pool(name: str, shapes: list[list[int]], rec: OpRecord, half: bool, eb: float) -> Classified:
    """Pooling by the reads its kernels make, at 4 bytes an element (they compute in fp32, as batch norm does):

    - forward (max, average): every output element reads its k_h x k_w window and writes its value (max: and its
      int64 index);
    - backward of a strided pooling: every input element gathers the gradient (max: and the index) of each window
      that covers it, ceil(k_h / s_h) x ceil(k_w / s_w) of them (PyTorch's NCHW kernels loop over the windows per
      input element), and writes its own;
    - adaptive average pooling (a network's head): its input read once and its output written.

    On the lent H100 (ResNet-50's one 3x3 / 2 max pooling over 112 x 112 x 64, bench/data/h100_kernel_breakdown_*):
    the forward measured 4.1 / 2.0 ms (AMP 1,280 / FP32 640) and the backward 11.4 / 5.7 ms: twice the elements,
    twice the time in either precision, where their tensors' bytes at the bandwidth are 1.4 / 1.1 ms. BENCHMARKS.md
    "Convolutional steps priced as they run" scores the rule."""
    params = rec.params or {}
    x = shapes[0]
    out_numel = _numel(rec.out_shapes[0]) if rec.out_shapes else _numel(x)
    if name.startswith("_adaptive_avg_pool2d"):
        inputs = _numel(shapes[1]) if name.endswith("backward") and len(shapes) > 1 else _numel(x)
        outputs = _numel(x) if name.endswith("backward") else out_numel
        moved = 4.0 * (inputs + outputs)
    else:
        kh, kw = _pair(params.get("kernel_size"), 1)
        sh, sw = _pair(params.get("stride"), 0)
        sh, sw = sh or kh, sw or kw  # stride defaults to the kernel size
        index = 8.0 if name.startswith("max_pool") else 0.0
        if name.endswith("backward"):  # grad_output, input (, indices)
            inputs = _numel(shapes[1]) if len(shapes) > 1 else out_numel
            windows = math.ceil(kh / max(sh, 1)) * math.ceil(kw / max(sw, 1))
            moved = inputs * (windows * (4.0 + index) + 4.0)
        else:
            moved = out_numel * (kh * kw * 4.0 + 4.0 + index)
    return Classified("pooling", {"bytes": moved}, rec.count, half, eb, rec.op)


def _gemm(name: str, shapes: list[list[int]], rec: OpRecord, half: bool, eb: float) -> Classified:
    mats = [s for s in shapes if len(s) >= 2]
    if name in ("mm",):
        (m, k), (_, n) = mats[0][-2:], mats[1][-2:]
        b = 1
    elif name in ("addmm", "_addmm_activation"):
        (m, k), (_, n) = mats[-2][-2:], mats[-1][-2:]
        b = 1
    else:  # bmm, baddbmm: [b, m, k] @ [b, k, n]
        a, w = mats[-2], mats[-1]
        b, m, k, n = a[0], a[1], a[2], w[2]
    return Classified("gemm", {"b": b, "m": m, "n": n, "k": k}, rec.count, half, eb, rec.op)


def _attention(name: str, shapes: list[list[int]], rec: OpRecord, half: bool, eb: float) -> Classified:
    """Fused attention as q @ k^T and p @ v plus its softmax, scaled by the recorded FLOPs (the backward's, a causal
    mask's), or when none are recorded by :func:`attention_work` from the operator's name and ``is_causal``.

    The fused kernels (flash, memory-efficient, cuDNN) never write the s_q x s_k scores to memory: the softmax is
    arithmetic on chip (max, subtract, exp, sum: ~4 operations per score) over the kernel's real traffic (q, k, v,
    the output and, backward, their gradients), so it is a streaming kernel over the scores, not a softmax over a
    materialised matrix (which would read and write 2 x s_q x s_k elements per head). The math path
    (``_scaled_dot_product_attention_math``) does materialise them: its softmax moves them too.
    """
    backward = "backward" in name or (name == "_scaled_dot_product_attention_math" and rec.phase == "backward")
    q, k, v = shapes[1:4] if "backward" in name else shapes[0:3]
    batch: float
    if name.startswith(("_flash_attention", "_efficient_attention")):  # [b, s, h, d]
        batch, s_q, d, s_k = q[0] * q[2], q[1], q[3], k[1]
    else:  # [..., h, s, d]
        batch, s_q, d, s_k = _numel(q[:-2]), q[-2], q[-1], k[-2]
    d_v = v[-1]
    forward_flops = 2 * batch * s_q * s_k * (d + d_v)  # every pair: the gemm below
    ratio = rec.flops / forward_flops if rec.flops > 0 else attention_work(name, rec.params, s_q, s_k, backward)
    scale = rec.count * ratio
    scores = batch * s_q * s_k
    moved = (rec.bytes_read + rec.bytes_written) / ratio  # per forward-equivalent: the call's bytes, once per call
    if name == "_scaled_dot_product_attention_math":
        moved += 4 * scores * eb  # scores and probabilities written and read back
    soft = Classified("elementwise", {"n": scores, "bytes": moved, "flops": 4.0 * scores}, scale, half, eb, rec.op)
    return Classified("gemm", {"b": batch, "m": s_q, "n": s_k, "k": d}, 2 * scale, half, eb, rec.op, (soft,))


def attention_work(name: str, params: Mapping[str, Sequence[int]] | None, s_q: int, s_k: int, backward: bool) -> float:
    """An attention call's work over an unmasked forward's (its two matmuls), from the operator alone: for records
    without FLOPs (profiles from before the attention formulas recorded ``_scaled_dot_product_flash_attention_for_cpu``
    with 0). Backward: 2.5 for the fused kernels (five matmuls: the scores are recomputed), 2 for the math path (four:
    they were saved). A causal mask (``is_causal``, ``custom_mask_type`` 1/2 in ``params``) makes the fused kernels
    skip the tiles above the diagonal: the share of (query, key) pairs on or below it (about half). Without
    ``params`` (older profiles) the mask is unknown: counted unmasked."""
    fused = name != "_scaled_dot_product_attention_math"
    ratio = (2.5 if fused else 2.0) if backward else 1.0
    params = params or {}
    causal = bool((params.get("is_causal") or [0])[0]) or (params.get("custom_mask_type") or [0])[0] in (1, 2)
    if causal and fused and s_q > 0 and s_k > 0:
        bottom_right = name.startswith("_flash_attention") or (params.get("custom_mask_type") or [0])[0] == 2
        ratio *= _causal_pairs(int(s_q), int(s_k), bottom_right) / (s_q * s_k)
    return ratio


def _causal_pairs(s_q: int, s_k: int, bottom_right: bool) -> int:
    """(query, key) pairs on or below the causal diagonal (top-left aligned as torch's ``is_causal``, or bottom-right
    as flash-attention's own ``causal``); :func:`lightning_srifty.profiling.attention.attended_pairs` in the
    torch-free predictor."""
    a = 1 + (s_k - s_q if bottom_right else 0)  # query i sees min(max(i + a, 0), s_k) keys
    first = min(max(0, 1 - a), s_q)
    full = min(max(first, s_k - a), s_q)
    return (full - first) * (first + full - 1 + 2 * a) // 2 + (s_q - full) * s_k


def _conv(backward: bool, shapes: list[list[int]], rec: OpRecord, half: bool, eb: float) -> Classified:
    params = rec.params or {}
    if backward:  # grad_output, input, weight
        x, w = shapes[1], shapes[2]
    else:
        x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        raise ValueError("not a 2-D convolution")
    n, cin, h, wd = x
    cout, _, kh, kw = w
    stride = (params.get("stride") or [1])[0]
    padding = (params.get("padding") or [0])[0]
    groups = (params.get("groups") or [1])[0]
    # the output's pixels as recorded (the forward's output, the backward's grad_output), which strides, dilation,
    # uneven kernels and paddings give; from the first stride and padding only when not recorded
    y = (rec.out_shapes[0] if rec.out_shapes else None) if not backward else shapes[0]
    if y is not None and len(y) == 4:
        oh, ow = y[2], y[3]
    else:
        oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    dims: dict[str, float] = {
        "b": n,
        "cin": cin,
        "cout": cout,
        "kh": kh,
        "kw": kw,
        "h": h,
        "w": wd,
        "stride": stride,
        "padding": padding,
        "groups": groups,
        "oh": max(oh, 1),
        "ow": max(ow, 1),
        "transposed": 1.0 if (params.get("transposed") or [0])[0] else 0.0,
    }
    scale = float(rec.count)
    if not backward:
        # the layout conversions cuDNN makes around it, for the whole step (forward and backward), priced where the
        # GPU's algorithm wants the other layout (ops_time): LAYOUT_CONVERSIONS x (input + output elements), each
        # read and written at 4 bytes (the conversion kernels compute in fp32, as batch norm's do)
        out = _numel(rec.out_shapes[0]) if rec.out_shapes else _numel(x)
        moved = LAYOUT_CONVERSIONS * (_numel(x) + out) * 2 * 4.0
        nhwc = 1.0 if (rec.params or {}).get("channels_last") else 0.0
        layout = Classified("layout", {"bytes": moved, "nhwc": nhwc}, scale, half, eb, rec.op)
        return Classified("conv", dims, scale, half, eb, rec.op, (layout,))
    mask = params.get("output_mask")
    if mask and not any(mask[:2]):
        # the bias gradient alone (the input and the weight need none: a frozen convolution with a trained bias): a
        # per-channel sum of grad_output, no convolution
        out = _numel(shapes[0])
        return Classified("reduction", {"n": out, "bytes": out * eb}, scale, half, eb, rec.op)
    if groups > 1 and mask:
        # the input and the weight gradient take the forward's FLOPs each; the recorded FLOPs are not used: torch's
        # formula counted a grouped weight gradient ``groups`` times over until the capture corrected it (tables
        # recorded before 2026-11-29 carry 960x for MobileNetV2's last depthwise blocks)
        scale *= float(sum(1 for m in mask[:2] if m))
        return Classified("conv", dims, scale, half, eb, rec.op)
    forward_flops = 2 * n * cout * max(oh, 1) * max(ow, 1) * (cin // max(1, groups)) * kh * kw
    scale *= rec.flops / forward_flops if rec.flops > 0 and forward_flops > 0 else 2.0
    return Classified("conv", dims, scale, half, eb, rec.op)


@dataclass(frozen=True)
class OpsTime:
    """The operator table's time on one GPU."""

    seconds: float  # one step, GPU side
    by_class: dict[str, float]
    kernels: int  # kernel launches per step
    unclassified: dict[str, int]  # operator -> calls predicted as bandwidth-bound because not understood
    unknown_dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> calls sized at 4 bytes per element
    by_phase: dict[str, float] = field(default_factory=dict)  # forward, backward, optimizer

    @property
    def optimizer_share(self) -> float:
        """The optimizer step's share of the step (it runs once per optimizer step, on the rank's shard)."""
        return self.by_phase.get("optimizer", 0.0) / self.seconds if self.seconds > 0 else 0.0


def classify_table(ops: Sequence[OpRecord]) -> list[Classified]:
    out = []
    for rec in ops:
        c = classify(rec)
        out += [replace(x, dtype=record_dtype(rec), phase=rec.phase) for x in (c, *c.extra)]
    return out


# Fused attention kernels (torch's SDPA: FlashAttention-2, memory-efficient) in 16-bit do not reach the GEMM
# utilisation of their two matmuls: the online softmax and the recompute sit between the tensor-core instructions.
# Their published ceiling, as a share of the dense 16-bit peak at long sequences, head dim 128, per kernel
# generation:
# - FlashAttention-2 (torch's SDPA flash backend from torch 2.2): Ampere (sm80) 50-73% of the A100's peak forward +
#   backward (Dao 2023, arXiv 2307.08691): 0.6; Hopper (sm90) torch SDPA reaches 287-304 TFLOP/s forward on
#   H100-SXM (pytorch/benchmark PR #2296, the FA3 paper's FlashAttention-2 row: 335-370): 0.3 of 989.
# - FlashAttention (v1, torch 2.0-2.1's SDPA flash backend, flash-attn 1.x and its Triton port): 25-40% of the A100's
#   peak (the same paper's abstract; its figures put the Triton port at or below v1): 0.32; Hopper: v1 has no Hopper
#   path either, taken at v2's Hopper share times v1/v2 on Ampere (0.32 / 0.6), 0.16 (judgement, flagged in notes).
# - Blackwell (sm100, sm103): FlashAttention-2's kernels are Ampere's mma.sync code, which does not reach the
#   Blackwell tensor cores' tcgen05 rate; no published torch SDPA figure on B200/B300 was found: Hopper's shares
#   (judgement, flagged here; the first measured B200 step should replace it).
# Other architectures take Ampere's.
ATTENTION_PEAK_SHARE = {"fa2": {"9": 0.3, "10": 0.3}, "fa1": {"9": 0.16, "10": 0.16}}
ATTENTION_PEAK_SHARE_DEFAULT = {"fa2": 0.6, "fa1": 0.32}
ATTENTION_GENERATIONS = tuple(ATTENTION_PEAK_SHARE_DEFAULT)


def attention_generation(torch_version: str | None) -> str:
    """The FlashAttention generation torch's SDPA runs: "fa1" before torch 2.2 (its release notes: FlashAttention-2
    in ``scaled_dot_product_attention``), "fa2" from 2.2 and when the version is unknown (today's torch)."""
    if not torch_version:
        return "fa2"
    try:
        major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return "fa2"
    return "fa1" if (major, minor) < (2, 2) else "fa2"


def attention_ceiling(gpu: GPU, generation: str = "fa2") -> float:
    """The share of the dense 16-bit peak a fused attention kernel of ``generation`` reaches at best on ``gpu``."""
    if generation not in ATTENTION_PEAK_SHARE_DEFAULT:
        raise PredictionError(
            f"unknown attention kernel generation {generation!r}: one of {', '.join(ATTENTION_GENERATIONS)}"
        )
    major = str(gpu.capability[0]) if gpu.capability else ""
    return ATTENTION_PEAK_SHARE[generation].get(major, ATTENTION_PEAK_SHARE_DEFAULT[generation])


def ops_time(
    classified: Sequence[Classified],
    gpu: GPU,
    precision: str,
    matmul: str | None,
    path: str = "ratio",
    attention: str = "fa2",
) -> OpsTime:
    """The sum over the classified table on ``gpu`` (vectorised per class); ``attention``: the generation of the fused
    attention kernels (:func:`attention_generation`)."""
    from predictor.model.kernels import load_kernel_model

    model = load_kernel_model()
    groups: dict[tuple[str, bool], list[Classified]] = defaultdict(list)
    for c in classified:
        groups[(c.cls, c.half)].append(c)
    by_class: defaultdict[str, float] = defaultdict(float)  # seconds
    by_phase: defaultdict[str, float] = defaultdict(float)
    for (cls, half), items in groups.items():
        dims = {key: np.array([c.dims[key] for c in items], dtype=float) for key in items[0].dims}
        peak = None
        if cls in ("gemm", "conv"):
            # cuDNN convolutions use TF32 by default (torch.backends.cudnn.allow_tf32); matmuls only when allowed
            peak = _tensor_peak(gpu, half, precision, "high" if cls == "conv" else matmul, path)
        eb = float(np.median([c.element_bytes for c in items]))
        if cls == "gemm":
            lat = gemm_step_time(dims, gpu, half, precision, matmul, eb, path)
        else:
            lat = _class_step_time(cls, dims, gpu, half, precision, eb, peak, model)
        if cls == "gemm":
            lat = _fused_attention(items, dims, lat, gpu, half, precision, attention, peak, model, eb)
        scale = np.array([c.scale for c in items])
        times = np.broadcast_to(lat * scale, (len(items),))
        by_class[cls] += float(np.sum(times))
        phases = np.array([c.phase for c in items])
        for phase in set(phases.tolist()):
            by_phase[phase] += float(np.sum(times[phases == phase]))
    kernels = kernel_count(classified)
    unclassified: Counter[str] = Counter()
    for c in classified:
        if c.op.endswith("?"):
            unclassified[c.op[:-1]] += int(c.scale)
    return OpsTime(
        sum(by_class.values()),
        dict(by_class),
        kernels,
        dict(unclassified),
        unknown_dtypes(classified),
        dict(by_phase),
    )


def _class_step_time(
    cls: str,
    dims: Mapping[str, np.ndarray],
    gpu: GPU,
    half: bool,
    precision: str,
    eb: float,
    peak: float | None,
    model: Any,
) -> np.ndarray:
    """In-stream seconds of the calls of one class other than GEMMs (:func:`ops_time`'s per-class pricing)."""
    if cls == "batch_norm":
        return batch_norm_time(dims, gpu, eb, model)
    if cls == "conv" and (dense := _convolution_dense(gpu, half, precision)):
        lat = implicit_gemm_time(dims, gpu, dense, eb)
        if dims["transposed"].any():  # a transposed convolution: the kernel model, as before (issue #40 left it)
            learned = model.step_time(cls, dims, gpu, peak_tflops=peak, element_bytes=eb)
            lat = np.where(dims["transposed"] == 1.0, learned, lat)
        return lat
    if cls == "conv":
        return cuda_core_convolution_time(dims, gpu, eb, peak, model)
    if cls in ("layout", "pooling"):  # bandwidth-bound at 4 bytes an element (their classifiers)
        lat = model.step_time("memory", {"bytes": dims["bytes"]}, gpu, element_bytes=4.0)
        if cls == "layout":  # converted only where the GPU's algorithm wants the other layout
            lat = lat * (dims["nhwc"] != float(tensor_core_convolution(gpu, half)))
        return lat
    return model.step_time(cls, dims, gpu, peak_tflops=peak, element_bytes=eb)


def _fused_attention(
    items: list[Classified],
    dims: dict[str, np.ndarray],
    lat: np.ndarray,
    gpu: GPU,
    half: bool,
    precision: str,
    attention: str,
    peak: float | None,
    model: Any,
    eb: float,
) -> np.ndarray:
    """The GEMM latencies with a fused attention kernel's matmuls priced as that kernel runs them."""
    fused = np.array([c.extra != () and base_name(c.op).startswith(_ATTENTION_PREFIX) for c in items])
    if half and fused.any() and peak:
        # a fused attention kernel's matmuls run at its published share of the dense peak (attention_ceiling),
        # not as the GEMM model's two batched matmuls: those write and read the s_q x s_k scores, which a fused
        # kernel keeps on chip (its real traffic, q, k, v and the output, is priced in its softmax part)
        dense = (gpu.bf16_tflops if precision.startswith("bf16") else gpu.fp16_tflops) or gpu.fp16_tflops
        if dense:
            share = attention_ceiling(gpu, attention)
            at_share = 2 * dims["b"] * dims["m"] * dims["n"] * dims["k"] / (dense * 1e12 * share)
            lat = np.where(fused, at_share, lat)
    elif fused.any() and not half:
        # FP32 fused attention (the memory-efficient kernel, cutlass's Sm80 f32 code even on Hopper: the lent
        # H100's BERT FP32 step ran fmha_cutlassF/B_f32, 116 of its 341 ms) multiplies on the CUDA cores, never
        # on TF32 tensor cores: its matmuls are the kernel model's FP32 GEMMs
        fp32 = model.step_time("gemm", dims, gpu, peak_tflops=None, element_bytes=eb)
        lat = np.where(fused, fp32, lat)
    return lat


def _convolution_dense(gpu: GPU, half: bool, precision: str) -> float | None:
    """The dense tensor-core peak a convolution of these inputs runs at on ``gpu`` (16-bit, or TF32 for FP32 from
    Ampere: :func:`tensor_core_convolution`), when the GPU states it, its SMs and its bandwidth; None: the kernel
    model prices it on the CUDA cores."""
    if not tensor_core_convolution(gpu, half) or not gpu.sms or not gpu.memory_bw_gbps:
        return None
    if not half:
        return gpu.tf32_tflops
    return (gpu.bf16_tflops if precision.startswith("bf16") else gpu.fp16_tflops) or gpu.fp16_tflops


def implicit_gemm_time(dims: Mapping[str, np.ndarray], gpu: GPU, dense_tflops: float, eb: float) -> np.ndarray:
    """In-stream seconds of convolutions on tensor cores, priced as the implicit GEMMs cuDNN runs them as (its
    ``*_implicit_gemm`` kernels on the lent H100): per group, the output pixels (``N x OH x OW``) by the output
    channels, contracting input channels x kernel window, wave by wave at the GPU's measured GEMM ceiling
    (:func:`predictor.model.tensor_gemm.tensor_gemm_time`; nothing fitted on convolutions), never faster than
    reading the input and the weight and writing the output once. A backward record is its forward's GEMM scaled by
    its FLOPs (the data- and weight-gradient GEMMs have the forward's FLOPs each). TF32 takes the 16-bit ceiling
    on the TF32 peak: on the lent H100 ResNet-50's TF32 convolutions ran at 0.34 of the TF32 peak and its fp16 ones
    at 0.36 of the fp16 peak (bench/layout_pooling.py)."""
    groups, m, n, k, moved = _conv_shape(dims, eb)
    gemm = tensor_gemm_time({"b": groups, "m": m, "n": n, "k": k}, gpu, dense_tflops, element_bytes=eb, moved=moved)
    share, _ = ceiling(gpu)
    return np.where(depthwise(dims), direct_depthwise_time(dims, gpu, dense_tflops * share, eb), gemm)


def _conv_shape(dims: Mapping[str, np.ndarray], eb: float) -> tuple[np.ndarray, ...]:
    """(groups, m, n, k, bytes moved) of convolutions as implicit GEMMs: per group, the output pixels by the output
    channels, contracting input channels x kernel window; the input, the weight and the output once."""
    groups = np.maximum(dims["groups"], 1.0)
    m = dims["b"] * dims["oh"] * dims["ow"]
    n = dims["cout"] / groups
    k = dims["cin"] / groups * dims["kh"] * dims["kw"]
    moved = eb * (dims["b"] * dims["cin"] * dims["h"] * dims["w"] + dims["cout"] * k + m * dims["cout"])
    return groups, m, n, k, moved


def depthwise(dims: Mapping[str, np.ndarray]) -> np.ndarray:
    """Which convolutions are depthwise (one input channel a group: EfficientNet's, MobileNet's)."""
    return (np.maximum(dims["groups"], 1.0) > 1.0) & (dims["cin"] / np.maximum(dims["groups"], 1.0) <= 1.0)


def direct_depthwise_time(dims: Mapping[str, np.ndarray], gpu: GPU, tflops: float, eb: float) -> np.ndarray:
    """In-stream seconds of depthwise convolutions, which run a direct kernel (PyTorch's ``conv_depthwise2d``,
    cuDNN's depthwise ones), not GEMM tiles a 1-wide output would waste: their FLOPs at ``tflops`` (the caller's
    bound on the rate; these kernels are bandwidth-bound at every shape the held-out sets have) or their bytes at the
    memory bandwidth, whichever takes longer, plus a kernel's fixed cost. Needs ``gpu.memory_bw_gbps``."""
    groups, m, n, k, moved = _conv_shape(dims, eb)
    bandwidth = float(gpu.memory_bw_gbps or 0.0) * 1e9
    return np.maximum(2 * groups * m * n * k / (tflops * 1e12), moved / bandwidth) + RAMP_S


def cuda_core_convolution_time(
    dims: Mapping[str, np.ndarray], gpu: GPU, eb: float, peak: float | None, model: Any
) -> np.ndarray:
    """In-stream seconds of convolutions on the CUDA cores (FP32 before Ampere; 16-bit before Volta): the kernel
    model's, learned from NeuSight's convolutions, which are all dense (no groups), except FP32 depthwise ones,
    which run a direct kernel (:func:`direct_depthwise_time`) at the FP32 units' sustained share
    (:func:`fp32_ceiling`) where the kernel model would price a batch of one-channel GEMMs it never saw. 16-bit
    depthwise convolutions before Volta keep the kernel model: on the one held-out set that has them (the TITAN Xp's
    FP16 MNASNet and MobileNetV2, bench/cnn_zoo.py) the direct rule priced them 0.43-0.53 of the measured time, the
    kernel model 0.66-0.82."""
    lat = model.step_time("conv", dims, gpu, peak_tflops=peak, element_bytes=eb)
    direct = (dims["transposed"] != 1.0) & depthwise(dims)
    if eb == 4.0 and direct.any() and gpu.memory_bw_gbps and gpu.fp32_tflops:
        lat = np.where(direct, direct_depthwise_time(dims, gpu, gpu.fp32_tflops * fp32_ceiling(gpu), eb), lat)
    return lat


def tensor_core_convolution(gpu: GPU, half: bool) -> bool:
    """Whether cuDNN runs a convolution of these inputs on ``gpu``'s tensor cores, whose kernels take NHWC
    activations (the others, FP32 on the CUDA cores, take NCHW): 16-bit inputs from compute capability 7.0 (Volta),
    FP32 from 8.0 (Ampere's TF32, which PyTorch allows cuDNN by default: ``torch.backends.cudnn.allow_tf32 = True``,
    docs.pytorch.org/docs/stable/notes/cuda.html#tf32-on-ampere). The lent H100's kernels say the same: every
    convolution of ResNet-50's AMP and FP32 steps ran an ``nhwckrsc_nhwc`` implicit GEMM (tf32 in FP32), between
    ``nchwToNhwc`` / ``nhwcToNchw`` conversions of the NCHW activations."""
    return gpu.tf32_convolutions or (half and (gpu.capability or (0, 0)) >= (7, 0))


def unknown_dtypes(classified: Sequence[Classified]) -> dict[str, int]:
    """dtype -> calls whose element size the model does not know (4 bytes assumed)."""
    out: Counter[str] = Counter()
    for c in classified:
        if c.dtype is not None and c.dtype not in DTYPE_BYTES:
            out[c.dtype] += int(c.scale)
    return dict(out)


def gemm_step_time(
    dims: Mapping[str, np.ndarray],
    gpu: GPU,
    half: bool,
    precision: str,
    matmul: str | None,
    element_bytes: float,
    path: str = "ratio",
) -> np.ndarray:
    """In-stream seconds of GEMM calls ``dims`` (b, m, n, k) on ``gpu``: 16-bit inputs on tensor cores
    (:func:`_tensor_dense`) as waves of tiles at the GPU's measured ceiling
    (:func:`predictor.model.tensor_gemm.tensor_gemm_time`); FP32 and TF32 by the kernel model."""
    from predictor.model.kernels import load_kernel_model

    dense = _tensor_dense(gpu, half, precision)
    if dense:
        return tensor_gemm_time(dict(dims), gpu, dense, element_bytes=element_bytes)
    peak = _tensor_peak(gpu, half, precision, matmul, path)
    return load_kernel_model().step_time("gemm", dims, gpu, peak_tflops=peak, element_bytes=element_bytes)


def _tensor_dense(gpu: GPU, half: bool, precision: str) -> float | None:
    """The dense 16-bit tensor-core peak a GEMM of these inputs runs on, priced by waves of tiles
    (:mod:`predictor.model.tensor_gemm`): 16-bit inputs on a GPU of compute capability 7.0 or later (Volta's tensor
    cores) that states the peak, its SM count and its bandwidth. None: the kernel model prices it (FP32 on the CUDA
    cores, or TF32 with the fitted efficiency, below)."""
    if (gpu.capability or (0, 0)) < (7, 0) or not gpu.sms or not gpu.memory_bw_gbps or not half:
        # TF32 stays on the kernel model's FP32-learned utilisation with its end-to-end-fitted efficiency: XLA's
        # TF32 dots reach 0.64-0.81 of the H100's TF32 peak, but PyTorch's (cuBLAS's sm90_xmma tf32 kernels) ran
        # BERT-base's large GEMMs at about 0.3 of it on the lent H100 (bench/data/h100_kernel_breakdown_*.csv: 24
        # calls a step of 2.16 ms, by count and tile the 66048 x 3072 x 768 products), which the fitted efficiency
        # matches; two sources 2x apart give no ceiling to build on
        return None
    bf16 = precision.startswith("bf16")
    return (gpu.bf16_tflops if bf16 else gpu.fp16_tflops) or gpu.fp16_tflops


def _tensor_peak(gpu: GPU, half: bool, precision: str, matmul: str | None, path: str = "ratio") -> float | None:
    """The peak a GEMM/convolution runs at: tensor cores for fp16/bf16 inputs, TF32 when allowed, else FP32 (None:
    the kernel model's own FP32 figure)."""
    if half:
        bf16 = precision.startswith("bf16")
        peak = (gpu.bf16_tflops if bf16 else gpu.fp16_tflops) or gpu.fp16_tflops
        return peak * tensor_core_efficiency("half", path) if peak else None
    if matmul in ("high", "medium") and gpu.tf32_tflops:
        return gpu.tf32_tflops * tensor_core_efficiency("tf32", path)
    return None


def tensor_core_efficiency(kind: str, path: str = "ratio") -> float:
    """Share of the tensor-core datasheet peak (``kind``: "half" or "tf32") that the FP32-trained utilisation model
    should assume on the ``path`` ("ratio": a measured GPU's time re-timed; "absolute": from a CPU or meta capture).
    Fitted per path on end-to-end measurements by ``bench/ops_validation.py --write-artefact``; 1.0 without."""
    from predictor.model.artefact import model_artefact

    fitted = model_artefact().get("tensor_core", {}).get(path, {})
    return float(fitted.get(kind, 1.0)) if isinstance(fitted, dict) else 1.0


@dataclass(frozen=True)
class PreparedTable:
    """What the operator table gives once per profile: its classification and its sum on the profiled GPU."""

    classified: tuple[Classified, ...]
    source: OpsTime | None  # None without a profiled GPU, or when its sum cannot be predicted
    source_error: str | None
    host_s: float = 0.0  # the host's floor per micro-step (host_floor; a host-bound measured step where longer)
    # a measured step the host bounds (within HOST_BOUND_BAND of host_floor, or over GPU_EXPLAINS_AT_MOST times the
    # model's own GPU time per step on the profiled GPU, absolute constants): the part of the step a GPU change
    # scales, that GPU time where the step is wholly the host's (host_bound, 1), between it and the measured step
    # where partly (:func:`host_bound_weight`); None when not the host's at all
    host_bound_gpu_s: float | None = None
    host_bound: float = 0.0  # the weight of the host's reading, 0-1 (:func:`host_bound_weight`)
    measured_s: float = 0.0  # the measured step it was read from
    modelled_s: float = 0.0  # the operator model's GPU time for it on the profiled GPU
    host_reading_s: float = 0.0  # the host's floor were the step wholly the host's


class ComputeEstimate(NamedTuple):
    """A GPU's compute per sample and what kind of prediction it is."""

    per_sample_s: float
    compute_share: float | None  # the GEMM and convolution share, when known
    kind: str  # the kind of prediction (its interval width: predictor.model.uncertainty)
    optimizer_share: float  # the optimizer step's share of the compute
    # the relative sd of not knowing whether the measured step was the host's or the GPU's (a step near the
    # thresholds: sqrt(w (1 - w)) times the log distance between the two readings' steps on this GPU); 0 elsewhere
    reading_sd: float = 0.0


def profile_attention(profile: Profile) -> str:
    """The attention kernel generation of the torch the profile ran (:func:`attention_generation`)."""
    return attention_generation(profile.software.torch if profile.software is not None else None)


def prepare(profile: Profile, src_gpu: GPU | None, compute_s: float = 0.0) -> PreparedTable | None:
    """Classify the profile's operator table, sum it on the profiled GPU, and tell whether the step measured there
    (``compute_s``) was the host's (None without a table)."""
    table = profile.ops
    if table is None or not table.ops:
        return None
    classified = tuple(classify_table(table.ops))
    host = host_floor(profile, classified)
    if src_gpu is None:
        return PreparedTable(classified, None, None, host)
    precision, matmul, attention = (
        profile.model.precision,
        profile.model.float32_matmul_precision,
        profile_attention(profile),
    )
    try:
        source = ops_time(classified, src_gpu, precision, matmul, attention=attention)
        bound, reading = None, 0.0
        weight = modelled = 0.0
        if compute_s > 0:  # the model's own GPU time per step there, its absolute constants
            alone = ops_time(classified, src_gpu, precision, matmul, "absolute", attention)
            modelled = alone.seconds * profile.batch.per_device / max(table.samples, 1e-12)
            # a multi-GPU step carries data-parallel costs the one-GPU operator sum does not price: not compared
            one_gpu = profile_world(profile) == 1
            weight = host_bound_weight(compute_s, modelled, host, kernel_count(classified), one_gpu)
            if weight > 0:
                # read as the host's, the host took the measured micro-step, which no GPU takes away (the optimizer
                # step, in the measured step and added once per optimizer step on every GPU, left out of it); read
                # as the GPU's, the floor is the host's own. Between the readings the floor is their geometric blend
                plain, reading = host, max(host, compute_s - modelled * alone.optimizer_share)
                host = math.exp(weight * math.log(reading) + (1.0 - weight) * math.log(host))
                floors, times = (reading, plain, host), (modelled, compute_s)
                bound = _gpu_part(weight, floors, times, 1.0, alone.optimizer_share)[0]
    except PredictionError as exc:
        return PreparedTable(classified, None, str(exc), host)
    return PreparedTable(classified, source, None, host, bound, weight, compute_s, modelled, reading)


def host_bound_weight(step_s: float, modelled_s: float, floor_s: float, kernels: int, one_gpu: bool) -> float:
    """How far a step measured at ``step_s`` is the host's (1) rather than the GPU's (0): within
    :data:`HOST_BOUND_BAND` of the host's floor ``floor_s``, or (one GPU) over :data:`GPU_EXPLAINS_AT_MOST` times
    the operator model's GPU time ``modelled_s`` at a time per kernel a host can take
    (:data:`HOST_S_PER_KERNEL_MAX`); each threshold a log ramp of :data:`HOST_BOUND_RAMP` either side, and 0 where
    the model's GPU time is not below the step (nothing for the host to explain; a ramp as well). Each ramp is read
    as the chance the step is on the host's side of its line, and the rule's "or" and "and" combine them as
    chances."""
    if not modelled_s > 0:
        return 0.0
    # a step the model's GPU time explains is the GPU's: that line (the model's time itself) is a ramp too
    unexplained = 1.0 - _below(step_s, modelled_s)
    band = _below(step_s, HOST_BOUND_BAND * floor_s)
    if not one_gpu:
        return band * unexplained
    slow = 1.0 - _below(step_s, GPU_EXPLAINS_AT_MOST * modelled_s)
    hostlike = _below(step_s / max(kernels, 1), HOST_S_PER_KERNEL_MAX)
    # each ramp's value read as the chance the step is on the host's side of that line, the lines independent: the
    # rule's "or" and "and" as chances (crisp values give the crisp rule back)
    return (1.0 - (1.0 - band) * (1.0 - slow * hostlike)) * unexplained


def _gpu_part(
    w: float, floors: tuple[float, float, float], times: tuple[float, float], ratio: float, o: float
) -> tuple[float, float]:
    """(the GPU's part of the micro-step at the profiled batch, with its optimizer step, on a GPU ``ratio`` times the
    profiled one's time; the sd of its log from not knowing the reading), the measured step read as the host's with
    weight ``w``. ``floors``: the host's floor read as the host's (the measured micro-step less its optimizer step),
    the plain floor (the host's own), their blend (the floor every micro-step gets); ``times``: the operator model's
    GPU time and the measured step on the profiled GPU; ``o``: the optimizer step's share of the GPU part. Each
    reading's micro-step is its floor or its GPU time less the optimizer step, whichever is longer, and the optimizer
    step on top (as :func:`predictor.model.fleets` composes them); the prediction is their geometric blend, and the
    GPU part is what gives it back over the blended floor (w = 1: the model's GPU time; w = 0: the measured step,
    scaled). The sd is the two-point mixture's, sqrt(w (1 - w)) |log(host's / GPU's)|."""
    reading, plain, floor = floors
    m, measured = times[0] * ratio, times[1] * ratio
    host_read = max(reading, m * (1.0 - o)) + m * o
    gpu_read = max(plain, measured * (1.0 - o)) + measured * o
    if w >= 1:
        return m, 0.0
    step = math.exp(w * math.log(host_read) + (1.0 - w) * math.log(gpu_read))
    part = step if o <= 0 or step * (1.0 - o) >= floor else (step - floor) / o
    return part, math.sqrt(w * (1.0 - w)) * abs(math.log(host_read / gpu_read))


def _below(value: float, threshold: float) -> float:
    """1 well below ``threshold``, 0 well above, linear in log across a factor of :data:`HOST_BOUND_RAMP` either
    side of it."""
    if value <= 0 or threshold <= 0:
        return 1.0 if value <= threshold else 0.0
    half = math.log(HOST_BOUND_RAMP)
    return min(1.0, max(0.0, (math.log(threshold) + half - math.log(value)) / (2.0 * half)))


def ops_compute(
    profile: Profile, src: Any, dst: GPU, notes: list[str], extrapolation: list[str]
) -> ComputeEstimate | None:
    """The compute per sample on ``dst`` from the operator table (prepared once in ``src.ops``), or None when it
    cannot be used (then the step-level path decides; the reason is in ``notes``)."""
    table, prepared = profile.ops, src.ops
    if table is None or prepared is None:
        return None
    precision, matmul = profile.model.precision, profile.model.float32_matmul_precision
    try:
        path = "ratio" if src.measured and src.gpu is not None else "absolute"
        target = ops_time(prepared.classified, dst, precision, matmul, path, profile_attention(profile))
    except PredictionError as exc:
        notes.append(f"operator table not used on {dst.key}: {exc}")
        return None
    _table_notes(profile, table, target, dst, notes)
    if (hint := channels_last_hint(prepared.classified, target, dst, precision, matmul, path)) is not None:
        notes.append(hint)
    # the GEMMs' and convolutions' share of the forward and backward work: the optimizer step, once per optimizer
    # step (and divided over a shard group), is left out (a capture at batch 1 made Adam half of a Llama step, and
    # every LLM fleet's bottleneck read "memory bandwidth": a new user's trial)
    share = target.by_class.get("gemm", 0.0) + target.by_class.get("conv", 0.0)
    share /= max(target.seconds * (1.0 - target.optimizer_share), 1e-12)
    if src.measured and src.gpu is not None:
        source = prepared.source
        if source is None or source.seconds <= 0:
            notes.append(f"operator table not used: {prepared.source_error or 'no operator time on ' + src.gpu.key}")
            return None
        ratio = target.seconds / source.seconds
        notes.append(
            f"{src.gpu.key} -> {dst.key}: time x{ratio:.2f} from the operator table ({len(table.ops)} operators, "
            f"ratio of predicted operator sums applied to the measured step)"
        )
        gpu_step, reading_sd = src.compute_s * ratio, 0.0
        if prepared.host_bound_gpu_s is not None:
            # the GPU waited on the host: the measured step is the host's, and what a GPU change scales is at most
            # the GPU's own time, which only the operator model gives
            notes.append(_host_bound_note(profile, prepared, src.gpu.key, src.compute_s, prepared.host_bound_gpu_s))
            gpu_step, reading_sd = _host_bound_step(profile, prepared, ratio, target.optimizer_share)
        per_sample = gpu_step / src.per_device_batch
        kind = "same" if src.gpu.key == dst.key else "cross-ops"
        return ComputeEstimate(per_sample, share, kind, target.optimizer_share, reading_sd)
    host = LIGHTNING_STEP_S + target.kernels * HOST_S_PER_KERNEL
    where = "on the meta device" if table.device in ("meta", "fake") or not src.measured else "on CPU"
    notes.append(
        f"{dst.key}: {target.seconds * 1e3:.3g} ms of GPU work for the captured step ({table.samples:g} samples on "
        f"one GPU, {target.optimizer_share:.0%} of it the optimizer step, which a sharded layout divides over its "
        f"shard group), predicted absolutely from the operator table captured {where} ({target.kernels} kernels; the "
        f"host needs at least {host * 1e3:.3g} ms to run Lightning's step and launch them: the step's floor); scaled "
        "to each GPU's share of the batch"
    )
    extrapolation.append(f"no GPU step was measured: {dst.key}'s time is the operator model's alone")
    return ComputeEstimate(target.seconds / table.samples, share, "ops-absolute", target.optimizer_share)


def _host_bound_step(profile: Profile, prepared: PreparedTable, ratio: float, o: float) -> tuple[float, float]:
    """(the GPU's part of the micro-step at the profiled batch on a GPU ``ratio`` times the profiled one's time, the
    sd of its log from not knowing the reading): :func:`_gpu_part` of the prepared readings; ``o``: the optimizer
    step's share of it there."""
    floors = (prepared.host_reading_s, host_floor(profile, prepared.classified), prepared.host_s)
    return _gpu_part(prepared.host_bound, floors, (prepared.modelled_s, prepared.measured_s), ratio, o)


def _host_bound_note(profile: Profile, prepared: PreparedTable, gpu: str, step_s: float, gpu_part: float) -> str:
    """Why a step measured on ``gpu`` was taken as the host's, and what the ratio scales then."""
    floor = host_floor(profile, prepared.classified)
    modelled = prepared.modelled_s or gpu_part
    why = (
        f"is x{step_s / floor:.2g} the host's floor ({floor * 1e3:.3g} ms; a step within x{HOST_BOUND_BAND:g} of it "
        "is the host's)"
        if _below(step_s, HOST_BOUND_BAND * floor) >= prepared.host_bound
        else f"is {step_s / modelled:.2g}x the operator model's GPU time there, more than the model's held-out error "
        f"allows (x{GPU_EXPLAINS_AT_MOST:g}): the host's, slower than the floor's {HOST_S_PER_KERNEL * 1e6:.3g} us "
        "a kernel"
    )
    if prepared.host_bound >= 1:
        what = f"host-bound, so {gpu_part * 1e3:.3g} ms of it (the operator model's GPU time on the profiled GPU)"
    else:  # near a threshold: read partly as the host's
        what = (
            f"host-bound at {prepared.host_bound:.0%} (it lies near the line, x{HOST_BOUND_RAMP:g} either side of "
            f"it is read partly as the host's and partly as the GPU's, the interval widened for it), so "
            f"{gpu_part * 1e3:.3g} ms of it (between the measurement and the operator model's GPU time on the "
            f"profiled GPU, {modelled * 1e3:.3g} ms)"
        )
    return (
        f"the step measured on {gpu} ({step_s * 1e3:.3g} ms) {why}: {what} is what the ratio scales; the host holds "
        f"every GPU's micro-step at {prepared.host_s * 1e3:.3g} ms or more (the profiled host's; the optimizer step "
        "apart)"
    )


# a channels-last hint is given when it would save at least this share of the step's operator time
CHANNELS_LAST_HINT_SHARE = 0.05


def channels_last_hint(
    classified: Sequence[Classified], target: OpsTime, dst: GPU, precision: str, matmul: str | None, path: str
) -> str | None:
    """What channels-last activations would save on ``dst``, where the table's convolutions run NCHW on tensor cores
    (cuDNN's layout conversions and NCHW batch norm priced): the calls whose price depends on the layout (the
    conversions, batch norm) re-priced NHWC, as ``model.to(memory_format=torch.channels_last)`` and channels-last
    inputs make them; None when it saves under :data:`CHANNELS_LAST_HINT_SHARE` or does not apply."""
    nchw = [c for c in classified if c.cls == "layout" and not c.dims["nhwc"]]
    if not nchw or not tensor_core_convolution(dst, nchw[0].half) or target.seconds <= 0:
        return None
    flipped = [replace(c, dims={**c.dims, "nhwc": 1.0}) for c in classified if "nhwc" in c.dims]
    before = sum(target.by_class.get(cls, 0.0) for cls in {c.cls for c in flipped})
    saved = (before - ops_time(flipped, dst, precision, matmul, path).seconds) / target.seconds
    if saved < CHANNELS_LAST_HINT_SHARE:
        return None
    norm = " and batch norm runs its NCHW kernels" if any(c.cls == "batch_norm" for c in classified) else ""
    return (
        f"{dst.key}: the table records NCHW convolutions (or was recorded before layouts were), so cuDNN's conversions "
        f"to NHWC and back are priced{norm}; channels-last (model.to(memory_format=torch.channels_last) and "
        "channels-last inputs; profile again, or srifty capture --channels-last) would take about "
        f"{saved:.0%} off the GPU's operator time"
    )


def _table_notes(profile: Profile, table: Any, target: OpsTime, dst: GPU, notes: list[str]) -> None:
    """What the operator table's pricing assumed: FlashAttention v1, operators not classified, unknown dtypes."""
    if (
        profile.software is not None
        and profile_attention(profile) == "fa1"
        and any(base_name(c.op).startswith(_ATTENTION_PREFIX) for c in table.ops)
    ):
        notes.append(
            f"fused attention priced as FlashAttention v1 (the profile's torch {profile.software.torch} predates "
            f"torch 2.2's FlashAttention-2): {attention_ceiling(dst, 'fa1'):.2f} of {dst.key}'s 16-bit peak at best"
        )
    if target.unclassified:
        calls = sum(target.unclassified.values())
        names = ", ".join(sorted(target.unclassified)[:5])
        notes.append(f"{calls} calls of operators the model does not classify ({names}): predicted bandwidth-bound")
    if target.unknown_dtypes:
        kinds = ", ".join(f"{d} ({n} calls)" for d, n in sorted(target.unknown_dtypes.items()))
        notes.append(f"operator table: dtypes of unknown element size {kinds}: sized at 4 bytes per element")


def framework_s(profile: Profile) -> float | None:
    """The host's own time per step that no phase holds (Lightning's loop, hooks, logging, the optimizer's Python):
    the measured step's mean minus its data, forward, backward and optimizer phases' means; None when they were not
    measured, or their means were not recorded.

    Means, never medians: the recorder times each step's phases back to back, so in every step they add up to the
    step (the data phase holds the loop's time between steps), and by linearity the difference of the means is the
    mean of that per-step remainder, which a busy host cannot inflate. The difference of the medians is not: on a
    loaded 2-core machine it came out 45.4, 0.3 and 71.5 ms in three profiles of the same run (issue #37 H1), and
    it floored every micro-step of every GPU."""
    t = profile.timing
    phases = t.phases_s or {}
    names = ("data", "forward", "backward", "optimizer")
    if not (t.step_time_s.p50 > 0 and all(p in phases for p in names)):
        return None
    step_mean = t.step_time_s.mean
    means = [phases[p].mean for p in names]
    if step_mean is None or any(m is None for m in means):
        return None
    rest = step_mean - sum(m for m in means if m is not None)
    return rest if rest > 1e-6 else 0.0  # below a microsecond: the sums' rounding, not time


def host_floor(profile: Profile, classified: Sequence[Classified]) -> float:
    """Seconds per micro-step the host needs whatever the GPU: the profile's own framework time (step less phases),
    Lightning's own per-step time (``LIGHTNING_STEP_S``) and ``HOST_S_PER_KERNEL`` per kernel of the table (what
    :func:`predictor.model.basis.step_floor` bounds by)."""
    return (framework_s(profile) or 0.0) + LIGHTNING_STEP_S + kernel_count(classified) * HOST_S_PER_KERNEL


def kernel_count(classified: Sequence[Classified]) -> int:
    """Kernel launches of one step of the table (a fused attention is one launch, not its parts)."""
    return int(sum(c.scale for c in classified if not c.extra))

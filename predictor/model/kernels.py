"""Per-operator GPU latency model: a wave-quantised roofline times a learned utilisation, plus a launch floor.

For one call of an operator on a GPU the model computes, from the GPU's datasheet facts only (SM count, FP32 peak,
memory bandwidth, L2 size; see ``predictor/data/gpu_arch.csv``):

- the roofline bound ``t_roof = max(FLOPs / peak, bytes / bandwidth)``;
- the launch floor ``f`` of the operator class on this GPU, measured from the data: the latency of the GPU's
  smallest kernels of the class (1st percentile; a kernel launch plus PyTorch's dispatch and the timing's
  synchronisation, 25-60 us), taken only where those kernels are launch-bound (``LAUNCH_BOUND_SHARE``). It is
  measured per GPU, not per family: it belongs to the host that timed the kernels as much as to the GPU (the P4 and
  the P100, both Pascal, differ by 20 us on gemm and 24 us on softmax), so a GPU without launch-bound measurements
  takes the median over the measured GPUs, not its family's (leave-one-GPU-out, BENCHMARKS.md);
- GPU-independent features of how well the work maps onto this GPU (NeuSight-style): per-SM work, output tiles of
  64x64 and 128x128 per SM, waves ``ceil(tiles / SMs)`` and the tile-quantisation efficiency
  ``tiles / (waves x SMs)``, the quantised compute time relative to the roofline, arithmetic intensity relative to
  the GPU's ridge point (``t_compute / t_memory``), the working set relative to L2, and the operator's shape.

A small ensemble of multilayer perceptrons per class (3 seeds, outputs averaged; trained by
``scripts/train_kernel_model.py`` on measured FP32 latencies, NeuSight ASPLOS'25 data, evaluated here in numpy)
maps the features to ``log(latency / (t_roof + f))``, so

    latency = (t_roof + f) x exp(mlp(features))

The multiplier is the inverse of the achieved utilisation of the roofline (plus floor); it is bounded to
``[1/4, 64]`` so a GPU far outside the training range cannot produce absurd numbers. Classes without measurements
(``reduction``, ``memory``) reuse the ``elementwise`` network, which learned how streaming kernels use bandwidth: a
reduction of ``n`` inputs is an elementwise kernel over ``n`` elements moving ``bytes``; a copy / cast / fill /
gather moves ``bytes`` (``n = bytes / (2 x element_bytes)``, no arithmetic). Their floor is the elementwise floor.

What a step pays is not what an isolated call costs. NeuSight timed each operator alone: launch, PyTorch's dispatch
and the synchronisation around the timing are in every latency (the smallest kernels of every training GPU take
25-32 us, whatever the GPU). In a training step the host queues kernels ahead of the GPU, and a kernel occupies the
GPU's stream only for its execution: :meth:`KernelModel.step_time` is the isolated latency less that overhead,
the class's own (:meth:`KernelModel.dispatch`: its launch floor, which is nothing but it, less the in-stream minimum;
a layer norm's host path is longer than an add's), never below ``MIN_KERNEL_S``, the interval of back-to-back
null kernels on current GPUs and drivers (about 3 us, NVIDIA's developer forum "Too much time for kernel launch
latency", 2022). The host's own rate of launching (``ops.HOST_S_PER_KERNEL``) bounds the step from below elsewhere
(``basis.step_floor``).

Loading never trains: the coefficients are in ``predictor/data/kernel_model.json`` (plain numbers, no pickle), which
also records the training data's sha256, the training GPUs and the library versions used to fit it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from predictor.catalog.gpus import CATALOG_EXTRA, GPU, die_twin
from predictor.exceptions import PredictionError

CLASSES = ("gemm", "conv", "elementwise", "norm", "softmax", "reduction", "memory")
# the classes with their own network; the others borrow one (see the module docstring)
TRAINED_CLASSES = ("gemm", "conv", "elementwise", "norm", "softmax")
BORROWED = {"reduction": "elementwise", "memory": "elementwise"}
DIMS = {
    "gemm": ("b", "m", "n", "k"),
    "conv": ("b", "cin", "cout", "kh", "kw", "h", "w", "stride", "padding", "groups"),
    "elementwise": ("n", "bytes", "flops"),
    "norm": ("rows", "cols", "bytes"),
    "softmax": ("rows", "cols", "bytes"),
    "reduction": ("n", "bytes"),
    "memory": ("bytes",),
}
FORMAT = "srifty.kernel-model/v2"
FORMAT_V1 = "srifty.kernel-model/v1"  # one floor per class for every GPU; read as a v2 without per-GPU floors
# a kernel queued behind another occupies the GPU's stream at least this long (back-to-back null kernels, ~3 us on
# recent GPUs and drivers: forums.developer.nvidia.com/t/too-much-time-for-kernel-launch-latency/233645)
MIN_KERNEL_S = 3e-6
# a GPU's smallest measured kernels give its launch floor only if they are launch-bound: their roofline under this
# share of their latency (NeuSight measured its test-split GPUs on large shapes only: L4's smallest elementwise kernel
# takes 548 us, three quarters of it moving bytes)
LAUNCH_BOUND_SHARE = 0.25
# the class whose launch floor holds a class's host dispatch (KernelModel.dispatch): its own where its smallest
# measured kernels are launch-bound
DISPATCH_OF = {"conv": "gemm", **BORROWED}
# bounds of exp(mlp): utilisation of the roofline between 1/64 and 4 (L2 reuse: a GEMM is held to its FLOPs at the
# peak all the same, which no reuse beats: a review found 0.1 % of random FP32 GEMMs on B200 at 0.9x)
MULTIPLIER_RANGE = (0.25, 64.0)
_TINY = 1e-12


@functools.lru_cache(maxsize=256)
def _trained(trained: tuple[str, ...]) -> tuple[GPU, ...]:
    """The catalog's entries of the training GPUs (one the catalog no longer names is left out)."""
    from predictor.catalog.gpus import gpu_table

    table = gpu_table()
    return tuple(table[k] for k in trained if k in table)


def _gpu_facts(gpu: GPU, cls: str, peak_tflops: float | None) -> tuple[float, float, float, float]:
    """(SMs, peak FLOP/s, bandwidth B/s, L2 bytes) of ``gpu``; PredictionError naming a missing field and the fix."""

    def need(name: str, value: float | None) -> float:
        if value is None or not value > 0:
            raise PredictionError(
                f"GPU {gpu.key!r} has no {name} (needed by the {cls!r} kernel latency model): add `{name}` to its "
                f"entry in {CATALOG_EXTRA}"
            )
        return value

    sms = need("sms", gpu.sms)
    l2_mb = need("l2_mb", gpu.l2_mb)
    bandwidth = need("memory_bw_gbps", gpu.memory_bw_gbps)
    peak = need("fp32_tflops", peak_tflops if peak_tflops is not None else gpu.fp32_tflops)
    return float(sms), peak * 1e12, bandwidth * 1e9, l2_mb * 2**20


def _log(x: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(x, _TINY))


def _tiles(b: np.ndarray, m: np.ndarray, n: np.ndarray, tile: int, sms: float) -> tuple[np.ndarray, ...]:
    tiles = b * np.ceil(m / tile) * np.ceil(n / tile)
    waves = np.maximum(np.ceil(tiles / sms), 1.0)
    return tiles, waves, tiles / (waves * sms)


def _gemm_features(
    b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, facts: tuple[float, ...], floor: float, eb: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sms, peak, bw, l2 = facts
    flops = 2.0 * b * m * n * k
    nbytes = eb * b * (m * k + k * n + m * n)
    t_c, t_m = flops / peak, nbytes / bw
    t_roof = np.maximum(t_c, t_m)
    cols = []
    for tile in (64, 128):
        tiles, waves, eff = _tiles(b, m, n, tile, sms)
        t_q = waves * 2.0 * tile * tile * k / (peak / sms)  # full tiles, wave by wave, at the per-SM peak
        cols += [_log(tiles / sms), _log(waves), eff, _log(t_q) - _log(t_roof)]
    cols += [
        _log(t_c) - _log(t_m),  # arithmetic intensity relative to the ridge point
        _log(t_roof / floor),
        _log(flops / sms),
        _log(nbytes / l2),
        _log(m),
        _log(n),
        _log(k),
        _log(b),
    ]
    return np.stack(cols, axis=1), t_roof, flops


def _stream_features(
    n: np.ndarray, nbytes: np.ndarray, flops: np.ndarray, facts: tuple[float, ...], floor: float
) -> tuple[np.ndarray, np.ndarray]:
    sms, peak, bw, l2 = facts
    t_roof = np.maximum(nbytes / bw, flops / peak)
    blocks = np.ceil(n / 1024.0)  # ~1024 elements per thread block (4 per thread, 256 threads)
    waves = np.maximum(np.ceil(blocks / (sms * 4)), 1.0)  # ~4 resident blocks per SM
    cols = [
        _log(t_roof / floor),
        _log(nbytes / sms),
        _log(nbytes / l2),
        _log(nbytes / np.maximum(n, 1.0)),
        _log(waves),
        blocks / (waves * sms * 4),
    ]
    return np.stack(cols, axis=1), t_roof


def _row_features(
    rows: np.ndarray, cols_: np.ndarray, nbytes: np.ndarray, facts: tuple[float, ...], floor: float
) -> tuple[np.ndarray, np.ndarray]:
    sms, _, bw, l2 = facts
    t_roof = nbytes / bw
    waves = np.maximum(np.ceil(rows / (sms * 8)), 1.0)  # one row per warp, ~8 rows per SM at a time
    cols = [
        _log(t_roof / floor),
        _log(nbytes / sms),
        _log(nbytes / l2),
        _log(rows / sms),
        _log(cols_),
        _log(nbytes / np.maximum(rows * cols_, 1.0)),
        _log(waves),
        rows / (waves * sms * 8),
    ]
    return np.stack(cols, axis=1), t_roof


def features(
    cls: str,
    dims: Mapping[str, np.ndarray],
    gpu: GPU,
    floor: float,
    *,
    peak_tflops: float | None = None,
    element_bytes: float = 4.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Model inputs of ``cls`` calls on ``gpu``: (features [N, F], roofline seconds [N], size [N], 0 = empty).

    ``cls`` is a class with its own network (``TRAINED_CLASSES``); used by :class:`KernelModel` and the training
    script alike, so what is trained is what is evaluated.
    """
    d = {key: np.asarray(dims[key], dtype=float) for key in DIMS[cls]}
    peak = peak_tflops if cls in ("gemm", "conv") else None
    facts = _gpu_facts(gpu, cls, peak)
    if cls == "gemm":
        x, t_roof, size = _gemm_features(d["b"], d["m"], d["n"], d["k"], facts, floor, element_bytes)
    elif cls == "conv":
        ho = np.floor((d["h"] + 2 * d["padding"] - d["kh"]) / d["stride"]) + 1
        wo = np.floor((d["w"] + 2 * d["padding"] - d["kw"]) / d["stride"]) + 1
        g = np.maximum(d["groups"], 1.0)
        m = d["b"] * np.maximum(ho, 0.0) * np.maximum(wo, 0.0)
        x, t_roof, size = _gemm_features(
            g, m, d["cout"] / g, d["cin"] / g * d["kh"] * d["kw"], facts, floor, element_bytes
        )
        # the input image is read once (not once per kernel position); implicit GEMM's bytes overcount it
        extra = [_log(d["kh"] * d["kw"]), _log(d["stride"]), _log(d["h"] * d["w"])]
        x = np.concatenate([x, np.stack(extra, axis=1)], axis=1)
    elif cls == "elementwise":
        x, t_roof = _stream_features(d["n"], d["bytes"], d["flops"], facts, floor)
        size = d["n"] * d["bytes"]
    else:  # norm, softmax
        x, t_roof = _row_features(d["rows"], d["cols"], d["bytes"], facts, floor)
        size = d["rows"] * d["cols"] * d["bytes"]
    return x, t_roof, size


@dataclass
class MLP:
    """A small ReLU network evaluated in numpy: standardised inputs, hidden layers, a linear output.

    Attributes:
        mean: per-feature mean subtracted from the inputs.
        scale: per-feature scale the inputs are divided by.
        weights: one [in, out] matrix per layer.
        biases: one [out] vector per layer.
    """

    mean: np.ndarray
    scale: np.ndarray
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The network's output for rows of features ``x`` ([N, F] -> [N]).

        Features outside the range seen in training are clipped to it: a ReLU network extrapolates linearly and
        without bound (a 128k-column softmax, 60x wider than any measured, came out at 64x its roofline), so outside
        its data the network answers with the utilisation of the nearest measured kernels, and the roofline, which
        is computed from the real sizes, carries the scale.
        """
        if self.lo is not None and self.hi is not None:
            x = np.clip(x, self.lo, self.hi)
        h = (x - self.mean) / self.scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def to_json(self) -> dict[str, Any]:
        """Plain lists of numbers (float64 repr, so a round trip is exact)."""
        out = {
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "weights": [w.tolist() for w in self.weights],
            "biases": [b.tolist() for b in self.biases],
        }
        if self.lo is not None and self.hi is not None:
            out |= {"lo": self.lo.tolist(), "hi": self.hi.tolist()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MLP:
        """Inverse of :meth:`to_json`."""
        return cls(
            mean=np.asarray(data["mean"], dtype=float),
            scale=np.asarray(data["scale"], dtype=float),
            weights=[np.asarray(w, dtype=float) for w in data["weights"]],
            biases=[np.asarray(b, dtype=float) for b in data["biases"]],
            lo=np.asarray(data["lo"], dtype=float) if "lo" in data else None,
            hi=np.asarray(data["hi"], dtype=float) if "hi" in data else None,
        )


def _launch_floors(
    cls: str, groups: list[tuple[Mapping[str, np.ndarray], GPU, np.ndarray]]
) -> tuple[float, dict[str, float]]:
    """The class's launch floor: each GPU's own (its 1st-percentile latency where its smallest kernels are
    launch-bound), and over all GPUs the median of those (for GPUs without such kernels)."""
    own: dict[str, float] = {}
    for dims, gpu, lat in groups:
        p1 = float(np.percentile(lat, 1))
        _, t_roof, _ = features(cls, dims, gpu, p1)
        smallest = lat <= p1
        if np.median(t_roof[smallest] / lat[smallest]) < LAUNCH_BOUND_SHARE:
            own[gpu.key] = p1
    if not own:
        raise PredictionError(f"no GPU has launch-bound {cls!r} kernels to measure a launch floor from")
    return float(np.median(list(own.values()))), own


def _flops_bound(cls: str, seconds: np.ndarray, size: np.ndarray, peak_tflops: float | None) -> np.ndarray:
    """A GEMM is never faster than its FLOPs (``size``) at ``peak_tflops``: L2 reuse may beat the bytes' roofline (the
    multiplier's floor), nothing beats the FLOPs'. A convolution may (cuDNN's Winograd and FFT algorithms do fewer
    multiplies than its direct FLOPs)."""
    if cls != "gemm" or not peak_tflops:
        return seconds
    return np.maximum(seconds, size / (peak_tflops * 1e12))


@dataclass
class KernelModel:
    """Per-operator latency model (scikit-learn estimator contract: ``fit`` returns self, learned attributes end
    in ``_``).

    Args:
        hidden: hidden layer widths of each class's network.
        max_iter: training epochs (Adam) per class.
        seed: random seed of the first network's initialisation and shuffling (member i uses seed + i).
        members: networks per class, their outputs averaged (seed variance on unseen GPUs is large).
    """

    hidden: tuple[int, ...] = (32, 32)
    max_iter: int = 60
    seed: int = 0
    members: int = 3
    floors_: dict[str, float] = field(default_factory=dict)
    gpu_floors_: dict[str, dict[str, float]] = field(default_factory=dict)
    nets_: dict[str, list[MLP]] = field(default_factory=dict)
    meta_: dict[str, Any] = field(default_factory=dict)

    def fit(
        self, samples: Mapping[str, list[tuple[Mapping[str, np.ndarray], GPU, np.ndarray]]], **meta: Any
    ) -> KernelModel:
        """Fit one network per class to measured latencies (needs scikit-learn; only training imports it).

        Args:
            samples: per trained class, a list of (dims, GPU, measured seconds) groups, one group per GPU.
            **meta: recorded in the artefact (data sha256, GPUs, script version...).

        Returns:
            self.
        """
        from sklearn.neural_network import MLPRegressor

        for cls, groups in samples.items():
            if cls not in TRAINED_CLASSES:
                raise PredictionError(f"cannot train class {cls!r}: trained classes are {', '.join(TRAINED_CLASSES)}")
            self.floors_[cls], self.gpu_floors_[cls] = _launch_floors(cls, groups)
            xs, ys = [], []
            for dims, gpu, lat in groups:
                floor = self.floor(cls, gpu)
                x, t_roof, _ = features(cls, dims, gpu, floor)
                xs.append(x)
                ys.append(np.log(lat) - np.log(t_roof + floor))
            x, y = np.concatenate(xs), np.concatenate(ys)
            mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-9
            nets = []
            for member in range(self.members):
                reg = MLPRegressor(
                    hidden_layer_sizes=self.hidden,
                    activation="relu",
                    alpha=1e-4,
                    learning_rate_init=1e-3,
                    batch_size=512,
                    max_iter=self.max_iter,
                    early_stopping=False,
                    n_iter_no_change=20,
                    tol=1e-6,
                    random_state=self.seed + member,
                    shuffle=True,
                )
                reg.fit((x - mean) / scale, y)
                nets.append(
                    MLP(
                        mean,
                        scale,
                        [np.asarray(w) for w in reg.coefs_],
                        list(map(np.asarray, reg.intercepts_)),
                        x.min(axis=0),
                        x.max(axis=0),
                    )
                )
            self.nets_[cls] = nets
        self.meta_ = dict(meta)
        return self

    def latency(
        self,
        cls: str,
        dims: Mapping[str, np.ndarray],
        gpu: GPU,
        *,
        peak_tflops: float | None = None,
        element_bytes: float = 4.0,
    ) -> np.ndarray:
        """Predicted seconds per call of ``cls`` operators with dimensions ``dims`` on ``gpu``.

        Args:
            cls: one of :data:`CLASSES`.
            dims: numpy arrays (or scalars) of equal length, the keys of :data:`DIMS` for the class.
            gpu: the GPU; needs ``sms``, ``l2_mb``, ``memory_bw_gbps`` and ``fp32_tflops`` (or ``peak_tflops``).
            peak_tflops: overrides the FP32 peak for gemm/conv (tensor-core precisions).
            element_bytes: input element size (4 fp32, 2 fp16/bf16). For gemm/conv, ``peak_tflops`` and
                ``element_bytes`` change the roofline only; the utilisation multiplier is the FP32 kernel's (the
                training data is FP32), so tensor-core efficiency belongs in the ``peak_tflops`` the caller passes.
                Other classes take bytes directly (``memory`` uses ``element_bytes`` to count elements).

        Returns:
            float64 array of seconds; an empty operator (size 0) takes the launch floor.

        Raises:
            PredictionError: unknown class, missing or negative dimension, or a GPU without a needed spec.
        """
        if cls not in CLASSES:
            raise PredictionError(f"unknown operator class {cls!r}: valid classes are {', '.join(CLASSES)}")
        missing = [key for key in DIMS[cls] if key not in dims]
        if missing:
            raise PredictionError(
                f"{cls!r} latency needs dimensions {', '.join(DIMS[cls])}; missing {', '.join(missing)}"
            )
        arrays = {key: np.atleast_1d(np.asarray(dims[key], dtype=float)) for key in DIMS[cls]}
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
        arrays = {key: np.broadcast_to(a, shape).ravel() for key, a in arrays.items()}
        for key, a in arrays.items():
            if not np.all(np.isfinite(a)) or np.any(a < 0):
                raise PredictionError(f"{cls!r} dimension {key!r} must be finite and >= 0, got {a[~(a >= 0)][:3]}")
        net_cls = BORROWED.get(cls, cls)
        if cls == "reduction":
            arrays = {"n": arrays["n"], "bytes": arrays["bytes"], "flops": arrays["n"]}
        elif cls == "memory":
            n = arrays["bytes"] / (2.0 * element_bytes)
            arrays = {"n": n, "bytes": arrays["bytes"], "flops": np.zeros_like(n)}
        if net_cls not in self.nets_:
            raise PredictionError(f"the kernel model has no network for {net_cls!r}: retrain it")
        twin = self.twin(gpu, cls)
        if twin is not None:
            return self._as_twin(cls, dims, arrays, gpu, twin, peak_tflops, element_bytes).reshape(shape)
        floor = self.floor(net_cls, gpu)
        x, t_roof, size = features(net_cls, arrays, gpu, floor, peak_tflops=peak_tflops, element_bytes=element_bytes)
        if net_cls in ("gemm", "conv") and (peak_tflops is not None or element_bytes != 4.0):
            # the networks learned FP32 kernels: utilisation from the FP32 features, the roofline from the real ones
            x, _, _ = features(net_cls, arrays, gpu, floor)
        log_mult = np.mean([net(x) for net in self.nets_[net_cls]], axis=0)
        mult = np.exp(np.clip(log_mult, *np.log(MULTIPLIER_RANGE)))
        out = _flops_bound(net_cls, (t_roof + floor) * mult, size, peak_tflops or gpu.fp32_tflops)
        return np.where(size > 0, out, floor).reshape(shape)

    def _as_twin(
        self,
        cls: str,
        dims: Mapping[str, np.ndarray],
        arrays: Mapping[str, np.ndarray],
        gpu: GPU,
        twin: GPU,
        peak_tflops: float | None,
        element_bytes: float,
    ) -> np.ndarray:
        """:meth:`latency` on a GPU with a trained twin (:meth:`twin`): the twin's execution (its latency above its
        launch floor, which is its host's) at this GPU's roofline, on this GPU's floor; flat like ``arrays``."""
        net_cls = BORROWED.get(cls, cls)
        floor, twin_floor = self.floor(net_cls, gpu), self.floor(net_cls, twin)
        options: dict[str, Any] = {"peak_tflops": peak_tflops, "element_bytes": element_bytes}
        _, t_roof, size = features(net_cls, arrays, gpu, floor, **options)
        _, twin_roof, _ = features(net_cls, arrays, twin, twin_floor, **options)
        theirs = self.latency(cls, dims, twin, **options).ravel()
        run = np.maximum(theirs - twin_floor, 0.0) * t_roof / np.maximum(twin_roof, _TINY)
        out = _flops_bound(net_cls, floor + run, size, peak_tflops or gpu.fp32_tflops)
        return np.where(size > 0, out, floor)

    def twin(self, gpu: GPU, cls: str = "gemm") -> GPU | None:
        """A GPU of the training data with this GPU's die, clocks and form factor (:func:`~predictor.catalog.gpus.
        same_die`) but other memory, with rows of the class ``cls`` (a borrowed class: its network's), the nearest
        in bandwidth; None for a trained GPU, one without such a twin, or an artefact that does not record its GPUs
        per class.

        The networks read the memory bandwidth through the roofline and the ridge point (``t_compute / t_memory``),
        and across NeuSight's GPUs the ridge point also tells a 70 W part from a 250-700 W one: the H200 (the H100's
        die with 4.8 TB/s of HBM3e) got FP32 GEMMs 0.82x the time measured on a lent H200, which ran NeuSight's H100
        shapes at 1.03-1.07x NeuSight's H100 latencies (bench/kernel_replay.py). A call on such a GPU takes the twin's
        time above the twin's launch floor, scaled by the two rooflines (the same where the arithmetic bounds it, the
        bandwidths' ratio where the memory does), on this GPU's own floor (the host's, :meth:`floor`). NeuSight
        measured the H100 on GEMMs only, so the H200's other classes stay the networks' own."""
        by_class = self.meta_.get("training_gpus_by_class")
        if not by_class or gpu.key in self.meta_.get("training_gpus", ()):
            return None
        return die_twin(gpu, _trained(tuple(by_class.get(BORROWED.get(cls, cls), ()))))

    def floor(self, cls: str, gpu: GPU) -> float:
        """Seconds of the smallest ``cls`` kernels on ``gpu`` (a trained class): its own measured launch floor, else
        the median over the measured GPUs (:attr:`floors_`)."""
        return self.gpu_floors_.get(cls, {}).get(gpu.key, self.floors_[cls])

    def dispatch(self, cls: str, gpu: GPU) -> float:
        """Seconds of an isolated ``cls`` timing on ``gpu`` that a stream of queued kernels does not pay: the host's
        dispatch of that operator, its launch and the timing's synchronisation, i.e. the class's launch floor
        (:meth:`floor`: its smallest measured kernels) less what such a kernel occupies the GPU in a stream
        (:data:`MIN_KERNEL_S`). Per class, because the host's share differs by operator: a layer norm's Python and
        ATen path costs 45 us where an add costs 25 (the launch-bound GPUs of the kernel data). A convolution takes a
        GEMM's (:data:`DISPATCH_OF`): the data has no convolution small enough to show its dispatch (the smallest
        take 59-108 us, 2-4x the smallest GEMM, with real work in them), and an implicit-GEMM convolution is a
        library GEMM call; a class without a network of its own (reduction, memory) takes the elementwise floor."""
        if cls not in CLASSES:
            raise PredictionError(f"unknown operator class {cls!r}: valid classes are {', '.join(CLASSES)}")
        net_cls = DISPATCH_OF.get(cls, cls)
        if net_cls not in self.floors_:
            raise PredictionError(f"the kernel model has no {net_cls!r} floor: retrain it")
        return max(self.floor(net_cls, gpu) - MIN_KERNEL_S, 0.0)

    def step_time(self, cls: str, dims: Mapping[str, np.ndarray], gpu: GPU, **options: Any) -> np.ndarray:
        """Seconds a call occupies the GPU inside a training step, where kernels are queued back to back: the
        isolated latency (:meth:`latency`, same arguments and keyword options) less the class's launch, dispatch and
        synchronisation on this GPU (:meth:`dispatch`), at least :data:`MIN_KERNEL_S`. Large kernels are unchanged
        (the overhead is a few percent of them); a small one costs its execution, not its launch-to-synchronisation
        time, so a step of many small kernels speeds up with the GPU as it does."""
        return np.maximum(self.latency(cls, dims, gpu, **options) - self.dispatch(cls, gpu), MIN_KERNEL_S)

    def to_json(self) -> dict[str, Any]:
        """The artefact: format, floors, networks and the training record."""
        return {
            "format": FORMAT,
            "classes": list(CLASSES),
            "borrowed": dict(BORROWED),
            "hidden": list(self.hidden),
            "floors_s": dict(self.floors_),
            "gpu_floors_s": {cls: dict(v) for cls, v in self.gpu_floors_.items()},
            "meta": self.meta_,
            "nets": {cls: [net.to_json() for net in nets] for cls, nets in self.nets_.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelModel:
        """A fitted model from :meth:`to_json`'s output (a v1 artefact reads as one without per-GPU floors: every
        GPU takes the class's median, as v1 did); PredictionError if the format is another."""
        if data.get("format") not in (FORMAT, FORMAT_V1):
            raise PredictionError(
                f"kernel model format {data.get('format')!r} is not {FORMAT!r}: retrain it with "
                "python scripts/train_kernel_model.py"
            )
        model = cls(hidden=tuple(data["hidden"]), members=len(next(iter(data["nets"].values()), [])))
        model.floors_ = {k: float(v) for k, v in data["floors_s"].items()}
        model.gpu_floors_ = {k: {g: float(f) for g, f in v.items()} for k, v in data.get("gpu_floors_s", {}).items()}
        model.nets_ = {k: [MLP.from_json(net) for net in v] for k, v in data["nets"].items()}
        model.meta_ = dict(data["meta"])
        return model


@functools.cache
def load_kernel_model() -> KernelModel:
    """The bundled kernel model (``predictor/data/kernel_model.json``), loaded once; never trains."""
    text = resources.files("predictor.data").joinpath("kernel_model.json").read_text(encoding="utf-8")
    return KernelModel.from_json(json.loads(text))

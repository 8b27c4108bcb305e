"""What a sharded run (FSDP1) adds to the profile: its layout, its collectives' time and bytes, the full model.

Collectives: FSDP1 all-gathers each unit's flat parameter (``dist.all_gather`` into chunks on CPU,
``dist.all_gather_single`` on accelerators, in ``torch/distributed/fsdp/_flat_param.py``) and reduce-scatters its
gradient (``dist.reduce_scatter_single``, ``_runtime_utils.py``). For the profile window only, the ``dist`` those two
modules call through is replaced by a proxy that times the all-gathers and reduce-scatters and passes every other
name through; nothing else in the process (Lightning's own collectives, DDP) is touched. Each call is bracketed by
two clock marks: host ``perf_counter`` on CPU, where gloo's collectives are synchronous, and CUDA events on the
stream FSDP issues the collective on (its current stream there) on CUDA.

Sizes: under FSDP the module's parameters are this rank's shard; the full model is read off the flat parameters
(``_numels``: the original parameters' sizes, shared ones once), and the structure off the wrapped units.
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_srifty.timing import PerfCounterClock
from predictor.model.layout import Layout
from predictor.model.stats import merge_intervals

# the FSDP1 modules whose ``dist`` is swapped, and the collectives timed there (current and older torch names)
FSDP_MODULES = ("torch.distributed.fsdp._flat_param", "torch.distributed.fsdp._runtime_utils")
GATHERS = frozenset({"all_gather", "all_gather_single", "all_gather_into_tensor", "_all_gather_base"})
SCATTERS = frozenset({"reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"})
SHARDINGS = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "HYBRID_SHARD": "hybrid_shard"}


@dataclass
class ShardedSeries:
    """Per-step collective times (seconds, the union of the calls' intervals) and bytes of the kept steps."""

    allgather_s: list[float]
    reduce_scatter_s: list[float]
    allgather_bytes_per_step: int
    reduce_scatter_bytes_per_step: int


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class _TimedDist:
    """``torch.distributed`` as FSDP's modules see it during the window: the timed collectives, the rest as is."""

    def __init__(self, timer: ShardedCollectiveTimer) -> None:
        self._timer = timer

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch.distributed, name)
        kind = "allgather" if name in GATHERS else "reduce_scatter" if name in SCATTERS else None
        return value if kind is None else functools.partial(self._timer.call, kind, value)


class ShardedCollectiveTimer:
    """Times FSDP1's all-gathers and reduce-scatters between :meth:`start` and :meth:`stop`, by step (``step``,
    set by the callback); bytes are what the call gathers (its output) or scatters (its input), per rank."""

    def __init__(self) -> None:
        self.clock: Any = PerfCounterClock()
        self.step = -1
        self._records: list[tuple[int, str, int, Any, Any]] = []
        self._saved: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        return bool(self._saved)

    def start(self, clock: Any) -> None:
        self.clock = clock
        self._records.clear()
        if self._saved:
            return
        proxy = _TimedDist(self)
        for name in FSDP_MODULES:
            module: Any = importlib.import_module(name)
            self._saved[name] = module.dist
            module.dist = proxy

    def stop(self) -> None:
        for name, original in self._saved.items():
            module: Any = importlib.import_module(name)
            module.dist = original
        self._saved.clear()

    def call(self, kind: str, collective: Any, *args: Any, **kwargs: Any) -> Any:
        nbytes = _nbytes(args[0] if kind == "allgather" else args[1]) if len(args) > 1 else 0
        begin = self.clock.mark()
        result = collective(*args, **kwargs)
        self._records.append((self.step, kind, nbytes, begin, self.clock.mark()))
        return result

    def resolve(self, steps: list[int]) -> ShardedSeries | None:
        """Per-step time and bytes of each kind over ``steps`` (those the recorder kept); None when none ran."""
        wanted = set(steps)
        records = [r for r in self._records if r[0] in wanted]
        if not records:
            return None
        times = self.clock.resolve([m for r in records for m in (r[3], r[4])])
        spans: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
        sizes: Counter[tuple[int, str]] = Counter()
        for i, (step, kind, nbytes, _, _) in enumerate(records):
            spans[step, kind].append((times[2 * i], times[2 * i + 1]))
            sizes[step, kind] += nbytes
        ran = [s for s in steps if (s, "allgather") in spans or (s, "reduce_scatter") in spans]
        return ShardedSeries(
            allgather_s=[merge_intervals(spans.get((s, "allgather"), [])) for s in ran],
            reduce_scatter_s=[merge_intervals(spans.get((s, "reduce_scatter"), [])) for s in ran],
            allgather_bytes_per_step=max(sizes[s, "allgather"] for s in ran),
            reduce_scatter_bytes_per_step=max(sizes[s, "reduce_scatter"] for s in ran),
        )


def fsdp_units(model: nn.Module) -> list[Any]:
    """The FSDP1 units in ``model`` (outermost first); empty when it is not sharded with FSDP1."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]


def _inner(module: nn.Module) -> nn.Module:
    """The module under FSDP's and the checkpoint wrapper's wrapping."""
    for attribute in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module"):
        while hasattr(module, attribute):
            module = getattr(module, attribute)
    return module


def checkpointed(model: nn.Module) -> list[nn.Module]:
    """The blocks under activation checkpointing (torch's checkpoint wrapper)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return [_inner(m) for m in model.modules() if isinstance(m, CheckpointWrapper)]


def layout_name(strategy: Any, model: nn.Module) -> str | None:
    """The run's layout as :mod:`predictor.model.layout` names it (``fsdp:full_shard+ac``, ``ddp+ac``), or None for
    plain DDP, a single device, or a strategy that vocabulary does not name (model parallel)."""
    ac = bool(checkpointed(model))
    units = fsdp_units(model)
    if units:
        sharding = SHARDINGS.get(str(getattr(units[0], "sharding_strategy", "")).rsplit(".", 1)[-1])
        return Layout("fsdp", sharding, ac).name if sharding else None  # type: ignore[arg-type]
    if type(getattr(strategy, "__wrapped__", strategy)).__name__ == "ModelParallelStrategy":  # a view's: its own
        return None
    return Layout(activation_checkpointing=True).name if ac else None


def _flat_params(model: nn.Module) -> list[Any]:
    handles = [getattr(u, "_handle", None) for u in fsdp_units(model)]
    return [h.flat_param for h in handles if h is not None]


def full_sizes(model: nn.Module) -> dict[str, Any] | None:
    """Of an FSDP1 model: the full (unsharded) parameter counts and gradient bytes by dtype, and the shard group's
    size; None when the model is not sharded."""
    flats = _flat_params(model)
    if not flats:
        return None
    total = trainable = 0
    grads: Counter[str] = Counter()
    for flat in flats:
        originals = getattr(flat, "_params", None)
        for i, numel in enumerate(flat._numels):
            total += numel
            if (originals[i] if originals is not None else flat).requires_grad:
                trainable += numel
                grads[str(flat.dtype).removeprefix("torch.")] += numel * flat.element_size()
    shard_group = int(getattr(fsdp_units(model)[0], "world_size", 1) or 1)
    return {"parameters": total, "trainable": trainable, "gradient_bytes": dict(grads), "shard_group": shard_group}


def structure(model: nn.Module) -> dict[str, Any] | None:
    """``model.structure`` (blocks, block, block_parameters) from the FSDP units below the root, or else from the
    activation-checkpointed blocks; None when neither names a repeated block."""
    units = fsdp_units(model)
    if units:
        inner = [(type(_inner(u)).__name__, sum(u._handle.flat_param._numels)) for u in units[1:] if u._handle]
        method = "FSDP wrap units"
    else:
        inner = [(type(b).__name__, sum(p.numel() for p in b.parameters())) for b in checkpointed(model)]
        method = "activation-checkpointed blocks"
    if not inner:
        return None
    block, blocks = Counter(name for name, _ in inner).most_common(1)[0]
    biggest = max(n for name, n in inner if name == block)
    return {"blocks": blocks, "block": block, "block_parameters": biggest, "method": method}

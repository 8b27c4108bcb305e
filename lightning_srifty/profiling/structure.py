"""The model's repeated block and the activation memory of one training step (the profile's ``model.structure``).

:func:`find_blocks` names the repeated block: the class with two or more instances that are not leaves (they hold
sub-modules) whose instances together hold the most parameters, the outermost such class on a tie (so a
``LlamaDecoderLayer`` wins over its ``LlamaMLP``, and ``nn.Linear`` is never a block).

:class:`MemoryProbe` watches one captured step (fake tensors on ``meta``, real ones on ``cpu``) and measures, in bytes:

- ``saved``: what autograd saves for backward over the forward (``torch.autograd.graph.saved_tensors_hooks``), as
  unique storages, parameters and buffers excluded (they are weights, not activations). Storages computed from the
  weights alone (autocast's half-precision copies under ``*-mixed``) do not grow with the batch: kept apart as
  fixed bytes.
- per block (forward pre/post hooks): what each block saves and the bytes of its own input (inputs shared by every
  block, such as rotary tables, are not a block's own);
- ``transient``: at the step's peak of live tensor bytes over forward and backward, what is live besides the weights,
  the gradients, the saved tensors and the fixed bytes (the logits of the loss, activation gradients, the batch).
  Live bytes are the storages the step allocates, each released by a ``weakref.finalize`` on its storage, on top of
  the weights and the batch. ``fixed_at_peak``: what was live at that peak that does not grow with the batch: tensors
  computed from the weights alone, and weight-shaped tensors of the backward (weight-gradient temporaries);
- ``optimizer_transient``: the peak of ``optimizer.step()`` above what it leaves live (foreach temporaries).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

METHOD = "saved_tensors_hooks (unique storages, weights excluded) and live storages under a TorchDispatchMode"


def find_blocks(module: torch.nn.Module) -> tuple[str | None, list[torch.nn.Module]]:
    """The repeated block of ``module``: (its class name, its instances in order); ``(None, [])`` when none."""
    instances: dict[type, list[torch.nn.Module]] = {}
    depth: dict[type, int] = {}
    for name, sub in module.named_modules(remove_duplicate=True):
        if sub is module or not any(True for _ in sub.children()):
            continue
        instances.setdefault(type(sub), []).append(sub)
        depth.setdefault(type(sub), name.count(".") + 1)
    best: tuple[int, int] | None = None
    chosen: type | None = None
    for cls, subs in instances.items():
        outer = _outermost(subs)
        if len(outer) < 2:
            continue
        params = sum(_count(s) for s in outer)
        if params == 0:
            continue
        key = (params, -depth[cls])
        if best is None or key > best:
            best, chosen = key, cls
    if chosen is None:
        return None, []
    return chosen.__name__, _outermost(instances[chosen])


def _outermost(subs: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The instances not nested inside another instance of the list."""
    inner = {id(m) for s in subs for m in s.modules() if m is not s}
    return [s for s in subs if id(s) not in inner]


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor subclass without a storage: not memory of its own
        return None


class MemoryProbe(TorchDispatchMode):
    """Measures saved, per-block, transient and optimizer bytes of one step; enter it before the step and set
    :attr:`phase` (``forward``, ``backward``, ``optimizer``) as the step goes.

    Args:
        module: the model the step runs (its parameters and buffers are the weights).
        batch: the batch the step runs on (live throughout the step).
        blocks: the repeated block's instances (:func:`find_blocks`).
    """

    def __init__(self, module: torch.nn.Module, batch: Any, blocks: list[torch.nn.Module]) -> None:
        super().__init__()
        self.phase = "forward"
        self.blocks = blocks
        self._weights: dict[int, int] = {}
        for t in [*module.parameters(), *module.buffers()]:
            if (k := _key(t)) is not None:
                self._weights[k] = t.untyped_storage().nbytes()
        self._params = [p for p in module.parameters() if p.requires_grad]
        shapes = [tuple(p.shape) for p in self._params]
        self._weight_shapes = {*shapes, *(s[::-1] for s in shapes)}
        # storage key -> [bytes, allocated in the step, saved, gradient, fixed (does not grow with the batch)]
        self._info: dict[int, list[Any]] = {}
        self._fixed: set[int] = set(self._weights)
        self.weight_bytes = sum(self._weights.values())
        self.live = self.weight_bytes
        for t in tree_leaves(batch):
            if isinstance(t, torch.Tensor) and (k := _key(t)) is not None and k not in self._weights:
                self._watch(t, k, allocated=True)
        self.saved = self.fixed = self.grads = 0
        self.saved_total = 0
        self.peak = self.live
        self.transient = self.fixed_at_peak = 0
        self._pending: tuple[int, int] | None = None
        self._opt_start: int | None = None
        self._opt_peak = 0
        self.optimizer_transient = 0
        self._block: int | None = None
        self.block_saved: list[int] = [0] * len(blocks)
        self._block_seen: list[set[int]] = [set() for _ in blocks]
        self._block_inputs: list[dict[int, int]] = [{} for _ in blocks]
        self._handles: list[Any] = []
        self.errors: Counter[str] = Counter()

    # -- storage bookkeeping -------------------------------------------------------------------------------------

    def _watch(self, t: torch.Tensor, key: int, *, allocated: bool) -> list[Any]:
        info = self._info.get(key)
        if info is None:
            storage = t.untyped_storage()
            info = [storage.nbytes(), allocated, False, False, False]
            self._info[key] = info
            weakref.finalize(storage, self._release, key)
            if allocated:
                self.live += info[0]
        return info

    def _release(self, key: int) -> None:
        info = self._info.pop(key, None)
        if info is None:
            return
        size, allocated, saved, grad, fixed = info
        if allocated:
            self.live -= size
        if saved:
            self.saved -= size
        if grad:
            self.grads -= size
        if fixed:
            self.fixed -= size
        self._fixed.discard(key)

    # -- dispatch ----------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self._settle()
        out = func(*args, **kwargs)
        try:  # the bookkeeping must never fail the step
            self._after(args, kwargs, out)
        except Exception as exc:  # noqa: BLE001 - reported in the structure's method
            self.errors[f"{func}: {type(exc).__name__}"] += 1
        return out

    def _after(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        from_weights = bool(inputs) and all(_key(t) in self._fixed for t in inputs)
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or (k := _key(t)) is None or k in self._weights:
                continue
            if k not in self._info:
                info = self._watch(t, k, allocated=True)
                if from_weights:
                    self._fixed.add(k)
                if from_weights or (self.phase == "backward" and tuple(t.shape) in self._weight_shapes):
                    info[4] = True
                    self.fixed += info[0]
        if self.phase == "optimizer":
            self._opt_peak = max(self._opt_peak, self.live)
        else:
            self._pending = (self.live, self.saved)

    def _settle(self) -> None:
        """Attribute the live bytes after the previous call, now that autograd has packed what it saves and
        accumulated what became a gradient (both happen after the call returns)."""
        if self._pending is None:
            return
        live, saved = self._pending
        self._pending = None
        if live > self.peak:
            self.peak = live
            self.fixed_at_peak = self.fixed
            self.transient = max(0, live - self.weight_bytes - max(saved, self.saved) - self.grads - self.fixed)

    # -- autograd hooks ----------------------------------------------------------------------------------------

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            k = _key(t)
            if k is not None and k not in self._weights:
                info = self._watch(t, k, allocated=False)
                if not info[2] and not info[4]:
                    info[2] = True
                    self.saved += info[0]
                    self.saved_total += info[0]
                if self._block is not None and k not in self._fixed and k not in self._block_seen[self._block]:
                    self._block_seen[self._block].add(k)
                    self.block_saved[self._block] += info[0]
        except Exception as exc:  # noqa: BLE001 - never fail the step
            self.errors[f"pack: {type(exc).__name__}"] += 1
        return t

    def _grad(self, p: torch.Tensor) -> None:
        g = p.grad
        k = None if g is None else _key(g)
        if g is None or k is None:
            return
        info = self._watch(g, k, allocated=True)
        if not info[3]:
            info[3] = True
            self.grads += info[0]
        if info[4]:
            info[4] = False
            self.fixed -= info[0]

    def _enter_block(self, index: int, args: Any, kwargs: Any) -> None:
        self._block = index
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and (k := _key(t)) is not None and k not in self._weights:
                self._block_inputs[index][k] = t.untyped_storage().nbytes()

    def _leave_block(self) -> None:
        self._block = None

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Wrap the forward: counts what autograd saves, block by block."""
        handles = []
        for i, block in enumerate(self.blocks):
            handles.append(
                block.register_forward_pre_hook(lambda m, a, k, i=i: self._enter_block(i, a, k), with_kwargs=True)
            )
            handles.append(block.register_forward_hook(lambda m, a, o: self._leave_block()))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield
        finally:
            for h in handles:
                h.remove()

    def start_optimizer(self) -> None:
        self._settle()
        self.phase = "optimizer"
        self._opt_start = self.live
        self._opt_peak = self.live

    def end_optimizer_step(self) -> None:
        """Call after ``optimizer.step()``, before ``zero_grad()``: what the step leaves live is its baseline."""
        self.optimizer_transient = max(0, self._opt_peak - self.live)

    def __enter__(self) -> MemoryProbe:
        self._handles = [p.register_post_accumulate_grad_hook(self._grad) for p in self._params]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._settle()
        for h in self._handles:
            h.remove()
        self._handles = []
        super().__exit__(*exc)

    # -- results -----------------------------------------------------------------------------------------------

    def block_input_bytes(self) -> int:
        """Bytes of the largest block's own input (storages that are the input of one block only)."""
        uses = Counter(k for inputs in self._block_inputs for k in inputs)
        return max((sum(b for k, b in inputs.items() if uses[k] == 1) for inputs in self._block_inputs), default=0)

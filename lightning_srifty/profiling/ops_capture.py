"""Recording the ATen operators of a training step (the profile's ``ops`` table), framework-free.

:class:`OpRecorder` is a ``TorchDispatchMode``: it sees every ATen call below autograd and autocast, i.e. the
operators that launch kernels, with the dtypes autocast chose and the backward that autograd runs. Each call is
recorded with its input and output shapes and dtypes, its FLOPs from torch's flop-counter registry (the formulas
``FlopCounterMode`` uses; 0 where there is none) with this package's formulas over it (:mod:`.attention`: every SDPA
kernel, causal masks; :mod:`.flops`: grouped convolutions' weight gradient), the bytes it reads and writes, and for
convolutions, pooling and attention the non-tensor arguments that shape the kernel; the CPU's attention kernel is
recorded as the one CUDA would run. Calls are aggregated by signature, so a step of a large transformer gives a few
hundred records. Operators that launch no kernel (views, aliases, ``detach``, allocation) are left out and counted in
``skipped``; nothing is dropped silently.

:func:`lightning_srifty.profiling.capture.capture_ops` runs one whole step of a model under it without a GPU;
``SriftyCallback`` records one real warm-up step with it.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lightning_srifty.profiling import attention
from lightning_srifty.profiling.flops import flop_formulas
from predictor.documents.profile import OpRecord, OpTable

# Shape the kernel without being tensors: kept in ``params`` (convolutions, pooling).
KERNEL_PARAMS = (
    "stride",
    "padding",
    "dilation",
    "groups",
    "transposed",
    "output_padding",
    "kernel_size",
    "output_mask",
)
# No kernel although the schema does not mark an alias: allocation and metadata.
NO_KERNEL = frozenset(
    {
        "aten._unsafe_view",
        "aten.empty",
        "aten.empty_like",
        "aten.empty_strided",
        "aten.new_empty",
        "aten.new_empty_strided",
        "aten.resize_",
        "aten.set_",
        "aten.lift_fresh",
        "aten._reshape_alias",
        "aten.sym_constrain_range_for_size",
        "aten._assert_async",
        "aten.record_stream",
    }
)
# In-place operators that overwrite their output without reading it.
OVERWRITE_ONLY = frozenset(
    {
        "aten.zero_",
        "aten.fill_",
        "aten.copy_",
        "aten.uniform_",
        "aten.normal_",
        "aten.bernoulli_",
        "aten.random_",
        "aten.exponential_",
        "aten._foreach_zero_",
        "aten._foreach_copy_",
    }
)
# Metadata queries, not operators of the step (``prim.device`` reaches dispatch only for fake tensors): passed
# through without being recorded or counted, so CPU and meta captures agree.
# Not compute kernels of the step: collectives (communication is measured and modelled apart) and profiler markers.
# Skipped and counted.
SKIPPED_NAMESPACES = frozenset({"c10d", "_c10d_functional", "profiler"})
_METADATA = (
    torch.ops.aten.size,
    torch.ops.aten.stride,
    torch.ops.aten.numel,
    torch.ops.aten.dim,
    torch.ops.prim.device,
)
# Convolutions: cuDNN picks the memory format from the input *or* the weight (PyTorch's
# ``cudnn_conv_suggest_memory_format``: channels-last when either is), and writes its output in it; the capture's
# fake CPU convolution does the same (tested), so what follows a convolution records the layout it has on the GPU.
_CONVOLUTIONS = frozenset({"aten.convolution", "aten._convolution", "aten.cudnn_convolution"})
_CONVOLUTION_BACKWARDS = frozenset({"aten.convolution_backward", "aten.cudnn_convolution_backward"})


def launches_no_kernel(func: Any) -> bool:
    """True for operators that only make views/aliases or allocate: every output aliases an input without writing
    it (the schema's alias annotation, e.g. ``Tensor(a)``), the operator is tagged ``inplace_view``, or it is one of
    :data:`NO_KERNEL`. Collectives and profiler markers (:data:`SKIPPED_NAMESPACES`) and calls that return no tensor
    and write none (``item()``) are skipped too."""
    if torch.Tag.inplace_view in func.tags or _packet(func) in NO_KERNEL or func.namespace in SKIPPED_NAMESPACES:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _mutates(func: Any) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def _packet(func: Any) -> str:
    return str(func._overloadpacket)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of memory a tensor spans: a broadcast dimension (stride 0) is read once."""
    if t.numel() == 0:
        return 0
    n = math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0)
    return int(n) * t.element_size()


def _tensors(value: Any) -> list[torch.Tensor]:
    return [v for v in tree_leaves(value) if isinstance(v, torch.Tensor)]


def _is_4d(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 4


def _nhwc(t: Any) -> bool:
    """A 4-D tensor in channels-last (NHWC) memory format and not also plainly contiguous (N, C or H x W of 1)."""
    return _is_4d(t) and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _conv_channels_last(args: Sequence[Any]) -> bool:
    """A convolution runs channels-last when its input or its weight is (PyTorch's rule for cuDNN)."""
    return any(_nhwc(a) for a in args[:2])


def _channels_last(name: str, args: Sequence[Any]) -> bool:
    """Whether a call runs on channels-last activations: a convolution by PyTorch's rule (its input or weight; the
    backward's grad_output, input or weight), any other operator by its first 4-D tensor input."""
    if name in _CONVOLUTIONS:
        return _conv_channels_last(args)
    if name in _CONVOLUTION_BACKWARDS:
        return any(_nhwc(a) for a in args[:3])
    first = next((a for a in args if _is_4d(a)), None)
    return first is not None and _nhwc(first)


def _param(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return [int(value)]
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, bool)) for v in value):
        return [int(v) for v in value]
    return None


class OpRecorder(TorchDispatchMode):
    """Records the ATen calls made while it is active, under the phase the caller sets.

    Args:
        phase: the phase calls are recorded under until changed (``forward``, ``backward``, ``optimizer``); calls
            made while it is ``None`` are not recorded.
    """

    def __init__(self, phase: str | None = "forward", *, cuda_attention: bool = True) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.phase = phase
        self.flop_registry = {**flop_registry, **flop_formulas()}
        self.cuda_attention = cuda_attention  # record the CPU's SDPA kernel as the one CUDA would run
        self.attention_kernels: Counter[str] = Counter()
        self.records: dict[tuple[Any, ...], list[Any]] = {}
        self.skipped: Counter[str] = Counter()
        self.flop_errors: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func._overloadpacket in _METADATA or self.phase is None:
            return func(*args, **kwargs)
        if func._overloadpacket not in self.flop_registry:
            with self:  # as FlopCounterMode: a composite operator is recorded as the kernels it decomposes into
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        try:  # the bookkeeping must never fail the step (an exception here can abort the process)
            if launches_no_kernel(func) or not (_tensors(out) or _mutates(func)):
                self.skipped[str(func)] += 1
            else:
                self._record(func, args, kwargs, out)
        except Exception as exc:  # noqa: BLE001 - reported in the table's notes
            self.errors[f"{func}: {type(exc).__name__}: {exc}"[:200]] += 1
        return out

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = _packet(func)
        read = written = 0
        shapes: list[list[int]] = []
        dtypes: list[str] = []
        params: dict[str, list[int]] = {}
        schema_args = func._schema.arguments
        for i, arg in enumerate(schema_args):
            if i < len(args):
                value = args[i]
            elif arg.name in kwargs:
                value = kwargs[arg.name]
            else:
                continue
            tensors = _tensors(value)
            if not tensors:
                if arg.name in KERNEL_PARAMS and (p := _param(value)) is not None:
                    params[arg.name] = p
                continue
            mutated = arg.alias_info is not None and arg.alias_info.is_write
            for t in tensors:
                shapes.append([int(s) for s in t.shape])
                dtypes.append(_dtype(t))
                size = _nbytes(t)
                if mutated:
                    written += size
                if not (arg.is_out or (mutated and name in OVERWRITE_ONLY)):
                    read += size
        outs = _tensors(out)
        fresh = [r.alias_info is None for r in func._schema.returns]
        if all(fresh):  # in-place results are the mutated arguments, counted above
            written += sum(_nbytes(t) for t in outs)
        flops = self._flops(func, args, kwargs, out)
        out_shapes = [[int(s) for s in t.shape] for t in outs]
        out_dtype = _dtype(outs[0]) if outs else None
        op = str(func)
        if func._overloadpacket in attention.SPECS:
            params.update(attention.kernel_params(func, args, kwargs))
        if _channels_last(name, args):
            params["channels_last"] = [1]
        if self.cuda_attention and func._overloadpacket in (attention.CPU_FORWARD, attention.CPU_BACKWARD):
            op, shapes, dtypes, kernel = attention.cuda_record(func, args, kwargs, shapes, dtypes)
            self.attention_kernels[f"{kernel} ({self.phase})"] += 1
        key = (
            op,
            self.phase,
            _freeze(shapes),
            tuple(dtypes),
            _freeze(sorted(params.items())),
            _freeze(out_shapes),
            out_dtype,
        )
        entry = self.records.get(key)
        if entry is None:
            self.records[key] = [1, shapes, dtypes, flops, read, written, out_shapes, out_dtype, params or None]
        else:
            entry[0] += 1

    def _flops(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        """The call's FLOPs by torch's formula for it (attention by the overload called); 0 when there is none, and
        counted in ``flop_errors`` when the formula cannot take these arguments."""
        if func._overloadpacket not in self.flop_registry:
            return 0
        try:
            if func._overloadpacket in attention.SPECS:  # by the overload called (FlopCounterMode: the default)
                return attention.attention_flops(func, args, kwargs)
            return int(self.flop_registry[func._overloadpacket](*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - a formula that cannot take these arguments: counted as 0, reported
            self.flop_errors[str(func)] += 1
            return 0

    def op_records(self) -> list[OpRecord]:
        """The aggregated records, in the order their signatures first ran."""
        return [
            OpRecord(
                op=key[0],
                phase=key[1],
                count=e[0],
                shapes=e[1],
                dtypes=e[2],
                flops=float(e[3]),
                bytes_read=float(e[4]),
                bytes_written=float(e[5]),
                out_shapes=e[6],
                out_dtype=e[7],
                params=e[8],
            )
            for key, e in self.records.items()
        ]

    def phase_flops(self) -> dict[str, float]:
        """FLOPs of the step by phase (count x per-call FLOPs)."""
        out: Counter[str] = Counter()
        for key, e in self.records.items():
            out[key[1]] += e[0] * e[3]
        return dict(out)

    def table(
        self, *, device: str, samples: int, method: str, precision: str | None, notes: list[str] | None = None
    ) -> OpTable:
        """The profile's ``ops`` section."""
        notes = list(notes or [])
        if self.attention_kernels:
            kernels = ", ".join(f"{k} x{n}" for k, n in sorted(self.attention_kernels.items()))
            notes.append(
                "attention: the CPU's _scaled_dot_product_flash_attention_for_cpu recorded as the SDPA kernel CUDA "
                f"would run ({kernels}; lightning_srifty.profiling.attention), with its FLOPs"
            )
        if self.errors:
            notes.append(
                "calls not recorded (recorder error): " + "; ".join(f"{e} x{n}" for e, n in self.errors.items())
            )
        if self.flop_errors:
            notes.append(
                "flop formula failed (counted as 0) for: "
                + ", ".join(f"{op} x{n}" for op, n in sorted(self.flop_errors.items()))
            )
        ops = self.op_records()
        return OpTable(
            device=device,  # type: ignore[arg-type]  # the capture's own: "cpu", "cuda", "meta" or "fake"
            samples=samples,
            ops=tuple(ops),
            method=method,
            precision=precision,
            total_flops=float(sum(o.count * o.flops for o in ops)),
            skipped=dict(sorted(self.skipped.items())) or None,
            notes=tuple(notes) or None,
        )


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


class StepOpCapture:
    """Records the operator table of one real training step, phase by phase; never raises.

    The caller maps its hooks onto :meth:`start_forward`, :meth:`start_backward`, :meth:`start_optimizer` and
    :meth:`finish`. It also gives the step's FLOPs (the interface of :class:`.flops.StepFlopCounter`),
    from the same flop formulas. On a CPU step it makes the step look like the CUDA one the table is for: CUDA's
    autocast policy under mixed precision, and ``foreach=True`` for optimizers that leave it unset (both for this one
    step, restored at its end).
    """

    method = "TorchDispatchMode on one warm-up training step"

    def __init__(self) -> None:
        self.reason: str | None = None
        self.notes: list[str] = []
        self.flops: dict[str, float] = {}
        self._recorder: OpRecorder | None = None
        self._records: OpRecorder | None = None
        self._policy: Any = None
        self._foreach: list[dict[str, Any]] = []
        self._after_step: Any = None  # a manual loop's optimizer step post-hook (start_forward's manual)

    @property
    def active(self) -> bool:
        return self._recorder is not None

    def start_forward(
        self,
        *,
        emulate_cuda_autocast: bool = False,
        optimizers: Any = (),
        first_step: bool = False,
        manual: bool = False,
    ) -> None:
        """``manual``: the module steps its own optimizers, a forward and backward for each (a GAN): what follows an
        optimizer step is the next forward, not more of the optimizer's work (a trial's GAN had its generator's
        forward priced as optimizer work, once a step, and its FLOPs a sample 17 % low)."""
        if first_step:
            self.notes.append("captured on the first step: includes one-off work such as creating optimizer state")
        if manual:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._after_step = register_optimizer_step_post_hook(lambda *_: self._next_forward())
            self.notes.append(
                "a manual optimization loop: each optimizer step ends its part of the step, and what follows is the "
                "next forward"
            )
        try:
            if emulate_cuda_autocast:
                from lightning_srifty.profiling.cuda_autocast import cuda_autocast_policy

                self._policy = cuda_autocast_policy()
                self._policy.__enter__()
                self.notes.append("mixed precision on CPU: CUDA's autocast policy emulated for the captured step")
            for opt in optimizers:
                inner = getattr(opt, "optimizer", opt)
                if "foreach" in getattr(inner, "defaults", {}):
                    for group in inner.param_groups:
                        if group.get("foreach") is None and not group.get("fused"):
                            group["foreach"] = True
                            self._foreach.append(group)
            if self._foreach:
                self.notes.append("optimizer foreach=True for the captured step (torch's default on CUDA)")
            self._recorder = OpRecorder(phase="forward")
            self._recorder.__enter__()
        except Exception as exc:  # noqa: BLE001 - the capture is optional: record why
            self.abort(f"the operator capture could not start: {type(exc).__name__}: {exc}")

    def start_backward(self) -> None:
        self._leave_policy()
        if self._recorder is not None:
            self._recorder.phase = "backward"

    def start_optimizer(self) -> None:
        """Gradient clipping, ``optimizer.step`` and ``zero_grad`` (Lightning zeroes before the backward)."""
        self._leave_policy()
        if self._recorder is not None:
            self._recorder.phase = "optimizer"

    def _next_forward(self) -> None:
        if self._recorder is not None:
            self._recorder.phase = "forward"

    def _stop_following_steps(self) -> None:
        handle, self._after_step = self._after_step, None
        if handle is not None:
            handle.remove()

    def finish(self) -> None:
        self._leave_policy()
        self._stop_following_steps()
        recorder, self._recorder = self._recorder, None
        self._restore_foreach()
        if recorder is None:
            return
        try:
            recorder.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - the capture is optional: record why
            self.reason = f"the operator capture failed: {type(exc).__name__}: {exc}"
            return
        self._records = recorder
        self.flops = recorder.phase_flops()
        if "backward" not in self.flops:
            self.reason = "no backward ran inside the captured step (manual optimization?)"

    def abort(self, reason: str) -> None:
        self._leave_policy()
        self._stop_following_steps()
        self._restore_foreach()
        if self._recorder is not None:
            with contextlib.suppress(Exception):  # already failing: the reason below is what matters
                self._recorder.__exit__(None, None, None)
        self._recorder = self._records = None
        self.reason = reason

    def table(self, *, samples: int | None, device: str, precision: str | None) -> OpTable | None:
        """The profile's ``ops`` (None when the step was not captured; ``reason`` says why)."""
        if self._records is None or not samples:
            return None
        return self._records.table(
            device=device, samples=samples, method=self.method, precision=precision, notes=self.notes
        )

    def per_sample(self, samples: int | None) -> dict[str, Any]:
        """The profile's ``model.flops`` section (as :meth:`StepFlopCounter.per_sample`)."""
        if self._records is None:
            return {"reason": self.reason or "the operator capture did not run"}
        if not samples:
            return {"reason": "the batch size is unknown, so FLOPs cannot be given per sample"}
        forward = self.flops.get("forward", 0.0)
        if not forward:
            return {"reason": "the flop counter found no matmul/convolution in the step"}
        out: dict[str, Any] = {
            "forward_per_sample": forward / samples,
            "method": "torch.utils.flop_counter formulas (attention, grouped convolutions' backward: "
            f"lightning_srifty's), {self.method}",
        }
        if "backward" in self.flops:
            out["backward_per_sample"] = self.flops["backward"] / samples
            out["per_sample"] = (forward + self.flops["backward"]) / samples
        else:
            out["reason"] = self.reason
        return out

    def _leave_policy(self) -> None:
        policy, self._policy = self._policy, None
        if policy is not None:
            try:
                policy.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 - record, never raise
                self.notes.append(f"restoring the autocast policy failed: {type(exc).__name__}: {exc}")

    def _restore_foreach(self) -> None:
        for group in self._foreach:
            group["foreach"] = None
        self._foreach = []

"""``capture_ops``: the operator table of one training step of a model, without a GPU and without its memory.

The step is what Lightning runs in automatic optimization: ``training_step`` (forward), ``backward``, then
``optimizer.step()`` and ``zero_grad()`` of ``configure_optimizers()`` (optimizer). On ``device="meta"`` every tensor
is a fake tensor (``FakeTensorMode``: shapes, dtypes and strides, no storage, no arithmetic), so a 1B-parameter model
is captured in seconds on a laptop; ``device="cpu"`` runs the same step for real and gives the same table.

Precision follows Lightning's plugins: ``*-true`` casts the module and the floating-point batch; ``*-mixed`` runs
``training_step`` under autocast with CUDA's policy (see :mod:`.cuda_autocast`), so the table has the
half/bfloat16 GEMMs and float32 reductions CUDA AMP runs. Optimizers whose ``foreach`` is left unset get
``foreach=True``, the multi-tensor path torch picks for CUDA parameters. Attention is recorded as the SDPA kernel CUDA
would run (:mod:`.attention`): attention dropout runs at 0 on meta and CPU so the CPU runs its fused kernel too.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_srifty.profiling.attention import CudaAttentionOnCpu
from lightning_srifty.profiling.model_info import (
    batch_size as detect_batch_size,
)
from lightning_srifty.profiling.model_info import (
    gradient_bytes,
    normalize_precision,
    optimizer_names,
    optimizer_state_bytes,
    parameter_counts,
)
from lightning_srifty.profiling.ops_capture import OpRecorder
from lightning_srifty.profiling.structure import METHOD as STRUCTURE_METHOD
from lightning_srifty.profiling.structure import MemoryProbe, find_blocks
from predictor.documents.profile import OpTable
from predictor.exceptions import ConfigError, ProfileError

DEVICES = ("meta", "cpu", "cuda")
TRUE_DTYPES = {
    "32-true": torch.float32,
    "64-true": torch.float64,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
}
MIXED_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
METHOD = "TorchDispatchMode over one training step"
_OWNER = "capture_ops()"


@dataclass
class StepCapture:
    """What one captured step gives: the operator table and the model's sizes."""

    table: OpTable
    name: str
    precision: str
    parameters: int
    trainable_parameters: int
    gradient_bytes_by_dtype: dict[str, int]
    optimizer: str | None
    optimizer_state_bytes: int
    phase_flops: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    structure: dict[str, Any] | None = None

    def model_section(self) -> dict[str, Any]:
        """The profile's ``model`` section (FLOPs per sample from the table)."""
        samples = self.table.samples
        fwd, bwd = self.phase_flops.get("forward", 0.0), self.phase_flops.get("backward", 0.0)
        flops: dict[str, Any] = {
            "method": "torch.utils.flop_counter formulas, attention's and grouped convolutions' backward from "
            f"lightning_srifty.profiling (attention, flops), over the operator table ({METHOD})"
        }
        if fwd:
            flops |= {"forward_per_sample": fwd / samples, "backward_per_sample": bwd / samples}
            flops["per_sample"] = (fwd + bwd) / samples
        else:
            flops = {"reason": "the flop counter found no matmul/convolution in the step"}
        return {
            "name": self.name,
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "precision": self.precision,
            "gradient_bytes": sum(self.gradient_bytes_by_dtype.values()),
            "gradient_bytes_by_dtype": self.gradient_bytes_by_dtype,
            "optimizer": self.optimizer,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "flops": flops,
            "structure": self.structure,
        }


def capture_ops(
    module: torch.nn.Module,
    example_batch: Any,
    *,
    precision: str = "32-true",
    device: str = "meta",
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    batch_size: int | None = None,
) -> OpTable:
    """The ATen operators of one training step of ``module`` on ``example_batch`` (the profile's ``ops``).

    ``module`` is left untouched: the step runs on a copy (on ``meta`` a copy without storage).

    Args:
        module: a LightningModule (its ``training_step(batch, 0)`` gives the loss, its ``configure_optimizers()`` the
            optimizer), or a plain ``nn.Module`` whose forward returns the loss: called as ``module(**batch)`` for a
            dict batch (Hugging Face models with labels), else ``module(batch)``; a tensor, a ``"loss"`` entry or a
            ``.loss`` attribute is the loss.
        example_batch: one batch as the DataLoader yields it (tensors on any device; on ``meta`` only their shapes
            and dtypes matter).
        precision: Lightning precision: 32-true, 64-true, 16-true, bf16-true, 16-mixed or bf16-mixed.
        device: ``meta`` (fake tensors: no memory, no arithmetic), ``cpu`` (a real step) or ``cuda``.
        optimizer: ``params -> Optimizer`` (e.g. ``functools.partial(torch.optim.AdamW, lr=1e-4)``); required for a
            plain ``nn.Module``, overrides ``configure_optimizers()`` otherwise.
        batch_size: samples in ``example_batch`` (default: the leading dimension of its first tensor).

    Raises:
        ConfigError: a parameter cannot work (its name, value and the fix are in the message).
        ProfileError: the step itself failed (the message names the phase and the cause).
    """
    return capture_step(
        module, example_batch, precision=precision, device=device, optimizer=optimizer, batch_size=batch_size
    ).table


def capture_step(
    module: torch.nn.Module,
    example_batch: Any,
    *,
    precision: str = "32-true",
    device: str = "meta",
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    batch_size: int | None = None,
) -> StepCapture:
    """:func:`capture_ops` with the model sizes the profile needs (parameters, gradient and optimizer bytes)."""
    start = time.perf_counter()
    precision = _check_precision(precision)
    _check_device(device)
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            f"The 'module' parameter of {_OWNER} must be a torch.nn.Module (a LightningModule or a model returning "
            f"its loss). Got {type(module).__name__}.",
            parameter="module",
            value=module,
        )
    lightning = _is_lightning(module)
    samples = _check_inputs(module, example_batch, optimizer, batch_size, lightning)
    notes: list[str] = []
    with _step_context(device) as convert:
        work = _copy_module(module, convert, TRUE_DTYPES.get(precision))
        batch = _convert_batch(example_batch, convert, TRUE_DTYPES.get(precision))
        opt = _make_optimizer(work, optimizer, lightning)
        if _force_foreach(opt):
            notes.append("optimizer foreach=True (torch's default for CUDA parameters; CPU would loop per tensor)")
        block, blocks = find_blocks(work)
        probe = MemoryProbe(work, batch, blocks)  # entered first: it sees the kernels the recorder decomposes into
        recorder = OpRecorder(phase="forward")
        routing = CudaAttentionOnCpu() if device != "cuda" else contextlib.nullcontext()
        _record_step(work, batch, opt, lightning, probe, recorder, routing, precision, device, notes)
        if isinstance(routing, CudaAttentionOnCpu) and (note := routing.note()):
            notes.append(note)
        if precision == "16-mixed":
            notes.append("16-mixed: GradScaler's loss scaling and unscaling (a few elementwise kernels) not captured")
        total, trainable = parameter_counts(work)
        table = recorder.table(
            device=device, samples=samples, method=f"{METHOD} ({_where(device)})", precision=precision, notes=notes
        )
        return StepCapture(
            table=table,
            name=type(module).__name__,
            precision=precision,
            parameters=total,
            trainable_parameters=trainable,
            gradient_bytes_by_dtype=gradient_bytes(work),
            optimizer=optimizer_names([opt]),
            optimizer_state_bytes=optimizer_state_bytes([opt]),
            phase_flops=recorder.phase_flops(),
            seconds=time.perf_counter() - start,
            structure=_structure(probe, block, blocks, samples, device),
        )


def _record_step(
    work: torch.nn.Module,
    batch: Any,
    opt: Any,
    lightning: bool,
    probe: MemoryProbe,
    recorder: OpRecorder,
    routing: Any,
    precision: str,
    device: str,
    notes: list[str],
) -> None:
    """One training step under the recorder and the memory probe: forward, backward, an unrecorded first optimizer
    step (it creates the optimizer's state), then the recorded one and ``zero_grad``."""
    with probe, recorder, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")  # no Trainer in a capture: log is a no-op
        with _precision_context(precision, device, notes), probe.saving(), routing:
            loss = _run_phase("forward (training_step)", lambda: _loss(work, batch, lightning))
        recorder.phase = probe.phase = "backward"
        _run_phase("backward", loss.backward)
        del loss
        # the optimizer's first step creates its state (AdamW: two zeros_like per parameter; SGD: the momentum
        # buffer cloned from the gradient): once per run, not per step. It runs unrecorded (the memory probe sees
        # it: the state stays live, its temporaries are the step's transient), and the step recorded is the
        # second one, what every later step of the run costs
        recorder.phase = None
        probe.start_optimizer()
        _run_phase("optimizer.step", opt.step)
        probe.end_optimizer_step()
        recorder.phase = "optimizer"
        _run_phase("optimizer.step", opt.step)
        _run_phase("optimizer.zero_grad", opt.zero_grad)


def _check_inputs(module: Any, example_batch: Any, optimizer: Any, batch_size: int | None, lightning: bool) -> int:
    """The capture's arguments checked (a plain module needs an optimizer factory); the samples of the batch."""
    if optimizer is not None and not callable(optimizer):
        raise ConfigError(
            f"The 'optimizer' parameter of {_OWNER} must be a callable params -> Optimizer, e.g. "
            f"functools.partial(torch.optim.AdamW, lr=1e-4). Got {optimizer!r}.",
            parameter="optimizer",
            value=optimizer,
        )
    if optimizer is None and not lightning:
        raise ConfigError(
            f"The 'optimizer' parameter of {_OWNER} is required for a plain nn.Module "
            f"({type(module).__name__} has no configure_optimizers()): pass e.g. "
            "optimizer=functools.partial(torch.optim.AdamW, lr=1e-4).",
            parameter="optimizer",
            value=None,
        )
    samples = batch_size if batch_size is not None else detect_batch_size(example_batch)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ConfigError(
            f"The 'batch_size' parameter of {_OWNER} must be a whole number >= 1"
            + (
                f". Got {batch_size!r}."
                if batch_size is not None
                else ": the example batch has no tensor with a leading dimension, so pass batch_size=."
            ),
            parameter="batch_size",
            value=batch_size,
        )
    return samples


def _structure(
    probe: MemoryProbe, block: str | None, blocks: list[torch.nn.Module], samples: int, device: str
) -> dict[str, Any]:
    """The profile's ``model.structure`` from the probe of the step (bytes per sample where they grow with it)."""
    method = f"{STRUCTURE_METHOD}, one step at batch {samples} ({_where(device)})"
    if probe.errors:
        method += "; not counted: " + ", ".join(f"{e} x{n}" for e, n in sorted(probe.errors.items()))
    return {
        "blocks": len(blocks),
        "block": block,
        "block_parameters": max((sum(p.numel() for p in b.parameters()) for b in blocks), default=None),
        "saved_bytes_per_sample": probe.saved_total / samples,
        "fixed_bytes": probe.fixed_at_peak,
        "block_saved_bytes_per_sample": max(probe.block_saved) / samples if blocks else None,
        "block_input_bytes_per_sample": probe.block_input_bytes() / samples if blocks else None,
        "transient_bytes_per_sample": probe.transient / samples,
        "optimizer_transient_bytes": probe.optimizer_transient,
        "method": method,
    }


def _where(device: str) -> str:
    return "fake tensors, no storage" if device == "meta" else f"real tensors on {device}"


def _check_precision(precision: Any) -> str:
    text = normalize_precision(precision)
    if text not in TRUE_DTYPES and text not in MIXED_DTYPES:
        raise ConfigError(
            f"The 'precision' parameter of {_OWNER} must be one of "
            f"{sorted([*TRUE_DTYPES, *MIXED_DTYPES])}. Got {precision!r}.",
            parameter="precision",
            value=precision,
        )
    return text


def _check_device(device: Any) -> None:
    if device not in DEVICES:
        raise ConfigError(
            f"The 'device' parameter of {_OWNER} must be one of {list(DEVICES)}. Got {device!r}.",
            parameter="device",
            value=device,
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"The 'device' parameter of {_OWNER} is 'cuda' but torch sees no CUDA GPU; use device='meta'.",
            parameter="device",
            value=device,
        )


def _is_lightning(module: torch.nn.Module) -> bool:
    return callable(getattr(module, "training_step", None)) and callable(getattr(module, "configure_optimizers", None))


@contextlib.contextmanager
def _step_context(device: str) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """Yields ``tensor -> tensor on the capture device``; on meta, inside a FakeTensorMode on a fake CPU."""
    if device != "meta":
        target = torch.device(device)
        yield lambda t: t.detach().to(target, copy=True)
        return
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    cpu = torch.device("cpu")

    def fake(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, FakeTensor):
            return t
        elem = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return FakeTensor(mode, elem, cpu)

    with mode:
        yield fake


def _copy_module(module: torch.nn.Module, convert: Callable[[Any], Any], dtype: torch.dtype | None) -> torch.nn.Module:
    """A copy whose parameters and buffers are ``convert``-ed, floating ones cast to ``dtype`` as Lightning's
    ``*-true`` precision does (the originals are neither copied nor changed)."""

    def move(t: torch.Tensor) -> torch.Tensor:
        out = convert(t)
        return out.to(dtype) if dtype is not None and out.is_floating_point() and out.dtype != dtype else out

    memo: dict[int, Any] = {}
    for name in ("_trainer", "_fabric"):
        if getattr(module, name, None) is not None:
            memo[id(getattr(module, name))] = None
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(move(p), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = move(b)
    work = copy.deepcopy(module, memo)
    work.train()
    return work


def _convert_batch(batch: Any, convert: Callable[[Any], Any], dtype: torch.dtype | None) -> Any:
    if isinstance(batch, torch.Tensor):
        out = convert(batch)
        if dtype is not None and out.is_floating_point():
            out = out.to(dtype)
        return out
    if isinstance(batch, Mapping):
        mapping: Any = type(batch)  # the batch's own mapping class (a dict, an OrderedDict, a BatchEncoding...)
        return mapping({k: _convert_batch(v, convert, dtype) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_convert_batch(v, convert, dtype) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_convert_batch(v, convert, dtype) for v in batch)
    return batch


def _make_optimizer(work: torch.nn.Module, factory: Callable[[Any], Any] | None, lightning: bool) -> Any:
    if factory is not None:
        opt = _run_phase("the optimizer factory", lambda: factory(work.parameters()))
    else:
        module: Any = work  # a LightningModule (``lightning``): it has configure_optimizers
        config = _run_phase("configure_optimizers()", module.configure_optimizers)
        opt = _first_optimizer(config)
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(
            f"The 'optimizer' parameter of {_OWNER} must build one torch.optim.Optimizer (or configure_optimizers() "
            f"return one, as a dict or a list). Got {type(opt).__name__}.",
            parameter="optimizer",
            value=opt,
        )
    return opt


def _first_optimizer(config: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get("optimizer")
    if isinstance(config, (list, tuple)) and config:
        head = config[0]
        opts = (
            head
            if isinstance(head, (list, tuple))
            else [c for c in config if isinstance(c, (torch.optim.Optimizer, Mapping))]
        )
        if len(opts) != 1:
            raise ConfigError(
                f"configure_optimizers() returned {len(opts)} optimizers; {_OWNER} captures automatic optimization "
                "with one. Pass optimizer= to choose it.",
                parameter="optimizer",
                value=None,
            )
        return _first_optimizer(opts[0]) if isinstance(opts[0], Mapping) else opts[0]
    return config


def _force_foreach(opt: torch.optim.Optimizer) -> bool:
    if "foreach" not in opt.defaults:
        return False
    changed = False
    for group in opt.param_groups:
        if group.get("foreach") is None and not group.get("fused"):
            group["foreach"] = True
            changed = True
    return changed


@contextlib.contextmanager
def _precision_context(precision: str, device: str, notes: list[str]) -> Iterator[None]:
    """What Lightning's precision plugin wraps ``training_step`` in."""
    if precision in MIXED_DTYPES:
        dtype = MIXED_DTYPES[precision]
        if device == "cuda":
            with torch.autocast("cuda", dtype=dtype):
                yield
            return
        from lightning_srifty.profiling.cuda_autocast import cuda_autocast_policy

        notes.append(
            f"autocast {dtype} with CUDA's policy, emulated on CPU autocast (lightning_srifty.profiling.cuda_autocast)"
        )
        with cuda_autocast_policy(), torch.autocast("cpu", dtype=dtype):
            yield
        return
    dtype = TRUE_DTYPES[precision]
    if dtype is torch.float32:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _loss(work: torch.nn.Module, batch: Any, lightning: bool) -> torch.Tensor:
    if lightning:
        module: Any = work  # a LightningModule
        out = module.training_step(batch, 0)
    elif isinstance(batch, Mapping):
        out = work(**batch)
    else:
        out = work(batch)
    loss = out
    if isinstance(out, Mapping):
        loss = out.get("loss")
    elif not isinstance(out, torch.Tensor):
        loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = "training_step" if lightning else "forward"
        raise ProfileError(
            f"{type(work).__name__}.{what} returned {type(out).__name__}, not a loss: return the scalar loss "
            "tensor (or a dict with 'loss'); manual optimization (training_step returning None) is not captured."
        )
    return loss


def _run_phase(what: str, fn: Callable[[], Any]) -> Any:
    """Run part of the step; a failure becomes a ProfileError naming the part, the cause and the usual fix."""
    try:
        return fn()
    except (ConfigError, ProfileError):
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".split("\n", 1)[0][:400]
        hint = ""
        if "trainer" in text.lower():
            hint = " The model uses self.trainer, which a capture has not: pass optimizer= or guard that code."
        elif any(s in text for s in ("data-dependent", "item()", "DataDependent", "DynamicOutputShape")):
            hint = (
                " The step reads tensor values (e.g. .item(), nonzero, a data-dependent branch), which fake tensors "
                "have not: use device='cpu' with a small batch, or keep such code out of training_step."
            )
        raise ProfileError(f"The captured step failed in {what}: {text}.{hint}") from exc

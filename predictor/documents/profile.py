"""The profile of a training run (``srifty.profile/v1``): what SriftyCallback measures and the predictor reads.

Only ``schema``, ``model.parameters``, ``batch.per_device`` and ``timing.step_time_s.p50`` are required, so a
profile can be written by hand for hardware one does not have. Field reference: ``docs/profile-schema.md``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from predictor.documents.atomic import atomic_write_json, read_json_document
from predictor.documents.schema import doc_field, from_dict, json_schema, to_dict
from predictor.exceptions import ProfileSchemaError

SCHEMA = "srifty.profile/v1"
SCHEMA_FAMILY = "srifty.profile/"
MAX_SAMPLES_PER_STEP = 2**30  # samples per optimizer step (one device, all ranks, with accumulation): bounds the work
MAX_STEP_S = 86400.0  # one measured step (or phase, or all-reduce, or checkpoint save) of a day is a unit mistake
# a training step (forward, backward, optimizer: kernels of a few microseconds' launch each, and the host's Python)
# shorter than this is a unit mistake too (1e-300 s was accepted and predicted every fleet as instant)
MIN_STEP_S = 1e-6
PHASES = ("data", "forward", "backward", "optimizer")

# Lightning 1.x's precision names, as Lightning 2 reads them
# (lightning.fabric.plugins.precision.precision._PRECISION_INPUT_STR_ALIAS_CONVERSION)
LEGACY_PRECISION = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
Precision = Literal[
    "64-true",
    "32-true",
    "16-true",
    "bf16-true",
    "16-mixed",
    "bf16-mixed",
    "transformer-engine",
    "transformer-engine-float16",
]


@dataclass(frozen=True)
class Stats:
    """Summary statistics of a measured series (seconds, or per-second rates)."""

    p50: float = doc_field("median", min=0)
    mean: float | None = doc_field("arithmetic mean", default=None, min=0)
    p90: float | None = doc_field("90th percentile", default=None, min=0)
    p99: float | None = doc_field("99th percentile", default=None, min=0)
    min: float | None = doc_field("smallest value", default=None, min=0)
    max: float | None = doc_field("largest value", default=None, min=0)
    std: float | None = doc_field("standard deviation", default=None, min=0)
    cv: float | None = doc_field(
        "coefficient of variation: std / mean (run-to-run variability; n values >= 0 cannot exceed sqrt(n - 1))",
        default=None,
        min=0,
        max=100,
    )
    count: int | None = doc_field("number of values summarised", default=None, min=0)


@dataclass(frozen=True)
class Window:
    """Which steps were profiled."""

    first_step: int = doc_field("index of the first profiled training batch (0-based)", min=0)
    steps: int = doc_field("number of steps kept in the statistics", min=0)
    requested_steps: int = doc_field("profile_steps asked for", min=1)
    truncated: bool = doc_field("true when the run ended before the requested window was complete", default=False)
    excluded_steps: dict[str, int] | None = doc_field(
        "steps left out of the statistics by reason (validation, checkpoint, epoch_boundary)", default=None
    )
    clock: Literal["perf_counter", "cuda_event"] | None = doc_field(
        "how time was measured: host perf_counter, or CUDA events on the device timeline", default=None
    )


@dataclass(frozen=True)
class Timing:
    """Step time and its breakdown."""

    step_time_s: Stats = doc_field("time per training step (batch), data wait included")
    samples_per_s: Stats | None = doc_field("global training throughput (all ranks), samples per second", default=None)
    phases_s: dict[str, Stats] | None = doc_field(
        "per-phase time: data (loader wait), forward (training_step), backward, optimizer", default=None
    )
    phase_share: dict[str, float] | None = doc_field(
        "each phase's share of the mean step (a phase's mean over the sum of the phases' means)", default=None
    )
    series_s: tuple[float, ...] | None = doc_field("raw per-step times of rank 0 (bounded length)", default=None)
    series_truncated: bool | None = doc_field("true when series_s holds only the first part", default=None)
    window: Window | None = doc_field("which steps were profiled", default=None)


@dataclass(frozen=True)
class Flops:
    """Floating-point operations of one training step, per sample."""

    per_sample: float | None = doc_field("forward + backward FLOPs per sample", default=None, min=0)
    forward_per_sample: float | None = doc_field("forward FLOPs per sample", default=None, min=0)
    backward_per_sample: float | None = doc_field("backward FLOPs per sample", default=None, min=0)
    method: str | None = doc_field("how they were counted (e.g. torch.utils.flop_counter)", default=None)
    reason: str | None = doc_field("why they are missing, when they are", default=None)


@dataclass(frozen=True)
class Structure:
    """The model's repeated blocks and what one training step keeps alive, per sample: what the memory of a sharded
    layout is built from (FSDP wraps and all-gathers one block at a time; activation checkpointing keeps a block's
    input and recomputes the rest). Written by a capture (``srifty capture``, meta device or CPU) or by hand."""

    blocks: int = doc_field("repeated blocks (e.g. 32 decoder layers of a 7B Llama); 0 when none was found", min=0)
    block: str | None = doc_field(
        "class name of the repeated block (e.g. LlamaDecoderLayer): FSDP's wrap and activation-checkpointing unit",
        default=None,
    )
    block_parameters: int | None = doc_field(
        "parameters of the largest block (what FSDP all-gathers at once)", default=None, min=0
    )
    saved_bytes_per_sample: float | None = doc_field(
        "bytes of tensors autograd saves for backward over the whole forward, per sample (activations)",
        default=None,
        min=0,
    )
    block_saved_bytes_per_sample: float | None = doc_field(
        "of those, what the largest block saves, per sample (recomputed one block at a time under activation "
        "checkpointing)",
        default=None,
        min=0,
    )
    block_input_bytes_per_sample: float | None = doc_field(
        "one block's input, per sample (what activation checkpointing keeps of each block)", default=None, min=0
    )
    fixed_bytes: float | None = doc_field(
        "bytes live at the forward/backward peak, besides weights, gradients and optimizer state, that do not grow "
        "with the batch, per step: tensors computed from the weights alone (autocast's half-precision copies of the "
        "weights under *-mixed precision) and weight-shaped temporaries of the backward (a weight gradient before it "
        "is accumulated); in neither saved_bytes_per_sample nor transient_bytes_per_sample",
        default=None,
        min=0,
    )
    transient_bytes_per_sample: float | None = doc_field(
        "the step's peak live bytes above weights, gradients, optimizer state and saved tensors (temporaries such as "
        "the logits of the loss and activation gradients), per sample",
        default=None,
        min=0,
    )
    optimizer_transient_bytes: float | None = doc_field(
        "optimizer.step()'s peak above the weights, gradients and optimizer state it leaves, per step (e.g. the "
        "foreach temporaries of Adam, as large as the trainable parameters' state held): a peak of its own, after "
        "backward has freed the activations",
        default=None,
        min=0,
    )
    method: str | None = doc_field("how it was measured", default=None)


MODEL_NAME_MAX = 200  # characters of model.name the service stores and the fleet's tag takes (AWS: 256)


@dataclass(frozen=True)
class Model:
    """The model and its training state sizes."""

    parameters: int = doc_field(
        "number of parameters (at most 10^13: beyond any model that is trained)", min=1, max=10**13
    )
    # v1 only grows (a bound added to a field would refuse a document it read before): the name's length is checked
    # where it is kept, the service's observations (MODEL_NAME_MAX); the fleet's tag takes it as AWS does
    name: str | None = doc_field(
        "a name for the model (class name by default; it names the plan, the fleet's srifty:model tag and the "
        "service's observations, which take at most 200 characters)",
        default=None,
    )
    trainable_parameters: int | None = doc_field(
        "parameters with requires_grad (frozen ones, e.g. a LoRA base model, have no gradients or optimizer state)",
        default=None,
        min=0,
    )
    precision: Precision = doc_field("Lightning precision setting", default="32-true")
    float32_matmul_precision: Literal["highest", "high", "medium"] | None = doc_field(
        "torch.get_float32_matmul_precision() (high/medium allow TF32 on Ampere and newer)", default=None
    )
    gradient_bytes: int | None = doc_field("bytes of gradients per replica (what DDP all-reduces)", default=None, min=0)
    gradient_bytes_by_dtype: dict[str, int] | None = doc_field("gradient bytes split by dtype", default=None)
    optimizer: str | None = doc_field("optimizer class name", default=None)
    optimizer_state_bytes: int | None = doc_field("bytes of optimizer state per replica", default=None, min=0)
    flops: Flops | None = doc_field("FLOPs per sample", default=None)
    structure: Structure | None = doc_field(
        "repeated blocks and activation bytes per sample (the memory of sharded layouts)", default=None
    )


@dataclass(frozen=True)
class Batch:
    """Samples per step."""

    per_device: int = doc_field(
        "samples per batch on one device (rank 0; median over the window)", min=1, max=MAX_SAMPLES_PER_STEP
    )
    all_devices: int | None = doc_field(
        "samples per batch over all devices (the ranks); an optimizer step is accumulate_grad_batches of them (the "
        "plan's global_batch is that step)",
        default=None,
        min=1,
        max=MAX_SAMPLES_PER_STEP,
    )
    accumulate_grad_batches: int | None = doc_field(
        "batches per optimizer step", default=None, min=1, max=MAX_SAMPLES_PER_STEP
    )
    source: Literal["detected", "batch_size_fn", "manual"] | None = doc_field(
        "how the batch size was found", default=None
    )
    loader_workers: int | None = doc_field(
        "the training DataLoader's num_workers (rank 0): the processes that load batches beside the training "
        "process, so more vCPUs per GPU than num_workers + 1 cannot load faster",
        default=None,
        min=0,
        max=4096,
    )
    manual_optimization: bool | None = doc_field(
        "the LightningModule steps its own optimizers (automatic_optimization=False): Lightning accumulates no "
        "gradients for it, so a fleet is planned without gradient accumulation (None: automatic, or not recorded)",
        default=None,
    )
    optimizer_steps_per_batch: float | None = doc_field(
        "optimizer steps a batch makes on average, each of which Lightning's global_step and max_steps count (a "
        "GAN's generator and discriminator: 2; a critic stepped every batch and a generator every fifth: 1.2); a "
        "step of srifty's work is one batch of the global batch whatever its optimizers, so max_steps is steps x "
        "this (None: 1)",
        default=None,
        min=1,
        max=1024,
    )
    global_batch: int | None = doc_field(
        "deprecated, the same number as all_devices: written for readers before 0.3 (which know only this name); "
        "0.3 stops writing it",
        default=None,
        min=1,
        max=MAX_SAMPLES_PER_STEP,
    )

    def __post_init__(self) -> None:
        # one name per meaning in the code: the plan's global batch is an optimizer step, a profile's batch is one
        # batch over all devices (all_devices); the old name is mirrored, so releases before 0.3 still read it
        if self.all_devices is None and self.global_batch is not None:
            object.__setattr__(self, "all_devices", self.global_batch)
        elif self.global_batch is not None and self.global_batch != self.all_devices:
            raise ProfileSchemaError(
                f"batch: all_devices {self.all_devices} and its old name global_batch {self.global_batch} differ: "
                "give all_devices only.",
                field="batch.global_batch",
                value=self.global_batch,
            )
        object.__setattr__(self, "global_batch", self.all_devices)


@dataclass(frozen=True)
class Hardware:
    """Where the profile was measured."""

    gpu: str | None = doc_field("canonical GPU key (e.g. A100-SXM-40GB); null on CPU", default=None)
    accelerator: Literal["cpu", "cuda", "mps", "meta", "other"] | None = doc_field(
        "accelerator kind; meta: a capture-only profile (srifty capture: operator table and sizes, no measured time)",
        default=None,
    )
    device_name: str | None = doc_field("device name as torch reports it", default=None)
    devices: int = doc_field("devices per node", default=1, min=1)
    nodes: int = doc_field("number of nodes", default=1, min=1)
    world_size: int | None = doc_field("number of ranks", default=None, min=1)
    gpu_memory_gb: float | None = doc_field("memory of one GPU, GiB", default=None, min=0)
    cpu_count: int | None = doc_field("CPUs usable by the process", default=None, min=1)
    cpu_model: str | None = doc_field("CPU model name", default=None)
    cpu_arch: str | None = doc_field(
        "CPU architecture as the OS names it (platform.machine(): x86_64, aarch64, arm64); arm64 profiles allow "
        "arm64 (Graviton) instance types in rankings",
        default=None,
    )
    instance_type: str | None = doc_field("EC2 instance type, when run on EC2", default=None)
    availability_zone: str | None = doc_field("EC2 availability zone, when run on EC2", default=None)
    lifecycle: str | None = doc_field("EC2 instance life cycle (spot or on-demand), when run on EC2", default=None)


@dataclass(frozen=True)
class Memory:
    """Peak memory during the profile window."""

    peak_allocated_bytes: int | None = doc_field("CUDA: torch.cuda.max_memory_allocated", default=None, min=0)
    peak_reserved_bytes: int | None = doc_field("CUDA: torch.cuda.max_memory_reserved", default=None, min=0)
    peak_rss_bytes: int | None = doc_field("host: peak resident set size of the process", default=None, min=0)


@dataclass(frozen=True)
class CheckpointTiming:
    """What one checkpoint of this run costs, measured once at the end of the profile window (a full
    ``trainer.save_checkpoint`` to local disk, read back with ``torch.load``)."""

    save_s: float = doc_field("seconds to save a full Lightning checkpoint (all ranks taking part)", min=0)
    load_s: float | None = doc_field("seconds to read it back on rank 0", default=None, min=0)
    bytes: int | None = doc_field("size of the checkpoint file", default=None, min=0)
    where: str | None = doc_field(
        "what was measured: local disk (remote stores such as S3 add their transfer)", default=None
    )


@dataclass(frozen=True)
class ValidationTiming:
    """The run's validation: how often it runs and what its batches cost where profiled (issue #37 L: plans said
    nothing of validation though the run validated every 500 steps). Not in the predicted training time."""

    every_batches: int | None = doc_field(
        "training batches between two validations (Lightning's val_check_batch; None: once per epoch or less)",
        default=None,
        min=1,
    )
    every_epochs: int | None = doc_field(
        "epochs between two validations (check_val_every_n_epoch)", default=None, min=1
    )
    every_epoch_fraction: float | None = doc_field(
        "the share of an epoch between two validations (a float val_check_interval; 1.0, Lightning's default, once an"
        " epoch): every_batches is then this epoch's, and a planned epoch of another length validates on its own count",
        default=None,
        exclusive_min=0,
        max=1,
    )
    every_s: float | None = doc_field(
        "seconds of training between two validations (a time-based val_check_interval): their count follows the "
        "fleet's speed",
        default=None,
        exclusive_min=0,
    )
    epoch_batches: int | None = doc_field(
        "training batches of one epoch of the profiled run, per rank (num_training_batches)", default=None, min=1
    )
    batches: int | None = doc_field("validation batches in one validation (all dataloaders)", default=None, min=0)
    batch_s: Stats | None = doc_field(
        "seconds per validation batch on the profiling hardware (sanity-check batches included)", default=None
    )


@dataclass(frozen=True)
class BucketTiming:
    """One DDP gradient bucket's all-reduce."""

    index: int = doc_field("bucket index as DDP numbers it", min=0)
    bytes: int = doc_field("bucket size in bytes", min=0)
    allreduce_s: Stats = doc_field("time from the bucket being ready to its all-reduce completing")


@dataclass(frozen=True)
class Communication:
    """Data-parallel gradient all-reduce, measured by the srifty_ddp communication hook."""

    backend: str | None = doc_field("process-group backend (nccl, gloo)", default=None)
    world_size: int | None = doc_field("ranks taking part", default=None, min=1)
    buckets: int | None = doc_field("gradient buckets per step", default=None, min=0)
    bytes_per_step: int | None = doc_field("bytes all-reduced per step per rank", default=None, min=0)
    allreduce_s: Stats | None = doc_field(
        "per step: union of the intervals from each bucket being ready on rank 0 to its reduction completing",
        default=None,
    )
    exposed_s: Stats | None = doc_field("per step: communication not hidden behind backward", default=None)
    overlap_fraction: float | None = doc_field(
        "share of all-reduce time hidden behind backward", default=None, min=0, max=1
    )
    share_of_step: float | None = doc_field("median exposed communication / median step time", default=None, min=0)
    bucket_detail: tuple[BucketTiming, ...] | None = doc_field("per-bucket sizes and times", default=None)
    allgather_s: Stats | None = doc_field(
        "sharded runs (FSDP): per step, time in parameter all-gathers (all blocks, forward and backward)",
        default=None,
    )
    reduce_scatter_s: Stats | None = doc_field(
        "sharded runs (FSDP): per step, time in gradient reduce-scatters", default=None
    )
    allgather_bytes_per_step: int | None = doc_field(
        "sharded runs: bytes all-gathered per step per rank (the gathered size)", default=None, min=0
    )
    reduce_scatter_bytes_per_step: int | None = doc_field(
        "sharded runs: bytes reduce-scattered per step per rank (the unsharded gradient size)", default=None, min=0
    )
    reason: str | None = doc_field("why communication was not measured, when it was not", default=None)


@dataclass(frozen=True)
class RankTiming:
    """What one rank measured (stragglers and heterogeneous ranks show here)."""

    rank: int = doc_field("global rank", min=0)
    step_time_s: Stats = doc_field("this rank's step time")
    phases_s: dict[str, Stats] | None = doc_field("this rank's phase times", default=None)
    exposed_comm_s: Stats | None = doc_field("this rank's exposed all-reduce time per step", default=None)
    samples_per_step: int | None = doc_field("this rank's batch size", default=None, min=0)
    device_name: str | None = doc_field("this rank's device", default=None)
    hostname: str | None = doc_field("this rank's host", default=None)
    peak_memory_bytes: int | None = doc_field(
        "this rank's peak memory (CUDA allocated or host RSS)", default=None, min=0
    )


OpPhase = Literal["forward", "backward", "optimizer"]
MAX_TENSOR_ELEMENTS = 2**48  # 256 T elements: beyond the memory of any fleet of GPUs; a larger shape is a typo


@dataclass(frozen=True)
class OpRecord:
    """One ATen operator signature of a training step: the same operator on the same input shapes and dtypes in the
    same phase, with how often it ran in the step. Per-call figures; the step's total is ``count`` times them."""

    op: str = doc_field("ATen operator overload as torch names it (e.g. aten.mm.default, aten.convolution.default)")
    phase: OpPhase = doc_field("forward (training_step), backward, or optimizer (optimizer.step and zero_grad)")
    count: int = doc_field("calls of this signature in one step", min=1)
    shapes: tuple[tuple[int, ...], ...] = doc_field("shapes of the tensor inputs, in argument order (lists flattened)")
    dtypes: tuple[str, ...] = doc_field("dtypes of the tensor inputs, in the same order (e.g. float32, bfloat16)")
    flops: float = doc_field("FLOPs of one call from torch's flop-counter registry (0 when it has no formula)", min=0)
    bytes_read: float = doc_field("bytes of the tensor inputs of one call", min=0)
    bytes_written: float = doc_field("bytes of the tensor outputs of one call", min=0)
    out_shapes: tuple[tuple[int, ...], ...] | None = doc_field("shapes of the tensor outputs", default=None)
    out_dtype: str | None = doc_field("dtype of the first tensor output", default=None)
    params: dict[str, tuple[int, ...]] | None = doc_field(
        "non-tensor arguments that shape the kernel (convolution stride, padding, dilation, groups, transposed), and "
        "channels_last = [1] when the call ran on channels-last (NHWC) activations (a convolution: its input or "
        "weight was, PyTorch's rule for cuDNN)",
        default=None,
    )

    def __post_init__(self) -> None:
        for name in ("shapes", "out_shapes"):
            for i, shape in enumerate(getattr(self, name) or []):
                if any(d < 0 for d in shape):
                    raise ValueError(
                        f"{self.op}: {name}[{i}] = {shape} has a negative dimension; sizes are counts of elements "
                        "(>= 0): re-capture the table or correct the shape"
                    )
                if math.prod(shape) > MAX_TENSOR_ELEMENTS:
                    raise ValueError(
                        f"{self.op}: {name}[{i}] = {shape} has {math.prod(shape):.3g} elements, more than any GPU "
                        f"holds ({MAX_TENSOR_ELEMENTS:.0e}): a shape overflowed or was mistyped; correct it"
                    )


@dataclass(frozen=True)
class OpTable:
    """The ATen operators of one full training step (forward, backward, optimizer), aggregated by signature."""

    device: Literal["cpu", "cuda", "meta", "fake"] = doc_field(
        "where the step was captured (the table does not depend on it)"
    )
    samples: int = doc_field("samples in the captured step (the per-device batch it was captured at)", min=1)
    ops: tuple[OpRecord, ...] = doc_field("the operators, aggregated by (op, phase, shapes, dtypes, params)")
    method: str | None = doc_field("how it was captured (e.g. TorchDispatchMode on one warm-up step)", default=None)
    precision: str | None = doc_field("Lightning precision the step ran in (autocast applied when mixed)", default=None)
    total_flops: float | None = doc_field("FLOPs of the whole step (sum of count x flops)", default=None, min=0)
    skipped: dict[str, int] | None = doc_field(
        "calls left out because they launch no kernel (views, aliases, metadata), by operator", default=None
    )
    notes: tuple[str, ...] | None = doc_field("what the capture could not see, when anything", default=None)


@dataclass(frozen=True)
class Software:
    """Versions of what ran."""

    python: str | None = doc_field("Python version", default=None)
    torch: str | None = doc_field("torch version", default=None)
    lightning: str | None = doc_field("lightning version", default=None)
    cuda: str | None = doc_field("CUDA version torch was built with", default=None)
    lightning_srifty: str | None = doc_field("lightning-srifty version", default=None)


@dataclass(frozen=True)
class Profile:
    """A profile of a real training run (srifty.profile/v1)."""

    schema: Literal["srifty.profile/v1"] = doc_field("document type and version")
    model: Model = doc_field("the model")
    batch: Batch = doc_field("samples per step")
    hardware: Hardware = doc_field("where it ran")
    timing: Timing = doc_field("step times")
    memory: Memory | None = doc_field("peak memory", default=None)
    communication: Communication | None = doc_field("gradient all-reduce timings", default=None)
    checkpoint: CheckpointTiming | None = doc_field("checkpoint save and load time", default=None)
    validation: ValidationTiming | None = doc_field("how often the run validates, and its cost", default=None)
    ranks: tuple[RankTiming, ...] | None = doc_field("per-rank measurements", default=None)
    ops: OpTable | None = doc_field("the ATen operators of one training step (performance model v2)", default=None)
    layout: str | None = doc_field(
        "the parallel layout the run used, as predictor.model.layout names it (ddp, fsdp:full_shard, "
        "fsdp:full_shard+ac); absent: ddp",
        default=None,
    )
    software: Software | None = doc_field("versions", default=None)
    created_at: str | None = doc_field("UTC time the profile was written (ISO 8601)", default=None)
    notes: tuple[str, ...] | None = doc_field("warnings and remarks from the profiler", default=None)

    def __post_init__(self) -> None:
        b, hw = self.batch, self.hardware
        ranks = hw.world_size or hw.devices * hw.nodes
        per_batch = b.all_devices or b.per_device * ranks
        samples = per_batch * (b.accumulate_grad_batches or 1)
        if samples > MAX_SAMPLES_PER_STEP:  # the predictor splits this number into its divisors: bound the work
            what = (
                f"all_devices {b.all_devices}"
                if b.all_devices
                else f"per_device {b.per_device} x {ranks} ranks (hardware.world_size, else devices x nodes)"
            )
            raise ProfileSchemaError(
                f"batch: {what} x accumulate_grad_batches {b.accumulate_grad_batches or 1} = {samples:.3g} samples "
                f"per optimizer step, more than {MAX_SAMPLES_PER_STEP:,} (2^30): a batch size or rank count was "
                "mistyped; correct it.",
                field="batch",
                value=samples,
            )

        t = self.timing
        for path, step in (
            ("timing.step_time_s", t.step_time_s),
            *((f"ranks[{i}].step_time_s", r.step_time_s) for i, r in enumerate(self.ranks or ())),
        ):
            for name in ("p50", "mean", "min"):
                value = getattr(step, name, None) if step is not None else None
                if value is not None and 0 < value < MIN_STEP_S:  # 0: not measured (a captured, timeless profile)
                    raise ProfileSchemaError(
                        f"{path}.{name}: expected a step time >= {MIN_STEP_S:g} s (a microsecond), or 0 for a "
                        f"profile that measured none, got {value!r}. A training step this short is a unit mistake "
                        "(microseconds or nanoseconds written as seconds?): correct it, or profile the run again.",
                        field=f"{path}.{name}",
                        value=value,
                    )
        for field, value in self._seconds():
            if value > MAX_STEP_S:
                raise ProfileSchemaError(
                    f"{field}: expected a number <= {MAX_STEP_S:g} (seconds; one day), got {value!r}. A time this "
                    "long is a unit mistake (milliseconds or nanoseconds written as seconds?): correct it, or profile "
                    "the run again with SriftyCallback().",
                    field=field,
                    value=value,
                )
        self._check_table_precision()

    def _check_table_precision(self) -> None:
        """The operator table's precision is the step's: a table captured at another precision than
        ``model.precision`` would price the capture's dtypes while the GPU rules read the model's (a hand-edited
        precision, a new user's trial: bf16-mixed over a 32-true table got FP32 times and a bf16 'cannot run')."""
        ops, model = self.ops, self.model.precision
        table = LEGACY_PRECISION.get(str(ops.precision), ops.precision) if ops is not None else None
        if table is None or table not in get_args(Precision) or table == model:
            return
        raise ProfileSchemaError(
            f"ops.precision: the operator table was captured at {table!r} but model.precision is {model!r}: the "
            f"step would be priced at the table's dtypes. Capture it again at {model!r} (srifty capture at that "
            f"precision, or SriftyCallback in a {model} run), or set model.precision back to {table!r}.",
            field="ops.precision",
            value=ops.precision if ops is not None else None,
        )

    def _seconds(self) -> Any:
        """(dotted path, value) of every time in seconds the profile measured."""

        def stats(path: str, s: Stats | None) -> Any:
            for f in dataclasses.fields(Stats) if s is not None else ():
                value = getattr(s, f.name)
                if f.name not in ("cv", "count") and value is not None:
                    yield f"{path}.{f.name}", value

        def phases(path: str, table: dict[str, Stats] | None) -> Any:
            for name, s in (table or {}).items():
                yield from stats(f"{path}.{name}", s)

        t = self.timing
        yield from stats("timing.step_time_s", t.step_time_s)
        yield from phases("timing.phases_s", t.phases_s)
        yield from ((f"timing.series_s[{i}]", v) for i, v in enumerate(t.series_s or ()))
        for i, r in enumerate(self.ranks or ()):
            yield from stats(f"ranks[{i}].step_time_s", r.step_time_s)
            yield from phases(f"ranks[{i}].phases_s", r.phases_s)
            yield from stats(f"ranks[{i}].exposed_comm_s", r.exposed_comm_s)
        c = self.communication
        for name in ("allreduce_s", "exposed_s", "allgather_s", "reduce_scatter_s"):
            yield from stats(f"communication.{name}", getattr(c, name) if c is not None else None)
        for i, b in enumerate((c.bucket_detail if c is not None else None) or ()):
            yield from stats(f"communication.bucket_detail[{i}].allreduce_s", b.allreduce_s)
        if self.checkpoint is not None:
            yield "checkpoint.save_s", self.checkpoint.save_s
            if self.checkpoint.load_s is not None:
                yield "checkpoint.load_s", self.checkpoint.load_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (fields left unmeasured are omitted)."""
        return to_dict(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON, atomically."""
        return atomic_write_json(path, self.to_dict())


def profile_from_dict(data: Any) -> Profile:
    """Validate parsed JSON as a profile; ProfileSchemaError names the field, the value and the fix."""
    if not isinstance(data, dict):
        raise ProfileSchemaError(f"profile: expected a JSON object, got {type(data).__name__}.", field="profile")
    version = data.get("schema")
    if version is None:
        raise ProfileSchemaError(
            f'schema: missing. Add "schema": "{SCHEMA}" at the top of the profile.', field="schema"
        )
    if version != SCHEMA:
        if isinstance(version, str) and version.startswith(SCHEMA_FAMILY):
            raise ProfileSchemaError(
                f"schema: this lightning-srifty reads {SCHEMA!r}, the profile is {version!r}. "
                "Upgrade lightning-srifty (newer profile) or re-profile the run (older profile).",
                field="schema",
                value=version,
            )
        raise ProfileSchemaError(
            f"schema: expected {SCHEMA!r}, got {version!r}: this is not a srifty profile.",
            field="schema",
            value=version,
        )
    return from_dict(Profile, data)


def load_profile(source: str | os.PathLike[str] | dict[str, Any]) -> Profile:
    """Load a profile from a path or from already-parsed data.

    Raises:
        ProfileError: the file is missing or is not JSON.
        ProfileSchemaError: a field is missing or malformed (its dotted path is in ``.field``).
    """
    if isinstance(source, dict):
        return profile_from_dict(source)
    data = read_json_document(
        source, "Profile", "Produce one with SriftyCallback() or write one by hand (docs/profile-schema.md)."
    )
    return profile_from_dict(data)


def profile_json_schema() -> dict[str, Any]:
    """The published JSON Schema of srifty.profile/v1 (predictor/schemas/profile.v1.schema.json)."""
    return json_schema(Profile, schema_id="https://lightning-srifty.dev/schemas/profile.v1.schema.json", title=SCHEMA)

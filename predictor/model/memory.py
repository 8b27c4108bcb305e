"""Per-GPU memory of training under a parallel layout (:mod:`predictor.model.layout`): weights, gradients and optimizer
state of what is trainable (sharded by FSDP, split by a pipeline), the all-gather buffers of FSDP, activations
(from ``model.structure``, or scaled from the profile's measured peak), temporaries and the CUDA context.

:func:`memory_parts` is the one model: numpy-friendly (the per-GPU micro-batch, the shard group and the stages may
be arrays over candidates), used by the fleet model (:mod:`predictor.model.fleets`) and by :func:`estimate_memory`,
its one-GPU view with the words. Every term is documented in docs/performance-model.md ("Memory per GPU").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError
from predictor.model.layout import DDP, Layout, parse

BYTES_PER_PARAM = {
    "64-true": 8,
    "32-true": 4,
    "16-mixed": 4,
    "bf16-mixed": 4,
    "16-true": 2,
    "bf16-true": 2,
    "transformer-engine": 4,
    "transformer-engine-float16": 4,
}
# the dtype a mixed-precision FSDP all-gathers (Lightning's FSDPPrecision: param_dtype = the 16-bit type)
COMPUTE_BYTES_PER_PARAM = {"16-mixed": 2, "bf16-mixed": 2}
ADAM_STATE_BYTES_PER_PARAM = 8  # two fp32 moments, when the profile did not measure the optimizer state
CUDA_CONTEXT_BYTES = 600 * 2**20  # CUDA context + cuDNN/cuBLAS workspaces, roughly
USABLE_SHARE = 0.92  # leave room for fragmentation
# FSDP1 with limit_all_gathers=True keeps at most two units' all-gathers in flight (the current one and the one
# prefetched); in backward the unit's unsharded gradient lives until its reduce-scatter
UNITS_IN_FLIGHT = 2
# size-based wrapping when the model's block is unknown: torch's size_based_auto_wrap_policy closes a unit once it
# holds min_num_params, so a unit is between one and two times that
WRAP_UNITS = 32
MIN_WRAP_PARAMS = 1_000_000
PARTS = ("weights", "gradients", "optimizer", "gathered", "activations", "transient", "context")


@dataclass(frozen=True)
class MemoryEstimate:
    """One GPU's memory at one micro-batch: the total, its parts (bytes) and the words of how it was reached."""

    bytes_per_gpu: float
    static_bytes: float  # weights + gradients + optimizer state + all-gather buffers (independent of the batch)
    activation_bytes: float | None  # activations + temporaries at this micro-batch (None: unknown, not counted)
    capacity_bytes: float  # what the allocator can use (USABLE_SHARE of the GPU)
    fits: bool
    margin: float  # (usable - needed) / usable
    basis: str
    parts: dict[str, float]  # bytes: weights, gradients, optimizer, gathered, activations, transient, context
    context_bytes: float = CUDA_CONTEXT_BYTES  # the CUDA context (a CPU measurement subtracts it)


@dataclass(frozen=True)
class Sizes:
    """What the memory model reads from a profile, once."""

    parameters: float
    trainable: float
    storage: float  # bytes per parameter as stored (fp32 master weights under mixed precision)
    compute: float  # bytes per parameter in the compute dtype (what FSDP all-gathers)
    gradients: float  # bytes of the trainable parameters' gradients (unsharded)
    optimizer: float  # bytes of optimizer state (unsharded)
    unit: float  # parameters of one FSDP unit (the block, else a size-based unit)
    rest: float  # parameters outside the blocks (FSDP's root unit: embeddings, head)
    blocks: int
    saved: float | None  # activation bytes per sample (structure), None without one
    block_saved: float
    block_input: float
    transient: float
    fixed: float  # bytes at the forward/backward peak that do not grow with the batch (structure.fixed_bytes)
    optimizer_transient: float  # optimizer.step()'s own peak above the state (structure.optimizer_transient_bytes)
    gathered_share: float  # the share of the parameters FSDP holds gathered at once (root + units in flight)
    measured_act: float | None  # per sample, from the measured peak (no structure)
    wrap_min_params: int


def checkpoint_bytes(profile: Profile) -> float:
    """The bytes a checkpoint of the profiled training holds: the weights in their storage precision and the
    optimizer state (the same sizes the memory model holds; gradients are not saved)."""
    sizes = _sizes(profile)
    return sizes.parameters * sizes.storage + sizes.optimizer


def _sizes(profile: Profile) -> Sizes:
    model = profile.model
    storage = float(BYTES_PER_PARAM.get(model.precision, 4))
    compute = float(COMPUTE_BYTES_PER_PARAM.get(model.precision, storage))
    params = float(model.parameters)
    counted = model.trainable_parameters
    trainable = params if counted is None else float(min(counted, model.parameters))
    grads = float(model.gradient_bytes) if model.gradient_bytes is not None else trainable * storage
    optimizer = (
        float(model.optimizer_state_bytes) if model.optimizer_state_bytes else trainable * ADAM_STATE_BYTES_PER_PARAM
    )
    st = model.structure
    wrap = max(MIN_WRAP_PARAMS, int(params // WRAP_UNITS))
    blocks = int(st.blocks) if st is not None else 0
    if st is not None and st.block_parameters and blocks:
        unit = float(min(st.block_parameters, params))
        rest = max(0.0, params - blocks * unit)
    else:
        unit, rest = float(min(params, 2 * wrap)), 0.0
    saved = float(st.saved_bytes_per_sample) if st is not None and st.saved_bytes_per_sample is not None else None
    block_saved = float(st.block_saved_bytes_per_sample or 0.0) if st is not None else 0.0
    block_input = float(st.block_input_bytes_per_sample or 0.0) if st is not None else 0.0
    transient = float(st.transient_bytes_per_sample or 0.0) if st is not None else 0.0
    fixed = float(st.fixed_bytes or 0.0) if st is not None else 0.0
    optimizer_transient = float(st.optimizer_transient_bytes or 0.0) if st is not None else 0.0
    gathered_share = min(1.0, (rest + UNITS_IN_FLIGHT * unit) / params) if params else 1.0
    measured = None
    mem = profile.memory
    if saved is None and mem is not None and mem.peak_allocated_bytes:
        ran = _profile_layout(profile)
        world = profile.hardware.world_size or profile.hardware.devices * profile.hardware.nodes
        held = sum(
            float(v)
            for k, v in _state(
                params, trainable, storage, compute, grads, optimizer, unit, rest, ran, world, 1, world
            ).items()
        )
        measured = max(0.0, mem.peak_allocated_bytes - held) / profile.batch.per_device
    return Sizes(
        params,
        trainable,
        storage,
        compute,
        grads,
        optimizer,
        unit,
        rest,
        blocks,
        saved,
        block_saved,
        block_input,
        transient,
        fixed,
        optimizer_transient,
        gathered_share,
        measured,
        wrap,
    )


def _profile_layout(profile: Profile) -> Layout:
    try:
        return parse(profile.layout) if profile.layout else DDP
    except ConfigError:
        return DDP


def _state(
    params: float,
    trainable: float,
    storage: float,
    compute: float,
    grads: float,
    optimizer: float,
    unit: float,
    rest: float,
    layout: Layout,
    shard: Any,
    stages: Any,
    ranks: Any = 1,
) -> dict[str, Any]:
    """Weights, gradients, optimizer state and all-gather buffers of one GPU (bytes; arrays broadcast)."""
    if layout.strategy == "fsdp":
        s = np.maximum(shard, 1)
        gathered: float | np.ndarray  # a float per layout, an array over the shard sizes below
        if layout.sharding == "shard_grad_op":  # gathered from forward to backward: the whole model, + a gradient unit
            gathered = params * compute + unit * compute
        else:  # full_shard, hybrid_shard: the root unit stays gathered; two units in flight + one unsharded gradient
            # (no more gathered than the model has: a model of fewer units than in flight gathers itself once)
            gathered = min(rest + UNITS_IN_FLIGHT * unit, params) * compute + unit * compute
        # one GPU (s = 1): FSDP keeps the flat parameter itself, nothing is gathered
        gathered = np.where(s > 1, gathered, 0.0)
        # use_orig_params=True (Lightning's default) flattens frozen and trainable parameters of a unit together:
        # the flat gradient covers both (torch's FSDP notes), so a LoRA unit carries a full-size gradient
        flat_grads = params * storage if trainable < params else grads
        return {
            "weights": params * storage / s,
            "gradients": flat_grads / s,
            "optimizer": optimizer / s,
            "gathered": gathered,
        }
    p = np.maximum(stages, 1) if layout.strategy == "pipeline" else 1
    # DDP's reducer copies the gradients into its buckets (gradient_as_bucket_view=False, Lightning's default): a
    # second gradient-sized buffer on every rank of a multi-rank run
    buckets = np.where(np.asarray(ranks) > 1, grads, 0.0) if layout.strategy == "ddp" else 0.0
    return {
        "weights": params * storage / p,
        "gradients": grads / p + buckets,
        "optimizer": optimizer / p,
        "gathered": 0.0,
    }


def needs_structure(layout: Layout) -> bool:
    """Activation checkpointing and pipelines are sized from ``model.structure`` (blocks, saved bytes)."""
    return layout.activation_checkpointing or layout.strategy == "pipeline"


def memory_parts(
    profile: Profile,
    layout: Layout | str,
    micro: Any,
    *,
    shard: Any = 1,
    stages: Any = 1,
    micro_steps: Any = 1,
    ranks: Any = 1,
) -> dict[str, Any]:
    """Bytes per GPU of each part (:data:`PARTS`) at ``micro`` samples per micro-step, arrays broadcast.

    ``shard``: GPUs one copy of the sharded state is spread over (:meth:`Layout.shard_group`); ``stages``: pipeline
    stages; ``micro_steps``: micro-batches per optimizer step (a pipeline's first stage holds min(stages,
    micro_steps) of them, 1F1B).

    Raises:
        ConfigError: activation checkpointing or a pipeline without ``model.structure`` (nothing to size them from).
    """
    layout = parse(layout) if isinstance(layout, str) else layout
    z = profile_sizes(profile)
    parts = _state(
        z.parameters,
        z.trainable,
        z.storage,
        z.compute,
        z.gradients,
        z.optimizer,
        z.unit,
        z.rest,
        layout,
        shard,
        stages,
        ranks,
    )
    if z.saved is None:
        if needs_structure(layout):
            raise ConfigError(
                f"layout {layout.name!r} needs the model's structure (blocks and activation bytes per sample) and "
                "the profile has no model.structure. Capture it (srifty capture) or use ddp / fsdp without +ac.",
                parameter="layout",
                value=layout.name,
            )
        parts["activations"] = (z.measured_act or 0.0) * micro
        parts["transient"] = 0.0 * micro  # inside the measured peak
    else:
        parts["activations"], parts["transient"] = _sized_activations(z, layout, micro, shard, stages, micro_steps)
    parts["context"] = float(CUDA_CONTEXT_BYTES)
    return parts


def _sized_activations(
    z: Sizes, layout: Layout, micro: Any, shard: Any, stages: Any, micro_steps: Any
) -> tuple[Any, Any]:
    """(activations kept, transient peak) per GPU from the model's structure: every block's input under activation
    checkpointing (the rest peaks in the head or in one block's recompute), a pipeline stage's share with its
    micro-batches in flight, the fixed 16-bit copies (FSDP: the gathered units' share), the optimizer's own peak."""
    assert z.saved is not None  # the caller sizes from the structure only when the profile has it
    # bytes per sample: floats, arrays over the stage counts under pipeline
    kept: float | np.ndarray
    rest: float | np.ndarray
    if layout.activation_checkpointing:
        # each block keeps its input; the rest peaks in one of two phases that never meet: the head's
        # (the saved tensors outside the blocks and the temporaries of the loss) or one block's recompute
        kept = z.blocks * z.block_input
        rest = np.maximum(max(0.0, z.saved - z.blocks * z.block_saved) + z.transient, z.block_saved)
    else:
        kept, rest = z.saved, z.transient
    split: float | np.ndarray = 1.0  # an array over the stage counts under pipeline
    if layout.strategy == "pipeline":  # one stage's share, the first stage holding up to p micro-batches
        p = np.maximum(stages, 1)
        split = p
        in_flight = np.minimum(p, np.maximum(micro_steps, 1))
        kept, rest = kept / p * in_flight, rest / p
    # what does not grow with the batch (autocast's 16-bit weight copies): under FSDP only the gathered units'
    # share (FSDP's mixed precision gathers 16-bit units; nothing else is copied); the optimizer step peaks on
    # its own (its foreach temporaries scale with the state it holds)
    fixed: float | np.ndarray = z.fixed  # an array over the shard sizes under FSDP
    if layout.strategy == "fsdp":
        fixed = z.fixed * np.where(np.maximum(shard, 1) > 1, z.gathered_share, 1.0)
    optimizer_peak = z.optimizer_transient / (np.maximum(shard, 1) if layout.strategy == "fsdp" else split)
    phase = fixed / split + (kept + rest) * micro
    return kept * micro, np.maximum(phase, optimizer_peak) - kept * micro


_CACHE: dict[int, tuple[Profile, Sizes]] = {}


def profile_sizes(profile: Profile) -> Sizes:
    """What the memory model reads from ``profile``, once per profile object (the fleet model calls
    :func:`memory_parts` per accumulation step)."""
    hit = _CACHE.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    if len(_CACHE) > 64:
        _CACHE.clear()
    sizes = _sizes(profile)
    _CACHE[id(profile)] = (profile, sizes)
    return sizes


def activations_known(profile: Profile) -> bool:
    """Whether the profile says what the activations take (a measured peak or ``model.structure``'s saved bytes).
    Without it a memory estimate counts weights, gradients and optimizer state only: a floor, not a fit."""
    z = profile_sizes(profile)
    return z.saved is not None or z.measured_act is not None


def wrap_min_params(profile: Profile) -> int:
    """The size-based FSDP wrap (``auto_wrap_policy: {"min_num_params": N}``) used when the block is unknown."""
    return profile_sizes(profile).wrap_min_params


def estimate_memory(
    profile: Profile,
    per_device_batch: float,
    gpu_memory_gib: float,
    layout: Layout | str = DDP,
    ranks: int = 1,
    gpus_per_node: int = 1,
    *,
    micro_steps: int | None = None,
) -> MemoryEstimate:
    """Memory of one GPU at ``per_device_batch`` samples per micro-step under ``layout`` on a fleet of ``ranks``
    GPUs, ``gpus_per_node`` per node (a pipeline has one stage per node: ``ranks // gpus_per_node`` stages, each
    micro-batch in flight on its first stage; ``micro_steps``: the micro-batches of an optimizer step, default as
    many as the stages, the most 1F1B keeps in flight).

    Only trainable parameters have gradients and optimizer state: with ``model.trainable_parameters`` recorded (a
    LoRA run trains 40M of 7B), frozen weights count once. Measured gradient and optimizer-state bytes win over the
    estimates from the parameter counts.
    """
    layout = parse(layout) if isinstance(layout, str) else layout
    stages = max(1, ranks // max(1, gpus_per_node)) if layout.strategy == "pipeline" else 1
    shard = layout.shard_group(gpus_per_node, ranks)
    parts = {
        k: float(v)
        for k, v in memory_parts(
            profile,
            layout,
            float(per_device_batch),
            shard=shard,
            stages=stages,
            micro_steps=stages if micro_steps is None else micro_steps,
            ranks=ranks,
        ).items()
    }
    z = profile_sizes(profile)
    static = parts["weights"] + parts["gradients"] + parts["optimizer"] + parts["gathered"]
    need = sum(parts.values())
    usable = gpu_memory_gib * 2**30 * USABLE_SHARE
    activations = parts["activations"] + parts["transient"] if activations_known(profile) else None
    return MemoryEstimate(
        need, static, activations, usable, need <= usable, (usable - need) / usable, _basis(z, layout, shard), parts
    )


def _basis(z: Sizes, layout: Layout, shard: int) -> str:
    """How the estimate was reached, in words."""
    text = "weights + gradients + optimizer state" + (
        f" (gradients and optimizer state of the {z.trainable:,.0f} trainable parameters only)"
        if z.trainable < z.parameters
        else ""
    )
    if layout.strategy == "fsdp" and shard > 1:
        text += f" sharded over {shard} GPUs ({layout.sharding}) + all-gather buffers"
    if layout.strategy == "pipeline":
        text += f" split over {layout.pipeline_stages} pipeline stages"
    if z.saved is not None:
        text += " + activations from model.structure" + (
            " (checkpointed blocks)" if layout.activation_checkpointing else ""
        )
    elif z.measured_act is not None:
        text += " + activations scaled from the profile's peak CUDA memory"
    else:
        text += "; activations unknown (profile has no CUDA peak memory nor model.structure): not counted"
    return text

"""Per-GPU memory of data-parallel training: weights + gradients + optimizer state + activations (scaled by batch)."""

from __future__ import annotations

from dataclasses import dataclass

from predictor.profile import Profile

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
ADAM_STATE_BYTES_PER_PARAM = 8  # two fp32 moments, when the profile did not measure the optimizer state
CUDA_CONTEXT_BYTES = 600 * 2**20  # CUDA context + cuDNN/cuBLAS workspaces, roughly
USABLE_SHARE = 0.92  # leave room for fragmentation


@dataclass(frozen=True)
class MemoryEstimate:
    bytes_per_gpu: float
    static_bytes: float
    activation_bytes: float | None
    capacity_bytes: float
    fits: bool
    margin: float  # (usable - needed) / usable
    basis: str


def estimate_memory(profile: Profile, per_device_batch: float, gpu_memory_gib: float) -> MemoryEstimate:
    """Memory of one GPU at ``per_device_batch`` samples per micro-step.

    Only trainable parameters have gradients and optimizer state: with ``model.trainable_parameters`` recorded (a
    LoRA run trains 40M of 7B), frozen weights count once. Measured gradient and optimizer-state bytes win over the
    estimates from the parameter counts.
    """
    model = profile.model
    per_param = BYTES_PER_PARAM.get(model.precision, 4)
    counted = model.trainable_parameters
    trainable = model.parameters if counted is None else min(counted, model.parameters)
    weights = model.parameters * per_param
    grads = model.gradient_bytes if model.gradient_bytes is not None else trainable * per_param
    optimizer = model.optimizer_state_bytes if model.optimizer_state_bytes else trainable * ADAM_STATE_BYTES_PER_PARAM
    static = weights + grads + optimizer
    mem = profile.memory
    activations: float | None = None
    basis = "weights + gradients + optimizer state" + (
        f" (gradients and optimizer state of the {trainable:,} trainable parameters only)"
        if trainable < model.parameters
        else ""
    )
    if mem is not None and mem.peak_allocated_bytes:
        measured = max(0.0, mem.peak_allocated_bytes - static)
        activations = measured * per_device_batch / profile.batch.per_device
        basis += " + activations scaled from the profile's peak CUDA memory"
    else:
        basis += "; activations unknown (profile has no CUDA peak memory): not counted"
    need = static + (activations or 0.0) + CUDA_CONTEXT_BYTES
    usable = gpu_memory_gib * 2**30 * USABLE_SHARE
    return MemoryEstimate(need, static, activations, usable, need <= usable, (usable - need) / usable, basis)

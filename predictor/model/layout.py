"""The parallel layout of a fleet: how the model's state and work are spread over its GPUs.

One vocabulary for the predictor (memory and time of each layout), the plan (the layout it records, as the Lightning
strategy and its arguments) and the job (:func:`lightning_srifty.plan_strategy` builds that strategy):

- ``ddp``: every GPU holds the whole model; gradients are all-reduced once per optimizer step.
- ``fsdp`` with a ``sharding``:
  ``full_shard`` (ZeRO-3: parameters, gradients and optimizer state sharded over every GPU; each block's parameters
  all-gathered for its forward and again for its backward, gradients reduce-scattered),
  ``shard_grad_op`` (ZeRO-2: parameters stay gathered from forward to backward; gradients and optimizer state
  sharded), ``hybrid_shard`` (full_shard inside a node, replicated across nodes: the slow inter-node link carries
  one all-reduce of a shard instead of every all-gather).
- ``pipeline``: the blocks are cut into ``pipeline_stages`` stages, one per node, with micro-batches flowing through
  them (Varuna's layout for commodity networks); activations, not weights, cross the slow link.
- ``activation_checkpointing`` (any strategy): each block keeps only its input and recomputes the rest in backward.

Torch-free: the job side turns :meth:`Layout.lightning` into a strategy object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from predictor.exceptions import ConfigError

Strategy = Literal["ddp", "fsdp", "pipeline"]
Sharding = Literal["full_shard", "shard_grad_op", "hybrid_shard"]
STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "pipeline")
SHARDINGS: tuple[str, ...] = ("full_shard", "shard_grad_op", "hybrid_shard")
AC_SUFFIX = "+ac"
# Lightning's FSDPStrategy names its sharding strategies after torch's ShardingStrategy enum
LIGHTNING_SHARDING = {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "hybrid_shard": "HYBRID_SHARD"}


@dataclass(frozen=True)
class Layout:
    """One parallel layout (see the module docstring). ``Layout()`` is plain DDP."""

    strategy: Strategy = "ddp"
    sharding: Sharding | None = None
    activation_checkpointing: bool = False
    pipeline_stages: int = 1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"layout strategy must be one of {list(STRATEGIES)}. Got {self.strategy!r}.",
                parameter="strategy",
                value=self.strategy,
            )
        if (self.strategy == "fsdp") != (self.sharding is not None):
            raise ConfigError(
                f"layout sharding is for fsdp only, and fsdp needs one of {list(SHARDINGS)}. Got strategy "
                f"{self.strategy!r} with sharding {self.sharding!r}.",
                parameter="sharding",
                value=self.sharding,
            )
        if self.sharding is not None and self.sharding not in SHARDINGS:
            raise ConfigError(
                f"layout sharding must be one of {list(SHARDINGS)}. Got {self.sharding!r}.",
                parameter="sharding",
                value=self.sharding,
            )
        if self.pipeline_stages < 1 or (self.strategy == "pipeline") != (self.pipeline_stages > 1):
            raise ConfigError(
                f"pipeline_stages must be >= 2 for a pipeline and 1 otherwise. Got {self.pipeline_stages} for "
                f"{self.strategy!r}.",
                parameter="pipeline_stages",
                value=self.pipeline_stages,
            )

    @property
    def name(self) -> str:
        """``ddp``, ``fsdp:full_shard``, ``fsdp:hybrid_shard+ac``, ``pipeline:4+ac`` (what :func:`parse` reads)."""
        base = {"ddp": "ddp", "fsdp": f"fsdp:{self.sharding}", "pipeline": f"pipeline:{self.pipeline_stages}"}
        return base[self.strategy] + (AC_SUFFIX if self.activation_checkpointing else "")

    @property
    def sharded(self) -> bool:
        return self.strategy == "fsdp"

    @property
    def launchable(self) -> bool:
        """Whether ``srifty launch`` can start it with a Lightning strategy (pipelines: not yet; the plan says what
        running one would need)."""
        return self.strategy != "pipeline"

    def shard_group(self, gpus_per_node: int, ranks: int) -> int:
        """GPUs one copy of the sharded state is spread over (1: not sharded)."""
        if self.strategy != "fsdp":
            return 1
        return gpus_per_node if self.sharding == "hybrid_shard" else ranks

    def lightning(
        self, block: str | None = None, wrap_min_params: int | None = None
    ) -> tuple[Strategy, dict[str, Any]]:
        """The Lightning strategy name and its keyword arguments (JSON-ready; the job side resolves them on the
        model: :func:`lightning_srifty.plan_strategy`).

        ``block``: the class name of the model's repeated block (``model.structure.block``): FSDP's wrap unit and
        the activation-checkpointing unit, written ``auto_wrap_policy: [block]``. Without one FSDP wraps by size,
        ``auto_wrap_policy: {"min_num_params": wrap_min_params}`` (torch's size_based_auto_wrap_policy), and
        activation checkpointing cannot be applied (it needs a block class).
        """
        args: dict[str, Any] = {}
        if self.strategy == "fsdp":
            args = {
                "sharding_strategy": LIGHTNING_SHARDING[str(self.sharding)],
                "state_dict_type": "sharded",
                "limit_all_gathers": True,
            }
            if block:
                args["auto_wrap_policy"] = [block]
            elif wrap_min_params:
                args["auto_wrap_policy"] = {"min_num_params": int(wrap_min_params)}
        if self.activation_checkpointing and block:
            args["activation_checkpointing_policy"] = [block]
        return self.strategy, args


DDP = Layout()


def parse(text: str) -> Layout:
    """A layout from its :attr:`Layout.name` (``ddp``, ``ddp+ac``, ``fsdp:full_shard+ac``, ``pipeline:4``)."""
    raw = text.strip().lower()
    ac = raw.endswith(AC_SUFFIX)
    head = raw[: -len(AC_SUFFIX)] if ac else raw
    strategy, _, arg = head.partition(":")
    fix = (
        "Use ddp, fsdp:full_shard, fsdp:shard_grad_op, fsdp:hybrid_shard or pipeline:<stages> (pipeline where a "
        "prediction takes it: one stage per node), each optionally +ac (or auto where a prediction takes it: the "
        "layout srifty recommend runs the fleet with)."
    )
    try:
        if strategy == "ddp" and not arg:
            return Layout(activation_checkpointing=ac)
        if strategy == "fsdp" and arg:
            # not yet a Sharding: Layout.__post_init__ refuses any other text (the ConfigError caught below)
            return Layout("fsdp", cast(Sharding, arg), ac)
        if strategy == "pipeline" and arg.isdigit():
            return Layout("pipeline", None, ac, int(arg))
    except ConfigError as exc:
        raise ConfigError(f"layout {text!r}: {exc} {fix}", parameter="layout", value=text) from None
    raise ConfigError(f"layout {text!r} is not a layout. {fix}", parameter="layout", value=text)

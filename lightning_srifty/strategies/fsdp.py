"""``srifty_fsdp``: Lightning's FSDP (FSDP1) with block classes given by name, on CUDA and on CPU (gloo).

    Trainer(strategy=SriftyFSDPStrategy(auto_wrap_policy=["LlamaDecoderLayer"], sharding_strategy="FULL_SHARD"))

A plan records its layout's Lightning arguments as JSON (:meth:`predictor.model.layout.Layout.lightning`), so block
classes travel by name; they are resolved here, at set-up, to the classes found in the LightningModule (an error names
the missing class and the classes that exist). ``{"min_num_params": N}`` becomes torch's
``size_based_auto_wrap_policy``.

On CPU, Lightning refuses ``FSDPStrategy`` with ``accelerator="cpu"`` and hands FSDP ``device_id=None``, for which
torch raises "FSDP needs a non-CPU accelerator device"; a subclass passes Lightning's check (it tests the exact
type) and this one gives FSDP ``device_id=torch.device("cpu")``, with which FSDP1 trains on gloo (it all-gathers into
a list of chunks there instead of ``all_gather_single``). That is how the tests run real FSDP ranks on CPU.

A full state dict (``state_dict_type="full"``, Lightning's default) is gathered there without the CPU offload:
Lightning 2.6 asks for ``offload_to_cpu=True`` on any device, which for shards already on the CPU frees the storage
their views still alias, and rank 0 ended with SIGSEGV in the first save (the profiler's measured checkpoint at the
end of its window, a spot notice's) (Lightning-AI/pytorch-lightning#21804; its fix offloads only from an
accelerator, as :func:`_full_state_dict_here` does). On a GPU nothing changes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from torch import nn

from lightning_srifty.strategies.hetero import RankBatches, rank_weights
from lightning_srifty.strategies.nodes import TorchrunNodes
from lightning_srifty.teardown import destroy_at_exit
from predictor.exceptions import ConfigError

# the arguments whose block classes may be given by name
NAMED_POLICIES = ("auto_wrap_policy", "activation_checkpointing_policy")


def block_classes(names: Iterable[str | type[nn.Module]], module: nn.Module, parameter: str) -> set[type[nn.Module]]:
    """The classes of ``module``'s submodules named ``names`` (classes are kept as they are).

    Raises:
        ConfigError: a name matches no submodule's class; the message lists the classes that exist.
    """
    found: dict[str, type[nn.Module]] = {}
    for sub in module.modules():
        found.setdefault(type(sub).__name__, type(sub))
    out: set[type[nn.Module]] = set()
    for name in names:
        if isinstance(name, type):
            out.add(name)
            continue
        if name not in found:
            shown = ", ".join(sorted(found))
            raise ConfigError(
                f"The {parameter!r} names the block class {name!r}, which the model does not have; its classes are: "
                f"{shown}. Re-plan with the model's block (model.structure.block of its profile) or pass the class.",
                parameter=parameter,
                value=name,
            )
        out.add(found[name])
    return out


def named(policy: Any) -> bool:
    """Whether ``policy`` names block classes (a list, tuple or set of strings) rather than giving them."""
    return isinstance(policy, (list, tuple, set, frozenset)) and any(isinstance(p, str) for p in policy)


def resolve_policy(policy: Any, module: nn.Module | None, parameter: str) -> Any:
    """A wrap or checkpointing policy Lightning takes: names -> the module's classes (needs ``module``), a set of
    classes kept, ``{"min_num_params": N}`` -> torch's ``size_based_auto_wrap_policy``, anything else unchanged."""
    if isinstance(policy, Mapping):
        if set(policy) != {"min_num_params"}:
            raise ConfigError(
                f"The {parameter!r} mapping may only hold min_num_params (torch's size-based wrap). "
                f"Got {dict(policy)!r}.",
                parameter=parameter,
                value=dict(policy),
            )
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

        return functools.partial(size_based_auto_wrap_policy, min_num_params=int(policy["min_num_params"]))
    if named(policy):
        assert module is not None
        return block_classes(policy, module, parameter)
    if isinstance(policy, (list, tuple, frozenset)):
        return set(policy)
    return policy


def loss_weight(batch_sizes: Iterable[int] | None, rank: int) -> float:
    """What rank ``rank``'s mean loss is multiplied by so that FSDP's gradient reduction (a mean over the ranks) is
    the mean over the global batch when ranks take unequal batches: ``b_r x ranks / sum(b)`` (1 when they are equal).
    DDP weights the gradient buckets instead (:mod:`lightning_srifty.strategies.hetero`); FSDP has no communication
    hook, and scaling the loss is the same by linearity."""
    sizes = list(batch_sizes or ())
    if len(set(sizes)) <= 1:
        return 1.0
    return rank_weights(sizes)[rank]


def scale_loss(output: Any, weight: float) -> Any:
    """``training_step``'s output with its loss multiplied by ``weight`` (a tensor, or a mapping with ``"loss"``)."""
    if weight == 1.0 or output is None:
        return output
    if isinstance(output, torch.Tensor):
        return output * weight
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return {**output, "loss": output["loss"] * weight}
    return output


class SriftyFSDPStrategy(RankBatches, TorchrunNodes, FSDPStrategy):
    """Lightning's :class:`~lightning.pytorch.strategies.FSDPStrategy` whose ``auto_wrap_policy`` and
    ``activation_checkpointing_policy`` may name block classes (``["LlamaDecoderLayer"]``) or give a size
    (``{"min_num_params": N}``), and which trains on CPU too (see the module docstring).

    Takes every argument of ``FSDPStrategy``, and ``batch_sizes``: the per-rank batches ``srifty launch`` gives;
    when they are unequal (a heterogeneous fleet's speed-proportional split, or a global batch that does not divide
    by the ranks) each rank's loss is weighted (:func:`loss_weight`) so the reduced gradient is the global-batch
    mean, as ``srifty_ddp`` does for DDP. The loss the progress bar shows is then the weighted one; what
    ``self.log`` records in ``training_step`` is not.

    Raises:
        ConfigError: at set-up, a named class the model does not have, or not one batch size per rank.
    """

    strategy_name = "srifty_fsdp"

    def __init__(
        self,
        *args: Any,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        **kwargs: Any,
    ) -> None:
        # names wait for the model (setup); everything else goes to Lightning now
        self._named = {
            k: v
            for k, v in (("auto_wrap_policy", auto_wrap_policy), ("ac", activation_checkpointing_policy))
            if named(v)
        }
        if named(auto_wrap_policy):  # a stand-in until set-up: Lightning checks at once that hybrid shard has one
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            auto_wrap_policy = ModuleWrapPolicy(set())
        super().__init__(
            *args,
            auto_wrap_policy=resolve_policy(auto_wrap_policy, None, "auto_wrap_policy"),
            activation_checkpointing_policy=None
            if named(activation_checkpointing_policy)
            else resolve_policy(activation_checkpointing_policy, None, "activation_checkpointing_policy"),
            **kwargs,
        )

    def resolve_names(self, module: nn.Module) -> None:
        """Turn the block names into ``module``'s classes (idempotent; done at set-up, or earlier by
        :func:`~lightning_srifty.plan_strategy` when given the model)."""
        from lightning.fabric.strategies.fsdp import _activation_checkpointing_kwargs, _auto_wrap_policy_kwargs

        if "auto_wrap_policy" in self._named:
            classes = block_classes(self._named.pop("auto_wrap_policy"), module, "auto_wrap_policy")
            self.kwargs = _auto_wrap_policy_kwargs(classes, self.kwargs)
        if "ac" in self._named:
            classes = block_classes(self._named.pop("ac"), module, "activation_checkpointing_policy")
            self._activation_checkpointing_kwargs = _activation_checkpointing_kwargs(None, classes)

    def setup_environment(self) -> None:
        super().setup_environment()
        destroy_at_exit()

    def setup(self, trainer: Any) -> None:
        assert self.model is not None
        self.resolve_names(self.model)
        if self.batch_sizes is not None and len(self.batch_sizes) != self.world_size:
            raise ConfigError(
                f"batch_sizes gives {len(self.batch_sizes)} per-rank batches for {self.world_size} ranks.",
                parameter="batch_sizes",
                value=self.batch_sizes,
            )
        super().setup(trainer)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        return scale_loss(super().training_step(*args, **kwargs), loss_weight(self.batch_sizes, self.global_rank))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        with self._full_state_dict_here():
            return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        with self._full_state_dict_here():
            return super().optimizer_state(optimizer)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        with self._full_state_dict_here():
            return super().load_checkpoint(checkpoint_path, weights_only)

    @contextlib.contextmanager
    def _full_state_dict_here(self) -> Iterator[None]:
        """On the CPU, Lightning's full-state-dict context for the call, without its offload (module docstring)."""
        if self.root_device.type != "cpu":
            yield
            return
        from lightning.pytorch.strategies import fsdp as lightning_fsdp

        lightnings = lightning_fsdp._get_full_state_dict_context
        lightning_fsdp._get_full_state_dict_context = _full_state_dict_in_place
        try:
            yield
        finally:
            lightning_fsdp._get_full_state_dict_context = lightnings

    def _setup_model(self, model: nn.Module) -> nn.Module:
        if self.root_device.type != "cpu":
            return super()._setup_model(model)
        # FSDPStrategy._setup_model with device_id=cpu (Lightning passes root_device.index: None on CPU)
        from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            model = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            )
        _setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(cls.strategy_name, cls, description="FSDP with block classes by name (srifty)")


def _full_state_dict_in_place(module: nn.Module, world_size: int, rank0_only: bool = True) -> Any:
    """Lightning's ``_get_full_state_dict_context`` for shards on the CPU: the same gather, no offload (a no-op copy
    there that freed the storage the parameters' views alias)."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
    )


SriftyFSDPStrategy.register_strategies(StrategyRegistry)

"""The node count a torchrun launch gives, for Lightning's strategies.

Lightning takes the node count from ``Trainer(num_nodes=...)`` (default 1) and, under torchrun, checks that devices x
num_nodes equals torchrun's ``WORLD_SIZE``. A script written for one machine (the README's
``Trainer(strategy="srifty_auto")``) then fails on every multi-node fleet: "You set devices=1 and num_nodes=1 in
Lightning, but the product (1 * 1) does not match the world size (2)". On a srifty fleet torchrun is the authority on
the layout (``--nnodes``, ``--nproc_per_node`` from the plan), so the srifty strategies take it from there:

- the node count is torchrun's ``GROUP_WORLD_SIZE`` (the agents that joined the rendezvous);
- the check is per node: this node's devices must be the processes torchrun started on it (``LOCAL_WORLD_SIZE``). A
  mixed fleet's nodes start different numbers (a 4-GPU and a 1-GPU type), which Lightning's product rule refuses
  although torchrun runs it;
- the distributed sampler's replicas are the world size, not nodes x this node's processes (the same thing on a
  homogeneous fleet; on a mixed one Lightning's product would be wrong on every node).

``Trainer(num_nodes=N)`` given by the script must agree with torchrun, or the job stops with both numbers.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.fabric.plugins.environments import TorchElasticEnvironment

from predictor.exceptions import ConfigError


def torchrun_nodes() -> int | None:
    """How many nodes torchrun's rendezvous joined (``GROUP_WORLD_SIZE``); None outside torchrun."""
    if not TorchElasticEnvironment.detect():
        return None
    try:
        return max(1, int(os.environ.get("GROUP_WORLD_SIZE", "1")))
    except ValueError:
        return None


class TorchrunEnvironment(TorchElasticEnvironment):
    """torchrun's environment, checked per node (this node's devices are its torchrun processes) rather than by
    Lightning's devices x num_nodes = world size, which a mixed fleet's nodes cannot satisfy."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(num_devices)))
        if num_devices != local:
            raise ConfigError(
                f"torchrun started {local} process(es) on this node (--nproc_per_node), the Trainer uses "
                f"{num_devices} device(s): leave Trainer(devices=...) at 'auto' on a srifty fleet, or start torchrun "
                f"with --nproc_per_node={num_devices}.",
                parameter="devices",
                value=num_devices,
            )
        nodes = torchrun_nodes()
        if nodes is not None and num_nodes != nodes:
            raise ConfigError(
                f"Trainer(num_nodes={num_nodes}) but torchrun's rendezvous joined {nodes} node(s) (--nnodes): leave "
                "num_nodes out on a srifty fleet (the strategy takes torchrun's), or give the same number.",
                parameter="num_nodes",
                value=num_nodes,
            )


class TorchrunNodes:
    """Mixed in before a Lightning DDP/FSDP strategy class: under torchrun its node count, its environment check and
    its sampler's replicas follow torchrun (module docstring); outside torchrun nothing changes."""

    _num_nodes: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("cluster_environment") is None and torchrun_nodes() is not None:
            kwargs["cluster_environment"] = TorchrunEnvironment()
        super().__init__(*args, **kwargs)

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        nodes = torchrun_nodes()
        # Lightning sets the Trainer's flag here, 1 unless the script gave one: a 1 is "not said" and takes torchrun's
        # count; another number is kept, and refused with both numbers by the environment's check at the launch
        self._num_nodes = nodes if nodes is not None and num_nodes == 1 else num_nodes

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": int(self.world_size), "rank": int(self.global_rank)}  # type: ignore[attr-defined]

"""The README's quick start as a user writes it, for two torchrun nodes: Trainer(strategy="srifty_auto"), nothing
about nodes or devices. Each rank records what it trained with and a checksum of its weights."""

import json
import os
import sys

import lightning.pytorch as pl

from lightning_srifty.demo.data import DigitsDataModule
from lightning_srifty.demo.models import DigitsCNN

if __name__ == "__main__":
    pl.seed_everything(0)
    # on a GPU node devices="auto" is every GPU, which torchrun's --nproc_per_node matches; a CPU counts one device,
    # so the mixed-node case names torchrun's processes as a GPU node's "auto" would
    devices = int(os.environ["LOCAL_WORLD_SIZE"]) if "--as-gpu-node" in sys.argv else "auto"
    trainer = pl.Trainer(
        max_steps=3,
        strategy="srifty_auto",
        devices=devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = DigitsCNN()
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=16))
    weights = float(sum(p.double().sum() for p in model.parameters()))
    out = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "node_rank": trainer.node_rank,
        "step": trainer.global_step,
        "weights": weights,
        "replicas": trainer.strategy.distributed_sampler_kwargs["num_replicas"],
        "batch_sizes": getattr(trainer.train_dataloader.batch_sampler, "batch_sizes", None),
        "accumulate": trainer.accumulate_grad_batches,
        "strategy_batch_sizes": getattr(trainer.strategy, "batch_sizes", None),
        "node_group": os.environ.get("SRIFTY_NODE_GROUP"),
    }
    with open(os.path.join(sys.argv[1], f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(out, f)

"""How a sharded checkpoint's bytes split over the ranks that write it: the premise of an unmeasured save spread over
a sharded fleet's nodes (``predictor.runs.spot.sharded_save_s``).

    python bench/save_spread.py [--ranks 2,4] [--blocks 8] [--width 512] [--out bench/results/save_spread.json]

CPU processes (gloo) save through ``torch.distributed.checkpoint.save`` (what Lightning's FSDPStrategy does for
``state_dict_type="sharded"``, every layout's in a plan), one ``__<rank>_0.distcp`` file a rank:

- ``fsdp``: FSDP full shard with one unit per block, Adam after one step (weights and both moments), the sharded
  state dict (each rank's shards are its own);
- ``replicated``: the same model's plain state dict on every rank, every item replicated (what a hybrid shard's
  replicas, or a DDP model handed to DCP, give it): DCP's default planner keeps one copy of each and hands it to the
  rank with the least planned so far (``dedup_save_plans``).

What a save on n nodes costs when each writes its file at once is set by the largest file: its share of the whole
against 1/n is printed for each case (1.00: a perfect spread).

``--ranking``: what the spread changes in a ranking, the shipped captured Llama-2 7B (bf16-mixed, 81 GB of weights
and Adam state, unmeasured: 617 s on one node's gp3 root volume) ranked on spot by instance family, each fleet's
save and expected cost against the same ranking with the one figure for every fleet (the save given as the
whole, as before the spread).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _worker(rank: int, world: int, port: int, folder: str, blocks: int, width: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    model = nn.Sequential(*(Block() for _ in range(blocks)))
    plain = model.state_dict()
    dcp.save({"model": plain}, checkpoint_id=os.path.join(folder, "replicated"))
    fsdp = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
        use_orig_params=True,
    )
    optimizer = torch.optim.Adam(fsdp.parameters(), lr=1e-3)
    fsdp(torch.randn(4, width)).sum().backward()
    optimizer.step()
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        state = {"model": fsdp.state_dict(), "optimizer": FSDP.optim_state_dict(fsdp, optimizer)}
    dcp.save(state, checkpoint_id=os.path.join(folder, "fsdp"))
    dist.barrier()
    dist.destroy_process_group()


def _files(folder: Path) -> list[int]:
    return [p.stat().st_size for p in sorted(folder.glob("__*_0.distcp"))]


def measure(world: int, blocks: int, width: int) -> dict[str, dict[str, object]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(world, port, folder, blocks, width), nprocs=world, join=True)
        out = {}
        for case in ("fsdp", "replicated"):
            sizes = _files(Path(folder) / case)
            total = sum(sizes)
            out[case] = {"bytes": sizes, "largest_share": max(sizes) / total, "spread": total / world / max(sizes)}
        return out


def ranking_effect(families: list[str], steps: int) -> list[dict[str, object]]:
    """Each family's spot fleets of the 7B profile, its save spread and not (:func:`sharded_save_s`)."""
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank
    from predictor.runs.spot import saves_on_notice

    profile = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    catalog, rows = Catalog.load(), []
    for family in families:
        asked = Constraints(steps=steps, market="spot", allow=(family,), top=64)
        now = rank(profile, asked, catalog=catalog)
        before = {e.fleet: e for e in rank(profile, asked, catalog=catalog, checkpoint_s=now.checkpoint_s).entries}
        for e in now.entries:
            old = before.get(e.fleet)
            if old is None or e.nodes < 2:
                continue
            rows.append({
                "family": family, "fleet": e.fleet, "layout": e.layout.name if e.layout else "ddp",
                "save_s": e.checkpoint_s, "fits_notice": bool(saves_on_notice(e.checkpoint_s)),
                "interruptions": e.expected_interruptions, "cost_usd": e.cost_usd, "cost_before_usd": old.cost_usd,
                "time_h": e.time_h, "time_before_h": old.time_h,
                "chosen": e.fleet == now.entries[now.chosen].fleet,
                "chosen_before": e.fleet == next(iter(before.values())).fleet,
            })  # fmt: skip
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--out", default=None)
    p.add_argument("--ranking", action="store_true", help="what the spread changes in a 7B model's spot ranking")
    p.add_argument("--families", default="p4d,p5,p5en,g5,g6e")
    p.add_argument("--steps", type=int, default=20_000)
    args = p.parse_args()
    if args.ranking:
        rows = ranking_effect(args.families.split(","), args.steps)
        print("fleet | layout | save (s) | fits the notice | interruptions | cost now / before | time now / before")
        for r in rows:
            print(
                f"{r['fleet']} | {r['layout']} | {r['save_s']:.0f} | {r['fits_notice']} | {r['interruptions']:.3f} | "
                f"{r['cost_usd'] / r['cost_before_usd']:.3f} | {r['time_h'] / r['time_before_h']:.3f}"
            )
        print("family | fleets of 2+ nodes | fit the notice | cost now / before: median, least | chosen now, before")
        for family in dict.fromkeys(r["family"] for r in rows):
            mine = [r for r in rows if r["family"] == family]
            ratios = sorted(r["cost_usd"] / r["cost_before_usd"] for r in mine)  # type: ignore[operator]
            chosen = [next((r["fleet"] for r in mine if r[k]), "-") for k in ("chosen", "chosen_before")]
            fits = sum(bool(r["fits_notice"]) for r in mine)
            print(f"{family} | {len(mine)} | {fits} | {statistics.median(ratios):.3f}, {ratios[0]:.3f} | {chosen}")
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
        return
    results = {}
    print("ranks | case | bytes a rank (MB) | largest share | 1/n | spread (1/n / largest share)")
    for world in (int(n) for n in args.ranks.split(",")):
        results[world] = measure(world, args.blocks, args.width)
        for case, r in results[world].items():
            mb = ", ".join(f"{b / 1e6:.2f}" for b in r["bytes"])  # type: ignore[attr-defined]
            print(f"{world} | {case} | {mb} | {r['largest_share']:.3f} | {1 / world:.3f} | {r['spread']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()

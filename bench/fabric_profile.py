"""A Fabric loop's profile against a Trainer's of the same training: is FabricProfiler the same measurement?

    python bench/fabric_profile.py [--rounds 5] [--warmup 20] [--profile 100] [--after 60] [--batch 64]

The demo's DigitsCNN (Adam, batch 64, torch single-threaded) trained the same way by a Trainer with SriftyCallback and
by a plain Fabric loop with FabricProfiler, interleaved in one process (order alternating each round, the same seed).
Per round:

- the profiles' step time (p50 over the window) and phases; the operator tables compared signature by signature
  (what the predictor reads: the same table is the same prediction input) and the FLOPs per sample;
- the predicted step on a g5.xlarge (A10G) and a p4d.24xlarge (A100) from each profile (``predictor.model.predict``);
- the Fabric profile against the loop's own clock: the loop's median wall-clock step over the same batches measured
  without a profiler (a third arm), so the ratio is what profiling the loop reports against what the loop takes;
- what the profiler's marks cost a Fabric step: the time inside ``prof.step``'s entry and exit (perf_counter
  around them, as bench/profile_overhead.py attributes the callback's hooks), inside the window and after it; the
  two marks ``prof.backward`` adds around ``fabric.backward`` are in the step's time, not in this figure.

Raw rows go to bench/results/fabric_profile.json; the table is printed (BENCHMARKS.md, "A Fabric loop profiled").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from lightning_srifty.demo.data import DigitsDataModule  # noqa: E402
from lightning_srifty.demo.models import DigitsCNN  # noqa: E402
from lightning_srifty.profiling.callback import SriftyCallback  # noqa: E402
from lightning_srifty.profiling.fabric import FabricProfiler  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.model.predict import predict  # noqa: E402

TARGETS = ("g5.xlarge:1", "p4d.24xlarge:1")


def _batches(batch: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = DigitsDataModule(batch_size=batch)
    data.setup()
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    g = torch.Generator().manual_seed(0)
    while len(out) < n:
        order = torch.randperm(len(data.train), generator=g)
        for i in range(0, len(order) - batch + 1, batch):
            idx = order[i : i + batch]
            out.append((data.train.tensors[0][idx], data.train.tensors[1][idx]))
    return out[:n]


class _List(torch.utils.data.Dataset):
    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


def trainer_arm(batches, args, out: Path) -> dict:
    torch.manual_seed(0)
    model = DigitsCNN()
    model.log = lambda *a, **k: None  # the Fabric loop logs nothing either
    cb = SriftyCallback(
        warmup_steps=args.warmup, profile_steps=args.profile, output=out / "trainer.json", recommend=False,
        verbose=False, measure_checkpoint=False,
    )  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=len(batches), callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(_List(batches), batch_size=None, shuffle=False)
    trainer.fit(model, train_dataloaders=loader)
    return json.loads((out / "trainer.json").read_text())


def fabric_arm(batches, args, out: Path, *, profiled: bool) -> tuple[dict | None, list[float], list[float]]:
    """(profile, the loop's step times, seconds inside the profiler's marks per step)."""
    torch.manual_seed(0)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    prof = (
        FabricProfiler(
            fabric,
            model,
            optimizer,
            warmup_steps=args.warmup,
            profile_steps=args.profile,
            output=out / "fabric.json",
            recommend=False,
            verbose=False,
            measure_checkpoint=False,
        )
        if profiled
        else None
    )
    steps: list[float] = []
    inside: list[float] = []
    last = time.perf_counter()
    for x, y in batches:
        spent = 0.0
        t = time.perf_counter()
        mark = prof.step((x, y)) if prof is not None else contextlib.nullcontext()
        mark.__enter__()
        spent += time.perf_counter() - t
        loss = F.cross_entropy(model(x), y)
        if prof is not None:
            prof.backward(loss)  # two marks around fabric.backward: in the step's time, not in ``spent``
        else:
            fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        t = time.perf_counter()
        mark.__exit__(None, None, None)
        spent += time.perf_counter() - t
        now = time.perf_counter()
        steps.append(now - last)
        inside.append(spent)
        last = now
    profile = json.loads((out / "fabric.json").read_text()) if profiled else None
    return profile, steps, inside


def _ops(profile: dict) -> dict[tuple, int]:
    return {
        (op["op"], op["phase"], json.dumps(op["shapes"]), json.dumps(op["dtypes"])): op["count"]
        for op in profile["ops"]["ops"]
    }


def _predicted(path: Path) -> dict[str, float]:
    profile = load_profile(path)
    return {fleet: predict(profile, fleet, layout="ddp").iteration_time_s for fleet in TARGETS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile", type=int, default=100)
    parser.add_argument("--after", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.warmup + args.profile + args.after
    batches = _batches(args.batch, n)
    window = slice(args.warmup + 1, args.warmup + args.profile)
    after = slice(args.warmup + args.profile + 5, n)
    rows = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            order = ("trainer", "fabric", "bare") if r % 2 == 0 else ("bare", "fabric", "trainer")
            got: dict = {}
            for arm in order:
                if arm == "trainer":
                    got["trainer"] = trainer_arm(batches, args, out)
                elif arm == "fabric":
                    got["fabric"], got["fabric_steps"], got["inside"] = fabric_arm(batches, args, out, profiled=True)
                else:
                    _, got["bare_steps"], _ = fabric_arm(batches, args, out, profiled=False)
            tp, fp = got["trainer"], got["fabric"]
            t_ops, f_ops = _ops(tp), _ops(fp)
            pred_t, pred_f = _predicted(out / "trainer.json"), _predicted(out / "fabric.json")
            bare_window = statistics.median(got["bare_steps"][window])
            row = {
                "round": r,
                "trainer_step_ms": tp["timing"]["step_time_s"]["p50"] * 1e3,
                "fabric_step_ms": fp["timing"]["step_time_s"]["p50"] * 1e3,
                "bare_loop_step_ms": bare_window * 1e3,
                "fabric_loop_step_ms_window": statistics.median(got["fabric_steps"][window]) * 1e3,
                "fabric_loop_step_ms_after": statistics.median(got["fabric_steps"][after]) * 1e3,
                "bare_loop_step_ms_after": statistics.median(got["bare_steps"][after]) * 1e3,
                "marks_us_window": statistics.median(got["inside"][window]) * 1e6,
                "marks_us_after": statistics.median(got["inside"][after]) * 1e6,
                "phases_trainer_ms": {k: v["p50"] * 1e3 for k, v in tp["timing"]["phases_s"].items()},
                "phases_fabric_ms": {k: v["p50"] * 1e3 for k, v in fp["timing"]["phases_s"].items()},
                "ops_signatures": [len(t_ops), len(f_ops)],
                "ops_same": t_ops == f_ops,
                "ops_only_trainer": sorted(map(str, set(t_ops) - set(f_ops)))[:8],
                "ops_only_fabric": sorted(map(str, set(f_ops) - set(t_ops)))[:8],
                "ops_count_diff": {
                    str(k): [t_ops[k], f_ops[k]] for k in set(t_ops) & set(f_ops) if t_ops[k] != f_ops[k]
                },
                "flops_per_sample": [tp["model"]["flops"].get("per_sample"), fp["model"]["flops"].get("per_sample")],
                "predicted_ms": {f: [pred_t[f] * 1e3, pred_f[f] * 1e3] for f in TARGETS},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "fabric_profile.json").write_text(json.dumps(rows, indent=2))
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    print(f"\nrounds {len(rows)}, batch {args.batch}, window {args.warmup}+{args.profile}, after {args.after}")
    print(f"profiled step p50: Trainer {med('trainer_step_ms'):.3f} ms, Fabric {med('fabric_step_ms'):.3f} ms")
    print(f"the Fabric loop's own step (no profiler) {med('bare_loop_step_ms'):.3f} ms; Fabric profile / loop = "
          f"{statistics.median(r['fabric_step_ms'] / r['bare_loop_step_ms'] for r in rows):.4f}")  # fmt: skip
    print(f"marks per step: window {med('marks_us_window'):.1f} us, after {med('marks_us_after'):.2f} us")
    print(f"operator tables identical in {sum(r['ops_same'] for r in rows)} of {len(rows)} rounds")
    for fleet in TARGETS:
        ratio = statistics.median(r["predicted_ms"][fleet][1] / r["predicted_ms"][fleet][0] for r in rows)
        print(f"predicted step on {fleet}: Fabric / Trainer = {ratio:.4f}")


if __name__ == "__main__":
    main()

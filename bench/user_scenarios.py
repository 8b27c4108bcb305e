"""The rankings a user meets, checked for what must hold whatever the truth (issue #12).

    python bench/user_scenarios.py

Scenarios: a CPU profile (what `srifty demo` writes), a bf16 profile, a LoRA profile (40M of 7B parameters
trainable), a short job (minutes), a long job (days), a multi-node job on an EFA type and on a type without EFA,
spot allowed. For each ranking every listed fleet (the top 10 and the Pareto front) is checked:

- **feasible**: its instance types' CPU architecture is x86_64 (no arm64 was allowed), its GPUs are supported by the
  profiled torch (compute capability >= 5.0 for torch 2) and have the precision (bf16: >= 8.0), and it holds the
  model in memory;
- **the same training**: its global batch equals the profile's (strong scaling, the default);
- **start-up counted**: its time is at least its start-up plus the predicted training time, and its cost at least
  the 60 s billing minimum of every instance.

Prints one row per scenario (the recommendation, its start-up, and the number of violations, which must be 0) and
writes bench/results/user_scenarios.json. No timing: the figures are the rankings' own.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import profile_from_dict  # noqa: E402
from predictor.documents.work import global_batch  # noqa: E402
from predictor.exceptions import NoFeasibleConfigError  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402

BASE = {
    "schema": "srifty.profile/v1",
    "model": {"name": "ResNet-50", "parameters": 25_557_032, "precision": "16-mixed"},
    "batch": {"per_device": 256},
    "hardware": {"gpu": "V100-SXM2-16GB", "devices": 1, "nodes": 1, "accelerator": "cuda"},
    "timing": {"step_time_s": {"p50": 0.31, "cv": 0.02}},
    "software": {"torch": "2.13.0"},
}


def profile(**changes: dict) -> dict:
    data = copy.deepcopy(BASE)
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    return data


CPU = profile(
    model={"name": "DigitsCNN", "parameters": 40_000, "precision": "32-true", "flops": {"per_sample": 2.4e6}},
    batch={"per_device": 64},
    hardware={"gpu": None, "accelerator": "cpu", "cpu_arch": "x86_64"},
    timing={"step_time_s": {"p50": 0.014, "cv": 0.1}},
)
BF16 = profile(
    model={"name": "BERT-large", "parameters": 335_000_000, "precision": "bf16-mixed"},
    batch={"per_device": 16},
    hardware={"gpu": "A100-SXM-80GB"},
    timing={"step_time_s": {"p50": 0.21, "cv": 0.02}},
)
LORA = profile(
    model={
        "name": "Llama-7B LoRA",
        "parameters": 6_738_000_000,
        "trainable_parameters": 40_000_000,
        "precision": "bf16-mixed",
    },
    batch={"per_device": 8},
    hardware={"gpu": "A100-SXM-80GB"},
    timing={"step_time_s": {"p50": 1.9, "cv": 0.02}},
)
SCENARIOS = {
    "CPU profile (srifty demo)": (CPU, {"steps": 20_000}),
    "bf16 profile": (BF16, {"steps": 50_000}),
    "LoRA profile (40M of 7B trainable)": (LORA, {"steps": 5_000}),
    "short job (minutes)": (BASE, {"steps": 300}),
    "long job (days)": (BASE, {"steps": 2_000_000}),
    "multi-node on EFA (p4d, >= 2 nodes)": (BASE, {"steps": 500_000, "allow": ("p4d.24xlarge",), "objective": "time"}),
    "multi-node without EFA (g5.12xlarge)": (BASE, {"steps": 500_000, "allow": ("g5.12xlarge",), "objective": "time"}),
    "spot allowed": (BASE, {"steps": 500_000, "market": "any"}),
}


def violations(entry, prof, catalog: Catalog) -> list[str]:
    out = []
    bf16 = prof.model.precision.startswith("bf16")
    for g in entry.groups:
        it = catalog.get(g.instance_type)
        gpu = catalog.gpu(it.gpu)
        cc = float(gpu.compute_capability or 0)
        if (it.arch or "x86_64") != "x86_64":
            out.append(f"{it.name} is {it.arch}")
        if cc < 5.0:
            out.append(f"{gpu.key} (sm {cc}) is not in torch 2's wheels")
        if bf16 and cc < 8.0:
            out.append(f"{gpu.key} has no bf16")
        if entry.memory_gib > gpu.memory_gb:
            out.append(f"{entry.memory_gib:.1f} GiB per GPU on a {gpu.memory_gb} GB {gpu.key}")
    if entry.global_batch != global_batch(prof):
        out.append(f"global batch {entry.global_batch} != the profile's {global_batch(prof)}")
    if entry.startup_s is None or entry.time_h * 3600 < entry.startup_s:
        out.append("time without its start-up")
    if entry.cost_usd < entry.usd_per_hour * 60 / 3600 * 0.999:
        out.append("cost under the 60 s billing minimum")
    return out


def main() -> int:
    catalog = Catalog.load(use_refreshed=False)
    rows = []
    for name, (data, asked) in SCENARIOS.items():
        prof = profile_from_dict(data)
        try:
            plan = rank(prof, Constraints(**asked), catalog=catalog)
        except NoFeasibleConfigError as exc:
            rows.append({"scenario": name, "pick": None, "why": str(exc)[:120], "violations": []})
            continue
        listed = list(plan.entries) + list(plan.pareto)
        bad = sorted({v for e in listed for v in violations(e, prof, catalog)})
        best = plan.entries[0]
        rows.append(
            {
                "scenario": name,
                "pick": best.fleet,
                "market": best.market,
                "global_batch": best.global_batch,
                "per_gpu": best.groups[0].per_device_batch,
                "accumulation": best.groups[0].accumulate_grad_batches,
                "startup_min": round((best.startup_s or 0) / 60, 1),
                "time_h": best.time_h,
                "cost_usd": best.cost_usd,
                "checked": len(listed),
                "excluded_types": plan.excluded_types,
                "keep_note": any(n.startswith("keep the fleet you have") for n in plan.notes),
                "violations": bad,
            }
        )
    print(
        "| scenario | recommendation | global batch (per GPU x accumulation) | start-up | time | cost | fleets checked "
        "| violations |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["pick"] is None:
            print(f"| {r['scenario']} | none: {r['why']} | | | | | 0 | 0 |")
            continue
        hours = r["time_h"]
        when = f"{hours * 60:.3g} min" if hours < 1 else f"{hours:.3g} h" if hours < 48 else f"{hours / 24:.3g} days"
        print(
            f"| {r['scenario']} | {r['pick']} ({r['market']}) | {r['global_batch']} ({r['per_gpu']:g} x "
            f"{r['accumulation']}) | {r['startup_min']:g} min | {when} | ${r['cost_usd']:,.4g} | {r['checked']} | "
            f"{len(r['violations'])}{': ' + '; '.join(r['violations']) if r['violations'] else ''} |"
        )
    out = ROOT / "bench" / "results" / "user_scenarios.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2, default=str))
    print(f"wrote {out}")
    return 1 if any(r["violations"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

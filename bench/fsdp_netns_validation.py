"""Ground truth on this machine: 2 real FSDP processes over a shaped link, predicted from a 1-process profile.

    sudo python bench/fsdp_netns_validation.py [--rates 50,200,1000] [--models mlp-tiny,gpt2-tiny]
        [--layouts fsdp:full_shard,fsdp:shard_grad_op] [--micro 4] [--steps 20] [--warmup 3] [--score-only]

For every model: a 1-process profile (Lightning + SriftyCallback, one thread, at the micro-batch each rank trains),
with the model's structure (bench/fsdp_memory.measure_structure) added. For every rate: two network namespaces
joined by a veth pair shaped with tc tbf (bench/netlab.py), 2 real processes (one per namespace, one thread each)
training with Lightning's FSDPStrategy (FSDP1, gloo) for each layout; per-step time is the median of the steps
after the warm-up on rank 0, and the time inside all-gather and reduce-scatter is measured by wrapping the
torch.distributed functions FSDP1 calls (bench/fsdp_lab.CollectiveTimer; synchronous on CPU). Two processes, not
four: the machine has 2 cores, so 4 ranks would measure CPU contention, not the network.

The prediction: predictor.model.predict.predict(profile, "netns-RATEmbit:2", scaling="weak", layout=LAYOUT) with the
link as a user-defined instance type (netlab.link_catalog_yaml). Raw measurements go to
bench/results/fsdp_netns.json before any scoring, so ``--score-only`` re-scores them without re-measuring.
Needs a quiet machine: other load on the 2 cores shows up as step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # predictor from a checkout that is not installed; bench/ is a script's own folder
    sys.path.insert(0, str(ROOT))

import fsdp_lab  # noqa: E402
import netlab  # noqa: E402
from fsdp_memory import measure_structure  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def one_process_profile(model: str, micro: int, steps: int, warmup: int, work: Path) -> Path:
    """The 1-process srifty profile of ``model`` at ``micro`` samples per step, with its structure added."""
    out = work / f"one-{model}-{micro}.json"
    case = {
        "model": model,
        "layout": "ddp",
        "micro": micro,
        "steps": warmup + steps,
        "warmup": warmup,
        "measure": "time",
        "profile_out": str(out),
    }
    fsdp_lab.run_ranks([case], work / f"one-{model}", world=1)
    data = json.loads(out.read_text())
    data["model"]["structure"] = measure_structure(fsdp_lab.MODELS[model], micro)["structure"]
    data["hardware"]["gpu"] = "host-cpu"  # this machine's CPU, described in the link's YAML
    out.write_text(json.dumps(data, indent=2))
    return out


def fsdp_over_link(
    lab: netlab.Link, model: str, layouts: list[str], micro: int, steps: int, warmup: int, work: Path
) -> list[dict[str, Any]]:
    """Each layout trained by 2 real processes, one per namespace, over the shaped link; rank 0's measurements."""
    cases = [
        {"model": model, "layout": lay, "micro": micro, "steps": warmup + steps, "measure": "time", "collectives": True}
        for lay in layouts
    ]
    ranks = fsdp_lab.run_ranks(
        cases,
        work,
        prefix=lambda r: ["ip", "netns", "exec", lab.names[r]],
        rank_env=lambda r: {"MASTER_ADDR": lab.addresses[0], "GLOO_SOCKET_IFNAME": lab.devices[r]},
    )
    out = []
    for per_rank in zip(*ranks):
        rank0 = per_rank[0]
        window = rank0["step_s"][warmup:]
        comm = rank0["comm"][warmup : warmup + steps]

        def med(key: str, comm: list[dict[str, float]] = comm) -> float:
            return statistics.median(c.get(key, 0.0) for c in comm)

        out.append(
            {
                "layout": rank0["layout"],
                "step_s": window,
                "measured_step_s": statistics.median(window),
                "rank_medians_s": [statistics.median(r["step_s"][warmup:]) for r in per_rank],
                "allgather_s": med("allgather_s"),
                "reduce_scatter_s": med("reduce_scatter_s"),
                "allreduce_s": med("allreduce_s"),
                "allgather_bytes": med("allgather_bytes"),
                "reduce_scatter_bytes": med("reduce_scatter_bytes"),
                "allgather_calls": med("allgather_calls"),
                "reduce_scatter_calls": med("reduce_scatter_calls"),
            }
        )
    return out


def predicted_step(one: Path, rate_mbit: float, layout: str, work: Path) -> dict[str, Any]:
    """The predictor's step time of 2 ranks over the link for ``layout`` (weak scaling: each rank keeps the
    profile's per-device batch)."""
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.model.predict import predict

    catalog = Catalog.load(
        extra=[netlab.link_catalog_yaml(work / f"link-{rate_mbit:g}.yaml", rate_mbit)],
        use_refreshed=False,
        use_env=False,
    )
    r = predict(load_profile(one), f"netns-{rate_mbit:g}mbit:2", catalog=catalog, scaling="weak", layout=layout)
    lo, hi = r.interval["iteration_time_s"]
    return {"predicted_step_s": r.iteration_time_s, "interval": [lo, hi], "breakdown": r.breakdown}


def score(raw: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    rows = []
    for row in raw["rows"]:
        pred = predicted_step(ROOT / raw["profiles"][row["model"]], row["rate_mbit"], row["layout"], work)
        true = row["measured_step_s"]
        lo, hi = pred["interval"]
        rows.append(row | pred | {"ape": abs(pred["predicted_step_s"] - true) / true, "covered": lo <= true <= hi})
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        pred = ""
        if "ape" in r:
            b = r["breakdown"]
            pred = (
                f"predicted {r['predicted_step_s'] * 1e3:8.1f} ms  APE {r['ape']:6.1%} (communication "
                f"{b['allreduce_s'] * 1e3:.1f}, exposed {b['exposed_comm_s'] * 1e3:.1f} ms)"
            )
        print(
            f"{r['model']:>10} {r['layout']:>20} {r['rate_mbit']:6g} Mbit  measured {r['measured_step_s'] * 1e3:8.1f} "
            f"ms (all-gather {r['allgather_s'] * 1e3:.1f}, reduce-scatter {r['reduce_scatter_s'] * 1e3:.1f} ms; "
            f"1 process {r['one_process_step_s'] * 1e3:.1f} ms)  {pred}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,200,1000", help="link rates in Mbit/s")
    parser.add_argument("--models", default="mlp-tiny,gpt2-tiny")
    parser.add_argument("--layouts", default="fsdp:full_shard,fsdp:shard_grad_op")
    parser.add_argument("--micro", type=int, default=4, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=20, help="measured steps (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "fsdp_netns.json")
    parser.add_argument("--score-only", action="store_true", help="score the saved measurements again")
    args = parser.parse_args()
    work = RESULTS / "fsdp_netns"
    work.mkdir(parents=True, exist_ok=True)
    if args.score_only:
        raw = json.loads(args.out.read_text())
    else:
        reason = netlab.unavailable_reason()
        if reason:
            raise SystemExit(f"cannot run: {reason}")
        raw = {"settings": vars(args) | {"out": str(args.out)}, "profiles": {}, "rows": []}
        for model in args.models.split(","):
            one = one_process_profile(model, args.micro, args.steps, args.warmup, work)
            raw["profiles"][model] = str(one.relative_to(ROOT))
            one_step = json.loads(one.read_text())["timing"]["step_time_s"]["p50"]
            for rate in (float(r) for r in args.rates.split(",")):
                t0 = time.time()
                with netlab.link(rate) as lab:
                    got = fsdp_over_link(
                        lab, model, args.layouts.split(","), args.micro, args.steps, args.warmup, work / "ranks"
                    )
                for g in got:
                    row = {"model": model, "rate_mbit": rate, "micro": args.micro, "one_process_step_s": one_step}
                    raw["rows"].append(row | g | {"seconds": round(time.time() - t0, 1)})
                    print_rows(raw["rows"][-1:])
                args.out.write_text(json.dumps(raw, indent=2))  # raw measurements first: --score-only reruns
    rows = score(raw, work)
    print_rows(rows)
    mape = statistics.fmean(r["ape"] for r in rows)
    coverage = sum(r["covered"] for r in rows) / len(rows)
    args.out.write_text(json.dumps(raw | {"scored": rows, "mape": mape, "coverage_80": coverage}, indent=2))
    print(f"\nMAPE {mape:.1%} over {len(rows)} cases (target <= 10%); 80% interval coverage {coverage:.0%}")
    plot(rows, ROOT / "docs" / "img" / "fsdp_netns.png")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Measured against predicted step time, each case with its 80% interval (log axes: 250 ms to 8 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = {"fsdp:full_shard": "o", "fsdp:shard_grad_op": "s"}
    colours = {50.0: "tab:red", 200.0: "tab:orange", 1000.0: "tab:green"}
    for r in rows:
        lo, hi = r["interval"]
        p = r["predicted_step_s"]
        ax.errorbar(
            r["measured_step_s"],
            p,
            yerr=[[p - lo], [hi - p]],
            fmt=markers.get(r["layout"], "^"),
            color=colours.get(r["rate_mbit"], "tab:blue"),
            mfc="none" if r["model"] == "mlp-tiny" else None,
        )
    span = [min(r["measured_step_s"] for r in rows) * 0.8, max(r["measured_step_s"] for r in rows) * 1.25]
    ax.plot(span, span, "k--", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="measured step (s), 2 FSDP processes over a shaped link",
        ylabel="predicted from a 1-process profile (s)",
    )
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=f"{k:g} Mbit/s") for k, c in colours.items()]
    handles += [plt.Line2D([], [], color="k", marker=m, ls="", mfc="none", label=k) for k, m in markers.items()]
    ax.legend(handles=handles, fontsize=8, title="hollow: mlp-tiny, filled: gpt2-tiny", title_fontsize=8)
    mape = statistics.fmean(r["ape"] for r in rows)
    ax.set_title(f"FSDP network lab (gloo): MAPE {mape:.1%}, {len(rows)} cases", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

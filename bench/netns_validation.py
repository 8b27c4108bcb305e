"""Ground truth on this machine: predict 2-process DDP over a shaped link from a 1-process profile, then measure.

    sudo python bench/netns_validation.py [--rates 50,200,1000] [--models cnn:small,cnn:large,lm:small]

For every model: a 1-process profile (single-threaded, like each rank). For every rate: two network namespaces
joined by a veth pair shaped with tc tbf, 2 real processes (one per namespace) training with srifty_ddp over gloo;
the prediction uses the 1-process profile and the link described as a user-defined instance type
(`bench/netlab.py`). Prints the per-case APE and the MAPE; writes bench/results/netns_validation.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # predictor from a checkout that is not installed; bench/ is a script's own folder
    sys.path.insert(0, str(ROOT))

import netlab  # noqa: E402

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import load_profile, profile_from_dict  # noqa: E402
from predictor.model.predict import predict  # noqa: E402


def predicted_step(one: Path, rate_mbit: float, work: Path) -> tuple[float, float, float, dict]:
    data = load_profile(one).to_dict()
    data["hardware"]["gpu"] = "host-cpu"  # this machine's CPU, described in the YAML
    catalog = Catalog.load(
        extra=[netlab.link_catalog_yaml(work / f"link-{rate_mbit:g}.yaml", rate_mbit)],
        use_refreshed=False,
        use_env=False,
    )
    # each of the two processes trains the 1-process profile's batch: the per-GPU batch is kept (weak scaling)
    r = predict(profile_from_dict(data), f"netns-{rate_mbit:g}mbit:2", catalog=catalog, scaling="weak", layout="ddp")
    lo, hi = r.interval["iteration_time_s"]
    return r.iteration_time_s, lo, hi, r.breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,200,1000", help="link rates in Mbit/s")
    parser.add_argument("--models", default="cnn:small,cnn:large,lm:small", help="model:size list")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    reason = netlab.unavailable_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "netns"
    work.mkdir(exist_ok=True)
    rows = []
    for spec in args.models.split(","):
        model, size = spec.split(":")
        one = work / f"one-{model}-{size}.json"
        netlab.profile_one_process(model, size, one, steps=args.steps)
        for rate in (float(r) for r in args.rates.split(",")):
            ddp = work / f"ddp-{model}-{size}-{rate:g}.json"
            t0 = time.time()
            with netlab.link(rate) as lab:
                netlab.ddp_over_link(lab, model, size, ddp, steps=args.steps)
            measured = load_profile(ddp)
            pred, lo, hi, parts = predicted_step(one, rate, work)
            true = measured.timing.step_time_s.p50
            comm = measured.communication
            row = {
                "model": f"{model}/{size}",
                "rate_mbit": rate,
                "gradient_mb": measured.model.gradient_bytes / 1e6,
                "one_process_step_s": load_profile(one).timing.step_time_s.p50,
                "measured_step_s": true,
                "predicted_step_s": pred,
                "interval": [lo, hi],
                "ape": abs(pred - true) / true,
                "covered": lo <= true <= hi,
                "measured_allreduce_s": comm.allreduce_s.p50 if comm.allreduce_s else None,
                "measured_exposed_s": comm.exposed_s.p50 if comm.exposed_s else None,
                "predicted_allreduce_s": parts["allreduce_s"],
                "predicted_exposed_s": parts["exposed_comm_s"],
                "seconds": round(time.time() - t0, 1),
            }
            rows.append(row)
            print(
                f"{row['model']:>10} {rate:6g} Mbit  grads {row['gradient_mb']:.1f} MB  measured "
                f"{true * 1e3:7.1f} ms  predicted {pred * 1e3:7.1f} ms  APE {row['ape']:.1%}  (all-reduce "
                f"measured {row['measured_allreduce_s'] * 1e3:.1f} / predicted {row['predicted_allreduce_s'] * 1e3:.1f}"
                f" ms; exposed {row['measured_exposed_s'] * 1e3:.1f} / {row['predicted_exposed_s'] * 1e3:.1f} ms)",
                flush=True,
            )
    mape = statistics.fmean(r["ape"] for r in rows)
    coverage = sum(r["covered"] for r in rows) / len(rows)
    (args.out / "netns_validation.json").write_text(
        json.dumps({"mape": mape, "coverage_80": coverage, "rows": rows}, indent=2)
    )
    print(f"\nMAPE {mape:.1%} over {len(rows)} cases; 80% interval coverage {coverage:.0%}")


if __name__ == "__main__":
    main()

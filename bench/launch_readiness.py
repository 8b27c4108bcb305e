"""From plan to a training that runs (issue #22): what the launch path costs in time, measured here.

- snapshot: packing a project (git's view) with the profiled environment (this lightning-srifty repacked as a wheel),
  for a small project (examples/) and a large one (this repository); median of --repeat runs, sizes;
- bootstrap: a node's environment from the snapshot (venv, pip of the pins, the wheel, the requirements) with this
  machine's interpreter standing for the image (pins already satisfied: what is measured is srifty's part, not the
  download of torch);
- pre-flight: srifty check of a generated root against moto's server and a local fake of Service Quotas (every
  check of a real one: credentials, quotas, offerings, bucket, imports); median of --repeat runs;
- failover: the AWS provider applying through a fault-injecting proxy in front of moto that refuses the first
  fleet's launch with InsufficientInstanceCapacity: the failed apply and its clean-up, then the next entry up
  (``--failover-runs``, each two terraform applies and a destroy).

python bench/launch_readiness.py [--repeat 5] [--failover-runs 1] [--out bench/results/launch_readiness.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def median_time(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench_snapshot(repeat: int, work: Path) -> dict:
    from lightning_srifty.provision.terraform.snapshot import build_snapshot, repacked_wheel

    spec = {"packages": ["torch==2.13.0", "lightning==2.6.6"], "requirements": None}
    out = {}
    wheel_s, (_, wheel) = median_time(repacked_wheel, repeat)
    out["wheel"] = {"median_s": round(wheel_s, 3), "bytes": len(wheel)}
    for name, folder in (("examples", ROOT / "examples"), ("repository", ROOT)):
        secs, snap = median_time(lambda f=folder: build_snapshot(f, work / "snap", spec, leave_out=(work,)), repeat)
        out[name] = {
            "median_s": round(secs, 3),
            "files": len(snap.files),
            "source": snap.source,
            "bytes_in": snap.bytes_in,
            "archive_bytes": snap.bytes_out,
        }
        print(
            f"snapshot {name}: {len(snap.files)} files, {snap.bytes_in / 2**20:.1f} MiB -> archive "
            f"{snap.bytes_out / 2**20:.2f} MiB in {secs:.2f} s (median of {repeat})",
            flush=True,
        )
    return out


def bench_bootstrap(work: Path) -> dict:
    import tarfile

    from lightning_srifty.provision.terraform.snapshot import build_snapshot

    project = work / "project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text("import lightning\n")
    (project / "requirements.txt").write_text("pyyaml\n")
    spec = {
        "packages": ["torch==" + _version("torch"), "lightning==" + _version("lightning")],
        "requirements": "requirements.txt",
        "base_python": sys.executable,
    }
    snap = build_snapshot(project, work / "boot-snap", spec)
    code = work / "code"
    with tarfile.open(snap.path) as tar:
        tar.extractall(code, filter="data")
    t0 = time.perf_counter()
    run = subprocess.run(
        ["python3", str(code / ".srifty" / "bootstrap.py"), str(work / "venv")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    secs = time.perf_counter() - t0
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    print(f"bootstrap (pins satisfied by the image): {secs:.1f} s", flush=True)
    return {"seconds": round(secs, 2)}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name).split("+")[0]


def bench_preflight(repeat: int, work: Path) -> dict:
    import boto3
    from quotas_server import FakeServiceQuotas

    from conftest import moto_server
    from lightning_srifty.provision.preflight import preflight_root
    from lightning_srifty.provision.terraform.generate import Options, generate
    from predictor.documents.plan import load_plan

    os.environ.update(AWS)
    project = work / "pf-project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text("import os\nimport lightning\nimport numpy\n")
    plan = load_plan(ROOT / "terraform" / "examples" / "multi-node-spot" / "plan.json")
    with moto_server() as moto, FakeServiceQuotas({"All P4, P3 and P2 Spot Instance Requests": 384}) as quotas:
        os.environ["AWS_ENDPOINT_URL_SERVICE_QUOTAS"] = quotas
        boto3.client("s3", endpoint_url=moto, region_name="us-east-1").create_bucket(Bucket="bench-preflight")
        options = Options(name="bench-pf", code=str(project), aws_endpoint=moto, bucket="bench-preflight")
        root = generate(plan, work / "pf-root", options=options).out
        preflight_root(root)  # warm: clients, the first moto calls
        secs, report = median_time(lambda: preflight_root(root), repeat)
    print(report.text(), flush=True)
    print(f"pre-flight: {secs:.2f} s (median of {repeat})", flush=True)
    return {"median_s": round(secs, 3), "checks": len(report.findings), "ok": report.ok}


def bench_failover(runs: int, work: Path) -> dict:
    import boto3
    from fault_proxy import FaultProxy

    from _support import MINIMAL, moto_network
    from conftest import moto_server
    from lightning_srifty.provision.launcher.legs import up_or_next
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from lightning_srifty.provision.terraform.generate import Options
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    os.environ.update(AWS)
    os.environ.pop("AWS_ENDPOINT_URL_SERVICE_QUOTAS", None)
    rc = work / "terraformrc"
    mirror = next(Path("/").glob("*/tf-plugins"), None) or next(Path("/").glob("tf-plugins"), None)
    rc.write_text(f'provider_installation {{\n  filesystem_mirror {{\n    path = "{mirror}"\n  }}\n}}\n')
    os.environ.update(TF_CLI_CONFIG_FILE=str(rc), CHECKPOINT_DISABLE="1")
    plan = rank(
        load_profile({**MINIMAL, "batch": {"per_device": 8}}),
        Constraints(steps=100_000, market="on-demand", allow=("g5.xlarge", "g6.xlarge"), max_instances=1, top=5),
    )
    results = []
    for run in range(runs):
        with moto_server() as moto:
            ec2 = boto3.client("ec2", endpoint_url=moto, region_name="us-east-1")
            image = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
            vpc, subnets = moto_network(moto)
            boto3.client("s3", endpoint_url=moto, region_name="us-east-1").create_bucket(Bucket="bench-failover")
            with FaultProxy(moto, {plan.entries[0].fleet.split(":")[0]}) as proxy:
                options = Options(
                    aws_endpoint=proxy, vpc_id=vpc, subnet_ids=subnets, mode="fleet", setup_command="true",
                    ami=image["Images"][0]["ImageId"], train_command="train.py",
                )  # fmt: skip
                stamps: list[tuple[float, str]] = []
                t0 = time.perf_counter()

                def echo(line: str, stamps=stamps, t0=t0) -> None:
                    stamps.append((time.perf_counter() - t0, line))

                prov = TerraformProvisioner(work / f"fo-{run}", "s3://bench-failover/runs/f/", options, echo=echo)
                fleet, _ = up_or_next(prov, plan, 0, (f"bench-fo-{run}-{n}" for n in range(1, 9)), echo)
                total = time.perf_counter() - t0
                refused = next(t for t, line in stamps if "could not start" in line)
                prov.down(fleet)
        results.append({"refused_after_s": round(refused, 1), "next_fleet_up_s": round(total, 1)})
        print(
            f"failover run {run + 1}: first fleet refused and cleaned up after {refused:.1f} s, the next entry "
            f"up after {total:.1f} s",
            flush=True,
        )
    return {
        "runs": results,
        "median_refused_s": statistics.median(r["refused_after_s"] for r in results),
        "median_total_s": statistics.median(r["next_fleet_up_s"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--failover-runs", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "launch_readiness.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="srifty-bench-") as tmp:
        work = Path(tmp)
        result = {
            "snapshot": bench_snapshot(args.repeat, work),
            "bootstrap": bench_bootstrap(work),
            "preflight": bench_preflight(args.repeat, work),
            "failover": bench_failover(args.failover_runs, work),
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()

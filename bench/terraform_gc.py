"""What Go's garbage collector costs the suite's terraform runs (tests/conftest.py sets GOGC for them).

terraform and the AWS provider it starts (a 675 MB Go binary, started about 275 times a suite run: BENCHMARKS.md,
"Where CI's CPU goes") spend much of a start decoding the provider's schema, allocating as they go; Go collects
whenever the heap has grown by GOGC % since the last collection (100 by default:
https://pkg.go.dev/runtime#hdr-Environment_Variables). This times ``terraform validate`` of a root module (one
terraform process and one provider start) under each GOGC given, alternating them, and reports the median CPU
(user + system, the children's rusage) and the largest resident set of each.

    python bench/terraform_gc.py [--root DIR] [--runs 5] [--gogc default,200,400,off]

The root (default: the one srifty terraform writes, with terraform/examples/multi-node-spot's values) is copied to a
temporary folder and initialised there (TF_CLI_CONFIG_FILE may point at a provider mirror).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(folder: Path, gogc: str) -> float:
    """One ``terraform validate`` under ``gogc`` ("default": unset): its CPU seconds and its provider's."""
    env = {k: v for k, v in os.environ.items() if k != "GOGC"}
    if gogc != "default":
        env["GOGC"] = gogc
    env["CHECKPOINT_DISABLE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(["terraform", "validate", "-no-color"], cwd=folder, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode:
        sys.exit(f"terraform validate failed under GOGC={gogc}:\n{result.stdout}{result.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def rss_mb(folder: Path, gogc: str) -> float:
    """The largest resident set of one ``terraform validate`` under ``gogc`` and the provider it starts, in MB: run
    from a Python of its own, whose children's rusage holds only theirs."""
    env = {k: v for k, v in os.environ.items() if k != "GOGC"}
    if gogc != "default":
        env["GOGC"] = gogc
    probe = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); " \
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe, "terraform", "validate"], cwd=folder, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return int(out.stdout.split()[-1]) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", help="a root module (default: terraform/root with the module and an example's values)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--gogc", default="default,200,400,off")
    args = p.parse_args()
    settings = args.gogc.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "root"
        if args.root:
            shutil.copytree(args.root, folder, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".srifty*"))
        else:  # the root srifty terraform writes: its .tf files, the module beside them, an example's values
            shutil.copytree(ROOT / "terraform" / "root", folder)
            shutil.copytree(ROOT / "terraform" / "modules" / "training_fleet", folder / "modules" / "training_fleet")
            example = ROOT / "terraform" / "examples" / "multi-node-spot" / "expected.auto.tfvars.json"
            shutil.copy(example, folder / "srifty.auto.tfvars.json")
        init = subprocess.run(["terraform", "init", "-input=false", "-no-color"], cwd=folder, capture_output=True,
                              text=True, env={**os.environ, "CHECKPOINT_DISABLE": "1"})  # fmt: skip
        if init.returncode:
            sys.exit(f"terraform init failed:\n{init.stdout}{init.stderr}")
        cpu: dict[str, list[float]] = {g: [] for g in settings}
        for _ in range(args.runs):
            for gogc in settings:  # alternated: a machine's drift falls on every setting alike
                cpu[gogc].append(run(folder, gogc))
        print(f"terraform validate of {args.root or 'terraform/root'}, {args.runs} runs each, alternated (user + sys)")
        base = statistics.median(cpu[settings[0]])
        for gogc in settings:
            median = statistics.median(cpu[gogc])
            print(f"  GOGC={gogc:8s} median {median:5.2f} CPU-s  ({median / base - 1:+.0%} against GOGC={settings[0]})")
        for gogc in settings:  # the resident set: each setting's own process tree (the children's largest)
            print(f"  GOGC={gogc:8s} largest resident set {rss_mb(folder, gogc):5.0f} MB")


if __name__ == "__main__":
    main()

"""The launcher-signal matrix (issue #23 item 2): SIGTERM, SIGINT and SIGHUP sent to ``srifty launch --provisioner
terraform`` at each phase of its bring-up that its own output marks, against moto's server (a fresh one per case,
on 127.0.0.1), the real terraform CLI with the AWS provider from a filesystem mirror, fake credentials. For each
case: the launcher's exit status, the seconds from the signal to its exit, and what is left in moto afterwards
(instances not terminated, Auto Scaling groups): both must be 0.

Phases (the line of the launcher's output that triggers the signal):

- ``preflight``: "srifty launch: terraform apply of ..." (the root is written, the pre-flight starts: nothing exists);
- ``plan``: "terraform plan" (init done, the plan runs: nothing exists yet);
- ``apply``: terraform's first "Creating..." line (the apply is creating the fleet);
- ``applied``: "Apply complete!" (the apply has ended: outputs, the wait for the group's instances);
- ``up``: "... is up; if this launcher dies ..." (the bring-up has returned the fleet to the launcher);
- ``job``: "... handed over: ..." (the fleet is up and the job handed over: the launcher waits for its records).

SIGTERM and SIGHUP go to the launcher's pid; SIGINT to its process group, as a terminal's Ctrl-C does.

python bench/launcher_signals.py [--signals TERM,INT,HUP] [--phases preflight,plan,apply,applied,up,job]
    [--out bench/results/launcher_signals.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):  # predictor from a checkout; tests/conftest's moto and terraform helpers
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"
PHASES = {
    "preflight": re.compile(r"^srifty launch: terraform apply of "),
    "plan": re.compile(r"^terraform plan$"),
    "apply": re.compile(r": Creating\.\.\.$"),
    "applied": re.compile(r"^Apply complete!"),
    "up": re.compile(r"^srifty launch: .* is up; if this launcher dies"),
    "job": re.compile(r"^srifty launch: .* handed over: "),
}
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "HUP": signal.SIGHUP}
AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "CHECKPOINT_DISABLE": "1",
    "TF_IN_AUTOMATION": "1",
}


def left_in(endpoint: str) -> dict[str, int]:
    """Instances not terminated and Auto Scaling groups in moto."""
    import boto3

    kw = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing"}
    kw["aws_secret_access_key"] = "testing"
    ec2, asg = boto3.client("ec2", **kw), boto3.client("autoscaling", **kw)
    instances = [
        i
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in ("terminated", "shutting-down")
    ]
    return {"instances": len(instances), "asgs": len(asg.describe_auto_scaling_groups()["AutoScalingGroups"])}


def run_case(sig: str, phase: str, work: Path, *, exit_timeout_s: float = 300.0, echo=print) -> dict:
    """One case: a launch against a fresh moto, ``sig`` when ``phase``'s line appears, the launcher's exit, what is
    left. Every process is bounded in time and stopped at the end."""
    import boto3

    from conftest import moto_server, write_terraformrc

    work.mkdir(parents=True, exist_ok=True)
    rc = write_terraformrc(work)
    if rc is None:
        raise RuntimeError(
            "needs the terraform CLI and a filesystem mirror of the AWS provider (SRIFTY_TF_PLUGIN_MIRROR)"
        )
    (work / "train.py").write_text("print('train')\n")
    with moto_server() as endpoint:
        kw = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing"}
        kw["aws_secret_access_key"] = "testing"
        image = boto3.client("ec2", **kw).describe_images(
            Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}]
        )["Images"][0]["ImageId"]
        boto3.client("s3", **kw).create_bucket(Bucket="signal-runs")
        env = {
            **os.environ,
            **AWS,
            "TF_CLI_CONFIG_FILE": str(rc),
            "SRIFTY_CACHE_DIR": str(work / "cache"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            env.pop(name, None)
        cmd = [
            sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(PLAN), "--provisioner", "terraform",
            "--checkpoint-uri", "s3://signal-runs/job", "--aws-endpoint", endpoint, "--ami", image,
            "--setup-command", "true", "--no-code", "--name", "sig", "--start-timeout-min", "10",
            "--workdir", str(work / "launch"), "--", "train.py",
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: SIGINT to the group is a terminal's Ctrl-C
        )
        lines: list[tuple[float, str]] = []
        reached = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                lines.append((time.monotonic() - t0, line))
                if not reached.is_set() and PHASES[phase].search(line):
                    reached.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        result: dict = {"signal": f"SIG{sig}", "phase": phase, "target": "group" if sig == "INT" else "pid"}
        waited = 0.0
        while not reached.wait(0.2):
            waited += 0.2
            if proc.poll() is not None or waited > 400:
                break
        if not reached.is_set():
            result["error"] = f"the phase's line never came (exit {proc.poll()})"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            result["signal_at_s"] = round(time.monotonic() - t0, 1)
            sent = time.monotonic()
            if sig == "INT":
                os.killpg(proc.pid, signal.SIGINT)
            else:
                proc.send_signal(SIGNALS[sig])
            try:
                result["exit"] = proc.wait(timeout=exit_timeout_s)
            except subprocess.TimeoutExpired:
                result["exit"] = None
                result["error"] = f"no exit within {exit_timeout_s:.0f} s of the signal: killed"
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            result["exit_after_s"] = round(time.monotonic() - sent, 1)
        reader.join(timeout=10)
        if not reader.is_alive():  # the pipe is ours to close once read to its end
            proc.stdout.close()  # type: ignore[union-attr]
        time.sleep(2)  # what the launcher left (terraform and its provider run in sessions of their own: issue #36 L2)
        stray = left_processes(work)
        result["processes"] = len(stray)
        result["processes_left"] = [cmd[:160] for cmd in stray.values()]
        for pid in stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # nothing of the launch outlives the case
            os.killpg(proc.pid, signal.SIGKILL)
        result.update(left_in(endpoint))
        result["tail"] = [line for _, line in lines if line.startswith(("srifty", "Interrupted", "Destroy"))][-8:]
        (work / "launcher.log").write_text("\n".join(f"{t:7.1f} {line}" for t, line in lines) + "\n")
    echo(
        f"SIG{sig:<4} {phase:<9} exit {result.get('exit')} after {result.get('exit_after_s')} s; left: "
        f"{result['instances']} instances, {result['asgs']} ASGs, {result.get('processes', '-')} processes"
        + (f" ({result['error']})" if "error" in result else "")
    )
    return result


def left_processes(work: Path) -> dict[int, str]:
    """Processes still running in ``work`` (their working folder or their command line): terraform, its AWS provider,
    a boot script. moto's own server is the case's and is not counted (it is stopped after)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if "moto" in cmd:
            continue
        if cwd.startswith(str(work)) or str(work) in cmd:
            found[int(entry.name)] = cmd
    return found


def table(results: list[dict]) -> str:
    out = [
        "| signal | to | phase | signal at (s) | exit | signal to exit (s) | instances left | ASGs left | "
        "processes left |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        out.append(
            f"| {r['signal']} | {r['target']} | {r['phase']} | {r.get('signal_at_s', '-')} | {r.get('exit', '-')} | "
            f"{r.get('exit_after_s', '-')} | {r['instances']} | {r['asgs']} | {r.get('processes', '-')} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--signals", default="TERM,INT,HUP")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "launcher_signals.json"))
    parser.add_argument("--keep", help="keep each case's folder (launcher.log, moto.log) under this folder")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="srifty-signals-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        for sig in args.signals.split(","):
            for phase in args.phases.split(","):
                results.append(run_case(sig, phase, base / f"{sig}-{phase}"))
    print(table(results))
    leaks = sum(r["instances"] + r["asgs"] for r in results)
    print(f"{len(results)} cases; {leaks} instances and ASGs left in all")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cases": results, "left": leaks}, indent=2) + "\n")
    sys.exit(1 if leaks or any("error" in r for r in results) else 0)


if __name__ == "__main__":
    main()

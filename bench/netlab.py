"""A two-host network lab on one machine: two network namespaces joined by a veth pair rate-limited with tc tbf.

Used by bench/netns_validation.py and tests/job/test_netns.py to run real 2-process DDP (gloo) over a link of known
rate. Traffic stays between the two namespaces' own addresses. Needs root, `ip` and `tc`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.231.7"


def unavailable_reason() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2)"
    probe = f"srp{uuid.uuid4().hex[:6]}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Link:
    names: tuple[str, str]
    devices: tuple[str, str]
    addresses: tuple[str, str]
    rate_mbit: float


@contextlib.contextmanager
def link(rate_mbit: float) -> Iterator[Link]:
    """Two namespaces joined by a veth pair shaped to ``rate_mbit`` in both directions; removed on exit."""
    tag = uuid.uuid4().hex[:6]
    ns = (f"sra{tag}", f"srb{tag}")
    dev = (f"sva{tag}", f"svb{tag}")
    addr = (f"{SUBNET}.1", f"{SUBNET}.2")
    try:
        for name in ns:
            _sh("ip", "netns", "add", name)
        _sh("ip", "link", "add", dev[0], "type", "veth", "peer", "name", dev[1])
        for name, d, a in zip(ns, dev, addr):
            _sh("ip", "link", "set", d, "netns", name)
            _sh("ip", "-n", name, "addr", "add", f"{a}/24", "dev", d)
            _sh("ip", "-n", name, "link", "set", d, "up")
            _sh("ip", "-n", name, "link", "set", "lo", "up")
            _sh(
                "tc",
                "-n",
                name,
                "qdisc",
                "add",
                "dev",
                d,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit}mbit",
                "burst",
                "256kb",
                "latency",
                "200ms",
            )
        yield Link(ns, dev, addr, rate_mbit)
    finally:
        for name in ns:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def demo_args(model: str, size: str, out: Path | None, steps: int, warmup: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lightning_srifty.cli",
        "demo",
        "--model",
        model,
        "--size",
        size,
        "--accelerator",
        "cpu",
        "--warmup-steps",
        str(warmup),
        "--profile-steps",
        str(steps),
        "--max-steps",
        str(warmup + steps),
        "--no-progress",
        "--output",
        str(out) if out else "-",
    ]


def env(threads: int = 1) -> dict[str, str]:
    e = dict(os.environ)
    e.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONPATH=os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    return e


def profile_one_process(
    model: str, size: str, out: Path, steps: int = 30, warmup: int = 5, timeout: float = 300
) -> None:
    """The 1-process profile the prediction starts from (single-threaded, like each DDP rank)."""
    subprocess.run(
        demo_args(model, size, out, steps, warmup),
        check=True,
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
        cwd=out.parent,
    )


def ddp_over_link(
    lab: Link, model: str, size: str, out: Path, steps: int = 30, warmup: int = 5, timeout: float = 600
) -> None:
    """2 real processes, one per namespace, DDP (srifty_ddp, gloo) over the shaped link; rank 0 writes ``out``."""
    port = "29517"
    procs = []
    for rank, (name, dev) in enumerate(zip(lab.names, lab.devices)):
        e = env()
        e.update(
            MASTER_ADDR=lab.addresses[0],
            MASTER_PORT=port,
            NODE_RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE="2",
            GLOO_SOCKET_IFNAME=dev,
        )
        cmd = [
            "ip",
            "netns",
            "exec",
            name,
            *demo_args(model, size, out if rank == 0 else None, steps, warmup),
            "--num-nodes",
            "2",
            "--devices",
            "1",
            "--strategy",
            "srifty_ddp",
        ]
        procs.append(
            subprocess.Popen(cmd, env=e, cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            errors.append(err[-2000:])
    if errors:
        raise RuntimeError("DDP over the namespace link failed:\n" + "\n".join(errors))


def link_catalog_yaml(path: Path, rate_mbit: float) -> Path:
    """User-defined hardware describing this machine's CPU 'device' and the shaped link, for the predictor."""
    path.write_text(f"""gpus:
  - name: host-cpu
    memory_gb: 24
    memory_bw_gbps: 20
    fp32_tflops: 0.1
instance_types:
  - name: netns-{rate_mbit:g}mbit
    gpu: host-cpu
    gpus: 1
    vcpus: 1
    memory_gib: 12
    network_gbps: {rate_mbit / 1000:g}
    efa: false
    process_group_backend: gloo
""")
    return path

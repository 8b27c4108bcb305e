"""A fleet of two nodes with disks of their own, on this machine: what a sharded (FSDP) job leaves in the store on a
notice, whether a second two-node fleet resumes from it, and whether the profiler's checkpoint measurement survives.

python bench/two_node_disks.py [--against REV]

Each node is a torchrun agent of one process in a mount namespace of its own, with a tmpfs at one path as its
TMPDIR (as every instance has its own /tmp under one name); root is needed (``unshare -m``). The job is
``tests/scripts/fsdp_migrate_run.py`` (FSDP, sharded state dict, gloo, 12 steps of global batch 12), checkpoints to
S3 on moto's server. Legs:

- leave: SIGTERM at step 5 on both ranks (every step also takes a periodic checkpoint, keep 2): the store's files
  under ``preempt-step=5.ckpt``, the manifest's, ``find_checkpoint``'s answer, the notice-to-durable time;
- resume: a new two-node fleet from the store: its first step and whether it trains to the end;
- profile: ``SriftyCallback`` (its default checkpoint measurement) over steps 1-4: the exit status and the bytes it
  measured against the shards in the store.

``--against REV`` runs the same legs on another revision (a temporary git worktree; this checkout's job script).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path("tests") / "scripts" / "fsdp_migrate_run.py"
STEPS, LEAVE_AT = 12, 5


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto() -> tuple[subprocess.Popen, str]:
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(150):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("moto's server did not start")


def two_nodes(tree: Path, out: Path, env: dict[str, str], *args: str) -> list[int]:
    """Two torchrun agents, 2 s apart, each on a private tmpfs at ``out/disk``; their exit codes."""
    from lightning_srifty.provision.rehearsal.node import on_its_own_disk

    port = _port()
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"b{port}"]
    cmd += [str(tree / SCRIPT), str(out), "--max-steps", str(STEPS), "--node-disk", *args]
    env = dict(env)
    cmd = on_its_own_disk(cmd, env, out / "disk")
    agents = []
    for node in (0, 1):
        with open(out / f"node{node}.log", "w") as log:
            agents.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(2)
    return [a.wait(timeout=600) for a in agents]


def run(tree: Path, label: str, endpoint: str, work: Path) -> dict:
    """The three legs on the package in ``tree``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree), "AWS_ENDPOINT_URL": endpoint}
    uri = f"s3://ckpts/{label}"
    got: dict = {"revision": label}
    started = time.monotonic()
    got["leave_exit"] = two_nodes(tree, work / "leave", env, "--sigterm-at", str(LEAVE_AT), "--ckpt-uri", uri)
    got["leave_s"] = round(time.monotonic() - started, 1)
    probe = (
        "import json, sys\n"
        "from lightning_srifty import store\n"
        "from lightning_srifty.migrate.checkpoints import find_checkpoint, read_manifest\n"
        "from lightning_srifty.protocol import Preempted, read_record\n"
        "uri, name = sys.argv[1], sys.argv[1] + '/preempt-step=5.ckpt'\n"
        "fs = store.filesystem(uri)\n"
        "files = sorted(p.rsplit('/', 1)[-1] for p in fs.ls(name)) if fs.exists(name) else []\n"
        "left = read_record(uri, Preempted)\n"
        "print(json.dumps({'store_files': files, 'manifest_files': sorted(read_manifest(fs, name) or {}),\n"
        "  'found': (find_checkpoint(uri) or '').rsplit('/', 1)[-1],\n"
        "  'shard_bytes': sum(v for k, v in fs.du(name, total=False).items() if k.endswith('.distcp')),\n"
        "  'notice_to_durable_s': left.notice_to_durable_s if left else None}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, uri], env=env, capture_output=True, text=True, cwd=tree)
    got.update(json.loads(done.stdout) if done.returncode == 0 else {"probe_error": done.stderr[-500:]})
    got["resume_exit"] = two_nodes(tree, work / "resume", env, "--resume-from", uri)
    lines = [line for f in sorted((work / "resume").glob("seen-rank*.txt")) for line in f.read_text().splitlines()]
    got["resume_steps"] = sorted({int(line.split()[1]) for line in lines})
    got["profile_exit"] = two_nodes(tree, work / "profile", env, "--profile")
    profile = work / "profile" / "profile.json"
    got["profile_checkpoint"] = json.loads(profile.read_text()).get("checkpoint") if profile.is_file() else None
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="another revision, run the same way (a temporary git worktree)")
    args = p.parse_args()
    from lightning_srifty.provision.rehearsal.node import private_disk

    if (why := private_disk()) is not None:
        raise SystemExit(f"two nodes with disks of their own need a mount namespace: {why}")
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(name, value)
    os.environ.update(AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    moto, endpoint = _moto()
    work = Path(tempfile.mkdtemp(prefix="srifty-two-nodes-"))
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
        trees = [(ROOT, "this")]
        if args.against:
            old = work / "against"
            git = ["git", "-C", str(ROOT), "worktree"]
            subprocess.run([*git, "add", "-q", "--detach", str(old), args.against], check=True)
            shutil.copy(ROOT / SCRIPT, old / SCRIPT)  # the job as this checkout's legs run it
            trees.append((old, args.against))
        for tree, label in trees:
            print(json.dumps(run(tree, label, endpoint, work / label.replace("/", "_")), indent=1), flush=True)
    finally:
        if args.against:
            git = ["git", "-C", str(ROOT), "worktree", "remove", "--force"]
            subprocess.run([*git, str(work / "against")], check=False)
        moto.kill()
        moto.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""What a checkpoint save to an object store costs: ``SpotPreemption.save`` of a file checkpoint into ``s3://`` on
moto's S3 server (127.0.0.1), timed per save and counted per S3 request, for this checkout and, with ``--against
REV``, for another revision (a temporary git worktree), run alternately in subprocesses on the same server.

python bench/checkpoint_store.py [--params-m 20] [--saves 3] [--rounds 3] [--against f415849]

Each subprocess builds one Lightning model of ``--params-m`` million parameters (Adam: the checkpoint holds about 3x
the weights), fits one step, then saves ``--saves`` times (reason "manual", no deadline: the periodic path) and prints
the seconds of each save and the S3 requests its s3fs clients made meanwhile (aiobotocore's API calls).
Reported: the median save per revision and the requests per save by operation.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
import boto3, torch
import lightning.pytorch as pl
from lightning_srifty.migrate.preemption import SpotPreemption

params_m, saves, endpoint, bucket, local = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
width = int((params_m * 1e6 / 4) ** 0.5)

class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(4)))
    def training_step(self, batch, _):
        return self.net(batch).square().mean()
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

data = torch.utils.data.DataLoader(torch.randn(8, width), batch_size=4)
handler = SpotPreemption(f"s3://{bucket}/run", exit_process=False, local_fallback=local)
trainer = pl.Trainer(max_steps=1, callbacks=[handler], logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
trainer.fit(M(), train_dataloaders=data)
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
from aiobotocore.client import AioBaseClient
calls = []
_call = AioBaseClient._make_api_call

async def counted(self, operation_name, api_params):  # every s3fs client's requests, Lightning's own instance too
    calls.append(operation_name)
    return await _call(self, operation_name, api_params)

AioBaseClient._make_api_call = counted
out = []
for i in range(saves):
    calls.clear()
    t0 = time.perf_counter()
    path = handler.save(trainer, reason=f"manual{i}")
    took = time.perf_counter() - t0
    size = s3.head_object(Bucket=bucket, Key=f"run/manual{i}-step=1.ckpt")["ContentLength"]
    out.append({"s": took, "bytes": size, "path": path, "calls": list(calls)})
import lightning_srifty
assert lightning_srifty.__file__.startswith(os.getcwd()), lightning_srifty.__file__
print("RESULT " + json.dumps(out))
"""


def revision_tree(rev: str, tmp: str) -> Path:
    where = Path(tmp) / f"rev-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params-m", type=float, default=20.0)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="another revision to time the same way (git worktree)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import boto3

    from conftest import moto_server

    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this checkout": ROOT}
        if args.against:
            trees[args.against] = revision_tree(args.against, tmp)
        times: dict[str, list[float]] = collections.defaultdict(list)
        requests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        sizes: list[int] = []
        try:
            with moto_server() as endpoint:
                s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
                for r in range(args.rounds):
                    for label, tree in trees.items():
                        bucket = f"b{r}-{abs(hash(label)) % 10**6}"
                        s3.create_bucket(Bucket=bucket)
                        proc = subprocess.run(
                            [
                                sys.executable,
                                "-c",
                                CHILD,
                                str(args.params_m),
                                str(args.saves),
                                endpoint,
                                bucket,
                                os.path.join(tmp, f"local-{r}-{len(times[label])}"),
                            ],
                            env=dict(env, AWS_ENDPOINT_URL=endpoint, PYTHONPATH=str(tree)),
                            cwd=tree,  # `python -c` puts the working directory first on sys.path
                            capture_output=True,
                            text=True,
                            check=False,
                            timeout=900,
                        )
                        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                        if proc.returncode or not line:
                            raise SystemExit(f"{label}: the child failed:\n{proc.stderr[-3000:]}")
                        result = json.loads(line[0][7:])
                        times[label] += [x["s"] for x in result]
                        sizes += [x["bytes"] for x in result]
                        for x in result:
                            requests[label].update(x["calls"])
                        print(
                            f"round {r + 1}/{args.rounds} {label}: " + ", ".join(f"{x['s']:.2f} s" for x in result),
                            flush=True,
                        )
        finally:
            if args.against:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[args.against])], check=False
                )
    saves = args.rounds * args.saves
    print(f"\ncheckpoint {statistics.median(sizes) / 1e6:.0f} MB, {saves} saves per revision\n")
    print("| revision | median save | min | max | S3 requests per save |")
    print("|---|---|---|---|---|")
    for label, ts in times.items():
        per = ", ".join(f"{op} {n / saves:g}" for op, n in sorted(requests[label].items()))
        print(f"| {label} | {statistics.median(ts):.2f} s | {min(ts):.2f} | {max(ts):.2f} | {per} |")


if __name__ == "__main__":
    main()

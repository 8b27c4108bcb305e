"""How long a node's boot takes to know that a data folder of ``--data`` is readable: the whole listing the first
version made (``aws s3 ls s3://bucket/prefix/``, which pages through every key directly under the folder) against the
one-key listing the boot makes now (``aws s3api list-objects-v2 --max-items 1 --page-size 1``), both the AWS CLI the
node runs, on moto's S3 server (127.0.0.1), for flat folders of growing size.

python bench/data_listing.py [--sizes 1000,4000,16000] [--rounds 3]

Reported: the median seconds of each (``--rounds`` runs, alternated), and the whole listing's seconds per 1,000 keys,
fitted over the sizes (least squares through the points), which puts a flat folder the size of ImageNet's training
set (1,281,167 images) against the boot's 120 s bound. moto answers a page of 1,000 keys from memory on this machine;
S3's own time per page is not measured here (no AWS account): the extrapolation is moto's, a floor only if S3 pages
no faster than moto on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGENET_TRAIN = 1_281_167  # ILSVRC-2012 training images, one file each in a flat copy


def _seconds(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {run.stderr[-500:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,4000,16000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import boto3

    from conftest import moto_server

    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ.update(env)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with moto_server() as endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for n in sizes:
            bucket = f"data-{n}"
            s3.create_bucket(Bucket=bucket)
            for i in range(n):
                s3.put_object(Bucket=bucket, Key=f"train/{i:08d}.JPEG", Body=b"x")
            whole, one = [], []
            first_key = ["aws", "s3api", "list-objects-v2", "--bucket", bucket, "--prefix", "train/"]
            first_key += ["--max-items", "1", "--page-size", "1", "--query", "Contents[0].Key", "--output", "text"]
            for _ in range(args.rounds):
                whole.append(_seconds(["aws", "s3", "ls", f"s3://{bucket}/train/"], env))
                one.append(_seconds(first_key, env))
            rows.append((n, statistics.median(whole), statistics.median(one)))
            print(f"{n:>7,} keys: whole listing {rows[-1][1]:.2f} s, one key {rows[-1][2]:.2f} s", flush=True)
    xs, ys = [r[0] / 1000 for r in rows], [r[1] for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    base = my - slope * mx
    imagenet = base + slope * IMAGENET_TRAIN / 1000
    print(f"whole listing: {slope:.3f} s per 1,000 keys + {base:.2f} s; ImageNet's training set: ~{imagenet:.0f} s")
    print(f"one key: {statistics.median(r[2] for r in rows):.2f} s whatever the folder's size")


if __name__ == "__main__":
    main()

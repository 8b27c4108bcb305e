"""How long ``srifty launch`` keeps a finished fleet for its script's work after the fit, against moto's server.

The job writes ``FINISHED.json`` as its fit ends; its script may still test, export or upload, and each node's boot
script then copies the job's outputs and its log beside the checkpoints and writes its status record last of all. The
terraform provisioner's ``wait`` (what the launch calls before it destroys the fleet) looks for every member's status
record every ``FINISH_LOOK_S``. Here two instances of a fleet (moto's EC2) end their scripts ``--ends`` seconds after
the wait begins (their status records written by a thread, as their boot scripts would); the table gives, per run,
when the wait returned after the last record (the fleet's extra time up) and its answer, and one run with a node that
never ends (the wait's limit, its answer None and the node named).

    python bench/after_fit.py [--repeat 5] [--ends 2,6]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ends", default="2,6", help="seconds after the wait begins at which each node's script ends")
    parser.add_argument("--limit-s", type=float, default=8.0, help="the wait's limit in the run with a node that hangs")
    args = parser.parse_args()
    ends = [float(x) for x in args.ends.split(",")]
    os.environ.update(AWS)

    import boto3

    from _support import MINIMAL
    from conftest import moto_server
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher.terraform_fleet import FINISH_LOOK_S, TerraformProvisioner
    from lightning_srifty.provision.terraform.generate import Options
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    plan = rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=10, max_instances=1), catalog=Catalog.load())
    with moto_server() as moto, tempfile.TemporaryDirectory() as work:
        os.environ["AWS_ENDPOINT_URL"] = moto
        s3 = boto3.client("s3", endpoint_url=moto, region_name="us-east-1")
        s3.create_bucket(Bucket="runs")
        ec2 = boto3.client("ec2", endpoint_url=moto, region_name=plan.entries[0].region)
        image = ec2.describe_images()["Images"][0]["ImageId"]
        provisioner = TerraformProvisioner(Path(work), "s3://runs/job", Options(aws_endpoint=moto), echo=lambda _: None)

        def fleet(name: str, count: int) -> tuple[LaunchedFleet, list[str]]:
            tags = [{"ResourceType": "instance", "Tags": [{"Key": "srifty:fleet", "Value": name}]}]
            made = ec2.run_instances(ImageId=image, MinCount=count, MaxCount=count, TagSpecifications=tags)
            ids = [i["InstanceId"] for i in made["Instances"]]
            return LaunchedFleet(plan, 0, name, {"members": set(ids)}), ids

        def end_at(name: str, instance: str, after_s: float, start: float, when: dict) -> None:
            time.sleep(max(0.0, start + after_s - time.monotonic()))
            key = f"job/status/{name}-{instance}.json"
            s3.put_object(Bucket="runs", Key=key, Body=b'{"exit_code": 0}')
            when[instance] = time.monotonic()

        print(f"FINISH_LOOK_S {FINISH_LOOK_S} s; scripts end {args.ends} s after the wait begins; moto {moto}")
        print("| run | last script's end (s) | wait returned (s) | after the last end (s) | answer |")
        print("|---|---:|---:|---:|---:|")
        lags = []
        for run in range(args.repeat):
            name = f"f-{run}"
            launched, ids = fleet(name, len(ends))
            when: dict[str, float] = {}
            start = time.monotonic()
            threads = [threading.Thread(target=end_at, args=(name, i, e, start, when)) for i, e in zip(ids, ends)]
            for t in threads:
                t.start()
            answer = provisioner.wait_after_fit(launched, 120.0)
            returned = time.monotonic()
            for t in threads:
                t.join()
            last = max(when.values())
            lags.append(returned - last)
            print(f"| {run + 1} | {last - start:.2f} | {returned - start:.2f} | {returned - last:.2f} | {answer} |")
        print(f"after the last end: median {statistics.median(lags):.2f} s, max {max(lags):.2f} s")
        hung, ids = fleet("hung", 2)
        start = time.monotonic()
        when = {}
        end_at("hung", ids[0], 0.0, start, when)
        answer = provisioner.wait_after_fit(hung, args.limit_s)
        print(
            f"a node that never ends: the wait returned {answer} after {time.monotonic() - start:.2f} s "
            f"(limit {args.limit_s} s), still running: {hung.data.get('still_running')} (of {ids})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

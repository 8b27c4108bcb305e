"""Where a fleet's ``terraform apply`` spends its time: each resource's start and end, against a local AWS.

``srifty rehearse`` and the suite's applies against moto take a minute or more each. This applies a root that
``srifty terraform`` wrote (a copy, pointed at a local AWS as the rehearsal points it: moto's server behind the rules
proxy), reads terraform's own lines ("X: Creating...", "X: Creation complete after Ns") as they come, destroys what
it made, and prints each resource's start and end (seconds since the apply began), the resource that ended last and
the apply's wall time. With ``--runs N`` the figures are medians of N applies. An apply that met a transient error
and was run again (``srifty apply``'s retry) shows a resource retried from its first start.

    python bench/apply_timeline.py INFRA [--runs 3] [--region us-east-1]

TF_CLI_CONFIG_FILE may point at a provider mirror (CHECKPOINT_DISABLE is set here).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_srifty.provision.apply import apply, destroy
from lightning_srifty.provision.rehearsal.local_aws import LocalAWS
from lightning_srifty.provision.rehearsal.walk import (
    Settings,
    _environment,
    copy_root_module,
    point_at_local_aws,
)

LINE = re.compile(
    r"^(?P<address>\S+): (?P<what>Creating\.\.\.|Reading\.\.\.|Creation complete after|Read complete after)"
)


def one_apply(root: Path, region: str) -> tuple[dict[str, tuple[float, float]], float]:
    """Apply a copy of ``root`` against a fresh local AWS: {resource address: (start s, end s)} and the wall time."""
    spans: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalAWS(region) as aws, _environment(aws.environment()):
        infra = Path(tmp) / "infra"
        copy_root_module(root, infra, Path(tmp) / "work")
        point_at_local_aws(infra, aws, Settings(), [])
        started = time.monotonic()

        def echo(line: str) -> None:
            match = LINE.match(line.strip())
            if match:
                at = time.monotonic() - started
                span = spans.setdefault(match["address"], [at, at])
                if match["what"] not in ("Creating...", "Reading..."):
                    span[1] = at

        try:
            apply(infra, yes=True, echo=echo, check=False)
            wall = time.monotonic() - started
        finally:
            destroy(infra, yes=True, echo=lambda line: None)
    return {address: (s, e) for address, (s, e) in spans.items()}, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("infra", help="a root module srifty terraform wrote")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--region", default="us-east-1")
    args = p.parse_args()
    os.environ["CHECKPOINT_DISABLE"] = "1"
    runs = []
    for i in range(args.runs):
        spans, wall = one_apply(Path(args.infra), args.region)
        runs.append((spans, wall))
        print(f"apply {i + 1}/{args.runs}: {wall:.1f} s, {len(spans)} resources", file=sys.stderr)
    addresses = sorted(set().union(*(spans for spans, _ in runs)), key=lambda a: statistics.median(
        spans[a][1] for spans, _ in runs if a in spans))  # fmt: skip
    print(f"| resource | starts at (s) | ends at (s) | takes (s) |  (medians of {args.runs})")
    print("|---|---:|---:|---:|")
    for address in addresses:
        starts = [spans[address][0] for spans, _ in runs if address in spans]
        ends = [spans[address][1] for spans, _ in runs if address in spans]
        takes = [spans[address][1] - spans[address][0] for spans, _ in runs if address in spans]
        short = address.removeprefix("module.fleet.")
        print(f"| `{short}` | {statistics.median(starts):.1f} | {statistics.median(ends):.1f} | "
              f"{statistics.median(takes):.1f} |")  # fmt: skip
    print(f"the apply: {statistics.median(w for _, w in runs):.1f} s (median of {args.runs})")


if __name__ == "__main__":
    main()

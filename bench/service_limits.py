"""Bounded service work (issue #14): the largest request `srifty serve` accepts, alone and four at once.

python bench/service_limits.py [--repeats 3]

Each configuration runs a fresh `srifty serve` process (on a free port of 127.0.0.1) and reads its peak resident
memory (VmHWM in /proc/PID/status) after the requests; times are medians over ``--repeats`` requests, measured by the
client. The worst-case allowed request is a ranking of two-type mixes (arm64 included) of up to 47 instances in
every market of one region: 4.82 million candidates with the bundled catalog, just under
predictor.ranking.candidates.MAX_CANDIDATES (48 instances is refused), with a global batch of 735,134,400 samples
(< 2^30, 1,344 divisors: the most accumulation choices a profile may ask for). The largest prediction is a
10^13 - 1 parameter model (the profile schema's limit).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROFILE = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())  # hand-written
WORST_PROFILE = {**PROFILE, "batch": {**PROFILE["batch"], "global_batch": 735_134_400}}
WORST_RANK = {
    "profile": WORST_PROFILE,
    "constraints": {
        "steps": 1_000_000,
        "max_types": 2,
        "max_instances": 47,
        "market": "any",
        "allow_arm64": True,
        "top": 200,
    },
}
TOO_BIG_RANK = {"profile": WORST_PROFILE, "constraints": {**WORST_RANK["constraints"], "max_instances": 48}}
LARGEST_PREDICT = {
    "profile": {**PROFILE, "model": {**PROFILE["model"], "parameters": 10**13 - 1}},
    "fleet": "p4d.24xlarge:32",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`srifty serve` in its own process, with the given options."""

    def __init__(self, *options: str) -> None:
        self.port = free_port()
        self.folder = tempfile.TemporaryDirectory(prefix="srifty-limits-")
        env = {**os.environ, "SRIFTY_OBSERVATIONS": f"{self.folder.name}/o.sqlite", "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "lightning_srifty.cli", "serve", "--port", str(self.port)]
        command += ["--log-level", "warning", "--no-access-log", *options]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(300):
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit("the service did not start")

    def rss_mib(self, key: str) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        raise KeyError(key)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.folder.cleanup()


def post(url: str, path: str, body: dict) -> tuple[float, int, str]:
    start = time.perf_counter()
    r = httpx.post(url + path, json=body, timeout=600)
    return time.perf_counter() - start, r.status_code, r.text


def alone(repeats: int) -> list[str]:
    rows = []
    for label, path, body in (
        ("largest allowed ranking (4.82 M candidates)", "/v1/rank", WORST_RANK),
        ("one instance more (5.03 M candidates: refused, 422)", "/v1/rank", TOO_BIG_RANK),
        ("largest allowed prediction (10^13 - 1 parameters)", "/v1/predict", LARGEST_PREDICT),
    ):
        server = Server()
        try:
            base = server.rss_mib("VmRSS")
            runs = [post(server.url, path, body) for _ in range(repeats)]
            statuses = sorted({s for _, s, _ in runs})
            if statuses != [422 if "refused" in label else 200]:
                raise SystemExit(f"{label}: unexpected answers {statuses}: {runs[0][2][:300]}")
            rows.append(
                f"| {label} | {path} | {statuses[0]} | {statistics.median(t for t, _, _ in runs):.2f} s "
                f"| {base:.0f} MiB | {server.rss_mib('VmHWM'):.0f} MiB |"
            )
            print(rows[-1], flush=True)
        finally:
            server.close()
    return rows


def four_at_once(max_concurrent: int, repeats: int) -> str:
    """Medians over ``repeats`` fresh servers of: the slowest of four answers, the server's peak RSS, and its RSS 3 s
    after the last answer (what it keeps: glibc held 2.3 GB before the service trimmed its heap, issue #23)."""
    slowest, peaks, kept, codes = [], [], [], set()
    for _ in range(repeats):
        server = Server("--max-concurrent", str(max_concurrent))
        try:
            answers: list[tuple[float, int, str]] = []
            threads = [
                threading.Thread(target=lambda a=answers, u=server.url: a.append(post(u, "/v1/rank", WORST_RANK)))
                for _ in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            codes.add(", ".join(str(s) for s in sorted(s for _, s, _ in answers)))
            slowest.append(max(t for t, _, _ in answers))
            peaks.append(server.rss_mib("VmHWM"))
            time.sleep(3)
            kept.append(server.rss_mib("VmRSS"))
        finally:
            server.close()
    row = (
        f"| --max-concurrent {max_concurrent} | {' / '.join(sorted(codes))} | {statistics.median(slowest):.1f} s "
        f"| {statistics.median(peaks):.0f} MiB ({min(peaks):.0f}-{max(peaks):.0f}) "
        f"| {statistics.median(kept):.0f} MiB |"
    )
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; `srifty serve` with its defaults (--max-concurrent 2, --request-timeout-s 60)\n")
    print("| request | endpoint | status | median time | server RSS before | server peak RSS |")
    print("|---|---|---|---|---|---|")
    alone(args.repeats)
    print(f"\nfour largest allowed rankings sent at once (medians of {args.repeats} fresh servers)\n")
    print("| server | statuses | slowest of the four answers | server peak RSS (range) | server RSS 3 s after |")
    print("|---|---|---|---|---|")
    four_at_once(2, args.repeats)  # the default limit
    four_at_once(4, args.repeats)  # no effective limit for four requests


if __name__ == "__main__":
    main()

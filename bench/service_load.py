"""Load on `srifty serve` over loopback: 50 concurrent clients, a bounded number of requests, latency and errors.

python bench/service_load.py [--clients 50] [--requests 1000] [--paced-seconds 20]

The service runs in its own process (`srifty serve` on a free port of 127.0.0.1); the clients are asyncio tasks
with httpx in this one. Two regimes:
- saturation: every client sends its next request as soon as the last one answered (the service's capacity and the
  queueing latency at 50 in flight);
- paced: every client sends one request per second (users who read the answer), for a fixed time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROFILE = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())  # hand-written
TYPICAL_RANK = {"profile": PROFILE, "constraints": {"steps": 100_000, "deadline_h": 12}}
REQUESTS = {
    "/v1/rank": TYPICAL_RANK,
    "/v1/predict": {"profile": PROFILE, "fleet": "p3.8xlarge:2"},
    "/healthz": None,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one(client: httpx.AsyncClient, path: str) -> tuple[float, bool]:
    body = REQUESTS[path]
    start = time.perf_counter()
    try:
        r = await (client.get(path) if body is None else client.post(path, json=body))
        ok = r.status_code == 200
    except httpx.HTTPError:
        ok = False
    return time.perf_counter() - start, ok


async def saturation(url: str, path: str, clients: int, total: int) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    left = total

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            dt, ok = await one(client, path)
            latencies.append(dt)
            errors += not ok

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - start
    return summary(latencies, errors, wall)


async def paced(url: str, path: str, clients: int, seconds: float, period: float = 1.0) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0

    async def worker(client: httpx.AsyncClient, offset: float) -> None:
        nonlocal errors
        await asyncio.sleep(offset)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            tick = time.perf_counter()
            dt, ok = await one(client, path)
            latencies.append(dt)
            errors += not ok
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - tick)))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client, i * period / clients) for i in range(clients)))
        wall = time.perf_counter() - start
    return summary(latencies, errors, wall)


def summary(latencies: list[float], errors: int, wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "errors": errors,
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "rps": len(ordered) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--paced-seconds", type=float, default=20)
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "SRIFTY_OBSERVATIONS": str(ROOT / "bench" / "results" / "load-observations.sqlite")}
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lightning_srifty.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise SystemExit("the service did not start")
        print(f"{args.clients} clients on loopback, service pid {server.pid}, {os.cpu_count()} CPUs shared with them")
        print("| regime | endpoint | requests | errors | p50 | p99 | max | requests/s |")
        print("|---|---|---|---|---|---|---|---|")
        for path in REQUESTS:
            for regime, coro in (
                ("paced (1 request/s per client)", paced(url, path, args.clients, args.paced_seconds)),
                ("saturation (closed loop)", saturation(url, path, args.clients, args.requests)),
            ):
                s = asyncio.run(coro)
                print(
                    f"| {regime} | {path} | {s['n']:,} | {s['errors']} | {s['p50_ms']:.1f} ms | {s['p99_ms']:.1f} ms "
                    f"| {s['max_ms']:.0f} ms | {s['rps']:.0f} |",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()

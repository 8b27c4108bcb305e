"""The clock a GPU sustains under a long GEMM load, and the rate it reaches, on a lent GPU (issue #38 items 4 and 5).

    python bench/gpu_clocks.py measure --out DIR [--seconds 8]   # on a CUDA machine
    python bench/gpu_clocks.py score DIR|ARCHIVE                  # here, no GPU

``measure``: ``nvidia-smi`` samples the SM and memory clocks, the power draw and limit and the temperature every
200 ms while the GPU runs, back to back for ``--seconds`` each: nothing (idle), an 8192^3 FP32 GEMM with TF32 off
(the CUDA cores), the same with TF32 on, and the same in bf16 (the tensor cores). Each phase's achieved rate is the
GEMMs' FLOPs over CUDA-event time. Writes ``DIR/clocks.csv`` (nvidia-smi's samples) and ``DIR/phases.csv`` (each
phase's wall-clock span and rate).

``score``: per phase, the median SM clock and power draw over the phase's samples (its first second left out) and the
achieved rate against the catalog's datasheet peak: whether the part holds its boost clock under load (issue #38
item 4 is about the 300 W / 72 W parts that do not). The samples are lined up on the phases by the first sample,
taken at the idle phase's start.
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import devicecli  # noqa: E402

QUERY = "timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu"
SMI_FORMAT = ("--format=csv,noheader,nounits", "-lms", "200")
SIDE = 8192


def measure(out: Path, seconds: float) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    log = (out / "clocks.csv").open("w")
    smi = subprocess.Popen(
        ["nvidia-smi", f"--id={torch.cuda.current_device()}", f"--query-gpu={QUERY}", *SMI_FORMAT],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rows = []
    try:
        time.sleep(seconds / 2)
        rows.append(("idle", time.time() - seconds / 2, time.time(), 0.0, 0))
        for phase, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                                   ("bf16", torch.bfloat16, False)):  # fmt: skip
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(SIDE, SIDE, device="cuda", dtype=dtype)
            b = torch.randn(SIDE, SIDE, device="cuda", dtype=dtype)
            torch.mm(a, b)
            torch.cuda.synchronize()
            t0, n, ms = time.time(), 0, 0.0
            while time.time() - t0 < seconds:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(5):
                    torch.mm(a, b)
                e.record()
                e.synchronize()
                ms += s.elapsed_time(e)
                n += 5
            tflops = 2 * SIDE**3 * n / (ms * 1e-3) / 1e12
            rows.append((phase, t0, time.time(), tflops, n))
            print(f"{phase}: {n} GEMMs, {tflops:.1f} TFLOP/s", flush=True)
            del a, b
    finally:
        time.sleep(0.5)
        smi.terminate()
        smi.wait(timeout=10)
        log.close()
    with (out / "phases.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("phase", "start_unix", "end_unix", "tflops", "gemms", "device"))
        for r in rows:
            w.writerow((*r[:3], f"{r[3]:.2f}", r[4], torch.cuda.get_device_name()))
    return 0


def score(path: Path) -> int:
    from datetime import datetime

    from predictor.catalog.gpus import get_gpu

    with devicecli.unpacked(path) as folder:
        base = folder / "clocks" if (folder / "clocks").is_dir() else folder
        with (base / "phases.csv").open() as fh:
            phases = list(csv.DictReader(fh))
        samples = []
        for line in (base / "clocks.csv").read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 6:
                continue
            try:
                t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, *(float(p) for p in parts[1:])))
            except ValueError:
                continue
    gpu = get_gpu(phases[0]["device"])
    peaks = {"fp32": gpu.fp32_tflops, "tf32": gpu.tf32_tflops, "bf16": gpu.bf16_tflops, "idle": None}
    # nvidia-smi's timestamps are the machine's local time; the phases' are Unix: line them up on the offset that
    # puts the samples inside the run (the first sample is taken as the idle phase's start)
    offset = samples[0][0] - float(phases[0]["start_unix"])
    print(f"{phases[0]['device']} (the catalog's {gpu.key}: boost {gpu.clock_mhz} MHz); {len(samples)} samples")
    print("phase | SM clock MHz (median) | power W (median) / limit | TFLOP/s | datasheet peak | achieved/peak")
    for p in phases:
        lo, hi = float(p["start_unix"]) + offset + 1.0, float(p["end_unix"]) + offset
        inside = [s for s in samples if lo <= s[0] <= hi]
        if not inside:
            continue
        sm = statistics.median(s[1] for s in inside)
        watts = statistics.median(s[3] for s in inside)
        peak = peaks.get(p["phase"])
        rate = float(p["tflops"])
        ratio = f"{rate / peak:.3f}" if peak else "-"
        print(f"{p['phase']} | {sm:.0f} | {watts:.0f} / {inside[0][4]:.0f} | {rate:.1f} | {peak or '-'} | {ratio}")
    return 0


def main(argv: list[str] | None = None) -> int:
    def measure_options(m) -> None:
        m.add_argument("--seconds", type=float, default=8.0, help="each phase's length")

    args = devicecli.parse(__doc__ or "", argv, 0.0, measure_options)
    if args.cmd == "measure":
        return measure(args.out, args.seconds)
    return score(args.path)


if __name__ == "__main__":
    sys.exit(main())

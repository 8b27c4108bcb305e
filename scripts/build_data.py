"""Regenerate predictor/data/ from the shared reference data, so that nobody edits numbers by hand.

    python scripts/build_data.py [--shared ../shared/data]

Writes predictor/data/gpus.csv: one row per canonical GPU key, numeric columns parsed from gpu_specs.csv
("300 (datasheet value...)" -> 300), boards sold in two memory sizes split into two keys, and the names torch
reports for each GPU as aliases. The alias and key choices below are the only hand-written part.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor._io import atomic_write_text  # noqa: E402

# shared row name -> list of (key, memory_gb override or None, aliases as torch.cuda.get_device_name reports)
GPU_KEYS: dict[str, list[tuple[str, float | None, list[str]]]] = {
    "K80 (one GK210 of the 2-GPU board)": [("K80", None, ["Tesla K80"])],
    "M60 (one GM204 of the 2-GPU board)": [("M60", None, ["Tesla M60"])],
    "T4": [("T4", None, ["Tesla T4", "NVIDIA T4"])],
    "P100-PCIe-16GB": [("P100-PCIe-16GB", None, ["Tesla P100-PCIE-16GB"])],
    "P100-SXM2-16GB": [("P100-SXM2-16GB", None, ["Tesla P100-SXM2-16GB"])],
    "V100-SXM2 (16GB/32GB)": [
        ("V100-SXM2-16GB", 16, ["Tesla V100-SXM2-16GB"]),
        ("V100-SXM2-32GB", 32, ["Tesla V100-SXM2-32GB"]),
    ],
    "V100-PCIe": [("V100-PCIe-16GB", 16, ["Tesla V100-PCIE-16GB"]), ("V100-PCIe-32GB", 32, ["Tesla V100-PCIE-32GB"])],
    "A10": [("A10", None, ["NVIDIA A10"])],
    "A10G (AWS g5)": [("A10G", None, ["NVIDIA A10G"])],
    "L4": [("L4", None, ["NVIDIA L4"])],
    "L40S": [("L40S", None, ["NVIDIA L40S"])],
    "L40": [("L40", None, ["NVIDIA L40"])],
    "A100-SXM-40GB": [("A100-SXM-40GB", None, ["NVIDIA A100-SXM4-40GB"])],
    "A100-SXM-80GB": [("A100-SXM-80GB", None, ["NVIDIA A100-SXM4-80GB"])],
    "A100-PCIe-40GB": [("A100-PCIe-40GB", None, ["NVIDIA A100-PCIE-40GB"])],
    "A100-PCIe-80GB": [("A100-PCIe-80GB", None, ["NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"])],
    "H100-SXM": [("H100-SXM", None, ["NVIDIA H100 80GB HBM3", "NVIDIA H100-SXM5-80GB"])],
    "H100-PCIe": [("H100-PCIe", None, ["NVIDIA H100 PCIe"])],
    "H100-NVL": [("H100-NVL", None, ["NVIDIA H100 NVL"])],
    "H200-SXM": [("H200-SXM", None, ["NVIDIA H200", "NVIDIA H200 141GB HBM3e"])],
    "RTX A6000": [("RTX-A6000", None, ["NVIDIA RTX A6000"])],
    "RTX 3090": [("RTX-3090", None, ["NVIDIA GeForce RTX 3090"])],
    "RTX 4090": [("RTX-4090", None, ["NVIDIA GeForce RTX 4090"])],
}

GPU_COLUMNS = [
    "key",
    "arch",
    "memory_gb",
    "memory_bw_gbps",
    "fp32_tflops",
    "tf32_tflops",
    "fp16_tflops",
    "bf16_tflops",
    "nvlink_gbps",
    "pcie",
    "aliases",
    "shared_name",
    "source",
]


def leading_number(text: str) -> str:
    """'300 (datasheet value)' -> '300'; '' -> ''."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", text or "")
    return match.group(1) if match else ""


def build_gpus(shared: Path) -> str:
    rows = list(csv.DictReader((shared / "gpu_specs.csv").open(encoding="utf-8")))
    unmapped = [r["gpu"] for r in rows if r["gpu"] not in GPU_KEYS]
    if unmapped:
        raise SystemExit(f"gpu_specs.csv has GPUs without a key in GPU_KEYS: {unmapped}; add them to this script.")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=GPU_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        for key, memory, aliases in GPU_KEYS[row["gpu"]]:
            writer.writerow(
                {
                    "key": key,
                    "arch": row["arch"],
                    "memory_gb": memory if memory is not None else leading_number(row["memory_gb"]),
                    "memory_bw_gbps": leading_number(row["memory_bw_gbps"]),
                    "fp32_tflops": leading_number(row["fp32_tflops"]),
                    "tf32_tflops": leading_number(row["tf32_tflops"]),
                    "fp16_tflops": leading_number(row["fp16_tflops"]),
                    "bf16_tflops": leading_number(row["bf16_tflops"]),
                    "nvlink_gbps": leading_number(row["nvlink_gbps"]),
                    "pcie": row["pcie"],
                    "aliases": ";".join(aliases),
                    "shared_name": row["gpu"],
                    "source": row["source"],
                }
            )
    return out.getvalue()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared",
        type=Path,
        default=ROOT.parent / "shared" / "data",
        help="folder holding gpu_specs.csv (default: ../shared/data)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the package data is out of date")
    args = parser.parse_args(argv)
    target = ROOT / "predictor" / "data" / "gpus.csv"
    text = build_gpus(args.shared)
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target} is out of date: run python scripts/build_data.py", file=sys.stderr)
            return 1
        print(f"{target} is up to date")
        return 0
    atomic_write_text(target, text)
    print(f"wrote {target} from {args.shared / 'gpu_specs.csv'} (sha256 {sha256(args.shared / 'gpu_specs.csv')[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate predictor/data/ from the shared reference data, so that nobody edits numbers by hand.

    python scripts/build_data.py [--shared ../shared/data]

Writes, from gpu_specs.csv and ec2_gpu_instances.csv:
- predictor/data/gpus.csv: one row per canonical GPU key, numeric columns parsed ("300 (datasheet value...)" ->
  300), boards sold in two memory sizes split into two keys, and the names torch reports for each GPU as aliases;
- predictor/data/instances.csv: one row per EC2 accelerator instance type, fixed columns, normalised kinds
  (accelerator_kind cuda/neuron/gaudi/amd; gpu_interconnect single/pcie/nvlink/nvswitch/neuronlink/other) and the
  canonical GPU key of its GPU;
- predictor/data/measurements.csv: measurements.csv, copied verbatim;
- predictor/data/sources.json: the sha256 of every file read and written (tests check the bundled files against it);
- predictor/data/prices.csv: long format, one row per (instance type, region, market, zone) price with its date and
  source; advisor-derived spot estimates are flagged ``estimated``.
The key, alias and kind choices below are the only hand-written part; numbers are copied, never typed, but for the
GPUs shared/ has no row for (scripts/data/gpu_specs_datasheets.csv: each row's figures from the datasheet it names).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog.fields import BY_NAME, GPU_SPECS, columns, from_shared  # noqa: E402
from predictor.catalog.instances import INSTANCE_COLUMNS, PRICE_COLUMNS  # noqa: E402
from predictor.documents.atomic import atomic_write_text  # noqa: E402

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
    # rows of DATASHEETS (not in shared/: newer than its table)
    "B200-SXM": [("B200-SXM", None, ["NVIDIA B200"])],
    "B300-SXM": [("B300-SXM", None, ["NVIDIA B300", "NVIDIA B300 SXM6 AC"])],
}
# GPUs shared/'s gpu_specs.csv has no row for, in its columns, each row's figures typed from the vendor's datasheet
# named in its source (the one hand-typed table of this script; keep it to GPUs EC2 sells and shared/ lacks)
DATASHEETS = ROOT / "scripts" / "data" / "gpu_specs_datasheets.csv"

# accelerator as the instance table names it -> canonical GPU key (by GPU memory where one name has two sizes)
INSTANCE_GPU = {
    ("NVIDIA Tesla K80", None): "K80",
    ("NVIDIA Tesla M60", None): "M60",
    ("NVIDIA T4", None): "T4",
    ("NVIDIA T4g", None): "T4",
    ("NVIDIA A10G", None): "A10G",
    ("NVIDIA L4", None): "L4",
    ("NVIDIA L40S", None): "L40S",
    ("NVIDIA Tesla V100", 16.0): "V100-SXM2-16GB",
    ("NVIDIA V100", 32.0): "V100-SXM2-32GB",
    ("NVIDIA A100", 40.0): "A100-SXM-40GB",
    ("NVIDIA A100", 80.0): "A100-SXM-80GB",
    ("NVIDIA H100", 80.0): "H100-SXM",
    ("NVIDIA H200", 141.0): "H200-SXM",
    # specs from DATASHEETS (shared/'s gpu_specs.csv has no row for them)
    ("NVIDIA B200", None): "B200-SXM",
    ("NVIDIA B300", None): "B300-SXM",
}
KIND = {"GPU": "cuda", "NON-GPU (AWS Neuron": "neuron", "GPU (AMD": "amd", "NON-GPU (Habana": "gaudi"}
INTERCONNECT = {
    "single-GPU": "single",
    "single-device": "single",
    "PCIe": "pcie",
    "NVLink": "nvlink",
    "NVSwitch": "nvswitch",
    "NeuronLink": "neuronlink",
}

# accelerator memory per device where moto's DescribeInstanceTypes dump contradicts the vendor's documentation, typed
# from it: (instance family, GiB per device, source). trn2's dump reads 512 GiB a Trainium2; AWS Neuron's "Trainium2
# Architecture" page gives 96 GiB of device memory a chip (4 HBM stacks), 1.5 TiB on trn2.48xlarge's 16 chips
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html).
DEVICE_MEMORY_FIXES = {"trn2": (96.0, "AWS Neuron docs, Trainium2 Architecture: 96 GiB of device memory a chip")}

GPU_COLUMNS = columns(GPU_SPECS, "gpus.csv")  # the declarations' (predictor.catalog.fields)


def leading_number(text: str) -> str:
    """'300 (datasheet value)' -> '300'; '' -> ''."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", text or "")
    return match.group(1) if match else ""


def build_gpus(shared: Path) -> str:
    rows = list(csv.DictReader((shared / "gpu_specs.csv").open(encoding="utf-8")))
    known = {r["gpu"] for r in rows}
    rows += [r for r in csv.DictReader(DATASHEETS.open(encoding="utf-8")) if r["gpu"] not in known]
    unmapped = [r["gpu"] for r in rows if r["gpu"] not in GPU_KEYS]
    if unmapped:
        raise SystemExit(f"gpu_specs.csv has GPUs without a key in GPU_KEYS: {unmapped}; add them to this script.")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=GPU_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        for key, memory, aliases in GPU_KEYS[row["gpu"]]:
            # copied from shared/ by the declarations (``shared``): the numbers' leading figure, the texts as they are
            copied = {
                f.key("column"): leading_number(row[f.shared]) if f.kind is float else row[f.shared]
                for f in GPU_SPECS
                if f.shared is not None
            }
            if memory is not None:
                copied["memory_gb"] = memory
            writer.writerow({**copied, "key": key, "aliases": ";".join(aliases)})
    return out.getvalue()


def _prefix_lookup(table: dict[str, str], text: str, what: str) -> str:
    for prefix in sorted(table, key=len, reverse=True):  # the longest matching prefix wins
        if text.startswith(prefix):
            return table[prefix]
    raise SystemExit(f"no {what} mapping for {text!r}: add it to scripts/build_data.py")


def _date_in(text: str, default: str) -> str:
    match = re.search(r"(\d{4}-\d{2}-\d{2})", text or "")
    return match.group(1) if match else default


def instance_gpu(accelerator: str, memory: float) -> str:
    for (name, mem), key in INSTANCE_GPU.items():
        if name == accelerator and (mem is None or abs(mem - memory) < 1.0):
            return key
    raise SystemExit(f"no GPU key for {accelerator!r} with {memory} GiB: add it to INSTANCE_GPU")


def vendor_fixed(row: dict[str, str]) -> dict[str, str]:
    """shared/'s instance row with DEVICE_MEMORY_FIXES applied, its source saying so."""
    fix = DEVICE_MEMORY_FIXES.get(row["family"])
    if fix is None:
        return row
    return {**row, "accelerator_memory_gib": str(fix[0]), "source_specs": f"{row['source_specs']}; memory: {fix[1]}"}


def build_instances(shared: Path) -> tuple[str, str]:
    rows = list(csv.DictReader((shared / "ec2_gpu_instances.csv").open(encoding="utf-8")))
    spec_out, price_out = io.StringIO(), io.StringIO()
    specs = csv.DictWriter(spec_out, fieldnames=INSTANCE_COLUMNS, lineterminator="\n")
    prices = csv.DictWriter(price_out, fieldnames=PRICE_COLUMNS, lineterminator="\n")
    specs.writeheader()
    prices.writeheader()
    for row in sorted(rows, key=lambda r: r["instance_type"]):
        kind = _prefix_lookup(KIND, row["accelerator_kind"], "accelerator kind")
        row = vendor_fixed(row)
        memory = float(row["accelerator_memory_gib"])
        # the fields copied as they are come from their declarations (predictor.catalog.fields, ``shared``)
        copied = from_shared(row)
        computed = {
            "accelerator_kind": kind,
            "gpu": instance_gpu(row["accelerator"], memory) if kind == "cuda" else "",
            "gpu_interconnect": next(
                (v for k, v in INTERCONNECT.items() if row["gpu_interconnect"].startswith(k)), "other"
            ),
            "spot_advisor_as_of": _date_in(row["spot_advisor_snapshot"], ""),
        }
        specs.writerow({BY_NAME[name].key("column"): value for name, value in {**copied, **computed}.items()})
        it = row["instance_type"]

        def price(
            region: str,
            market: str,
            zone: str,
            value: str,
            as_of: str,
            source: str,
            estimated: bool = False,
            it: str = it,
        ) -> None:
            if value and value != "NA":
                prices.writerow(
                    {
                        "instance_type": it,
                        "region": region,
                        "market": market,
                        "availability_zone": zone,
                        "usd_hr": value,
                        "estimated": str(estimated).lower(),
                        "as_of": as_of,
                        "source": source,
                    }
                )

        price(
            "us-east-1",
            "on-demand",
            "",
            row["ondemand_usd_hr_us_east_1"],
            _date_in(row["ondemand_us_east_1_source"], ""),
            row["ondemand_us_east_1_source"],
        )
        price(
            "us-west-2",
            "on-demand",
            "",
            row["ondemand_usd_hr_us_west_2"],
            "2026-06",
            row["ondemand_us_west_2_source"] + " (mid 2026)",
        )
        for item in filter(None, row["spot_us_east_1_az_prices"].split(";")):
            zone, value = item.split("=")
            price("us-east-1", "spot", zone, value, "2026-06", row["spot_snapshot"])
        price("us-west-2", "spot", "", row["spot_us_west_2_min"], "2026-06", row["spot_snapshot"] + " (lowest zone)")
        if not row["spot_us_east_1_az_prices"]:
            price(
                "us-east-1",
                "spot",
                "",
                row["spot_est_usd_hr_us_east_1_from_advisor"],
                _date_in(row["spot_advisor_snapshot"], ""),
                "on-demand x (1 - Spot Advisor savings): " + row["spot_advisor_snapshot"],
                estimated=True,
            )
    return spec_out.getvalue(), price_out.getvalue()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


SOURCES = ("gpu_specs.csv", "ec2_gpu_instances.csv", "measurements.csv")
MANIFEST = "sources.json"


def manifest(shared: Path, outputs: dict[Path, str]) -> str:
    """sources.json: the sha256 of every shared file read and of every file written, so that a test can tell, without
    the shared data (a clean checkout), that nobody edited the bundled numbers by hand since the last build."""
    doc = {
        "built_by": "scripts/build_data.py",
        "sources": {
            **{name: sha256(shared / name) for name in SOURCES},
            str(DATASHEETS.relative_to(ROOT)): sha256(DATASHEETS),
        },
        "outputs": {p.name: hashlib.sha256(text.encode("utf-8")).hexdigest() for p, text in outputs.items()},
    }
    return json.dumps(doc, indent=2) + "\n"


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
    data = ROOT / "predictor" / "data"
    instances, prices = build_instances(args.shared)
    outputs = {
        data / "gpus.csv": build_gpus(args.shared),
        data / "instances.csv": instances,
        data / "prices.csv": prices,
        data / "measurements.csv": (args.shared / "measurements.csv").read_bytes().decode("utf-8"),  # verbatim (CRLF)
    }
    outputs[data / MANIFEST] = manifest(args.shared, outputs)
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_bytes() != text.encode("utf-8")]
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run python scripts/build_data.py", file=sys.stderr)
        if not stale:
            print("predictor/data is up to date")
        return 1 if stale else 0
    for path, text in outputs.items():
        atomic_write_text(path, text)
    for src in SOURCES:
        print(f"read {args.shared / src} (sha256 {sha256(args.shared / src)[:12]})")
    print(f"wrote {', '.join(str(p.relative_to(ROOT)) for p in outputs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Build ``bench/data/llm_foundry_mpt.csv`` from mosaicml/llm-foundry's published MPT training benchmarks.

Source: ``scripts/train/benchmarking/README.md`` of github.com/mosaicml/llm-foundry (the commit is given on the
command line and written into every row). The README's tables are measured throughput of MPT 125M-70B trained with
PyTorch FSDP on the MosaicML platform (H100-80GB, A100-80GB and A100-40GB nodes of 8 GPUs; the A100 nodes with a
1600 Gbit/s RoCE interconnect). Only numbers are copied, never edited; the architecture of each size is from the
same commit's ``scripts/train/yamls/pretrain/mpt-<size>.yaml`` (d_model, n_heads, n_layers, expansion_ratio,
vocab_size, flash attention).

    python scripts/build_mpt_data.py --readme README.md --commit <sha> --out bench/data/llm_foundry_mpt.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

# scripts/train/yamls/pretrain/mpt-<size>.yaml at the source commit: d_model, n_heads, n_layers (expansion_ratio 4,
# vocab_size 50368, attn_impl flash for every size)
ARCH = {
    "125m": (768, 12, 12),
    "350m": (1024, 16, 24),
    "760m": (1536, 12, 24),
    "1b": (2048, 16, 24),
    "3b": (2560, 20, 32),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 56, 48),
    "70b": (8192, 64, 80),
}
COLUMNS = [
    "section",
    "model",
    "seq_len",
    "gpus",
    "gpu",
    "micro_batch",
    "grad_accum",
    "global_batch",
    "tokens_s",
    "tokens_s_gpu",
    "precision",
    "mp_mode",
    "sharding",
    "activation_checkpointing",
    "cpu_offload",
    "num_params",
    "d_model",
    "n_heads",
    "n_layers",
    "mfu",
    "hfu",
    "source_repo",
    "source_path",
    "source_commit",
]


def parse(text: str, commit: str) -> list[dict[str, str]]:
    rows, section, header = [], "", None
    for line in text.splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
            continue
        if not line.strip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Model":
            header = cells
            continue
        if header is None or cells[0].startswith("---") or len(cells) != len(header):
            continue
        r = dict(zip(header, cells))
        size = r["Model"].lower()
        d, h, layers = ARCH[size]
        rows.append(
            {
                "section": section,
                "model": f"mpt-{size}",
                "seq_len": r["SeqLen (T)"],
                "gpus": r["# GPUs"],
                "gpu": r["GPU"],
                "micro_batch": r["MicroBatchSize"],
                "grad_accum": r["GradAccum"],
                "global_batch": r["GlobalBatchSize"],
                "tokens_s": r["Throughput (T/s)"],
                "tokens_s_gpu": r["Throughput (T/s/GPU)"],
                "precision": r["Precision"],
                "mp_mode": r["MP Mode"],
                "sharding": r["Sharding Strategy"],
                "activation_checkpointing": r["Activation Checkpointing"],
                "cpu_offload": r["Activation CPUOffload"],
                "num_params": r["NumParams"],
                "d_model": d,
                "n_heads": h,
                "n_layers": layers,
                "mfu": r["MFU"],
                "hfu": r["HFU"],
                "source_repo": "mosaicml/llm-foundry",
                "source_path": "scripts/train/benchmarking/README.md",
                "source_commit": commit,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", required=True, type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    rows = parse(args.readme.read_text(), args.commit)
    tmp = args.out.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(args.out)
    print(f"{len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()

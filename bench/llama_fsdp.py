"""The Llama FSDP set: published tokens/s per GPU of Llama 2/3 7B-70B trained with PyTorch FSDP on 64-128 A100-80GB
(torchtitan, fms-fsdp) against the predictor, from meta-device captures. Nothing in the predictor is fitted on these
rows: it is the held-out check of the sharded path at 64-128 GPUs that issue #38 item 4 names.

    python bench/llama_fsdp.py [--score-only] [--torch 2.4.0] [--plot docs/img/llama_fsdp.png]

Data: ``bench/data/published_llama_fsdp.csv`` (the commit in every row): torchtitan's ``docs/performance.md`` (FSDP2,
64 A100-80GB, Llama 3 8B / 70B at 8192 tokens, Llama 2 13B / 70B at 4096, local batch 1-2) and fms-fsdp's
``README.md`` (FSDP / HSDP, 128 A100, Llama 2 7B-70B at 4096 tokens). Architectures from the published configurations
(hidden, MLP width, layers, heads, KV heads, vocabulary), captured with ``srifty capture
transformers:LlamaForCausalLM`` (bf16-mixed, SDPA). Nodes: 8 A100-SXM-80GB on NVSwitch with 8 x 200 Gbit/s RDMA
(``bench/data/mosaic_nodes.yaml``): neither source states its network; Meta's Research SuperCluster, where
torchtitan's numbers were most likely taken, is DGX A100 with 8 x 200 Gbit/s InfiniBand (Meta, "Introducing the AI
Research SuperCluster", 2022).

Activation checkpointing: the model prices none (``fsdp:full_shard``) or every block recomputed
(``fsdp:full_shard+ac``). torchtitan's "selective layer" recomputes every second block, "selective op" keeps the
matmul outputs (every second one) and recomputes the rest: between the two. Both prices are reported; the score uses
the fraction of the forward each recomputes (``RECOMPUTE``: 0.5 for both selective kinds, the share of blocks or of
matmul FLOPs they recompute) as a weighted mean of the two step times.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DATA = ROOT / "bench" / "data" / "published_llama_fsdp.csv"
NODES = ROOT / "bench" / "data" / "mosaic_nodes.yaml"
OUT = ROOT / "bench" / "results" / "llama_fsdp"
FLEET_TYPE = {"a100_80gb": os.environ.get("LLAMA_FSDP_NODE", "mosaic-a100-80gb")}
SHARDING = {"FULL_SHARD": "fsdp:full_shard", "HYBRID_SHARD": "fsdp:hybrid_shard"}
# share of the forward recomputed in backward (see the module docstring)
RECOMPUTE = {"no": 0.0, "selective layer": 0.5, "selective op": 0.5, "full": 1.0}
# torchtitan's and fms-fsdp's numbers were taken on 2024 nightlies (FlashAttention-2 through SDPA)
ROWS_TORCH = "2.4.0"


def load_rows() -> list[dict]:
    with DATA.open() as fh:
        return list(csv.DictReader(fh))


def capture_key(row: dict) -> str:
    return f"{row['model']}-s{row['seq_len']}-b{row['local_batch']}"


def config_of(row: dict) -> dict:
    return {
        "hidden_size": int(row["hidden"]),
        "intermediate_size": int(row["intermediate"]),
        "num_hidden_layers": int(row["layers"]),
        "num_attention_heads": int(row["heads"]),
        "num_key_value_heads": int(row["kv_heads"]),
        "vocab_size": int(row["vocab"]),
        "max_position_embeddings": int(row["seq_len"]),
        "tie_word_embeddings": False,
        "attn_implementation": "sdpa",
    }


def capture(row: dict) -> tuple[str, float, str]:
    """Capture the row's architecture in this process (cached): (key, seconds, error)."""
    from _validation_sets import cli_in_process

    key = capture_key(row)
    path = OUT / "captures" / f"{key}.json"
    if path.exists():
        return key, 0.0, ""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [
        "capture",
        "transformers:LlamaForCausalLM",
        "--config",
        json.dumps(config_of(row)),
        "--seq-len",
        row["seq_len"],
        "--batch-size",
        row["local_batch"],
        "--precision",
        "bf16-mixed",
        "--name",
        row["model"],
        "--out",
        str(path),
    ]
    took, err = cli_in_process(args)
    return key, took, err


def score(rows: list[dict], torch: str = ROWS_TORCH) -> list[dict]:
    import dataclasses

    from predictor.catalog.catalog import Catalog
    from predictor.documents.profile import Software, load_profile
    from predictor.model.predict import predict

    catalog = Catalog.load(extra=[str(NODES)])
    out = []
    for row in rows:
        rec = {k: row[k] for k in ("source", "model", "seq_len", "gpus", "local_batch", "activation_checkpointing")}
        rec["measured"] = float(row["tokens_s_gpu"])
        path = OUT / "captures" / f"{capture_key(row)}.json"
        if not path.exists():
            out.append({**rec, "status": "no capture"})
            continue
        profile = load_profile(path)
        software = dataclasses.replace(profile.software, torch=torch) if profile.software else Software(torch=torch)
        profile = dataclasses.replace(profile, software=software)
        gpus, seq = int(row["gpus"]), int(row["seq_len"])
        fleet = f"{FLEET_TYPE[row['gpu']]}:{gpus // 8}"
        base = SHARDING[row["sharding"]]
        p0 = predict(profile, fleet, catalog=catalog, layout=base, scaling="weak")
        p1 = predict(profile, fleet, catalog=catalog, layout=base + "+ac", scaling="weak")
        share = RECOMPUTE[row["activation_checkpointing"]]
        step = (1 - share) * p0.iteration_time_s + share * p1.iteration_time_s
        pick = p1 if share >= 0.5 else p0
        tokens = int(row["local_batch"]) * seq  # per GPU per step
        per_gpu = tokens / step
        lo_s, hi_s = (x * step / pick.iteration_time_s for x in pick.interval["iteration_time_s"])
        lo, hi = tokens / hi_s, tokens / lo_s
        out.append(
            {
                **rec,
                "status": "ok",
                "predicted": per_gpu,
                "no_ac": tokens / p0.iteration_time_s,
                "full_ac": tokens / p1.iteration_time_s,
                "lo": lo,
                "hi": hi,
                "ape": abs(per_gpu - rec["measured"]) / rec["measured"],
                "ratio": per_gpu / rec["measured"],
                "inside": lo <= rec["measured"] <= hi,
                "step_s": step,
                "compute_s": pick.breakdown["compute_s"],
                "exposed_comm_s": pick.breakdown["exposed_comm_s"],
                "dp_loss_s": pick.breakdown["dp_loss_s"],
                "memory_gib": max(g.memory_gib for g in pick.groups),
                "fits": pick.fits_memory,
                "params": profile.model.parameters,
            }
        )
    return out


def summary(scores: list[dict]) -> str:
    from _validation_sets import summary_line

    ok = [s for s in scores if s["status"] == "ok"]
    lines = [f"rows {len(scores)}; scored {len(ok)}"]
    lines.append(summary_line("all", ok))
    lines.append(summary_line("torchtitan (64 GPUs)", [s for s in ok if s["source"].startswith("torchtitan")]))
    lines.append(summary_line("fms-fsdp (128 GPUs)", [s for s in ok if s["source"].startswith("fms")]))
    lines.append(
        summary_line("no AC / full AC rows", [s for s in ok if s["activation_checkpointing"] in ("no", "full")])
    )
    lines.append("")
    lines.append(
        f"{'model':11} {'gpus':>4} {'b':>2} {'AC':16} {'measured':>8} {'pred':>7} {'ratio':>5} {'no-ac':>7} "
        f"{'full-ac':>7} {'comp s':>6} {'comm s':>6} {'loss s':>6} {'GiB':>5}"
    )
    for s in ok:
        lines.append(
            f"{s['model']:11} {s['gpus']:>4} {s['local_batch']:>2} {s['activation_checkpointing']:16} "
            f"{s['measured']:8.0f} {s['predicted']:7.0f} {s['ratio']:5.2f} {s['no_ac']:7.0f} {s['full_ac']:7.0f} "
            f"{s['compute_s']:6.2f} {s['exposed_comm_s']:6.2f} {s['dp_loss_s']:6.2f} {s['memory_gib']:5.1f}"
        )
    return "\n".join(lines)


def plot(scores: list[dict], path: Path) -> None:
    from _validation_sets import predicted_vs_measured

    ok = [s for s in scores if s["status"] == "ok"]
    groups = [
        ("torchtitan, 64 A100", [s for s in ok if s["source"].startswith("torchtitan")], {"c": "tab:blue"}),
        ("fms-fsdp, 128 A100", [s for s in ok if s["source"].startswith("fms")], {"c": "tab:orange"}),
    ]
    mape = 100 * statistics.mean(s["ape"] for s in ok)
    predicted_vs_measured(
        groups,
        path,
        xlabel="measured tokens/s per GPU (published)",
        ylabel="predicted tokens/s per GPU (meta capture)",
        title=f"Llama 7B-70B, PyTorch FSDP bf16, 64-128 A100: MAPE {mape:.1f}% over {len(ok)} rows",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--score-only", action="store_true")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--torch", default=ROWS_TORCH, help=f"torch the rows are priced for (default {ROWS_TORCH})")
    args = ap.parse_args()
    rows = load_rows()
    if not args.score_only:
        todo = {capture_key(r): r for r in rows}
        for done, r in enumerate(todo.values(), 1):
            key, took, err = capture(r)
            print(f"[{done}/{len(todo)}] capture {key}: {f'FAILED {err}' if err else f'{took:.1f} s'}", flush=True)
    scores = score(rows, args.torch)
    from _validation_sets import save_scores

    text = summary(scores)
    save_scores(OUT, scores, text)
    print(text)
    if args.plot:
        plot(scores, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

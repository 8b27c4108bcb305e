"""The MPT FSDP set: published tokens/s per GPU of MPT 125M-70B (mosaicml/llm-foundry) against the predictor, from
meta-device captures. Nothing in the predictor is fitted on these rows.

    python bench/mpt_fsdp.py [--capture-only] [--score-only] [--jobs 2] [--plot docs/img/mpt_fsdp.png]

Data: ``bench/data/llm_foundry_mpt.csv`` (``scripts/build_mpt_data.py`` from llm-foundry's
``scripts/train/benchmarking/README.md``; the commit is in every row): MPT trained with PyTorch FSDP (Composer),
bf16, flash attention, micro-batch and accumulation as published, on 8-512 H100-80GB, A100-80GB and A100-40GB.

For every distinct (size, sequence length, micro-batch, accumulation, precision) the architecture is captured on the
meta device with ``srifty capture`` as a user would: a GPT-2-style transformers model with MPT's sizes (d_model,
n_heads, n_layers, expansion 4, vocab 50368, learned positions as long as the sequence, tied embeddings, biases, no
dropout, SDPA attention; its parameter count matches the row's ``NumParams`` to 0.1%), ``--batch-size`` = the
micro-batch, ``--global-batch`` = micro-batch x accumulation. The prediction is
``predictor.model.predict.predict(profile, fleet, layout=..., scaling="weak")``: the published micro-batch and
accumulation on every GPU, so the global batch is the published one. Fleets: H100 rows on ``p5.48xlarge`` (8 x H100-SXM,
3200 Gbit/s EFA); A100 rows on nodes of 8 A100-SXM with the 1600 Gbit/s RoCE the README states
(``bench/data/mosaic_nodes.yaml``: 8 x 200 Gbit/s RDMA interfaces).

Out of scope, counted and said: FP8 rows (transformer-engine FP8 GEMMs; the predictor models eager bf16).

Results: ``bench/results/mpt_fsdp/scores.csv`` and a summary (MAPE overall, by GPU, by scale, leave-one-model-out
figures where a constant is chosen here), and the predicted-vs-measured plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DATA = ROOT / "bench" / "data" / "llm_foundry_mpt.csv"
NODES = ROOT / "bench" / "data" / "mosaic_nodes.yaml"
OUT = ROOT / "bench" / "results" / "mpt_fsdp"
FLEET_TYPE = {"h100_80gb": "p5.48xlarge", "a100_80gb": "mosaic-a100-80gb", "a100_40gb": "mosaic-a100-40gb"}
PRECISION = {"amp_bf16": "bf16-mixed", "bf16": "bf16-true"}
SHARDING = {"FULL_SHARD": "fsdp:full_shard", "SHARD_GRAD_OP": "fsdp:shard_grad_op"}
# The rows' software, as llm-foundry's benchmark scripts ran them at the README's last table update (5e85bd62d,
# 2024-01-06, "new benchmarks"): scripts/train/benchmarking/sweep.sh runs IMAGE mosaicml/pytorch:2.1.0_cu121 with
# llm-foundry v0.0.4, submit_benchmarks.py defaults to `--attn_impl triton` (FlashAttention's Triton port), and
# setup.py's gpu extra pins flash-attn==1.0.9: a torch 2.1 environment with FlashAttention-1-generation kernels. The
# captures ran today's torch, so each profile is told the rows' torch (`--torch` to price today's instead).
ROWS_TORCH = "2.1.0"


def load_rows() -> list[dict]:
    with DATA.open() as fh:
        return list(csv.DictReader(fh))


def in_scope(row: dict) -> str | None:
    """None when the predictor should answer this row, else why not."""
    if row["precision"] not in PRECISION:
        return f"precision {row['precision']} (FP8 GEMMs through transformer-engine; the model knows eager bf16)"
    if row["cpu_offload"] == "True":
        return "activation CPU offload"
    return None


def capture_key(row: dict) -> str:
    return f"{row['model']}-s{row['seq_len']}-mb{row['micro_batch']}-ga{row['grad_accum']}-{row['precision']}"


def config_of(row: dict) -> dict:
    d = int(row["d_model"])
    return {
        "n_embd": d,
        "n_head": int(row["n_heads"]),
        "n_layer": int(row["n_layers"]),
        "n_inner": 4 * d,
        "n_positions": int(row["seq_len"]),
        "vocab_size": 50368,
        "activation_function": "gelu",
        "tie_word_embeddings": True,
        "attn_implementation": "sdpa",
        # MPT's defaults (llmfoundry/models/mpt/configuration_mpt.py): no dropout anywhere, biases kept
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def capture(row: dict, in_process: bool = False) -> tuple[str, float, str]:
    """Capture the row's architecture (cached); (key, seconds, error). ``in_process``: through the CLI's ``main`` in
    this process (no interpreter and import start-up per capture), else ``python -m lightning_srifty.cli``."""
    key = capture_key(row)
    path = OUT / "captures" / f"{key}.json"
    if path.exists():
        return key, 0.0, ""
    path.parent.mkdir(parents=True, exist_ok=True)
    micro, accum = int(row["micro_batch"]), int(row["grad_accum"])
    cmd = [
        sys.executable,
        "-m",
        "lightning_srifty.cli",
        "capture",
        "transformers:GPT2LMHeadModel",
        "--config",
        json.dumps(config_of(row)),
        "--seq-len",
        row["seq_len"],
        "--batch-size",
        str(micro),
        "--global-batch",
        str(micro * accum),
        "--precision",
        PRECISION[row["precision"]],
        "--name",
        row["model"],
        "--out",
        str(path),
    ]
    if in_process:
        from _validation_sets import cli_in_process

        took, err = cli_in_process(cmd[3:])
        return key, took, err
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        return key, took, (res.stderr or res.stdout).strip().splitlines()[-1] if (res.stderr or res.stdout) else "?"
    return key, took, ""


def layout_of(row: dict) -> str:
    return SHARDING[row["sharding"]] + ("+ac" if row["activation_checkpointing"] == "True" else "")


def score(rows: list[dict], torch: str = ROWS_TORCH) -> list[dict]:
    import dataclasses

    from predictor.catalog.catalog import Catalog
    from predictor.documents.profile import Software, load_profile
    from predictor.exceptions import SriftyError
    from predictor.model.predict import predict

    catalog = Catalog.load(extra=[str(NODES)])
    out = []
    for row in rows:
        why = in_scope(row)
        rec = {k: row[k] for k in ("section", "model", "seq_len", "gpus", "gpu", "micro_batch", "grad_accum")}
        rec.update(layout=layout_of(row), measured=float(row["tokens_s_gpu"]), precision=row["precision"])
        if why:
            out.append({**rec, "status": "out of scope: " + why})
            continue
        path = OUT / "captures" / f"{capture_key(row)}.json"
        if not path.exists():
            out.append({**rec, "status": "no capture"})
            continue
        profile = load_profile(path)
        software = dataclasses.replace(profile.software, torch=torch) if profile.software else Software(torch=torch)
        profile = dataclasses.replace(profile, software=software)
        gpus = int(row["gpus"])
        fleet = f"{FLEET_TYPE[row['gpu']]}:{max(1, gpus // 8)}"
        try:
            p = predict(profile, fleet, catalog=catalog, layout=layout_of(row), scaling="weak")
        except SriftyError as exc:
            out.append({**rec, "status": f"error: {exc}"})
            continue
        seq = int(row["seq_len"])
        per_gpu = p.throughput_samples_s * seq / gpus
        lo, hi = (x * seq / gpus for x in p.interval["throughput_samples_s"])
        params = profile.model.parameters
        out.append(
            {
                **rec,
                "status": "ok",
                "predicted": per_gpu,
                "lo": lo,
                "hi": hi,
                "ape": abs(per_gpu - rec["measured"]) / rec["measured"],
                "ratio": per_gpu / rec["measured"],
                "inside": lo <= rec["measured"] <= hi,
                "params_ratio": params / float(row["num_params"]),
                "step_s": p.iteration_time_s,
                "compute_s": p.breakdown["compute_s"],
                "exposed_comm_s": p.breakdown["exposed_comm_s"],
                "dp_loss_s": p.breakdown["dp_loss_s"],
                "memory_gib": max(g.memory_gib for g in p.groups),
                "fits": p.fits_memory,
            }
        )
    return out


def summary(scores: list[dict]) -> str:
    from _validation_sets import summary_line

    ok = [s for s in scores if s["status"] == "ok"]
    lines = [f"rows {len(scores)}; scored {len(ok)}; out of scope {sum(s['status'].startswith('out') for s in scores)}"]
    other = [s for s in scores if s["status"] not in ("ok",) and not s["status"].startswith("out")]
    if other:
        lines.append(f"not scored: {len(other)} (e.g. {other[0]['status'][:160]})")

    lines.append(summary_line("all", ok))
    lines.append(held_out_width(ok))
    by: dict[str, list] = defaultdict(list)
    for s in ok:
        by["gpu " + s["gpu"]].append(s)
        by["scale " + ("1 node" if int(s["gpus"]) <= 8 else "multi-node")].append(s)
        by["layout " + s["layout"]].append(s)
        by["model " + s["model"]].append(s)
    for k in sorted(by):
        lines.append(summary_line(k, by[k]))
    return "\n".join(lines)


def held_out_width(ok: list[dict]) -> str:
    """80% coverage with the interval's width itself held out: for each model, the width that holds 80% of the
    other models' log residuals (predictor.validation.calibrated_sd), scored on the held-out model's rows."""
    from predictor.model.uncertainty import Z80
    from predictor.validation import calibrated_sd

    res = [(s["model"], math.log(s["ratio"])) for s in ok]
    inside = 0
    for model, r in res:
        sd = calibrated_sd([x for m, x in res if m != model])
        inside += abs(r) <= Z80 * sd
    width = calibrated_sd([x for _, x in res])
    return (
        f"80% coverage with the width held out (leave-one-model-out): {100 * inside / len(res):.0f}%; "
        f"the width all rows give: relative sd {width:.3f}"
    )


def write_errors(ok: list[dict]) -> str:
    """The interval widths of the operator paths, from held-out residuals only, into ``model_v3.json``'s ``errors``,
    each from the one set of its regime: ``ops-absolute-sharded`` (a capture, no GPU, FSDP on 8-512 GPUs) from this
    set's rows, ``ops-absolute`` (a capture, one GPU) from ``bench/ops_validation.py``'s absolute cases (Lambda, FP32
    and AMP; its last results), ``cross-ops`` (a profile measured on another GPU) from that bench's ratio cases. The
    width is the one that holds 80% of the set's log residuals (:func:`predictor.validation.calibrated_sd`); the
    coverage reported for it is leave-one-model-out (the width from the other models' residuals)."""
    from predictor.documents.atomic import atomic_write_json
    from predictor.model.uncertainty import Z80
    from predictor.validation import calibrated_sd

    lambda_path = ROOT / "bench" / "results" / "ops_validation.json"
    lam = json.loads(lambda_path.read_text()) if lambda_path.exists() else {}
    sources = {
        "ops-absolute-sharded": (
            [(s["model"], math.log(s["ratio"])) for s in ok],
            "held-out residuals of bench/mpt_fsdp.py (MPT 125M-70B, FSDP bf16 on 8-512 GPUs; nothing fitted on it)",
        ),
        "ops-absolute": (
            [(r["model"], r["log_residual"]) for r in lam.get("absolute", {}).get("rows", [])],
            "bench/ops_validation.py's absolute cases (kernel model leave-one-chip-out, tensor-core efficiency "
            "leave-one-model-out or at its shipped bound)",
        ),
        "cross-ops": (
            [(r["model"], r["log_residual"]) for r in lam.get("ratio", {}).get("rows", [])],
            "bench/ops_validation.py's ratio cases (kernel model leave-one-chip-out, tensor-core efficiency "
            "leave-one-model-out)",
        ),
    }
    path = ROOT / "predictor" / "data" / "model_v3.json"
    artefact = json.loads(path.read_text())
    lines = []
    for kind, (pool, source) in sources.items():
        if not pool:
            lines.append(f"{kind}: no held-out residuals (run bench/ops_validation.py first); not written")
            continue
        inside = sum(abs(r) <= Z80 * calibrated_sd([x for m, x in pool if m != model]) for model, r in pool)
        sd = round(calibrated_sd([x for _, x in pool]), 6)
        artefact["errors"][kind] = sd
        artefact["cases"][kind] = len(pool)
        artefact.setdefault("errors_from", {})[kind] = source
        lines.append(
            f"{kind}: relative sd {sd:.3f} from {len(pool)} held-out cases; coverage with the width held out "
            f"(leave-one-model-out) {100 * inside / len(pool):.0f}%"
        )
    # the GPUs the sharded width was calibrated on: a sharded prediction on another GPU keeps the one-GPU width and
    # the scaling floor (predictor.model.uncertainty.sharded_error)
    artefact.setdefault("errors_gpus", {})["ops-absolute-sharded"] = calibrated_gpus(ok)
    lines.append(f"ops-absolute-sharded calibrated on {', '.join(calibrated_gpus(ok))}")
    atomic_write_json(path, artefact)
    return "\n".join(lines)


def calibrated_gpus(ok: list[dict]) -> list[str]:
    """The catalog's GPU keys of the rows' fleets."""
    from predictor.catalog.catalog import Catalog

    catalog = Catalog.load(extra=[str(NODES)])
    return sorted({catalog.get(FLEET_TYPE[s["gpu"]]).gpu for s in ok})


def plot(scores: list[dict], path: Path) -> None:
    from _validation_sets import predicted_vs_measured

    ok = [s for s in scores if s["status"] == "ok"]
    colours = {"h100_80gb": "tab:red", "a100_80gb": "tab:blue", "a100_40gb": "tab:green"}
    groups = [
        (
            f"{gpu} {'multi-node' if multi else '8 GPUs'}",
            [s for s in ok if s["gpu"] == gpu and (int(s["gpus"]) > 8) == multi],
            {"c": colour, "marker": marker, "s": 18, "alpha": 0.75},
        )
        for gpu, colour in colours.items()
        for multi, marker in ((False, "o"), (True, "^"))
    ]
    mape = 100 * statistics.mean(s["ape"] for s in ok)
    predicted_vs_measured(
        groups,
        path,
        xlabel="measured tokens/s per GPU (llm-foundry)",
        ylabel="predicted tokens/s per GPU (meta capture)",
        title=f"MPT 125M-70B, PyTorch FSDP bf16: MAPE {mape:.1f}% over {len(ok)} rows",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture-only", action="store_true")
    ap.add_argument("--score-only", action="store_true")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="1: captures in this process, one after another; more: that many capture processes at once",
    )
    ap.add_argument("--models", default=None, help="comma list of sizes to keep (e.g. mpt-7b,mpt-13b)")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument(
        "--torch", default=ROWS_TORCH, help=f"torch version the rows are priced for (default {ROWS_TORCH}: theirs)"
    )
    ap.add_argument(
        "--write-errors",
        action="store_true",
        help="write the operator paths' interval widths (held-out residuals: this set's for FSDP, "
        "bench/ops_validation.py's for one GPU) into predictor/data/model_v3.json",
    )
    args = ap.parse_args()
    rows = load_rows()
    if args.models:
        keep = set(args.models.split(","))
        rows = [r for r in rows if r["model"] in keep]
    if not args.score_only:
        todo = {capture_key(r): r for r in rows if in_scope(r) is None}
        t0 = time.perf_counter()
        if args.jobs == 1:
            results = (capture(r, in_process=True) for r in todo.values())
        else:
            results = ThreadPoolExecutor(args.jobs).map(capture, todo.values())
        for done, (key, took, err) in enumerate(results, 1):
            status = f"FAILED {err}" if err else f"{took:.1f} s"
            print(f"[{done}/{len(todo)}] capture {key}: {status}", flush=True)
        print(f"captures: {time.perf_counter() - t0:.0f} s", flush=True)
    if args.capture_only:
        return
    scores = score(rows, args.torch)
    from _validation_sets import save_scores

    text = summary(scores)
    save_scores(OUT, scores, text)
    print(text)
    if args.write_errors:
        print(write_errors([s for s in scores if s["status"] == "ok"]))
    if args.plot:
        plot(scores, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

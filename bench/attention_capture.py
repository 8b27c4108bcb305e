"""Attention in a meta-device capture: its FLOPs and kernels, and the H100 step predicted from the capture.

    python bench/attention_capture.py [--label after] [--out bench/results/attention_capture.json]

Captures a GPT-2-medium-like model (``transformers:GPT2LMHeadModel``, 24 layers, 1024 wide, 16 heads, SDPA,
bf16-mixed, attention dropout 0.1 as GPT-2's configuration has it) at 8 x 1024 and 1 x 8192 tokens with
``srifty capture``, and a Llama-like one (no attention dropout, causal), then predicts each with ``srifty predict
--fleet p5.48xlarge:1 --scaling weak`` (the captured batch on each H100). Attention FLOPs are the FLOPs of the
attention operators of the table (fused SDPA kernels, or the batched matmuls of the unfused math path, the only
``bmm`` of these models). Run it on two commits with different ``--label`` to compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT2_MEDIUM = {"n_embd": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 50257, "n_positions": 8192}
LLAMA = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
}
CASES = [
    ("GPT-2-medium-like", "transformers:GPT2LMHeadModel", GPT2_MEDIUM, 8, 1024),
    ("GPT-2-medium-like", "transformers:GPT2LMHeadModel", GPT2_MEDIUM, 1, 8192),
    ("Llama-like (GQA 16/4)", "transformers:LlamaForCausalLM", LLAMA, 8, 1024),
    ("Llama-like (GQA 16/4)", "transformers:LlamaForCausalLM", LLAMA, 1, 8192),
]


def _srifty(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "lightning_srifty.cli", *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise RuntimeError(f"srifty {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def _attention(profile: dict) -> dict:
    phases: dict[str, float] = {"forward": 0.0, "backward": 0.0}
    kernels: dict[str, int] = {}
    for o in profile["ops"]["ops"]:
        name = o["op"].split(".")[1]
        if "attention" in name or name == "bmm":
            phases[o["phase"]] = phases.get(o["phase"], 0.0) + o["count"] * o["flops"]
            key = f"{name} ({o['phase']}, {o['dtypes'][0]})"
            kernels[key] = kernels.get(key, 0) + o["count"]
    return {"forward_flops": phases["forward"], "backward_flops": phases["backward"], "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_capture.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, config, batch, seq in CASES:
            path = Path(tmp) / "profile.json"
            config = {**config, "attn_implementation": "sdpa"}
            _srifty("capture", model, "--config", json.dumps(config), "--seq-len", str(seq), "--batch-size",
                    str(batch), "--precision", "bf16-mixed", "--out", str(path))  # fmt: skip
            profile = json.loads(path.read_text())
            predict = ["predict", "--fleet", "p5.48xlarge:1", "--scaling", "weak", "--format", "json"]
            pred = json.loads(_srifty(*predict, "--profile", str(path)))
            step = pred["iteration_time_s"]
            row = {
                "model": name,
                "batch": batch,
                "seq": seq,
                **_attention(profile),
                "total_flops": profile["ops"]["total_flops"],
                "h100_step_s": step,
                "h100_compute_s": pred["breakdown"]["compute_s"],
            }
            rows.append(row)
            print(
                f"{args.label:7s} {name:22s} {batch}x{seq:<5d} attention fwd {row['forward_flops'] / 1e12:7.2f} "
                f"bwd {row['backward_flops'] / 1e12:7.2f} TFLOP, step total {row['total_flops'] / 1e12:7.2f} TFLOP, "
                f"H100 step {step * 1e3:.1f} ms (compute {row['h100_compute_s'] * 1e3:.1f})  {row['kernels']}",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    results[args.label] = rows
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

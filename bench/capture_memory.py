"""Activation memory from a meta-device capture against the real step's peak on CPU, with and without checkpointing.

    python bench/capture_memory.py [--models llama,gpt2,tinylm,mlp] [--out bench/results/capture_memory.json]

Each model is captured once on the meta device (fake tensors) at a small batch with ``capture_step``; its
``model.structure`` predicts the peak of a training step at a larger batch::

    static    = weights + gradients + optimizer state                  (sizes from the capture)
    no AC     = fixed + batch x (saved + transient)
    AC        = fixed + batch x (blocks x block_input + saved - blocks x block_saved + block_saved + transient)
    AC by phase: the same with max(saved - blocks x block_saved + transient, block_saved) for the last two terms
                (the head's peak and a block's recompute happen at different times)
    predicted = static + max(no AC or AC, optimizer_transient)

and the real peak is torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``: live tensor storages) over the
second real step on CPU (AdamW, foreach, state already built), with activation checkpointing applied to every block
with ``torch.utils.checkpoint`` (non-reentrant) for the AC rows. Target: within 10%.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from lightning_srifty.profiling.capture import capture_step  # noqa: E402
from lightning_srifty.profiling.structure import find_blocks  # noqa: E402

ADAMW = functools.partial(torch.optim.AdamW, lr=1e-4, foreach=True)


class Block(nn.Module):
    """A residual MLP block (a user's own repeated block)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    """Residual MLP blocks on flat features, a classification loss."""

    def __init__(self, dim: int = 256, depth: int = 6, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(depth)))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.head(self.blocks(x)).flatten(0, 1), y)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, vocab_size=4000
    )
    return LlamaForCausalLM(cfg), lambda n: _tokens(n, 256, 4000)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=256, n_layer=4, n_head=8, vocab_size=4000, n_positions=256, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return GPT2LMHeadModel(cfg), lambda n: _tokens(n, 256, 4000)


def tinylm():
    from capture_models import TinyLM

    return TinyLM(vocab=4000, dim=128), lambda n: {"tokens": torch.randint(0, 4000, (n, 257))}


def mlp():
    return MLP(), lambda n: {"x": torch.randn(n, 64, 256), "y": torch.randint(0, 10, (n * 64,))}


def _tokens(n: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    tokens = torch.randint(0, vocab, (n, seq))
    return {"input_ids": tokens, "labels": tokens}


MODELS = {"llama": llama, "gpt2": gpt2, "tinylm": tinylm, "mlp": mlp}


def _loss(model: nn.Module, batch: dict) -> torch.Tensor:
    if hasattr(model, "training_step"):
        return model.training_step(batch, 0)
    if "input_ids" in batch:
        return model(**batch).loss
    return model(**batch)


def checkpoint_blocks(model: nn.Module) -> int:
    """Wrap the forward of every repeated block in torch.utils.checkpoint (non-reentrant); returns how many."""
    _, blocks = find_blocks(model)
    for block in blocks:
        block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
    return len(blocks)


def real_peak(make, batch_size: int, ac: bool) -> int:
    """Peak live tensor bytes (MemTracker) of the second real training step on CPU."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model, make_batch = make()
    model.train()
    if ac:
        checkpoint_blocks(model)
    opt = ADAMW(model.parameters())
    batch = make_batch(batch_size)

    def step() -> None:
        _loss(model, batch).backward()
        opt.step()
        opt.zero_grad()

    step()
    tracker = MemTracker()
    tracker.track_external(model, opt, batch)
    with tracker:
        step()
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def predicted_peak(capture, weights: int, batch_size: int, ac: bool, *, phases: bool = False) -> int:
    """The peak from the capture's sizes and structure (``phases``: the AC peak as the larger of the head's and one
    block's recompute, instead of their sum)."""
    s = capture.structure
    per_sample = s["saved_bytes_per_sample"] + s["transient_bytes_per_sample"]
    if ac and s["blocks"]:
        inputs = s["blocks"] * s["block_input_bytes_per_sample"]
        outside = s["saved_bytes_per_sample"] - s["blocks"] * s["block_saved_bytes_per_sample"]
        if phases:
            head = outside + s["transient_bytes_per_sample"]
            per_sample = inputs + max(head, s["block_saved_bytes_per_sample"])
        else:
            per_sample = inputs + outside + s["block_saved_bytes_per_sample"] + s["transient_bytes_per_sample"]
    activations = s["fixed_bytes"] + batch_size * per_sample
    static = weights + sum(capture.gradient_bytes_by_dtype.values()) + capture.optimizer_state_bytes
    return int(static + max(activations, s["optimizer_transient_bytes"]))


def run(name: str, captured_batch: int, batches: list[int]) -> list[dict]:
    torch.manual_seed(0)
    with torch.device("meta"):
        model, make_batch = MODELS[name]()
    start = time.perf_counter()
    capture = capture_step(model, make_batch(captured_batch), device="meta", optimizer=ADAMW)
    seconds = time.perf_counter() - start
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    rows = []
    for batch_size in batches:
        for ac in (False, True):
            if ac and not capture.structure["blocks"]:
                continue
            real = real_peak(MODELS[name], batch_size, ac)
            pred = predicted_peak(capture, weights, batch_size, ac)
            by_phase = predicted_peak(capture, weights, batch_size, ac, phases=True)
            rows.append(
                {
                    "model": name,
                    "block": capture.structure["block"],
                    "blocks": capture.structure["blocks"],
                    "captured_batch": captured_batch,
                    "batch": batch_size,
                    "activation_checkpointing": ac,
                    "predicted_bytes": pred,
                    "measured_bytes": real,
                    "error": (pred - real) / real,
                    "predicted_bytes_ac_by_phase": by_phase if ac else None,
                    "error_ac_by_phase": (by_phase - real) / real if ac else None,
                    "capture_s": round(seconds, 3),
                }
            )
            print(
                f"{name:7s} batch {batch_size:3d} ac={ac!s:5s} predicted {pred / 2**20:8.1f} MiB  measured "
                f"{real / 2**20:8.1f} MiB  error {rows[-1]['error']:+.1%}"
                + (f"  (AC by phase {rows[-1]['error_ac_by_phase']:+.1%})" if ac else ""),
                file=sys.stderr,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--captured-batch", type=int, default=2)
    parser.add_argument("--batches", default="2,8")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "capture_memory.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for name in args.models.split(","):
        rows += run(name, args.captured_batch, [int(b) for b in args.batches.split(",")])
    worst = max(abs(r["error"]) for r in rows)
    result = {
        "what": "peak memory of a training step: meta-device capture (model.structure) vs MemTracker on CPU",
        "torch": torch.__version__,
        "rows": rows,
        "worst_abs_error": worst,
    }
    from predictor.documents.atomic import atomic_write_json

    atomic_write_json(args.out, result)
    print(f"worst |error| {worst:.1%} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Operator-table capture: record counts and capture times of published architectures, and the callback's cost.

    pip install -e '.[bench]'          # transformers (architectures built from their configurations, no weights)
    python bench/capture_ops.py [--models resnet50,bert-large-squad,gpt2-medium] [--callback]

Each model is built on the meta device from its configuration and captured with ``capture_step`` (fake tensors:
no memory, no arithmetic) in 32-true and bf16-mixed with AdamW. ``--callback`` trains the demo CNN on CPU with
SriftyCallback with and without ``capture_ops`` and reports the wall time of the captured warm-up step against the
median step. ResNet-50 is transformers' ``ResNetForImageClassification`` (the torchvision wheel on PyPI is built for
CUDA torch and does not import next to a CPU-only torch).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lightning_srifty.profiling.capture import capture_step  # noqa: E402


def resnet50(n: int = 32):
    from transformers import ResNetConfig, ResNetForImageClassification

    with torch.device("meta"):
        model = ResNetForImageClassification(ResNetConfig(num_labels=1000))
    return model, {"pixel_values": torch.empty(n, 3, 224, 224), "labels": torch.zeros(n, dtype=torch.long)}


def bert_large_squad(n: int = 8, seq: int = 384):
    from transformers import BertConfig, BertForQuestionAnswering

    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    with torch.device("meta"):
        model = BertForQuestionAnswering(config)
    batch = {
        "input_ids": torch.zeros(n, seq, dtype=torch.long),
        "attention_mask": torch.ones(n, seq, dtype=torch.long),
        "start_positions": torch.zeros(n, dtype=torch.long),
        "end_positions": torch.zeros(n, dtype=torch.long),
    }
    return model, batch


def gpt2_medium(n: int = 8, seq: int = 1024):
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16))
    tokens = torch.zeros(n, seq, dtype=torch.long)
    return model, {"input_ids": tokens, "labels": tokens}


MODELS = {"resnet50": resnet50, "bert-large-squad": bert_large_squad, "gpt2-medium": gpt2_medium}


def bench_models(names: list[str]) -> list[dict]:
    rows = []
    adamw = functools.partial(torch.optim.AdamW, lr=1e-4)
    for name in names:
        model, batch = MODELS[name]()
        for precision in ("32-true", "bf16-mixed"):
            capture = capture_step(model, batch, optimizer=adamw, precision=precision)
            table = capture.table
            rows.append(
                {
                    "model": name,
                    "precision": precision,
                    "samples": table.samples,
                    "records": len(table.ops),
                    "calls": sum(o.count for o in table.ops),
                    "skipped": sum((table.skipped or {}).values()),
                    "parameters": capture.parameters,
                    "tflop_per_step": round((table.total_flops or 0) / 1e12, 3),
                    "capture_s": round(capture.seconds, 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_callback(rounds: int = 4) -> dict:
    """CPU time of the captured warm-up step over the median step, demo CNN and LM on CPU, one torch thread.

    Thread CPU time, not wall time: on a shared machine wall times of the same step vary tenfold. The "off" arm is
    SriftyCallback(capture_ops=False), whose FlopCounterMode runs on the same step.
    """
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    from lightning_srifty.demo.run import DemoConfig, build
    from lightning_srifty.profiling.callback import SriftyCallback

    class Clock(Callback):
        def __init__(self) -> None:
            self.steps: list[float] = []
            self.start = 0.0

        def on_train_batch_start(self, *args) -> None:
            self.start = time.thread_time()

        def on_train_batch_end(self, *args) -> None:
            self.steps.append(time.thread_time() - self.start)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ratios: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            for model_kind in ("cnn", "lm"):
                for capture in (True, False):
                    model, data = build(DemoConfig(model=model_kind, seed=0, accelerator="cpu"))
                    clock = Clock()
                    callback = SriftyCallback(
                        warmup_steps=5, profile_steps=10, output=None, verbose=False, recommend=False,
                        measure_checkpoint=False, capture_ops=capture,
                    )  # fmt: skip
                    trainer = pl.Trainer(
                        max_steps=16, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[clock, callback],
                    )  # fmt: skip
                    trainer.fit(model, data)
                    key = f"{model_kind} {'capture_ops' if capture else 'flop_counter_only'}"
                    ratios.setdefault(key, []).append(clock.steps[4] / statistics.median(clock.steps[6:]))
    finally:
        torch.set_num_threads(threads)
    out = {k: round(statistics.median(v), 2) for k, v in ratios.items()}
    print(json.dumps({"captured_step_cpu_time_over_median_step": out}), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {list(MODELS)}")
    parser.add_argument("--callback", action="store_true", help="also measure the callback's capture step")
    args = parser.parse_args()
    bench_models([m for m in args.models.split(",") if m])
    if args.callback:
        bench_callback()


if __name__ == "__main__":
    main()

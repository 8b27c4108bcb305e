"""model.structure from a captured step: the repeated block, saved/transient bytes, LoRA, and the peak it predicts."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_srifty.profiling.capture import capture_step
from lightning_srifty.profiling.lora import LoRALinear, add_lora
from lightning_srifty.profiling.structure import find_blocks
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ADAMW = functools.partial(torch.optim.AdamW, lr=1e-4)
LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 256,
}


def tiny_llama(device: str = "meta") -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device(device):
        return LlamaForCausalLM(LlamaConfig(**LLAMA))


def tokens(batch: int, seq: int = 32) -> dict[str, torch.Tensor]:
    t = torch.randint(0, 256, (batch, seq))
    return {"input_ids": t, "labels": t}


def _bench():
    spec = importlib.util.spec_from_file_location("capture_memory", ROOT / "bench" / "capture_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["capture_memory"] = module
    spec.loader.exec_module(module)
    return module


def test_the_block_is_the_repeated_class_holding_most_parameters() -> None:
    name, blocks = find_blocks(tiny_llama())
    assert name == "LlamaDecoderLayer" and len(blocks) == 2
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=64))
    assert find_blocks(gpt2)[0] == "GPT2Block" and len(find_blocks(gpt2)[1]) == 3
    assert find_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))) == (None, [])
    mlp = _bench().MLP(dim=8, depth=3)
    assert find_blocks(mlp)[0] == "Block" and len(find_blocks(mlp)[1]) == 3


def test_saved_bytes_are_the_activations_not_the_weights() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    class Sum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).sum()

    s = capture_step(Sum(), torch.zeros(8, 16), optimizer=ADAMW).structure
    # addmm saves its input x (16 floats), relu its output, which the second addmm saves too (one storage)
    assert s["saved_bytes_per_sample"] == (16 + 32) * 4
    assert s["blocks"] == 0 and s["block"] is None and s["block_saved_bytes_per_sample"] is None
    assert s["optimizer_transient_bytes"] > 0  # foreach AdamW's temporaries


def test_meta_equals_cpu_and_bytes_per_sample_do_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    model = tiny_llama("cpu")
    small = capture_step(model, tokens(2), device="meta", optimizer=ADAMW).structure
    assert capture_step(model, tokens(2), device="cpu", optimizer=ADAMW).structure == {
        **small,
        "method": small["method"].replace("fake tensors, no storage", "real tensors on cpu"),
    }
    large = capture_step(model, tokens(8), device="meta", optimizer=ADAMW).structure
    assert small["blocks"] == 2 and small["block_parameters"] == sum(
        p.numel() for p in model.model.layers[0].parameters()
    )
    assert small["block_input_bytes_per_sample"] == large["block_input_bytes_per_sample"] == 32 * 64 * 4
    for key in ("saved_bytes_per_sample", "block_saved_bytes_per_sample"):
        # the rotary cos/sin tables (4 KiB here) are saved once whatever the batch
        assert large[key] == pytest.approx(small[key], rel=0.02), key
    assert 0 < small["block_saved_bytes_per_sample"] * 2 < small["saved_bytes_per_sample"]


def test_mixed_precision_weight_copies_are_fixed_bytes() -> None:
    model = tiny_llama()
    s32 = capture_step(model, tokens(2), optimizer=ADAMW).structure
    mixed = capture_step(model, tokens(2), optimizer=ADAMW, precision="bf16-mixed").structure
    assert s32["fixed_bytes"] < mixed["fixed_bytes"]
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert mixed["fixed_bytes"] >= linears * 2  # the bfloat16 copy of every linear weight autocast saves


def test_lora_trains_the_adapters_and_the_frozen_base_still_saves() -> None:
    model = tiny_llama()
    full = capture_step(model, tokens(2), optimizer=ADAMW)
    assert add_lora(model, 4) == 4 and isinstance(model.model.layers[0].self_attn.q_proj, LoRALinear)
    lora = capture_step(model, tokens(2), optimizer=ADAMW)
    assert lora.trainable_parameters == 2 * 2 * 4 * (64 + 64)
    assert lora.gradient_bytes_by_dtype == {"float32": lora.trainable_parameters * 4}
    assert 0.3 * full.structure["saved_bytes_per_sample"] < lora.structure["saved_bytes_per_sample"]
    assert lora.structure["saved_bytes_per_sample"] < full.structure["saved_bytes_per_sample"]
    with pytest.raises(ConfigError, match=r"'rank' parameter of add_lora\(\).*Got 0"):
        add_lora(tiny_llama(), 0)
    with pytest.raises(ConfigError, match=r"names no linear layer.*q_proj"):
        add_lora(tiny_llama(), 4, targets=("query",))


@pytest.mark.slow  # GPT-2's real steps on the CPU under the memory tracker: 13 s
def test_predicted_peak_is_within_10_percent_of_memtracker_on_cpu() -> None:
    bench = _bench()
    with torch.device("meta"):
        model, make_batch = bench.gpt2()
    capture = capture_step(model, make_batch(2), optimizer=bench.ADAMW)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    predicted = bench.predicted_peak(capture, weights, 8, ac=False)
    measured = bench.real_peak(bench.gpt2, 8, ac=False)
    assert abs(predicted - measured) / measured < 0.10, (predicted, measured)


def test_cli_captures_a_transformers_config_with_lora(tmp_path, capsys) -> None:
    from lightning_srifty.cli import main

    out = tmp_path / "p.json"
    argv = ["capture", "transformers:LlamaForCausalLM", "--config", json.dumps(LLAMA), "--seq-len", "16"]
    assert main([*argv, "--batch-size", "2", "--global-batch", "8", "--lora-rank", "4", "--out", str(out)]) == 0
    profile = load_profile(out)
    # the training's global batch: 4 micro-steps of the captured 2 samples (every fleet is ranked training 8)
    assert (profile.batch.per_device, profile.batch.accumulate_grad_batches) == (2, 4)
    assert profile.model.trainable_parameters == 2 * 2 * 4 * 128 and profile.model.name.endswith("LoRA r4")
    assert profile.model.structure.block == "LlamaDecoderLayer" and profile.model.structure.blocks == 2
    assert profile.hardware.accelerator == "meta" and profile.timing.step_time_s.p50 == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["capture_models:TinyLM", "--config", "{}", "--batch", "capture_models:make_batch"], "--config is for a"),
        (["transformers:LlamaForCausalLM", "--config", "nope.json", "--seq-len", "8"], "neither a JSON object"),
        (["transformers:LlamaForCausalLM", "--config", "{}"], "--batch is required"),
        (["transformers:LlamaForCausalLM", "--config", "{}", "--seq-len", "8", "--global-batch", "7"],
         "--global-batch 7 is not a multiple of --batch-size 2"),
        (["transformers:LlamaForCausalLM", "--config", "{}", "--seq-len", "8", "--lora-rank", "2",
          "--lora-targets", "query"], "--lora-targets"),
        (["transformers:LlamaForCausalLM", "--config", json.dumps(LLAMA), "--image-size", "32"],
         "is not an image classifier"),
        (["transformers:ResNetForImageClassification", "--image-size", "32", "--seq-len", "8"],
         "--image-size and --seq-len"),
        (["capture_models:TinyLM", "--image-size", "32"], "--image-size is for a transformers vision model"),
        # a trial: the class kept a misspelt key as an inert attribute and built its default 32 layers
        (["transformers:LlamaForCausalLM", "--config", '{"hidden_size": 64, "num_hidden_layer": 40}', "--seq-len",
          "8"], "--config key 'num_hidden_layer' is not a LlamaConfig argument: Did you mean 'num_hidden_layers'?"),
    ],
)  # fmt: skip
def test_cli_bad_transformers_input_names_the_flag(args, expected, tmp_path, capsys) -> None:
    from lightning_srifty.cli import main

    assert main(["capture", *args, "--batch-size", "2", "--out", str(tmp_path / "p.json")]) == 2
    assert expected in capsys.readouterr().err


def test_a_config_key_the_class_takes_another_way_is_not_said_and_an_inert_one_is(tmp_path, capsys) -> None:
    """transformers 5 takes rope_theta into rope_parameters and torch_dtype as dtype: neither is a spelling error;
    a key the class only keeps as an attribute is said (a saved config.json carries some: it is not refused)."""
    from lightning_srifty.cli import main

    config = {**LLAMA, "rope_theta": 10000.0, "torch_dtype": "float16", "transformers_version": "4.31.0", "foo": 1}
    argv = ["capture", "transformers:LlamaForCausalLM", "--config", json.dumps(config), "--seq-len", "8"]
    assert main([*argv, "--batch-size", "2", "--out", str(tmp_path / "p.json")]) == 0
    err = capsys.readouterr().err
    assert "LlamaConfig takes none of 'foo':" in err and "rope_theta" not in err and "torch_dtype" not in err


@pytest.mark.slow
def test_llama_7b_captures_on_the_meta_device() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    capture = capture_step(model, tokens(1, 2048), optimizer=ADAMW, precision="bf16-true")
    s = capture.structure
    assert capture.parameters == 6_738_415_616 and (s["block"], s["blocks"]) == ("LlamaDecoderLayer", 32)
    assert s["block_input_bytes_per_sample"] == 2048 * 4096 * 2
    assert 32 * s["block_saved_bytes_per_sample"] < s["saved_bytes_per_sample"] < 40 * s["block_saved_bytes_per_sample"]


def test_cli_captures_a_transformers_image_classifier_from_its_size(tmp_path) -> None:
    """A published vision architecture by name (issue #38 item 6): pixel_values and labels of --image-size."""
    from lightning_srifty.cli import main

    out = tmp_path / "p.json"
    config = json.dumps({"num_labels": 10, "embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1]})
    argv = ["capture", "transformers:ResNetForImageClassification", "--config", config, "--image-size", "32"]
    assert main([*argv, "--batch-size", "4", "--precision", "16-mixed", "--out", str(out)]) == 0
    profile = load_profile(out)
    convs = [o for o in profile.ops.ops if "convolution" in o.op]
    assert convs and profile.model.flops.per_sample > 0 and profile.batch.per_device == 4
    assert profile.hardware.accelerator == "meta"


def test_cli_channels_last_is_recorded_and_priced(tmp_path) -> None:
    """``srifty capture --channels-last`` captures the run a script with ``model.to(memory_format=channels_last)``
    makes: its convolutions and batch norms recorded NHWC, and on a tensor-core GPU no layout conversions priced
    where the NCHW capture of the same model pays them (issue #40 item 3)."""
    from lightning_srifty.cli import main
    from predictor.catalog.gpus import get_gpu
    from predictor.model.ops import classify_table, ops_time

    config = json.dumps({"num_labels": 10, "embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1]})
    argv = ["capture", "transformers:ResNetForImageClassification", "--config", config, "--image-size", "224",
            "--batch-size", "64", "--precision", "16-mixed"]  # fmt: skip
    layouts = {}  # batch 64 at 224 px: large enough that no kernel sits at its in-stream floor
    for flag in ([], ["--channels-last"]):
        out = tmp_path / f"p{len(flag)}.json"
        assert main([*argv, *flag, "--out", str(out)]) == 0
        ops = load_profile(out).ops.ops
        nhwc = {o.op for o in ops if (o.params or {}).get("channels_last")}
        layouts[bool(flag)] = (nhwc, ops_time(classify_table(ops), get_gpu("A100-SXM-80GB"), "16-mixed", None,
                                              "absolute").by_class)  # fmt: skip
    assert not layouts[False][0] and layouts[False][1]["layout"] > 0
    assert {"aten.convolution.default", "aten._native_batch_norm_legit.default"} <= layouts[True][0]
    assert layouts[True][1].get("layout", 0.0) == 0.0
    assert layouts[True][1]["batch_norm"] < layouts[False][1]["batch_norm"]  # NHWC kernels: bandwidth-bound

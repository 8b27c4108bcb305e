"""Attention in the operator table: FLOPs of every SDPA kernel (causal, GQA, backward), the kernel CUDA would run for a
CPU step, and a capture of a tiny transformers model (issue #21, item 4)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_srifty.profiling import attention
from lightning_srifty.profiling.attention import (
    EFFICIENT,
    FLASH,
    MATH,
    attended_pairs,
    attention_flops,
    cuda_kernel,
    flop_formulas,
)
from lightning_srifty.profiling.capture import capture_ops, capture_step
from lightning_srifty.profiling.cuda_autocast import cuda_autocast_policy
from lightning_srifty.profiling.ops_capture import OpRecorder
from predictor.model.ops import _causal_pairs, attention_work

aten = torch.ops.aten
ADAMW = functools.partial(torch.optim.AdamW, lr=1e-4)
FLASH_OPS = (
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_flash_attention_backward.default",
)
EFFICIENT_OPS = (
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_efficient_attention_backward.default",
)


def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


# ------------------------------------------------------------------------------------------------------ formulas


def test_attended_pairs_count_the_causal_triangle_both_alignments() -> None:
    for s_q, s_k in [(1, 1), (5, 5), (3, 7), (7, 3), (64, 64), (1, 9), (9, 1)]:
        top = sum(min(i + 1, s_k) for i in range(s_q))
        bottom = sum(max(0, min(i + 1 + s_k - s_q, s_k)) for i in range(s_q))
        assert attended_pairs(s_q, s_k, True) == _causal_pairs(s_q, s_k, False) == top
        assert attended_pairs(s_q, s_k, True, bottom_right=True) == _causal_pairs(s_q, s_k, True) == bottom
        assert attended_pairs(s_q, s_k, False) == s_q * s_k
    assert attended_pairs(1024, 1024, True) == 1024 * 1025 // 2  # about half of 1024^2


# b=2, h=8 query heads (2 key/value heads: GQA), s=128, d=64: hand-computed
B, HQ, HKV, S, D = 2, 8, 2, 128, 64
FULL_FWD = 4 * B * HQ * S * S * D  # 33,554,432: q @ k^T and P @ v, 2*b*h*s*s*d each
CAUSAL_FWD = 4 * B * HQ * (S * (S + 1) // 2) * D  # 16,908,288: the pairs on or below the diagonal


def _call(packet, *, backward: bool, layout: str = "bhsd", causal: bool = False, mask: bool = False):
    """(overload, args, kwargs) of one call of ``packet`` on bf16 meta tensors, GQA 8/2."""
    if layout == "bshd":
        q, kv = meta(B, S, HQ, D), meta(B, S, HKV, D)
        lse = meta(B, HQ, S, dtype=torch.float32)
    else:
        q, kv = meta(B, HQ, S, D), meta(B, HKV, S, D)
        lse = meta(B, HQ, S, dtype=torch.float32)
    bias = meta(S, S) if mask else None
    seed = meta(2, dtype=torch.int64)
    none = None
    calls = {
        aten._scaled_dot_product_flash_attention_for_cpu: ((q, kv, kv, 0.0, causal), {"attn_mask": bias}),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: (
            (q, q, kv, kv, q, lse, 0.0, causal),
            {"attn_mask": bias},
        ),
        aten._scaled_dot_product_flash_attention: ((q, kv, kv, 0.1, causal), {"scale": 0.125}),
        aten._scaled_dot_product_flash_attention_backward: (
            (q, q, kv, kv, q, lse, none, none, S, S, 0.1, causal, seed, seed),
            {"scale": 0.125},
        ),
        aten._scaled_dot_product_efficient_attention: ((q, kv, kv, bias, True, 0.0, causal), {}),
        aten._scaled_dot_product_efficient_attention_backward: (
            (q, q, kv, kv, bias, q, lse, seed, seed, 0.0, [True, True, True, False], causal),
            {},
        ),
        aten._scaled_dot_product_cudnn_attention: ((q, kv, kv, bias, True, 0.0, causal), {}),
        aten._scaled_dot_product_cudnn_attention_backward: (
            (q, q, kv, kv, q, lse, seed, seed, bias, none, none, S, S, 0.0, causal),
            {},
        ),
        aten._flash_attention_forward: ((q, kv, kv, none, none, S, S, 0.0, causal, False), {}),
        aten._flash_attention_backward: ((q, q, kv, kv, q, lse, none, none, S, S, 0.0, causal, seed, seed), {}),
        aten._efficient_attention_forward: ((q, kv, kv, bias, none, none, S, S, 0.0, int(causal)), {}),
        aten._efficient_attention_backward: (
            (q, q, kv, kv, bias, q, none, none, S, S, lse, 0.0, seed, seed, int(causal), False),
            {},
        ),
    }
    args, kwargs = calls[packet]
    return packet.default, args, kwargs


FORWARD = [
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten._flash_attention_forward,
    aten._efficient_attention_forward,
]
BACKWARD = [
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
    aten._flash_attention_backward,
    aten._efficient_attention_backward,
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("packet", FORWARD + BACKWARD, ids=lambda p: p.__name__)
def test_every_sdpa_kernel_forward_and_backward_gqa_and_causal(packet, causal) -> None:
    backward = packet in BACKWARD
    layout = "bshd" if packet.__name__.startswith(("_flash_attention", "_efficient_attention")) else "bhsd"
    func, args, kwargs = _call(packet, backward=backward, layout=layout, causal=causal)
    forward = CAUSAL_FWD if causal else FULL_FWD
    expected = forward * 5 // 2 if backward else forward  # five matmuls backward: the scores are recomputed
    assert attention_flops(func, args, kwargs) == expected
    # FlopCounterMode with the same formulas gives the same (by the operator's default overload)
    assert flop_formulas()[packet](*args, **kwargs, out_val=None) == expected
    from torch.utils.flop_counter import flop_registry

    if not causal and packet in flop_registry:
        # torch's own formula agrees where it applies: it has none for the CPU kernel, ignores causality, and reads
        # the [b, s, h, d] tensors of _flash/_efficient_attention_forward/backward as [b, h, s, d] (unless nested)
        torch_flops = flop_registry[packet](*args, **kwargs, out_val=None)
        assert (torch_flops == expected) == (layout == "bhsd")


def test_a_mask_scale_and_dropout_change_no_flops_and_mqa_counts_query_heads() -> None:
    func, args, kwargs = _call(aten._scaled_dot_product_efficient_attention, backward=False, mask=True)
    assert attention_flops(func, args, kwargs) == FULL_FWD  # an additive bias: every tile is computed
    q, kv = meta(B, HQ, S, D), meta(B, 1, S, D)  # MQA: one key/value head
    op = aten._scaled_dot_product_flash_attention.default
    assert attention_flops(op, (q, kv, kv, 0.5, False), {"scale": 3.0}) == FULL_FWD
    # head dims of values may differ: (d + d_v) per pair forward, (3 d + 2 d_v) backward
    v = meta(B, HQ, S, 128)
    assert attention_flops(op, (q, meta(B, HQ, S, D), v), {}) == 2 * B * HQ * S * S * (D + 128)


def test_the_kernel_cuda_selects() -> None:
    q, kv = [2, 8, 1024, 64], [2, 2, 1024, 64]
    assert cuda_kernel(torch.bfloat16, q, kv, kv, has_mask=False, is_causal=True) == FLASH
    assert cuda_kernel(torch.float16, q, q, q, has_mask=False, is_causal=False) == FLASH
    assert cuda_kernel(torch.bfloat16, q, q, q, has_mask=True, is_causal=False) == EFFICIENT  # flash takes no mask
    assert cuda_kernel(torch.float32, q, q, q, has_mask=False, is_causal=False) == EFFICIENT  # flash: half only
    big = [2, 8, 1024, 512]
    assert cuda_kernel(torch.bfloat16, big, big, big, has_mask=False, is_causal=False) == EFFICIENT  # d > 256
    short = [2, 8, 16, 64]  # causal with s_q != s_k: not flash
    assert cuda_kernel(torch.bfloat16, short, q, q, has_mask=False, is_causal=True) == EFFICIENT
    odd = [2, 8, 1024, 30]  # not a multiple of 4 (float32) or 8 (half)
    assert cuda_kernel(torch.float32, odd, odd, odd, has_mask=False, is_causal=False) == MATH
    assert cuda_kernel(torch.float64, q, q, q, has_mask=False, is_causal=False) == MATH


# -------------------------------------------------------------------------------- the recorder and the counter


def _attend(dtype: torch.dtype, *, causal: bool = False, mask: bool = False, mixed: bool = False, d: int = 16):
    q = torch.randn(2, 4, 32, d, dtype=dtype, requires_grad=True)
    kv = torch.randn(2, 2, 32, d, dtype=dtype, requires_grad=True)
    m = torch.ones(32, 32, dtype=torch.bool).tril() if mask else None
    rec = OpRecorder()
    with rec:
        ctx = cuda_autocast_policy() if mixed else torch.autocast("cpu", enabled=False)
        with ctx, torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=m, is_causal=causal, enable_gqa=True)
        rec.phase = "backward"
        out.float().sum().backward()
    return [r for r in rec.op_records() if "attention" in r.op], rec


@pytest.mark.parametrize(
    ("dtype", "mixed", "causal", "mask", "ops"),
    [
        (torch.float32, False, False, False, EFFICIENT_OPS),
        (torch.float32, True, True, False, FLASH_OPS),
        (torch.bfloat16, False, True, False, FLASH_OPS),
        (torch.bfloat16, False, False, True, EFFICIENT_OPS),
    ],
    ids=["fp32", "bf16-mixed-causal", "bf16-causal", "bf16-mask"],
)
def test_a_cpu_step_records_the_cuda_kernel_with_its_flops(dtype, mixed, causal, mask, ops) -> None:
    fwd, bwd = _attend(dtype, causal=causal, mask=mask, mixed=mixed)[0]
    assert (fwd.op, fwd.phase, bwd.op, bwd.phase) == (ops[0], "forward", ops[1], "backward")
    pairs = 32 * 33 // 2 if causal else 32 * 32
    assert fwd.flops == 4 * 2 * 4 * pairs * 16 and bwd.flops == fwd.flops * 2.5
    assert fwd.params == bwd.params == {"is_causal": [int(causal)]}
    assert fwd.dtypes[0] == ("bfloat16" if mixed else str(dtype).removeprefix("torch."))
    # the bytes the fused kernel moves: q, k, v (and the mask) in, out and logsumexp out; never the 32 x 32 scores
    eb = 2 if fwd.dtypes[0] == "bfloat16" else 4
    q, kv, lse = 2 * 4 * 32 * 16 * eb, 2 * 2 * 32 * 16 * eb, 2 * 4 * 32 * 4
    mask_bytes = 32 * 32 * eb if mask else 0
    assert fwd.bytes_read == q + 2 * kv + mask_bytes and fwd.bytes_written == q + lse
    if mask:  # the efficient backward's order: grad_out, q, k, v, attn_bias, out, logsumexp
        assert bwd.shapes[4] == [32, 32] and bwd.shapes[6] == [2, 4, 32]


def test_cuda_attention_off_keeps_the_cpu_kernel() -> None:
    rec = OpRecorder(cuda_attention=False)
    q = torch.randn(1, 2, 8, 8)
    with rec:
        F.scaled_dot_product_attention(q, q, q)
    (only,) = rec.op_records()
    assert only.op == "aten._scaled_dot_product_flash_attention_for_cpu.default" and only.flops == 4 * 2 * 8 * 8 * 8


def test_flop_counter_mode_with_the_formulas_agrees_with_the_table() -> None:
    records, _ = _attend(torch.bfloat16, causal=True)
    q = torch.randn(2, 4, 32, 16, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(2, 2, 32, 16, dtype=torch.bfloat16, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as forward:
        out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as backward:
        out.float().sum().backward()
    assert forward.get_total_flops() == records[0].flops and backward.get_total_flops() == records[1].flops
    with FlopCounterMode(display=False) as plain:  # torch alone: the CPU kernel counts nothing (the bug)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    assert plain.get_total_flops() == 0


def test_the_math_path_is_counted_by_its_matmuls() -> None:
    q = torch.randn(2, 4, 32, 16, requires_grad=True)
    with OpRecorder() as rec:
        out = torch.ops.aten._scaled_dot_product_attention_math(q, q, q, is_causal=True)[0]
        rec.phase = "backward"
        out.sum().backward()
    flops = rec.phase_flops()
    full = 4 * 2 * 4 * 32 * 32 * 16  # the math path computes every score, masked or not
    assert flops["forward"] == full and flops["backward"] == 2 * full  # it saved the probabilities: 4 matmuls


# ------------------------------------------------------------------------------------------------------ captures


class DropoutAttention(nn.Module):
    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.qkv, self.dropout = nn.Linear(64, 192), dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True).float().square().mean()


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_attention_dropout_still_records_the_fused_kernel(device) -> None:
    """CPU SDPA with dropout falls back to the unfused math path in float32; CUDA runs flash (dropout on chip)."""
    table = capture_ops(DropoutAttention(), torch.randn(2, 32, 64), device=device, precision="bf16-mixed",
                        optimizer=ADAMW)  # fmt: skip
    ops = {o.op: o for o in table.ops}
    assert FLASH_OPS[0] in ops and FLASH_OPS[1] in ops and "aten.bmm.default" not in ops
    assert ops[FLASH_OPS[0]].dtypes[0] == "bfloat16" and ops[FLASH_OPS[0]].flops == 4 * 2 * 4 * (32 * 33 // 2) * 16
    assert any("dropout (p=0.1 x1) run at p=0" in n for n in table.notes)


def _tiny(cls_name: str, **extra):
    import transformers

    configs = {
        "GPT2LMHeadModel": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64},
        "LlamaForCausalLM": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256},
    }  # fmt: skip
    cls = getattr(transformers, cls_name)
    config = cls.config_class(**configs[cls_name], attn_implementation="sdpa", **extra)
    with torch.device("meta"):
        return cls(config)


@pytest.mark.parametrize("model", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_capture_of_a_tiny_sdpa_model_records_cuda_kernels_with_flops(model) -> None:
    tokens = torch.zeros(2, 32, dtype=torch.long)
    capture = capture_step(_tiny(model), {"input_ids": tokens, "labels": tokens}, precision="bf16-mixed",
                           optimizer=ADAMW)  # fmt: skip
    ops = capture.table.ops
    attn = [o for o in ops if "attention" in o.op]
    assert {o.op for o in attn} == set(FLASH_OPS)
    assert not any("for_cpu" in o.op or o.op == "aten.bmm.default" for o in ops)
    heads, kv_heads = 4, (4 if model.startswith("GPT2") else 2)
    fwd = next(o for o in attn if o.phase == "forward")
    bwd = next(o for o in attn if o.phase == "backward")
    assert fwd.shapes[0] == [2, heads, 32, 16] and fwd.shapes[1] == [2, kv_heads, 32, 16]
    assert fwd.count == bwd.count == 2 and fwd.params == {"is_causal": [1]}
    assert fwd.flops == 4 * 2 * heads * (32 * 33 // 2) * 16 and bwd.flops == 2.5 * fwd.flops
    # the step's FLOPs include attention, forward and backward
    assert capture.phase_flops["forward"] >= 2 * fwd.flops and capture.phase_flops["backward"] >= 2 * bwd.flops
    assert any("recorded as the SDPA kernel CUDA would run" in n for n in capture.table.notes)


# ------------------------------------------------------------------------------ the predictor on old records


def test_the_predictor_reads_the_work_from_the_name_when_flops_are_missing() -> None:
    assert attention_work("_scaled_dot_product_flash_attention_for_cpu_backward", None, 1024, 1024, True) == 2.5
    assert attention_work("_scaled_dot_product_flash_attention_for_cpu", None, 1024, 1024, False) == 1.0
    causal = attention_work("_scaled_dot_product_flash_attention", {"is_causal": [1]}, 1024, 1024, False)
    assert causal == pytest.approx(1025 / 2048)
    assert attention_work("_scaled_dot_product_attention_math", {"is_causal": [1]}, 64, 64, True) == 2.0
    # and the module's formulas agree with what the predictor assumes
    q = meta(1, 2, 1024, 64)
    flops = attention.attention_flops(aten._scaled_dot_product_flash_attention.default, (q, q, q, 0.0, True), {})
    assert flops == pytest.approx(causal * 4 * 2 * 1024 * 1024 * 64)

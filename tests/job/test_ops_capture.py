"""The operator table: the recorder (FLOPs, bytes, views, aggregation) and capture_ops on fake and real tensors."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from helpers import TinyModel
from lightning_srifty.profiling.attention import flop_formulas
from lightning_srifty.profiling.capture import capture_ops, capture_step
from lightning_srifty.profiling.cuda_autocast import _registered, policy_names
from lightning_srifty.profiling.ops_capture import OpRecorder
from predictor.exceptions import ConfigError, ProfileError

ADAM = functools.partial(torch.optim.Adam, lr=1e-3)
GEMMS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.convolution.default")


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, stride=2)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return nn.functional.cross_entropy(self.fc(h.flatten(1)), y)


class SmallLM(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, batch_first=True, dropout=0.0)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.block(self.emb(tokens[:, :-1])))
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), tokens[:, 1:].flatten())


def cnn_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(4, 3, 8, 8, generator=g), "y": torch.randint(0, 10, (4,), generator=g)}


def lm_batch() -> torch.Tensor:
    return torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize(
    "make", [lambda: (SmallCNN(), cnn_batch()), lambda: (SmallLM(), lm_batch())], ids=["cnn", "lm"]
)
def test_cpu_and_meta_give_the_same_table(make, precision) -> None:
    model, batch = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    real = capture_ops(model, batch, device="cpu", optimizer=ADAM, precision=precision)
    fake = capture_ops(model, batch, device="meta", optimizer=ADAM, precision=precision)
    assert (real.device, fake.device) == ("cpu", "meta")
    assert len(real.ops) == len(fake.ops)
    differ = {a.op for a, b in zip(real.ops, fake.ops) if a != b}
    # one known torch quirk: the meta kernel of batch norm on a bfloat16 input with float32 weights gives its saved
    # mean/invstd in bfloat16, the CPU (and CUDA) kernels in float32 (a few bytes per layer)
    quirk = {"aten._native_batch_norm_legit.default", "aten.native_batch_norm_backward.default"}
    assert differ == (quirk if precision == "bf16-mixed" and isinstance(model, SmallCNN) else set())
    assert real.skipped == fake.skipped and real.total_flops == fake.total_flops
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the model must be left untouched"


def test_phases_and_adam_foreach_ops() -> None:
    table = capture_ops(SmallCNN(), cnn_batch(), optimizer=ADAM)
    by_phase = {p: {o.op for o in table.ops if o.phase == p} for p in ("forward", "backward", "optimizer")}
    assert "aten.convolution.default" in by_phase["forward"]
    assert "aten.convolution_backward.default" in by_phase["backward"]
    assert {"aten._foreach_lerp_.Scalar", "aten._foreach_addcdiv_.ScalarList"} <= by_phase["optimizer"]
    conv = next(o for o in table.ops if o.op == "aten.convolution.default")
    assert conv.params["stride"] == [2, 2] and conv.params["padding"] == [1, 1] and conv.params["groups"] == [1]
    assert table.samples == 4 and any("foreach" in n for n in table.notes)


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_the_optimizer_step_recorded_is_a_steady_one(device) -> None:
    """The optimizer's first step creates its state once per run (Adam: two zeros_like per parameter; SGD with
    momentum: the buffer cloned from the gradient). The recorded step is the second one, what every later step
    costs: on BERT-large, 788 zeros_like calls, 9 ms of a 66 ms H100 step, were priced per step before."""
    adam = capture_ops(SmallCNN(), cnn_batch(), optimizer=ADAM, device=device)
    ops = {o.op for o in adam.ops if o.phase == "optimizer"}
    assert not any(name in op for op in ops for name in ("zeros", "empty", "clone", "fill")), ops
    assert {"aten._foreach_lerp_.Scalar", "aten._foreach_sqrt.default"} <= ops
    sgd = capture_ops(
        SmallCNN(), cnn_batch(), optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), device=device
    )
    ops = {o.op for o in sgd.ops if o.phase == "optimizer"}
    assert ops == {"aten._foreach_mul_.Scalar", "aten._foreach_add_.List"}, ops  # momentum x m + g; p - lr x m


def test_identical_layers_aggregate_into_one_record() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16))

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).sum()

    table = capture_ops(Loss(), torch.zeros(4, 16), optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    addmm = [o for o in table.ops if o.op == "aten.addmm.default"]
    assert len(addmm) == 1 and addmm[0].count == 3 and addmm[0].flops == 2 * 4 * 16 * 16


def test_flops_equal_flop_counter_mode() -> None:
    """With the attention formulas the table records (torch's count nothing for the CPU's SDPA kernel)."""
    model, batch = SmallLM(), lm_batch()
    capture = capture_step(model, batch, device="cpu", optimizer=ADAM)
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as forward:
        loss = model(batch)
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as backward:
        loss.backward()
    assert capture.phase_flops["forward"] == forward.get_total_flops() > 0
    assert capture.phase_flops["backward"] == backward.get_total_flops() > 0
    assert capture.table.total_flops == forward.get_total_flops() + backward.get_total_flops()


def test_bytes_and_flops_of_a_matmul_and_in_place_ops() -> None:
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    with OpRecorder() as rec:
        c = torch.mm(a, b)
        c.add_(1.0)
        c.zero_()
    mm, add_, zero_ = rec.op_records()
    assert (mm.op, mm.shapes, mm.out_shapes, mm.out_dtype) == (
        "aten.mm.default",
        [[64, 32], [32, 16]],
        [[64, 16]],
        "float32",
    )
    assert mm.flops == 2 * 64 * 32 * 16
    assert mm.bytes_read == (64 * 32 + 32 * 16) * 4 and mm.bytes_written == 64 * 16 * 4
    assert (add_.bytes_read, add_.bytes_written) == (64 * 16 * 4, 64 * 16 * 4)
    assert (zero_.op, zero_.bytes_read, zero_.bytes_written) == ("aten.zero_.default", 0, 64 * 16 * 4)


def test_views_are_skipped_and_counted() -> None:
    x = torch.randn(8, 4)
    with OpRecorder() as rec:
        y = x.view(4, 8).t().transpose(0, 1).expand(2, 4, 8).permute(0, 2, 1)
        y.detach()
        z = y + 1  # the only kernel; the broadcast input is read once
    ops = rec.op_records()
    assert [o.op for o in ops] == ["aten.add.Tensor"] and z.shape == (2, 8, 4)
    assert ops[0].bytes_read == 8 * 4 * 4
    for op in (
        "aten.view.default",
        "aten.t.default",
        "aten.transpose.int",
        "aten.expand.default",
        "aten.permute.default",
    ):
        assert rec.skipped[op] == 1, op


def test_mixed_precision_runs_gemms_in_bf16_and_norms_in_fp32() -> None:
    table = capture_ops(SmallLM(), lm_batch(), optimizer=ADAM, precision="bf16-mixed")
    gemms = [o for o in table.ops if o.op in GEMMS and o.phase != "optimizer"]
    assert gemms and all(o.out_dtype == "bfloat16" and set(o.dtypes) == {"bfloat16"} for o in gemms)
    norms = [o for o in table.ops if o.op == "aten.native_layer_norm.default"]
    assert norms and all(o.dtypes[0] == "float32" for o in norms), "CUDA autocast runs layer_norm in float32"
    assert all(o.dtypes == ["float32"] * len(o.dtypes) for o in table.ops if o.phase == "optimizer")
    half = capture_ops(SmallCNN(), cnn_batch(), optimizer=ADAM, precision="16-mixed")
    conv = next(o for o in half.ops if o.op == "aten.convolution.default")
    assert conv.dtypes == ["float16"] * 3


def test_mixed_precision_gemms_match_cpu_autocast() -> None:
    """Where CPU and CUDA autocast agree (GEMMs), the emulated table equals what real CPU autocast runs."""
    model, batch = SmallLM(), lm_batch()
    emulated = capture_ops(model, batch, optimizer=ADAM, precision="bf16-mixed")
    with OpRecorder() as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        model(batch)

    def gemms(ops):
        return sorted((o.op, str(o.shapes), str(o.dtypes), o.count) for o in ops if o.op in GEMMS)

    cpu = rec.op_records()
    assert gemms(cpu) and gemms(cpu) == gemms([o for o in emulated.ops if o.phase == "forward"])


def test_true_precision_casts_the_module() -> None:
    table = capture_ops(SmallCNN(), cnn_batch(), optimizer=ADAM, precision="bf16-true")
    conv = next(o for o in table.ops if o.op == "aten.convolution.default")
    assert conv.dtypes == ["bfloat16"] * 3
    assert not any(o.op == "aten._to_copy.default" for o in table.ops if o.phase == "forward")


def test_emulated_policy_covers_cuda_autocast_exactly() -> None:
    assert _registered("AutocastCUDA") == set(policy_names())


def test_lightning_module_and_model_sizes() -> None:
    model = TinyModel()
    capture = capture_step(model, (torch.zeros(8, 16), torch.zeros(8, 1)))
    assert capture.parameters == capture.trainable_parameters == sum(p.numel() for p in model.parameters())
    assert capture.gradient_bytes_by_dtype == {"float32": capture.parameters * 4}
    assert capture.optimizer == "SGD" and capture.optimizer_state_bytes == capture.parameters * 4  # momentum
    section = capture.model_section()
    assert section["flops"]["forward_per_sample"] == 2 * (16 * 32 + 32)
    assert capture.table.samples == 8


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(ConfigError, match=r"'precision'.*Got 'fp8'") as err:
        capture_ops(SmallCNN(), cnn_batch(), optimizer=ADAM, precision="fp8")
    assert err.value.parameter == "precision"
    with pytest.raises(ConfigError, match=r"'optimizer' parameter .* required for a plain nn\.Module"):
        capture_ops(SmallCNN(), cnn_batch())
    with pytest.raises(ConfigError, match="'device'"):
        capture_ops(SmallCNN(), cnn_batch(), optimizer=ADAM, device="tpu")
    with pytest.raises(ConfigError, match="'batch_size'"):
        capture_ops(SmallCNN(), {"x": 1}, optimizer=ADAM)


def test_a_data_dependent_step_fails_with_the_fix() -> None:
    class ItemModel(SmallCNN):
        def forward(self, x, y):
            loss = super().forward(x, y)
            if loss.item() > 0:
                return loss
            return loss * 2

    with pytest.raises(ProfileError, match=r"forward .*device='cpu'"):
        capture_ops(ItemModel(), cnn_batch(), optimizer=ADAM)
    assert capture_ops(ItemModel(), cnn_batch(), optimizer=ADAM, device="cpu").ops


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_channels_last_is_recorded_on_the_convolutions_and_what_follows_them(device) -> None:
    """A model and input in channels-last (``.to(memory_format=torch.channels_last)``, as the tutorials do): the
    convolution runs NHWC by PyTorch's rule for cuDNN (its input or weight is), and the batch norm and activation
    after it receive NHWC activations, as on CUDA. A plain model records no layout at all."""
    batch = cnn_batch()
    plain = capture_ops(SmallCNN(), batch, device=device, optimizer=ADAM)
    assert not any((r.params or {}).get("channels_last") for r in plain.ops)
    nhwc = SmallCNN().to(memory_format=torch.channels_last)
    batch = {"x": batch["x"].to(memory_format=torch.channels_last), "y": batch["y"]}
    table = capture_ops(nhwc, batch, device=device, optimizer=ADAM)
    layout = {r.op: bool((r.params or {}).get("channels_last")) for r in table.ops if r.phase == "forward"}
    assert layout["aten.convolution.default"] and layout["aten._native_batch_norm_legit.default"]
    assert layout["aten.relu.default"]
    backward = {r.op: bool((r.params or {}).get("channels_last")) for r in table.ops if r.phase == "backward"}
    assert backward["aten.convolution_backward.default"]
    # the weights alone make a convolution NHWC (PyTorch: input or weight)
    weights_only = capture_ops(SmallCNN().to(memory_format=torch.channels_last), cnn_batch(), device=device,
                               optimizer=ADAM)  # fmt: skip
    nhwc = {r.op for r in weights_only.ops if r.phase == "forward" and (r.params or {}).get("channels_last")}
    assert {"aten.convolution.default", "aten._native_batch_norm_legit.default", "aten.relu.default"} <= nhwc


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_grouped_convolution_s_backward_is_twice_its_forward(device) -> None:
    """torch's formula counts a grouped convolution's weight gradient ``groups`` times over (MobileNet's depthwise
    blocks came out 960x); the table and the step's FLOPs count the input and the weight gradient at the forward's
    FLOPs each, as for a dense convolution."""

    class Depthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
            self.dense = nn.Conv2d(16, 16, 3, padding=1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dense(self.dw(x)).square().mean()

    x = torch.randn(2, 16, 8, 8, requires_grad=False)
    table = capture_ops(Depthwise(), x, device=device, optimizer=ADAM)
    by_groups: dict[tuple[str, int], float] = {}
    for r in table.ops:
        if "convolution" in r.op:
            by_groups[(r.phase, (r.params or {}).get("groups", [1])[0])] = r.flops
    forward_dw = 2 * 2 * 16 * 8 * 8 * 1 * 9
    assert by_groups[("forward", 16)] == forward_dw and by_groups[("forward", 1)] == 16 * forward_dw
    # the input is not a leaf that needs a gradient: the first convolution's backward is its weight gradient alone
    assert by_groups[("backward", 16)] == forward_dw
    assert by_groups[("backward", 1)] == 2 * 16 * forward_dw
    with FlopCounterMode(display=False) as torch_count:
        Depthwise()(x).backward()
    assert torch_count.get_total_flops() > table.total_flops  # torch's own registry still overcounts

"""The CUDA paths (CUDA-event clock, CUDA peak memory, canonical GPU key, NCCL comm hook). Skipped without CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from predictor.documents.profile import load_profile

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for an NCCL run")


@cuda
def test_cuda_event_clock_orders_marks() -> None:
    from lightning_srifty.timing import CudaEventClock

    clock = CudaEventClock(torch.device("cuda"))
    a = clock.mark()
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(10):
        x = x @ x / 2048
    b = clock.mark()
    ta, tb = clock.resolve([a, b])
    assert ta == 0.0 and tb > 0


@cuda
def test_callback_on_cuda(tmp_path) -> None:
    from helpers import TinyModel, loader, trainer
    from lightning_srifty import SriftyCallback

    cb = SriftyCallback(recommend=False, warmup_steps=3, profile_steps=20, output=tmp_path / "p.json", verbose=False)
    t = trainer([cb], max_steps=30, accelerator="cuda")
    t.fit(TinyModel(), train_dataloaders=loader())
    profile = load_profile(tmp_path / "p.json")
    assert profile.timing.window.clock == "cuda_event"
    assert profile.hardware.accelerator == "cuda" and profile.hardware.device_name
    assert profile.memory.peak_allocated_bytes > 0
    assert profile.timing.step_time_s.p50 > 0


@two_gpus
def test_nccl_srifty_ddp(tmp_path, subprocess_env) -> None:
    out = tmp_path / "p.json"
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import lightning.pytorch as pl; "
        "from helpers import TinyModel, loader; from lightning_srifty import SriftyCallback; "
        f"pl.Trainer(accelerator='cuda', devices=2, strategy='srifty_ddp', max_steps=30, logger=False, "
        f"enable_checkpointing=False, callbacks=[SriftyCallback(recommend=False, warmup_steps=5, profile_steps=20, "
        f"output={str(out)!r}, verbose=False)]).fit(TinyModel(hidden=20000), train_dataloaders=loader(4096, 16))"
    )
    script = tmp_path / "run.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=subprocess_env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    comm = load_profile(out).communication
    assert comm.backend == "nccl" and comm.allreduce_s.p50 > 0


@cuda
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_operator_table_on_cuda_equals_the_meta_capture(precision) -> None:
    """The meta capture (CUDA autocast policy emulated, foreach forced) gives what CUDA runs, for a model free of the
    documented device-dependent choices (batch norm's cuDNN kernel, fused attention, fused dropout). As a multiset:
    CUDA's autocast casts a layer's weight and bias in another order than the emulation (seen on an H100,
    2026-11-27), and the predictor sums the table, so the order carries nothing."""
    import functools

    from torch import nn

    from lightning_srifty import capture_ops

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.norm = nn.LayerNorm(8 * 8 * 8)
            self.fc = nn.Linear(8 * 8 * 8, 10)

        def forward(self, x, y):
            h = self.norm(torch.relu(self.conv(x)).flatten(1))
            return nn.functional.cross_entropy(self.fc(h), y)

    batch = {"x": torch.randn(4, 3, 8, 8), "y": torch.randint(0, 10, (4,))}
    adam = functools.partial(torch.optim.Adam, lr=1e-3)
    on_gpu = capture_ops(Net(), batch, device="cuda", optimizer=adam, precision=precision)
    on_meta = capture_ops(Net(), batch, device="meta", optimizer=adam, precision=precision)
    assert sorted(on_gpu.ops, key=repr) == sorted(on_meta.ops, key=repr)

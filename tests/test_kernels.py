"""The per-operator latency model: the artefact, predictions, bad input, and deterministic training."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import ROOT
from predictor.exceptions import PredictionError
from predictor.perf.kernels import CLASSES, KernelModel, gpu_spec, load_kernel_model

KERNELS = ROOT.parent / "shared" / "data" / "kernels"
ARTEFACT = ROOT / "predictor" / "data" / "kernel_model.json"


def test_artefact_records_its_data_and_versions_and_loads_fast() -> None:
    data = json.loads(ARTEFACT.read_text())
    assert set(data["fitted_with"]) == {"python", "numpy", "scikit-learn"}
    assert len(data["trained_on"]) == 8 and set(data["nets"]) == {"gemm", "conv", "elementwise", "norm", "softmax"}
    if KERNELS.exists():
        sys.path.insert(0, str(ROOT / "scripts"))
        import train_kernel_model

        assert data["data_sha256"] == train_kernel_model.data_sha256(KERNELS), "retrain: scripts/train_kernel_model.py"
    assert isinstance(load_kernel_model(), KernelModel)


def _dims(cls: str, scale: float) -> dict[str, np.ndarray]:
    s = np.array([scale])
    return {
        "gemm": {"b": s * 0 + 1, "m": 256 * s, "n": 256 * s, "k": 256 * s},
        "conv": {
            "b": 8 * s,
            "cin": s * 0 + 64,
            "cout": s * 0 + 64,
            "kh": s * 0 + 3,
            "kw": s * 0 + 3,
            "h": s * 0 + 56,
            "w": s * 0 + 56,
            "stride": s * 0 + 1,
            "padding": s * 0 + 1,
            "groups": s * 0 + 1,
        },
        "elementwise": {"n": 1e5 * s, "bytes": 8e5 * s, "flops": s * 0},
        "norm": {"rows": 64 * s, "cols": s * 0 + 1024, "bytes": 64 * 1024 * 8 * s},
        "softmax": {"rows": 64 * s, "cols": s * 0 + 1024, "bytes": 64 * 1024 * 8 * s},
        "reduction": {"n": 1e5 * s, "bytes": 4e5 * s},
        "memory": {"bytes": 8e5 * s},
    }[cls]


@pytest.mark.parametrize("cls", CLASSES)
def test_positive_and_larger_work_takes_longer(catalog, cls) -> None:
    model, gpu = load_kernel_model(), catalog.gpu("A100-SXM-40GB")
    small, big = model.latency(cls, _dims(cls, 1.0), gpu), model.latency(cls, _dims(cls, 256.0), gpu)
    assert small[0] > 1e-6 and np.isfinite(small[0])
    assert big[0] > 1.3 * small[0], (cls, small, big)  # small ones sit on the launch floor


def test_faster_gpu_is_faster_on_big_gemms(catalog) -> None:
    model = load_kernel_model()
    dims = {"b": np.array([1.0]), "m": np.array([8192.0]), "n": np.array([8192.0]), "k": np.array([8192.0])}
    t = {g: model.latency("gemm", dims, catalog.gpu(g))[0] for g in ("T4", "V100-SXM2-16GB", "H100-SXM")}
    assert t["T4"] > t["V100-SXM2-16GB"] > t["H100-SXM"]
    flops = 2 * 8192**3
    assert flops / t["H100-SXM"] < catalog.gpu("H100-SXM").fp32_tflops * 1e12  # never above the roofline


def test_zero_size_gives_the_launch_floor_not_nan(catalog) -> None:
    model, gpu = load_kernel_model(), catalog.gpu("L4")
    for cls in ("elementwise", "memory", "gemm"):
        dims = {k: v * 0 for k, v in _dims(cls, 1.0).items()}
        t = model.latency(cls, dims, gpu)
        assert np.isfinite(t).all() and (t >= 0).all()


def test_bad_input_is_named(catalog) -> None:
    model = load_kernel_model()
    with pytest.raises(PredictionError, match=r"'cls' parameter .* Got 'gemv'"):
        model.latency("gemv", {}, catalog.gpu("L4"))
    no_bw = replace(catalog.gpu("L4"), key="Mystery-GPU", memory_bw_gbps=None)
    with pytest.raises(PredictionError, match=r"Mystery-GPU.*sms.*memory_bw_gbps.*--catalog-extra"):
        gpu_spec(no_bw)
    with pytest.raises(PredictionError, match=r"not fitted yet"):
        KernelModel().latency("gemm", _dims("gemm", 1.0), catalog.gpu("L4"))


@pytest.mark.skipif(not KERNELS.exists(), reason=f"NeuSight kernel data not found at {KERNELS}")
def test_training_is_deterministic_on_a_slice() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_kernel_model as tk

    specs = tk.load_specs(KERNELS)
    rows = [r for r in tk.load_data(KERNELS)["softmax"] if r[0] in specs][:3000]
    fit = {"softmax": tk.arrays(rows, specs)}
    a = KernelModel(max_rows=2000).fit(fit).to_dict()
    b = KernelModel(max_rows=2000).fit(fit).to_dict()
    assert hashlib.sha256(json.dumps(a).encode()).hexdigest() == hashlib.sha256(json.dumps(b).encode()).hexdigest()

"""The transfer oracles of bench/kernel_oracle.py on small synthetic tables: an exact scaling is found exactly, a GPU
whose kernels follow no other GPU is not, and a source that measured too few of the shapes is not used."""

from __future__ import annotations

import numpy as np
import pytest

from _support import bench_module


@pytest.fixture(scope="module")
def oracle():
    return bench_module("kernel_oracle")


def _tables(rng: np.random.Generator) -> dict[str, dict[tuple, float]]:
    shapes = [("mm", float(m), float(n)) for m in range(1, 21) for n in range(1, 11)]
    base = {s: 1e-5 * s[1] * s[2] for s in shapes}
    return {
        "held": {s: 0.5 * t for s, t in base.items()},  # exactly half of "fast"'s latency
        "fast": dict(base),
        "noisy": {s: t * float(np.exp(rng.normal(0, 0.5))) for s, t in base.items()},
        "sparse": {s: t for i, (s, t) in enumerate(base.items()) if i % 3 == 0},  # a third of the shapes
    }


def test_an_exact_scaling_of_another_gpu_is_found(oracle) -> None:
    tables = _tables(np.random.default_rng(0))
    err, src, n = oracle.best_single(tables, "held")
    assert src == "fast" and n == 200 and err < 1.0
    err, sources, n = oracle.log_linear(tables, "held")
    assert "sparse" not in sources and set(sources) == {"fast", "noisy"} and err < 1e-6


def test_a_gpu_that_follows_no_other_is_not_predicted(oracle) -> None:
    rng = np.random.default_rng(1)
    tables = _tables(rng)
    tables["held"] = {s: t * float(np.exp(rng.normal(0, 0.5))) for s, t in tables["held"].items()}
    assert oracle.best_single(tables, "held")[0] > 20
    assert oracle.log_linear(tables, "held")[0] > 20


def test_no_source_with_enough_shapes_gives_no_oracle(oracle) -> None:
    tables = _tables(np.random.default_rng(2))
    only = {"held": tables["held"], "sparse": tables["sparse"]}
    assert oracle.best_single(only, "held") is None and oracle.log_linear(only, "held") is None

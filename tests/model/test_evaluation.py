"""Validation on the published measurements, and the learned cross-GPU correction's artefact."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import ROOT
from lightning_srifty.cli import main
from predictor.catalog.gpus import bundled_gpus
from predictor.model import correction as corr
from predictor.validation import (
    build_cases,
    correction_training_set,
    cross_validate,
    load_points,
    summarize_cases,
    train_correction,
)
from predictor.validation.harness import ACROSS_TF32, ANALYTIC_ROW, FLOPS_ROW, LOGO_ROW, WITHIN_TF32

DATA = ROOT / "predictor" / "data" / "measurements.csv"


def test_bundled_measurements_are_the_shared_file_verbatim() -> None:
    """The build copies measurements.csv byte for byte (sources.json records both sha256s); where the shared reference
    data is present, it is still the file the bundled copy was built from."""
    manifest = json.loads((DATA.parent / "sources.json").read_text())
    sha = hashlib.sha256(DATA.read_bytes()).hexdigest()
    assert sha == manifest["outputs"]["measurements.csv"] == manifest["sources"]["measurements.csv"]
    shared = ROOT.parent / "shared" / "data" / "measurements.csv"
    if shared.exists():
        assert hashlib.sha256(shared.read_bytes()).hexdigest() == sha, "run python scripts/build_data.py"


def test_points_merge_repeats_and_measure_their_spread() -> None:
    points = load_points(DATA)
    h100 = [
        p
        for p in points
        if p.source == "lambdal"
        and p.model == "ResNet-50"
        and p.gpu == "H100-SXM"
        and p.precision == "16-mixed"
        and p.gpus == 1
    ]
    assert len(h100) == 1 and h100[0].repeats > 10 and 0 < h100[0].cv < 0.1
    assert not any(p.gpu in ("RTX6000Ada", "QuadroRTX8000") for p in points)  # no specs for those


def test_cases_and_leave_one_out_folds() -> None:
    gpus = bundled_gpus()
    cases = build_cases(load_points(DATA, gpus), gpus)
    scaling = [c for c in cases if c.kind == "scaling"]
    assert len(scaling) >= 150 and all(c.dst.gpus > 1 and c.src.gpus == 1 for c in scaling)
    assert all(c.dst.throughput <= 1.25 * c.dst.gpus * c.src.throughput for c in scaling)
    logo = cross_validate(cases, lambda c: [c.src.gpu, c.dst.gpu], gpus)
    assert len(logo) == len([c for c in cases if c.kind == "cross"])
    summary = summarize_cases(logo)
    assert 0.02 < summary["mape"] < 0.5, summary  # a held-out error, neither perfect nor absurd


def test_held_out_gpu_never_trains_its_fold(monkeypatch) -> None:
    gpus = bundled_gpus()
    cases = build_cases(load_points(DATA, gpus), gpus)
    X, _, kept = correction_training_set(cases, gpus)
    rows_of = {tuple(x): c for x, c in zip(X, kept)}  # same features -> same GPU pair
    trained_on = []
    real_fit = corr.CrossGpuCorrection.fit

    def spy(self, X, y):
        trained_on.append({g for x in X for g in (rows_of[tuple(x)].src.gpu, rows_of[tuple(x)].dst.gpu)})
        return real_fit(self, X, y)

    monkeypatch.setattr(corr.CrossGpuCorrection, "fit", spy)
    predicted = cross_validate(cases, lambda c: [c.src.gpu, c.dst.gpu], gpus)
    pairs = sorted({frozenset((c.src.gpu, c.dst.gpu)) for c in kept}, key=sorted)
    assert len(trained_on) == len(pairs)  # one fit per GPU pair ...
    for pair, gpus_seen in zip(pairs, trained_on):
        assert not pair & gpus_seen  # ... that saw neither GPU of the pair
    assert len(predicted) == len(kept)


def test_artefacts_record_the_bundled_data_and_load_without_training(monkeypatch) -> None:
    import builtins

    from predictor.model import artefact

    sha = hashlib.sha256(DATA.read_bytes()).hexdigest()
    committed = json.loads((ROOT / "predictor" / "data" / "correction.json").read_text())
    model = json.loads((ROOT / "predictor" / "data" / "model_v3.json").read_text())
    assert committed["data_sha256"] == sha == model["data_sha256"], "refit: python scripts/fit_model.py"
    # loading reads plain numbers: no scikit-learn, no training, whatever the installed versions
    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise AssertionError("loading the model imported scikit-learn")
        return real_import(name, *args, **kwargs)

    corr.load_correction.cache_clear()
    artefact.model_artefact.cache_clear()
    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    try:
        assert corr.load_correction().coef_ == committed["coef"]
        assert artefact.model_artefact()["scaling"] == model["scaling"]
    finally:
        monkeypatch.setattr(builtins, "__import__", real_import)
        corr.load_correction.cache_clear()
        artefact.model_artefact.cache_clear()


def test_correction_refit_matches_the_artefact_within_float_noise() -> None:
    """Ridge has no randomness: another scikit-learn may differ in the last digits only. So the refit is compared with
    the committed artefact within float noise (coefficients, residual spread, predictions on every training row), and
    the scikit-learn version the artefact records is provenance, never compared: this passes on any version that
    fits the same Ridge, and fails on any that fits another."""
    committed = json.loads((ROOT / "predictor" / "data" / "correction.json").read_text())
    model, fresh = train_correction()
    assert fresh["coef"] == pytest.approx(committed["coef"], rel=1e-6, abs=1e-9)
    assert fresh["residual_sd"] == pytest.approx(committed["residual_sd"], rel=1e-6)
    assert fresh["gpus"] == committed["gpus"] and fresh["n_samples"] == committed["n_samples"]
    gpus = bundled_gpus()
    X, _, _ = correction_training_set(build_cases(load_points(DATA, gpus), gpus), gpus)
    loaded = corr.CrossGpuCorrection.from_dict({**committed, "sklearn_version": "0.0-another"})
    assert len(X) == committed["n_samples"]
    assert max(abs(model.predict_one(x) - loaded.predict_one(x)) for x in X) < 1e-6  # log time ratios


def test_unfitted_correction_says_what_to_call() -> None:
    with pytest.raises(corr.NotFittedError, match=r"call fit\(X, y\) first"):
        corr.CrossGpuCorrection().predict_one([0.0] * len(corr.FEATURES))


@pytest.mark.slow  # every validation of the README table, then a figure: ~20 s on 2 cores
def test_eval_command_prints_and_plots(tmp_path, capsys, monkeypatch) -> None:
    """The README command, run outside the repository: the bundled measurements are the default data."""
    monkeypatch.chdir(tmp_path)
    png = tmp_path / "fig.png"
    assert main(["eval", "--format", "json", "--plot", "fig.png"]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out[: out.rindex("}") + 1])
    paths = (ANALYTIC_ROW, FLOPS_ROW, LOGO_ROW)  # every path without an operator table, and its two regimes
    assert set(rows) == {
        "same-GPU scaling, no data-parallel losses (perfect overlap)",
        "same-GPU scaling, data-parallel losses fitted leave-one-model-out",
        "cross-GPU + learned correction, leave-one-model-out",
        *paths,
        *(path + regime for path in paths for regime in (ACROSS_TF32, WITHIN_TF32)),
    }
    for path in paths:
        across, within = rows[path + ACROSS_TF32], rows[path + WITHIN_TF32]
        assert across["cases"] + within["cases"] == rows[path]["cases"] and across["cases"] >= 30
        # each regime's interval is its own width (80 % of its cases inside), and the path's held-out coverage is
        # the two regimes' together
        assert abs(across["coverage_80"] - 0.8) < 0.04 and abs(within["coverage_80"] - 0.8) < 0.04
        inside = across["coverage_80_nested"] * across["cases"] + within["coverage_80_nested"] * within["cases"]
        assert rows[path]["coverage_80_nested"] == pytest.approx(inside / rows[path]["cases"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.csv", None, "does not exist or is not a file"),
        ("other.csv", "a,b\n1,2\n", "is not a measurements CSV: it has no source_repo"),
    ],
)
def test_eval_with_a_bad_data_path_says_so_without_a_traceback(tmp_path, capsys, name, content, message) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["eval", "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err and "Traceback" not in err
    assert "leave data out" in err

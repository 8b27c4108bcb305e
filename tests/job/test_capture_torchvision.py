"""``srifty capture torchvision:NAME``: a torchvision model builder by name (issue #38 item 6's "torchvision and
transformers names"), trained as torchvision's reference recipe trains it (cross entropy, SGD with momentum). The
tests build a small torchvision package of their own (the real one is not a dependency, and PyPI's CUDA torchvision
does not load against the CPU torch this project tests with); the real one is tried where it is installed."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from predictor.documents.profile import load_profile

MODELS = '''
import torch
from torch import nn


def tiny_cnn(num_classes=1000, weights=None):
    """A builder as torchvision writes them: keyword arguments, no weights unless asked."""
    if weights is not None:
        raise ValueError("no weights here")
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes),
    )
    net.num_classes = num_classes
    return net


class TinyNet(nn.Module):  # a class, not a builder
    pass


def widths_from_tensors(num_classes=1000):
    """As RegNet's builders do: widths computed with tensor ops, which have no values on the meta device."""
    width = int(torch.arange(4).sum().item()) + 2  # 8
    return nn.Sequential(nn.Conv2d(3, width, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))


def list_models(module=None):
    classifiers = ["tiny_cnn", "widths_from_tensors"]
    return classifiers if module is not None else [*classifiers, "fasterrcnn_resnet50_fpn"]  # every kind
'''


def _package(root, init: str = "") -> None:
    (root / "torchvision" / "models").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(init)
    (root / "torchvision" / "models" / "__init__.py").write_text(textwrap.dedent(MODELS))


@pytest.fixture
def no_torchvision_loaded():
    """No torchvision in ``sys.modules`` during the test, and afterwards what was there before (never the test's own
    stand-in, nor the stub package a fallback installs)."""
    saved = {m: mod for m, mod in sys.modules.items() if m == "torchvision" or m.startswith("torchvision.")}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.fixture
def torchvision_here(tmp_path, monkeypatch, no_torchvision_loaded):
    """A torchvision of the test's own, first on the path."""
    _package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _capture(tmp_path, *args: str) -> int:
    from lightning_srifty.cli import main

    return main(["capture", *args, "--out", str(tmp_path / "p.json")])


def test_a_torchvision_builder_is_captured_with_sgd_on_images(torchvision_here, tmp_path) -> None:
    argv = ["torchvision:tiny_cnn", "--init-args", '{"num_classes": 10}', "--image-size", "32", "--batch-size", "4"]
    assert _capture(tmp_path, *argv, "--precision", "16-mixed") == 0
    profile = load_profile(tmp_path / "p.json")
    assert profile.model.name == "tiny_cnn" and profile.batch.per_device == 4
    assert profile.hardware.accelerator == "meta" and profile.model.precision == "16-mixed"
    convs = [o for o in profile.ops.ops if "convolution" in o.op and o.phase == "forward"]
    assert {tuple(o.shapes[0]) for o in convs} == {(4, 3, 32, 32), (4, 8, 32, 32)}  # 32 px, 3-channel images
    assert any((o.params or {}).get("groups") == (8,) for o in convs)  # the depthwise one, as recorded
    linear = [o for o in profile.ops.ops if o.phase == "forward" and o.op == "aten.addmm.default"]
    assert linear and linear[0].shapes[-1][-1] == 10  # --init-args reached the builder: 10 classes
    optimizer = [o for o in profile.ops.ops if o.phase == "optimizer"]
    assert optimizer  # SGD with momentum and weight decay: the reference recipe's step is captured
    assert profile.model.parameters == sum(
        n for n in (3 * 8 * 9 + 8, 8 + 8, 8 * 9 + 8, 8 + 8, 8 * 10 + 10)
    )  # conv, bn, depthwise conv, bn, linear


def test_a_builder_that_computes_its_widths_is_built_on_the_cpu_then_captured_on_meta(
    torchvision_here, tmp_path
) -> None:
    assert _capture(tmp_path, "torchvision:widths_from_tensors", "--image-size", "16", "--batch-size", "2") == 0
    profile = load_profile(tmp_path / "p.json")
    assert profile.model.parameters == 3 * 8 * 9 + 8 + 8 * 1000 + 1000 and profile.hardware.accelerator == "meta"


def test_channels_last_and_a_global_batch_apply_to_a_torchvision_model(torchvision_here, tmp_path) -> None:
    argv = ["torchvision:tiny_cnn", "--image-size", "32", "--batch-size", "4", "--global-batch", "16"]
    assert _capture(tmp_path, *argv, "--channels-last") == 0
    profile = load_profile(tmp_path / "p.json")
    assert any((o.params or {}).get("channels_last") for o in profile.ops.ops if "convolution" in o.op)
    assert profile.batch.accumulate_grad_batches == 4  # 16 a step: four micro-steps of the captured 4


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["torchvision:tiny_cnnn", "--image-size", "32"], "Did you mean 'tiny_cnn'"),
        (["torchvision:TinyNet", "--image-size", "32"], "no model builder 'TinyNet'"),
        (["torchvision:tiny_cnn"], "--image-size is required for a torchvision model"),
        (["torchvision:tiny_cnn", "--seq-len", "8"], "--seq-len is not for a torchvision model"),
        (["torchvision:tiny_cnn", "--image-size", "32", "--config", "{}"], "--config is not for a torchvision"),
        (["torchvision:tiny_cnn", "--batch", "pkg.data:make_batch"], "capture the LightningModule that trains it"),
        (["torchvision:tiny_cnn", "--image-size", "32", "--lora-rank", "4"], "--lora-rank is not for a torchvision"),
        (["torchvision:fasterrcnn_resnet50_fpn", "--image-size", "32"], "is not a classification model"),
        (["torchvision:tiny_cnn", "--image-size", "32", "--init-args", '{"weights": "IMAGENET1K_V1"}'],
         "would download them: leave weights out"),
        (["torchvision.models:tiny_cnn", "--image-size", "32"], "give it as torchvision:tiny_cnn"),
        (["torchvision:tiny_cnn", "--image-size", "32", "--init-args", '{"num_classes": "ten"}'],
         "could not be built on the meta device"),
    ],
)  # fmt: skip
def test_bad_torchvision_input_names_the_flag(args, expected, torchvision_here, tmp_path, capsys) -> None:
    assert _capture(tmp_path, *args, "--batch-size", "2") == 2
    assert expected in capsys.readouterr().err


def test_torchvision_not_installed_says_how_to_install_it(tmp_path, monkeypatch, capsys) -> None:
    from lightning_srifty.cli import capture

    real = importlib.util.find_spec
    monkeypatch.setattr(capture.importlib.util, "find_spec", lambda n, *a: None if n == "torchvision" else real(n, *a))
    assert _capture(tmp_path, "torchvision:resnet50", "--image-size", "32", "--batch-size", "2") == 2
    err = capsys.readouterr().err
    assert "MODEL 'torchvision:resnet50': torchvision is not installed" in err
    assert "--index-url https://download.pytorch.org/whl/cpu" in err


def test_compiled_operators_that_do_not_load_leave_the_builders(
    tmp_path, monkeypatch, capsys, no_torchvision_loaded
) -> None:
    """PyPI's CUDA torchvision beside a CPU torch fails in its ``__init__`` ("operator torchvision::nms does not
    exist"); the builders are plain Python and a meta-device capture runs none of those operators."""
    _package(tmp_path, init='raise RuntimeError("operator torchvision::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _capture(tmp_path, "torchvision:tiny_cnn", "--image-size", "16", "--batch-size", "2") == 0
    err = capsys.readouterr().err
    assert "compiled operators do not load against this torch" in err and "tiny_cnn:" in err
    assert not hasattr(sys.modules["torchvision"], "__file__")  # the stub the fallback entered the package by


def test_a_module_that_imports_a_mismatched_torchvision_is_said_as_such(tmp_path, monkeypatch, capsys) -> None:
    """Lightning (and any module of the user's) imports torchvision: a CUDA torchvision beside a CPU torch fails
    there with "operator torchvision::nms does not exist", which is not a spelling or PYTHONPATH problem."""
    (tmp_path / "brokenvision.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _capture(tmp_path, "brokenvision:Model", "--batch", "brokenvision:make", "--batch-size", "2") == 2
    err = capsys.readouterr().err
    assert "imports torchvision, whose compiled operators do not load" in err and "whl/cpu" in err
    # any command that imports Lightning meets it (srifty demo did, with a 50-line traceback): one line, the fix
    from lightning_srifty.cli import capture

    def lightning_import(args):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(capture, "cmd_capture", lightning_import)
    assert _capture(tmp_path, "pkg.mod:Model", "--batch-size", "2") == 2
    assert "torchvision's compiled operators do not load against this torch" in capsys.readouterr().err
    assert not capture.torchvision_mismatch(RuntimeError("CUDA out of memory"))


def test_a_lazy_packages_class_whose_import_meets_a_mismatched_torchvision_is_said_as_such(
    tmp_path, monkeypatch, capsys
) -> None:
    """A trial: ``srifty capture transformers:LlamaForCausalLM`` beside PyPI's torchvision and a CPU torch printed a
    72-line traceback ending "Could not import module 'LlamaForCausalLM'": transformers imports the class's module
    when the attribute is asked for (a lazy package), and that imports torchvision. Said in one line, with the fix."""
    (tmp_path / "lazypkg.py").write_text(
        "def __getattr__(name):\n"
        "    try:\n"
        '        raise RuntimeError("operator torchvision::nms does not exist")\n'
        "    except RuntimeError as exc:\n"
        '        raise ModuleNotFoundError(f"Could not import module {name!r}") from exc\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _capture(tmp_path, "lazypkg:LlamaForCausalLM", "--batch", "lazypkg:make", "--batch-size", "2") == 2
    err = capsys.readouterr().err
    assert "importing lazypkg.LlamaForCausalLM imports torchvision, whose compiled operators do not load" in err
    assert "whl/cpu" in err and "pip uninstall torchvision" in err and "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_a_real_torchvision_resnet18_is_captured(tmp_path) -> None:
    assert _capture(tmp_path, "torchvision:resnet18", "--image-size", "64", "--batch-size", "2") == 0
    assert load_profile(tmp_path / "p.json").model.parameters == 11_689_512

"""``srifty capture pkg.mod:Model --batch pkg.mod:make_batch --batch-size 8``: a profile without a GPU.

The LightningModule is built on the meta device (no memory), ``make_batch(batch_size)`` is called under the meta
device too, and one training step is captured with fake tensors (:func:`~lightning_srifty.profiling.capture_step`).
A transformers model class is built from its configuration instead (``srifty capture transformers:LlamaForCausalLM
--config '{"num_hidden_layers": 32, ...}' --seq-len 2048 --batch-size 1``, no weights, nothing downloaded), trained
with AdamW on ``input_ids = labels`` (an image classifier, ``transformers:ResNetForImageClassification --image-size
224``, on ``pixel_values`` and class labels); ``--lora-rank 16`` freezes it and trains adapters on q/v projections. A
torchvision model (``srifty capture torchvision:resnet50 --image-size 224 --batch-size 256``) is built by its builder
(``--init-args`` its keyword arguments, no weights) and trained as torchvision's reference recipe trains it: cross
entropy, SGD with momentum 0.9 and weight decay 1e-4 (``references/classification/train.py``). The
profile has the operator table, the model's sizes, FLOPs and structure (repeated block, activation bytes per sample),
``hardware.accelerator = "meta"`` and ``timing.step_time_s.p50 = 0``: the time is not measured, the predictor predicts
it from the table."""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import importlib.util
import json
import os
import re
import sys
import types
from typing import Any

from lightning_srifty.cli._common import positive_int
from predictor.documents.atomic import read_bounded
from predictor.documents.profile import LEGACY_PRECISION
from predictor.exceptions import ConfigError, did_you_mean

PRECISIONS = ("32-true", "64-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


def _lightning_precision(value: str) -> str:
    """Lightning's short precision names as ``Trainer(precision=...)`` reads them (``bf16`` is ``bf16-mixed``): the
    parser's closest-name hint offered bf16-true for bf16, a different training (no FP32 master weights)."""
    return LEGACY_PRECISION.get(value.strip(), value)


_MAX_BYTES = 2**40  # a batch tensor above 1 TiB is a typo in a shape, not a batch
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# bounds on what a capture may be asked (issue #23 item 9: 100,000 layers ran for minutes): the time grows with the
# layers (256 take 25 s on 2 cores) and the deepest model trained so far has about 130; the submodule count allows a
# 256-expert MoE of 61 layers (about 47,000); the longest context trained is about 10M tokens
MAX_LAYERS = 512
MAX_MODULES = 60_000
MAX_SEQ_LEN = 1 << 24


def resolve(path: str, flag: str) -> Any:
    """``pkg.module:attr`` -> the object; ConfigError naming the flag, the value and the fix."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{flag} {path!r}: expected an import path 'package.module:Name' (a colon between the module and the "
            "attribute).",
            parameter=flag,
            value=path,
        )
    if not _MODULE.match(module_name):  # ./models/net.py or .net: a file path or a relative import, not a module
        dotted = module_name.removesuffix(".py").lstrip("./").replace("/", ".") or "package.module"
        raise ConfigError(
            f"{flag} {path!r}: {module_name!r} is not a module name: give the dotted import path from a folder on "
            f"PYTHONPATH (the current folder is), e.g. {dotted}:{attr} for ./{dotted.replace('.', '/')}.py.",
            parameter=flag,
            value=path,
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the module's own code raised on import
        raise _import_failed(flag, path, f"module {module_name!r}", exc) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            found = hasattr(obj, part)  # a lazy package (transformers) imports the attribute's module here
        except Exception as exc:  # noqa: BLE001 - that module's own import failed: say which and why
            raise _import_failed(flag, path, f"{module_name}.{part}", exc) from None
        if not found:
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" {did_you_mean(close)}" if close else ""
            raise ConfigError(
                f"{flag} {path!r}: {module_name} has no attribute {part!r}.{hint}", parameter=flag, value=path
            )
        obj = getattr(obj, part)
    return obj


def _import_failed(flag: str, path: str, what: str, exc: BaseException) -> ConfigError:
    """The refusal for ``what`` (a module, or a lazy package's attribute) whose import raised ``exc``: torchvision's
    operators not loading against this torch (anywhere in the chain: transformers imports torchvision when it is
    installed, and reported "Could not import module 'LlamaForCausalLM'" over it, in a 70-line traceback), else the
    error itself."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    mismatch = next((c for c in chain if torchvision_mismatch(c)), None)
    if mismatch is not None:
        return ConfigError(
            f"{flag} {path!r}: importing {what} imports torchvision, whose compiled operators do not load against "
            f"this torch ({mismatch}): {TORCHVISION_FIX}; or pip uninstall torchvision, which a transformers text "
            "model does not need.",
            parameter=flag,
            value=path,
        )
    return ConfigError(
        f"{flag} {path!r}: {what} cannot be imported ({type(exc).__name__}: {exc}). Check the spelling, and that its "
        "folder is on PYTHONPATH (run from the project root or pip install -e it).",
        parameter=flag,
        value=path,
    )


def _json_object_arg(source: str, flag: str, text: str, fix: str = "") -> Any:
    """``source`` parsed as JSON for ``flag`` (given as ``text``): ConfigError for text that is not JSON, or that
    nests deeper than the parser recurses (a 100,000-deep file was a RecursionError)."""
    from predictor.documents.atomic import nesting_depth

    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        why = f"not JSON ({exc.msg} at character {exc.pos})"
    except RecursionError:
        why = f"nested {nesting_depth(source):,} deep, which no configuration is"
    except ValueError as exc:  # an integer literal over sys.get_int_max_str_digits()
        why = f"not readable as JSON ({exc})"
    shown = text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"
    raise ConfigError(f"{flag} {shown!r}: {why}.{' ' + fix if fix else ''}", parameter=flag, value=text)


def _init_args(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    value = _json_object_arg(text, "--init-args", text, "Give a JSON object, e.g. --init-args '{\"hidden\": 1024}'.")
    if not isinstance(value, dict):
        raise ConfigError(
            f"--init-args {text!r}: expected a JSON object of keyword arguments, got {type(value).__name__}.",
            parameter="--init-args",
            value=text,
        )
    return value


def _check_batch(batch: Any, path: str) -> None:
    import torch
    from torch.utils._pytree import keystr, tree_flatten_with_path

    known = {
        torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.uint8,
        torch.int8, torch.int16, torch.int32, torch.int64,
    }  # fmt: skip
    leaves, _ = tree_flatten_with_path(batch)
    tensors = [(keystr(k) or "batch", v) for k, v in leaves if isinstance(v, torch.Tensor)]
    if not tensors:
        raise ConfigError(
            f"--batch {path!r} returned {type(batch).__name__} with no tensor: return the batch as the DataLoader "
            "yields it (tensors, or tuples/dicts of tensors).",
            parameter="--batch",
            value=path,
        )
    for where, t in tensors:
        shape = list(t.shape)
        if t.dtype not in known:
            raise ConfigError(
                f"--batch {path!r}: tensor {where} has dtype {t.dtype}, which a training batch does not use here. "
                "Use a float (float32, bfloat16...), integer or bool tensor.",
                parameter="--batch",
                value=path,
            )
        if t.numel() == 0:
            raise ConfigError(
                f"--batch {path!r}: tensor {where} has the zero-size shape {shape}. Every dimension of an example "
                "batch must be >= 1 (check --batch-size and the sizes make_batch uses).",
                parameter="--batch",
                value=path,
            )
        if t.numel() * t.element_size() > _MAX_BYTES:
            raise ConfigError(
                f"--batch {path!r}: tensor {where} of shape {shape} would take "
                f"{t.numel() * t.element_size() / 2**40:.1f} TiB, more than any GPU holds: a shape is wrong.",
                parameter="--batch",
                value=path,
            )


def _is_transformers_model(cls: Any) -> bool:
    """A transformers ``PreTrainedModel`` class (built from its configuration, trained with AdamW)."""
    return isinstance(cls, type) and hasattr(cls, "config_class") and hasattr(cls, "from_pretrained")


TORCHVISION = "torchvision:"
# PyPI's torchvision is a CUDA build; beside a CPU torch its compiled operators do not register, and every import of
# it (Lightning's among them) fails with "operator torchvision::nms does not exist"
TORCHVISION_FIX = (
    "install the torchvision built for this torch: for a CPU torch, pip install torchvision --index-url "
    "https://download.pytorch.org/whl/cpu (pytorch.org/get-started/previous-versions lists the version pairs)"
)


def torchvision_mismatch(exc: BaseException) -> bool:
    """Whether ``exc`` is a torchvision whose compiled operators do not load against the installed torch."""
    return "torchvision::" in str(exc) and "does not exist" in str(exc)


def torchvision_models(model: str = "torchvision:NAME") -> Any:
    """``torchvision.models``. Where torchvision's compiled operators do not load against the installed torch (PyPI's
    CUDA torchvision beside a CPU torch: "operator torchvision::nms does not exist"), the package is entered without
    its ``__init__``: the model builders are plain Python, and a meta-device capture runs none of those operators."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.submodule_search_locations is None:
        raise ConfigError(
            f"MODEL {model!r}: torchvision is not installed: {TORCHVISION_FIX}.", parameter="MODEL", value=model
        )
    try:
        return importlib.import_module("torchvision.models")
    except Exception as exc:  # noqa: BLE001 - RuntimeError / ImportError / OSError of its compiled operators
        print(
            f"torchvision's compiled operators do not load against this torch ({type(exc).__name__}: {exc}); its "
            "model builders are used without them (a meta-device capture runs none). Lightning imports torchvision "
            f"and fails the same way: {TORCHVISION_FIX}.",
            file=sys.stderr,
        )
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        package = types.ModuleType("torchvision")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["torchvision"] = package
        return importlib.import_module("torchvision.models")


def _torchvision_builder(model: str) -> Any:
    """The builder ``torchvision.models.NAME`` of MODEL ``torchvision:NAME``."""
    name = model[len(TORCHVISION) :]
    models = torchvision_models(model)
    builder = getattr(models, name, None) if name.isidentifier() and not name.startswith("_") else None
    if not callable(builder) or isinstance(builder, type):
        listed = getattr(models, "list_models", None)
        if callable(listed) and name in listed():  # detection, segmentation, video, optical flow
            raise ConfigError(
                f"MODEL {model!r} is not a classification model: torchvision:NAME takes torchvision.models' image "
                "classifiers (images in, class logits out). Capture the LightningModule that trains it "
                "(package.module:Class --batch package.module:make_batch).",
                parameter="MODEL",
                value=model,
            )
        names = sorted(listed(module=models)) if callable(listed) else [n for n in dir(models) if n.islower()]
        close = difflib.get_close_matches(name, [n for n in names if not n.startswith("_")], n=3)
        hint = f" {did_you_mean(close)}" if close else ""
        raise ConfigError(
            f"MODEL {model!r}: torchvision.models has no model builder {name!r}.{hint} Give a builder's name "
            "(torchvision.models.list_models() lists them: resnet50, efficientnet_b0, vit_b_16, ...).",
            parameter="MODEL",
            value=model,
        )
    return builder


def _built_on_meta(builder: Any, init_args: dict[str, Any]) -> Any:
    """``builder(**init_args)`` on the meta device. A builder that computes its widths from tensor values (RegNet's
    ``torch.arange`` widths: "Cannot copy out of meta tensor") is built on the CPU and moved there: torchvision's
    largest builders hold about 650M parameters (2.6 GB in FP32) for that moment."""
    import torch

    try:
        with torch.device("meta"):
            return builder(**init_args)
    except (NotImplementedError, RuntimeError) as exc:
        if "meta" not in str(exc):
            raise
    return builder(**init_args).to("meta")


def vision_classifier(net: Any, label_smoothing: float = 0.0) -> Any:
    """``net`` (images -> logits) as a module whose forward is the training loss: cross entropy on class labels
    (``pixel_values``, ``labels``). Its ``config`` says what its batch is (3-channel images), as a transformers
    classifier's does."""
    import torch
    import torch.nn.functional as F

    class Classifier(torch.nn.Module):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net
            classes = getattr(net, "num_classes", None) or 1000
            self.config = types.SimpleNamespace(num_channels=3, num_labels=classes)

        def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            out = self.net(pixel_values)
            logits = out.logits if hasattr(out, "logits") else out  # GoogLeNet / Inception's training outputs
            return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)

    return Classifier(net)


def _transformers_config(cls: Any, text: str | None) -> Any:
    """The configuration of ``cls`` from ``--config``: a JSON object of its keyword arguments or a config.json."""
    from pathlib import Path

    if text is None:
        return cls.config_class()
    source = text
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise ConfigError(
                f"--config {text!r}: neither a JSON object nor a config.json file. Give e.g. "
                '--config \'{"hidden_size": 4096, "num_hidden_layers": 32}\' or the path of a saved config.json '
                "(no download: hub names are not fetched).",
                parameter="--config",
                value=text,
            )
        try:
            source = read_bounded(path, 16 << 20).decode("utf-8", errors="replace")  # a config.json is a few KB
        except OSError as exc:
            raise ConfigError(
                f"--config {text!r}: cannot read it ({exc.strerror or exc}).", parameter="--config", value=text
            ) from None
    values = _json_object_arg(source, "--config", text)
    if not isinstance(values, dict):
        raise ConfigError(
            f"--config {text!r}: expected a JSON object of {cls.config_class.__name__} arguments, got "
            f"{type(values).__name__}.",
            parameter="--config",
            value=text,
        )
    values.pop("model_type", None)
    values.pop("architectures", None)
    _check_declared(cls.config_class, values, text)
    try:
        config = cls.config_class(**values)
    except Exception as exc:  # noqa: BLE001 - the configuration class's own validation, re-worded with the flag
        raise ConfigError(
            f"--config: {cls.config_class.__name__} refused it ({type(exc).__name__}: {exc}). Check the values.",
            parameter="--config",
            value=text,
        ) from None
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > MAX_LAYERS:
        raise ConfigError(
            f"--config: num_hidden_layers {layers:,} is over {MAX_LAYERS}, which no trained model has (the deepest "
            "have about 130) and which a capture would take minutes for. Capture the real depth.",
            parameter="--config",
            value=text,
        )
    return config


def _check_declared(config_class: Any, values: dict[str, Any], text: str) -> None:
    """A configuration class keeps a key it does not take as a plain attribute that no part of the model reads: a
    misspelt ``num_hidden_layer`` built the default 32 layers, and the capture was of another model (a trial's 13B
    came out 10.5B). A key is taken when the default configuration has it, or when the class does not keep it as
    given or it changes another value (``rope_theta`` -> ``rope_parameters``, ``torch_dtype`` -> ``dtype`` in
    transformers 5). An inert key
    close to a taken one is refused with the name; any other is said (a saved config.json carries keys of its own,
    e.g. its ``transformers_version``)."""
    try:
        default = config_class().to_dict()
    except Exception:  # noqa: BLE001 - a class whose defaults do not build: its own call says what it needs
        return
    taken = set(default) | set(getattr(config_class, "attribute_map", None) or {})
    inert = []
    for key in [k for k in values if k not in taken]:
        try:
            given = config_class(**{key: values[key]}).to_dict()
        except Exception:  # noqa: BLE001 - refused alone: the whole call below says why
            continue
        # kept as it was given and nothing else moved: a consumed key is popped (rope_theta is not in the dict)
        if key in given and all(given.get(name) == value for name, value in default.items()):
            inert.append(key)
    for key in inert:
        close = difflib.get_close_matches(key, sorted(taken), n=1, cutoff=0.8)
        if close:
            raise ConfigError(
                f"--config key {key!r} is not a {config_class.__name__} argument: {did_you_mean(close)} The class "
                "would keep it as an attribute no part of the model reads, and build its default instead.",
                parameter="--config",
                value=key,
            )
    if inert:
        print(
            f"--config: {config_class.__name__} takes none of {', '.join(map(repr, inert))}: kept as attributes no "
            "part of the model reads (check the spelling if you meant to change the model).",
            file=sys.stderr,
        )


def _build(cls: Any, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The model on the meta device, and what describes it (its init arguments or configuration)."""
    import torch

    if args.model.startswith(TORCHVISION):
        init_args = _init_args(args.init_args)
        if weights := [k for k in ("weights", "weights_backbone") if init_args.get(k) is not None]:
            raise ConfigError(
                f"--init-args {weights[0]}={init_args[weights[0]]!r}: a capture needs no weights (it runs on the meta "
                f"device) and would download them: leave {weights[0]} out.",
                parameter="--init-args",
                value=args.init_args,
            )
        try:
            return vision_classifier(_built_on_meta(cls, init_args)), {"init_args": init_args}
        except Exception as exc:  # noqa: BLE001 - re-worded with the fix
            raise _init_args_error(args, init_args, exc, "Check the builder's arguments.") from None
    if _is_transformers_model(cls):
        config = _transformers_config(cls, args.config)
        try:
            with torch.device("meta"):
                return cls(config), {"config": args.config}
        except Exception as exc:  # noqa: BLE001 - re-worded with the fix
            raise ConfigError(
                f"MODEL {args.model!r} could not be built on the meta device from --config {args.config!r}: "
                f"{type(exc).__name__}: {exc}. Check the configuration's values.",
                parameter="--config",
                value=args.config,
            ) from None
    from lightning.pytorch import LightningModule

    if not (isinstance(cls, type) and issubclass(cls, LightningModule)):
        raise ConfigError(
            f"MODEL {args.model!r} is {cls!r}, not a LightningModule class nor a transformers model class. Name the "
            "class (not an instance); for another nn.Module call lightning_srifty.capture_ops(module, batch, "
            "optimizer=...) from Python.",
            parameter="MODEL",
            value=args.model,
        )
    init_args = _init_args(args.init_args)
    try:
        with torch.device("meta"):
            return cls(**init_args), {"init_args": init_args}
    except Exception as exc:  # noqa: BLE001 - re-worded with the fix
        fix = "Check the arguments; code in __init__ that reads tensor values (or loads weights) cannot run without "
        fix += "memory."
        raise _init_args_error(args, init_args, exc, fix) from None


def _init_args_error(args: argparse.Namespace, init_args: dict[str, Any], exc: Exception, fix: str) -> ConfigError:
    """MODEL could not be built with ``init_args``: what it raised, and ``fix``."""
    return ConfigError(
        f"MODEL {args.model!r} could not be built on the meta device with --init-args {init_args}: "
        f"{type(exc).__name__}: {exc}. {fix}",
        parameter="--init-args",
        value=args.init_args,
    )


def _accumulation(global_batch: int | None, batch_size: int) -> int:
    """Micro-steps of ``batch_size`` per optimizer step of ``global_batch`` samples."""
    if global_batch is None:
        return 1
    if global_batch % batch_size:
        raise ConfigError(
            f"--global-batch {global_batch} is not a multiple of --batch-size {batch_size}: the capture's batch is "
            f"one micro-step of it. Use --global-batch {global_batch // batch_size * batch_size or batch_size} or "
            "another --batch-size.",
            parameter="--global-batch",
            value=global_batch,
        )
    return global_batch // batch_size


def _token_batch(batch_size: int, seq_len: int) -> dict[str, Any]:
    import torch

    with torch.device("meta"):
        tokens = torch.zeros(batch_size, seq_len, dtype=torch.long)
    return {"input_ids": tokens, "labels": tokens}


MAX_IMAGE_SIZE = 8192  # pixels a side: past any classifier trained (a typo in a size, not an image)


def _image_batch(module: Any, batch_size: int, size: int, model: str) -> dict[str, Any]:
    """A transformers image classifier's batch: ``pixel_values`` [batch, channels, size, size] and class labels."""
    import torch

    config = getattr(module, "config", None)
    channels, labels = getattr(config, "num_channels", None), getattr(config, "num_labels", None)
    if not isinstance(channels, int) or not isinstance(labels, int):
        raise ConfigError(
            f"MODEL {model!r} is not an image classifier (its configuration has no num_channels and num_labels): "
            "--image-size is for transformers *ForImageClassification classes; give a token model --seq-len, or "
            "any model its batch with --batch.",
            parameter="--image-size",
            value=size,
        )
    if size > MAX_IMAGE_SIZE:
        raise ConfigError(f"--image-size {size:,} is over {MAX_IMAGE_SIZE:,} pixels a side: give the training's "
                          "crop (224 for ImageNet).", parameter="--image-size", value=size)  # fmt: skip
    with torch.device("meta"):
        return {
            "pixel_values": torch.zeros(batch_size, channels, size, size),
            "labels": torch.zeros(batch_size, dtype=torch.long),
        }


def cmd_capture(args: argparse.Namespace) -> int:
    here = os.getcwd()
    added = here not in sys.path and "" not in sys.path
    if added:  # as `python -m` would: the project's modules import from the folder srifty runs in
        sys.path.insert(0, here)
    try:
        return _capture(args)
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def _capture(args: argparse.Namespace) -> int:
    import torch

    from lightning_srifty.profiling.assemble import capture_profile
    from lightning_srifty.profiling.capture import capture_step

    vision = args.model.startswith(TORCHVISION)
    cls = _torchvision_builder(args.model) if vision else resolve(args.model, "MODEL")
    if not vision and callable(cls) and str(getattr(cls, "__module__", "")).startswith("torchvision.models"):
        raise ConfigError(
            f"MODEL {args.model!r} is a torchvision builder: give it as torchvision:{cls.__name__} (with "
            "--image-size).",
            parameter="MODEL",
            value=args.model,
        )
    transformers_model = _is_transformers_model(cls)
    _check_batch_kind(args, transformers_model, vision)
    module = _built_module(cls, args)
    batch, batch_name = _batch_for(args, module)
    _check_batch(batch, batch_name)
    if args.channels_last:
        module, batch = _to_channels_last(module, batch)
    optimizer: Any = None
    if transformers_model:
        optimizer = functools.partial(torch.optim.AdamW, lr=1e-4)
    elif vision:  # torchvision's reference classification recipe (references/classification/train.py defaults)
        optimizer = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=1e-4)
    accumulation = _accumulation(args.global_batch, args.batch_size)
    capture = capture_step(
        module, batch, precision=args.precision, device="meta", batch_size=args.batch_size, optimizer=optimizer
    )
    name = args.name or cls.__name__ + (f" + LoRA r{args.lora_rank}" if args.lora_rank else "")
    profile = capture_profile(capture, name=name, batch_size=args.batch_size, accumulation=accumulation)
    if args.out == "-":
        print(json.dumps(profile.to_dict(), indent=2))
        return 0
    written = profile.save(args.out)
    table = capture.table
    print(
        f"{name}: {len(table.ops)} operator records ({sum(o.count for o in table.ops)} calls, "
        f"{sum((table.skipped or {}).values())} views skipped), {profile.model.parameters:,} parameters, "
        f"{(table.total_flops or 0) / 1e12:.3f} TFLOP per step, captured in {capture.seconds:.1f} s -> {written}",
        file=sys.stderr,
    )
    return 0


def _to_channels_last(module: Any, batch: Any) -> tuple[Any, Any]:
    """The model and the batch's 4-D tensors in channels-last memory format, as a script does with
    ``model.to(memory_format=torch.channels_last)`` and its inputs (the layout is recorded and priced)."""
    import torch
    from torch.utils._pytree import tree_map

    def nhwc(t: Any) -> Any:
        return t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) and t.dim() == 4 else t

    return module.to(memory_format=torch.channels_last), tree_map(nhwc, batch)


def _check_batch_kind(args: argparse.Namespace, transformers_model: bool, vision: bool = False) -> None:
    """One kind of batch, and the flags that go with MODEL's kind."""
    if vision:
        _check_vision_flags(args)
        return
    if args.config is not None and not transformers_model:
        raise ConfigError(
            f"--config is for a transformers model class (e.g. transformers:LlamaForCausalLM); MODEL {args.model!r} "
            "is not one: pass its arguments with --init-args.",
            parameter="--config",
            value=args.config,
        )
    if args.image_size is not None and not transformers_model:
        raise ConfigError(
            f"--image-size is for a transformers vision model class (e.g. transformers:ResNetForImageClassification); "
            f"MODEL {args.model!r} is not one: give its batch with --batch.",
            parameter="--image-size",
            value=args.image_size,
        )
    if args.image_size is not None and args.seq_len is not None:
        raise ConfigError(
            "--image-size and --seq-len are two kinds of batch (images, tokens): give the one MODEL takes.",
            parameter="--image-size",
            value=args.image_size,
        )
    if args.batch is None and not (transformers_model and (args.seq_len or args.image_size)):
        raise ConfigError(
            "--batch is required (package.module:make_batch), except for a transformers model with --seq-len, "
            "whose batch is input_ids = labels of --batch-size x --seq-len tokens, or a transformers vision model "
            "with --image-size (pixel_values of --batch-size x channels x size x size, and class labels).",
            parameter="--batch",
            value=None,
        )
    if args.seq_len is not None and args.seq_len > MAX_SEQ_LEN:
        raise ConfigError(
            f"--seq-len {args.seq_len:,} is over {MAX_SEQ_LEN:,} tokens, beyond any model's context: give the "
            "training's sequence length.",
            parameter="--seq-len",
            value=args.seq_len,
        )


def _check_vision_flags(args: argparse.Namespace) -> None:
    """A torchvision MODEL takes the images --image-size makes; no --config, --seq-len or --batch."""
    refused = (("--config", args.config), ("--seq-len", args.seq_len), ("--batch", args.batch),
               ("--lora-rank", args.lora_rank))  # fmt: skip
    for flag, value in refused:
        if value is not None:
            raise ConfigError(
                f"{flag} is not for a torchvision model ({args.model!r}): its batch is --image-size's 3-channel "
                "square images and class labels, its arguments --init-args (e.g. '{\"num_classes\": 10}'). For "
                "another batch or loss, capture the LightningModule that trains it (package.module:Class --batch ...).",
                parameter=flag,
                value=value,
            )
    if args.image_size is None:
        raise ConfigError(
            f"--image-size is required for a torchvision model ({args.model!r}): pixels a side of its square "
            "training crops (224 for ImageNet).",
            parameter="--image-size",
            value=None,
        )


def _built_module(cls: Any, args: argparse.Namespace) -> Any:
    """MODEL on the meta device, within the submodule bound, with LoRA adapters when asked."""
    module, _ = _build(cls, args)
    modules = sum(1 for _ in module.modules())
    if modules > MAX_MODULES:
        raise ConfigError(
            f"MODEL {args.model!r} has {modules:,} submodules, over {MAX_MODULES:,}: a capture of it would take many "
            "minutes. Check the arguments that set its depth and width.",
            parameter="MODEL",
            value=args.model,
        )
    if args.lora_rank is not None:
        from lightning_srifty.profiling.lora import add_lora

        targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
        try:
            add_lora(module, args.lora_rank, targets)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("'targets' parameter", "--lora-targets"), parameter="--lora-targets",
                              value=args.lora_targets) from None  # fmt: skip
    return module


def _batch_for(args: argparse.Namespace, module: Any) -> tuple[Any, str]:
    """The batch (meta tensors) and the flag that made it: --image-size, --seq-len or --batch's function."""
    import torch

    if args.batch is None and args.image_size is not None:
        return _image_batch(module, args.batch_size, args.image_size, args.model), f"--image-size {args.image_size}"
    if args.batch is None:
        return _token_batch(args.batch_size, args.seq_len), f"--seq-len {args.seq_len}"
    make_batch = resolve(args.batch, "--batch")
    if not callable(make_batch):
        raise ConfigError(
            f"--batch {args.batch!r} is {type(make_batch).__name__}, not a callable batch_size -> batch.",
            parameter="--batch",
            value=args.batch,
        )
    try:
        with torch.device("meta"):
            return make_batch(args.batch_size), args.batch
    except Exception as exc:  # noqa: BLE001 - re-worded with the fix
        raise ConfigError(
            f"--batch {args.batch!r} failed when called with batch_size={args.batch_size}: "
            f"{type(exc).__name__}: {exc}. It must take the batch size and build tensors with torch (it runs "
            "under torch.device('meta'), so no data is loaded).",
            parameter="--batch",
            value=args.batch,
        ) from None


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "capture",
        help="write a profile from a LightningModule's operator table, without a GPU",
        description="Build MODEL on the meta device, capture one training step (forward, backward, optimizer) as "
        "its ATen operator table and write a srifty.profile/v1 profile whose step time the predictor predicts.",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="the LightningModule class, as package.module:ClassName, a transformers model class built from "
        "--config and trained with AdamW (e.g. transformers:LlamaForCausalLM), or a torchvision model builder "
        "trained with SGD as torchvision's reference recipe trains it (e.g. torchvision:resnet50 --image-size 224)",
    )
    p.add_argument(
        "--init-args",
        default=None,
        metavar="JSON",
        help="keyword arguments of MODEL (a torchvision builder's too), e.g. '{\"num_classes\": 10}'",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="JSON|PATH",
        help="a transformers MODEL's configuration: a JSON object of its config class's arguments or a config.json "
        "file (nothing is downloaded)",
    )
    _model_kind_flags(p)
    p.add_argument(
        "--batch",
        default=None,
        metavar="CALLABLE",
        help="package.module:make_batch, called as make_batch(batch_size) under torch.device('meta'); returns one "
        "batch as the DataLoader yields it (required unless a transformers MODEL gets --seq-len or --image-size, or "
        "a torchvision MODEL --image-size)",
    )
    p.add_argument("--batch-size", type=positive_int, required=True, help="samples per step on one device")
    p.add_argument(
        "--global-batch",
        type=positive_int,
        default=None,
        help="samples per optimizer step of the training (default: --batch-size), a multiple of --batch-size: the "
        "profile records it as gradient accumulation over the captured batch, so every fleet is ranked training "
        "this global batch, split over its GPUs",
    )
    p.add_argument("--precision", type=_lightning_precision, choices=PRECISIONS, default="32-true",
                   help="Lightning precision of the run (bf16, 16, 32: read as Lightning reads them)")  # fmt: skip
    p.add_argument(
        "--channels-last",
        action="store_true",
        help="the run puts the model and its images in channels-last memory format "
        "(model.to(memory_format=torch.channels_last)): no NCHW<->NHWC conversions priced on tensor-core GPUs, and "
        "batch norm's NHWC kernels",
    )
    p.add_argument("--name", default=None, help="model name in the profile (default: the class name)")
    p.add_argument("--out", default="srifty/profile.json", help="profile path ('-' prints the JSON)")
    p.set_defaults(func=cmd_capture)


def _model_kind_flags(p: argparse.ArgumentParser) -> None:
    """A transformers MODEL's batch kind (--seq-len, --image-size) and LoRA adapters."""
    p.add_argument(
        "--seq-len",
        type=positive_int,
        default=None,
        help="a transformers MODEL without --batch: tokens per sample (the batch is input_ids = labels)",
    )
    p.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="an image classifier without --batch (transformers:ResNetForImageClassification, torchvision:resnet50): "
        "pixels a side of its square inputs (the batch is pixel_values and class labels)",
    )
    p.add_argument(
        "--lora-rank",
        type=positive_int,
        default=None,
        help="freeze the model and train rank-R LoRA adapters on --lora-targets (plain torch, no peft)",
    )
    p.add_argument("--lora-targets", default="q_proj,v_proj", help="linear layers (attribute names) the adapters go on")

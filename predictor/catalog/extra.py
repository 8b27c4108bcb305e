"""User-defined GPUs and instance types from YAML, merged over the bundled catalog.

    gpus:
      - name: B200-SXM
        memory_gb: 180
        memory_bw_gbps: 8000
        fp32_tflops: 80
        bf16_tflops: 2250
        sms: 148                 # optional architecture facts (the kernel model needs sms, clock_mhz, l2_mb)
        clock_mhz: 1965
        l2_mb: 126
        compute_capability: "10.0"
    instance_types:
      - name: dgx-a100-40g
        gpu: A100-SXM-40GB
        gpus: 8
        vcpus: 256
        memory_gib: 1024
        network_gbps: 1600
        efa: true
        gpu_interconnect: nvswitch
        price_usd_hr: 30.0

Every error names the file, the entry and the field.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.catalog.fields import ARCHES, FIELDS, GPU_SPECS, YamlField, by_yaml_key, normal_arch, yaml_fields
from predictor.catalog.gpus import GPU
from predictor.catalog.instances import InstanceType, Price
from predictor.documents.atomic import TooLarge, read_bounded
from predictor.documents.checks import suggest
from predictor.documents.schema import yaml_number_hint
from predictor.exceptions import CatalogError, did_you_mean

_F = YamlField
GPU_FIELDS: dict[str, YamlField] = yaml_fields(GPU_SPECS)  # a GPU's, declared with its other forms
# an instance type's fields are declared with its other forms (predictor.catalog.fields); its prices are the extra's
PRICE_FIELDS: dict[str, YamlField] = {
    "price_usd_hr": _F(float, "on-demand price, USD per hour", most=100_000),
    "spot_price_usd_hr": _F(float, "spot price, USD per hour", most=100_000),
    "region": _F(str, "the region its prices are for (default: user)"),
}
INSTANCE_FIELDS: dict[str, YamlField] = {**yaml_fields(), **PRICE_FIELDS}
_GPU_BY_YAML = by_yaml_key(GPU_SPECS)
_BY_YAML = by_yaml_key(FIELDS)
GPU_REQUIRED = tuple(k for k, f in GPU_FIELDS.items() if f.required)
INSTANCE_REQUIRED = tuple(k for k, f in INSTANCE_FIELDS.items() if f.required)
SECTIONS = {"gpus": GPU_FIELDS, "instance_types": INSTANCE_FIELDS}
SCHEMA_ID = "srifty.catalog-extra/v1"


def _field_schema(f: YamlField) -> dict[str, Any]:
    """The JSON Schema of one declared field."""
    out: dict[str, Any] = {"description": f.doc}
    if f.kind in (float, int):
        out["type"] = "number" if f.kind is float else "integer"
        out["exclusiveMinimum" if f.positive else "minimum"] = 0
        if f.most is not None:
            out["maximum"] = f.most
    else:
        out["type"] = {str: "string", bool: "boolean", list: "array"}[f.kind]
        if f.required and f.kind is str:
            out["minLength"] = 1  # the loader counts an empty required text as missing
    if f.choices:
        out["enum"] = list(f.choices)
    if f.pattern:
        out["pattern"] = f.pattern
    if f.number_too:
        out["type"] = ["string", "number"]
    return out


def extra_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a catalog extra, generated from :data:`GPU_FIELDS` and
    :data:`INSTANCE_FIELDS`: an editor checks a YAML file against it as it is written (``srifty catalog schema``);
    the loader checks the same rules and more (the names unique, an instance type's GPU known)."""

    def entry(fields: dict[str, YamlField]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {name: _field_schema(f) for name, f in fields.items()},
            "required": [name for name, f in fields.items() if f.required],
            "additionalProperties": False,
        }

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "lightning-srifty catalog extra (srifty --catalog-extra FILE.yaml)",
        "type": ["object", "null"],
        "properties": {section: {"type": ["array", "null"], "items": entry(f)} for section, f in SECTIONS.items()},
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Extra:
    """What one YAML file adds."""

    path: str
    gpus: tuple[GPU, ...]
    instances: tuple[dict[str, Any], ...]  # validated fields; resolved into InstanceType by the catalog


def _err(path: str, where: str, message: str) -> CatalogError:
    return CatalogError(f"{path}: {where}: {message}")


def _check(path: str, where: str, entry: Any, fields: dict[str, YamlField]) -> dict[str, Any]:
    """``entry``'s fields against their declarations (:class:`YamlField`): known, the required ones given, each of its
    kind, within its bounds and among its choices; the patterns are checked where the entry is read."""
    if not isinstance(entry, dict):
        raise _err(path, where, f"expected a mapping of fields, got {entry!r}")
    for key in entry:
        if key not in fields:
            close = suggest(str(key), list(fields), n=1)
            hint = did_you_mean(close) or "Known fields: " + ", ".join(fields) + "."
            raise _err(path, f"{where}.{key}", f"unknown field. {hint}")
    for key, declared in fields.items():
        if declared.required and entry.get(key) in (None, ""):
            raise _err(path, f"{where}.{key}", "missing (required)")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        declared = fields[key]
        kind = declared.kind
        ok = (
            isinstance(value, bool)
            if kind is bool
            else isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, int) and not isinstance(value, bool)
            if kind is int
            else isinstance(value, kind)
        )
        if not ok:
            names = {float: "a number", int: "a whole number", bool: "true or false", str: "a string", list: "a list"}
            hint = yaml_number_hint(value) if kind in (float, int) else ""
            raise _err(path, f"{where}.{key}", f"expected {names[kind]}, got {value!r}" + (f". {hint}" if hint else ""))
        if kind in (float, int):
            if value < 0:
                raise _err(path, f"{where}.{key}", f"must not be negative, got {value!r}")
            if declared.positive and value == 0:
                raise _err(path, f"{where}.{key}", "must be more than 0, got 0: give the hardware's figure")
            if declared.most is not None and value > declared.most:
                raise _err(
                    path,
                    f"{where}.{key}",
                    f"must be at most {declared.most:,}, got {value!r}: beyond any hardware; check the unit "
                    "(docs/catalog.md)",
                )
        if declared.choices and value not in declared.choices:
            close = suggest(str(value), declared.choices, n=1)
            raise _err(
                path,
                f"{where}.{key}",
                f"must be one of {', '.join(declared.choices)} ({declared.doc}), got {value!r}. {did_you_mean(close)}"
                .rstrip(),
            )  # fmt: skip
        out[key] = float(value) if kind is float else value
    return out


def _unique_names(path: str, section: str, entries: list[Any]) -> None:
    """Refuse a name given to two entries of one section (the second silently replaced the first)."""
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str):
            if name.casefold() in seen:
                raise _err(
                    path,
                    f"{section}[{i}].name",
                    f"{name!r} is also {section}[{seen[name.casefold()]}]: give each entry its own name, or merge them",
                )
            seen[name.casefold()] = i


def _capability(path: str, i: int, value: Any) -> str | None:
    """A CUDA compute capability as text, ``8.0`` or ``"8.0"`` -> ``"8.0"`` (YAML reads an unquoted 8.0 as a number)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = f"{float(value):.1f}"
    if not isinstance(value, str) or not re.fullmatch(r"\d+\.\d+", value.strip()):
        raise _err(path, f"gpus[{i}].compute_capability", f'expected MAJOR.MINOR such as "8.0", got {value!r}')
    return value.strip()


MAX_EXTRA_BYTES = 1 << 20  # a catalog of hand-written GPUs and instance types is a few KB


def _safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` without aliases: ``*name`` references can expand a few hundred bytes into gigabytes
    (nested aliases, the "billion laughs"), and a catalog has no use for them."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not allowed in a catalog file: write the values out",
                    event.start_mark,
                )  # fmt: skip
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            # YAML keeps the last of two equal keys without a word; a catalog with two memory_gb is a mistake
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue  # an unhashable key is refused by SafeLoader itself
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"the key {key!r} is given twice (lines {seen[key].line + 1} and "
                        f"{key_node.start_mark.line + 1}): keep one",
                        key_node.start_mark,
                    )  # fmt: skip
                seen[key] = key_node.start_mark
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=NoAliases)


def _unreadable(data: Any, where: str = "") -> str | None:
    """What is wrong with the first value of parsed YAML no number or text can be: a NaN or infinite number, or text
    with a lone surrogate (YAML's "\\ud800" escape makes one, and nothing can print it), as "<path> <why>"; None when
    there is none."""
    if isinstance(data, float) and not math.isfinite(data):
        return f"{where or '(top level)'} is NaN or infinite (.nan/.inf); give a finite number"
    if isinstance(data, str) and any("\ud800" <= c <= "\udfff" for c in data):
        return f"{where or '(top level)'} holds a lone surrogate (\\ud800...); write the text as plain UTF-8"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = _unreadable(value, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}".lstrip("."))
        if found:
            return found
    return None


def load_extra(path: str | os.PathLike[str]) -> Extra:
    """Parse and validate one YAML file of user-defined GPUs and instance types: read (:func:`_read_yaml`), its
    sections checked (:func:`_sections`), then its GPUs (:func:`_extra_gpus`) and instance types
    (:func:`_extra_instances`)."""
    name = str(path)
    data = _sections(name, _read_yaml(path, name))
    gpus = _extra_gpus(name, data.get("gpus") or [])
    instances = _extra_instances(name, data.get("instance_types") or [])
    return Extra(path=name, gpus=tuple(gpus), instances=tuple(instances))


def _read_yaml(path: str | os.PathLike[str], name: str) -> Any:
    """The YAML document of ``path``, read within :data:`MAX_EXTRA_BYTES` and parsed safely.

    Raises:
        CatalogError: a folder, a missing, unreadable, oversized or non-UTF-8 file, YAML nested too deeply or not
            valid (with the line and column).
    """
    import yaml

    try:
        if Path(path).is_dir():
            raise CatalogError(f"{name}: is a folder; give the YAML file of GPUs and instance types inside it")
        try:
            raw = read_bounded(path, MAX_EXTRA_BYTES)
        except TooLarge:
            raise CatalogError(
                f"{name}: over {MAX_EXTRA_BYTES:,} bytes, the most a catalog extra file may be"
            ) from None
        data = _safe_yaml(raw.decode("utf-8"))
    except FileNotFoundError:
        raise CatalogError(f"{name}: catalog extra file not found") from None
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{name}: not UTF-8 text (byte {exc.start}); save the YAML as UTF-8") from None
    except OSError as exc:
        raise CatalogError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    except RecursionError:
        raise CatalogError(f"{name}: nested too deeply to be a catalog file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CatalogError(f"{name}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except ValueError as exc:  # an integer over sys.get_int_max_str_digits() (4,300 digits), found by the probe
        raise CatalogError(f"{name}: a value cannot be read: {exc}") from None
    return data


def _sections(name: str, data: Any) -> dict[str, Any]:
    """The document as a mapping of the sections ``gpus`` and ``instance_types`` (empty: none), each a list of
    entries with unique names.

    Raises:
        CatalogError: text that cannot be shown, another shape, an unknown section (with the closest name), a
            section that is not a list, a name given twice.
    """
    bad = _unreadable(data)
    if bad:
        raise CatalogError(f"{name}: {bad.encode('utf-8', 'backslashreplace').decode()}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CatalogError(f"{name}: expected a mapping with 'gpus' and/or 'instance_types', got {type(data).__name__}")
    unknown = [k for k in data if k not in ("gpus", "instance_types")]
    if unknown:
        close = suggest(str(unknown[0]), ["gpus", "instance_types"], n=1)
        raise CatalogError(f"{name}: unknown section {unknown[0]!r}. {did_you_mean(close)}".rstrip())
    for section in ("gpus", "instance_types"):
        if data.get(section) is not None and not isinstance(data[section], list):
            raise CatalogError(
                f"{name}: {section}: expected a list of entries (each line starting with '- '), got "
                f"{type(data[section]).__name__} {data[section]!r}; see docs/catalog.md"
            )
    for section in ("gpus", "instance_types"):
        _unique_names(name, section, data.get(section) or [])
    return data


def _extra_gpus(name: str, entries: list[Any]) -> list[GPU]:
    """The ``gpus`` entries as :class:`GPU` records (their source: the file), each field checked (:func:`_check`).

    Raises:
        CatalogError: naming the entry and the field.
    """
    gpus = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            entry = {**entry, "compute_capability": _capability(name, i, entry.get("compute_capability"))}
            if entry["compute_capability"] is None:
                del entry["compute_capability"]
        f = _check(name, f"gpus[{i}]", entry, GPU_FIELDS)
        given = {spec.name: f[key] for key, spec in _GPU_BY_YAML.items() if key in f}
        unset = {spec.name: None if spec.optional else spec.default for spec in GPU_SPECS if spec.record}
        aliases = tuple(str(a) for a in given.get("aliases", ()))
        gpus.append(GPU(**{**unset, **given, "aliases": aliases, "source": f"user: {name}"}))
    return gpus


def _extra_instances(name: str, entries: list[Any]) -> list[dict[str, Any]]:
    """The ``instance_types`` entries, each field checked (:func:`_check`: its kind, bounds and choices), the
    architecture one of those known; each keeps where it was (``_where``) for the errors of
    :func:`build_instance`.

    Raises:
        CatalogError: naming the entry and the field.
    """
    instances = []
    for i, entry in enumerate(entries):
        f = _check(
            name,
            f"instance_types[{i}] ({entry.get('name', '?') if isinstance(entry, dict) else '?'})",
            entry,
            INSTANCE_FIELDS,
        )
        if "arch" in f and normal_arch(f["arch"]) not in ARCHES:
            raise _err(
                name,
                f"instance_types[{i}].arch",
                f"must be one of {', '.join(ARCHES)} (it picks the machine image), got {f['arch']!r}.",
            )
        if f.get("gpudirect_rdma") and not f.get("efa"):
            raise _err(
                name,
                f"instance_types[{i}].gpudirect_rdma",
                "is true, but the entry has no RDMA network (efa: false): the predictor prices its nodes over TCP "
                "sockets. Set efa: true for an EFA, RoCE or InfiniBand network whose NIC reads GPU memory, or leave "
                "gpudirect_rdma out.",
            )
        instances.append({**f, "_where": f"instance_types[{i}]"})
    return instances


def build_instance(fields: dict[str, Any], gpu: GPU, path: str) -> InstanceType:
    """An InstanceType from validated YAML fields whose GPU has been resolved."""
    region = fields.get("region", "user")
    prices = []
    if "price_usd_hr" in fields:
        prices.append(Price(region=region, market="on-demand", usd_hr=fields["price_usd_hr"], source=f"user: {path}"))
    if "spot_price_usd_hr" in fields:
        prices.append(Price(region=region, market="spot", usd_hr=fields["spot_price_usd_hr"], source=f"user: {path}"))
    gpus = fields["gpus"]
    given = {f.name: fields[key] for key, f in _BY_YAML.items() if key in fields}  # by field name
    defaults = {  # the defaults that depend on the entry; the others are the declarations'
        "family": fields["name"].split(".")[0],
        "gpu_memory_gib": gpu.memory_gb,
        "efa_interfaces": 1 if fields.get("efa", False) else 0,
        "gpu_interconnect": "single" if gpus == 1 else "pcie",
    }
    declared = {f.name: f.default for f in _BY_YAML.values() if not f.optional and f.default is not None}
    values = {**declared, **defaults, **given}
    resolved = {"gpu": gpu.key, "accelerator": gpu.key, "accelerator_kind": "cuda", "arch": normal_arch(values["arch"])}
    return InstanceType(**{**values, **resolved}, prices=tuple(prices), origin=f"user: {path}")

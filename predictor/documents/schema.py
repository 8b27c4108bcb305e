"""Frozen dataclasses as versioned JSON documents: validation with field paths, dumping, JSON Schema.

A document class is a frozen dataclass whose fields use plain types (``int``, ``float``, ``str``, ``bool``),
``X | None``, ``tuple[X, ...]`` (a JSON array; documents are immutable, so the loader builds tuples),
``dict[str, X]``, ``Literal[...]`` and nested document classes. Field metadata may carry ``doc`` (a one-line
description), ``min`` / ``exclusive_min`` / ``max`` (numeric bounds) and ``max_length`` (a text's characters). From
that one declaration come the loader (:func:`from_dict`, errors naming the dotted field path, the value and the fix),
the dumper (:func:`to_dict`) and the published JSON Schema (:func:`json_schema`).

Forward compatibility: within one major version (``srifty.plan/v1``, ``srifty.profile/v1``) fields are only ever
added, so a reader accepts fields it does not know and warns once per document (:class:`NewerDocumentWarning`,
naming them). An unknown field that is a near miss of a known field the document leaves out is a typo, not a newer
field, and is refused with "Did you mean".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
import types
import typing
import warnings
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from predictor.documents.checks import shown, suggest
from predictor.exceptions import NewerDocumentWarning, ProfileSchemaError, did_you_mean

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
MAX_INT = 2**63  # integers at or beyond are refused (int64, what JSON tools share)


def doc_field(
    doc: str, *, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING, **bounds: float
) -> Any:
    """A dataclass field with a description and optional bounds (numbers: ``min``, ``exclusive_min``, ``max``; text:
    ``max_length`` in characters)."""
    metadata = {"doc": doc, **bounds}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _array_item(tp: Any) -> Any:
    """``X`` when ``tp`` is ``tuple[X, ...]``, a JSON array of X; None otherwise."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    if (item := _array_item(tp)) is not None:
        return f"a list of {_describe(item)}"
    if origin is dict:
        return f"an object of {_describe(typing.get_args(tp)[1])}"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def yaml_number_hint(value: Any) -> str:
    """For a number that arrived as text because YAML 1.1 (PyYAML) reads ``1e300`` or ``1e3``, with no dot, as a
    string: what to write instead; "" for anything else."""
    if not isinstance(value, str) or "e" not in value.lower():
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    mantissa, _, exponent = f"{number:e}".partition("e")
    written = f"{float(mantissa)!r}e{'+' if not exponent.startswith('-') else '-'}{int(exponent.lstrip('+-'))}"
    return (
        f"YAML reads {value} as text (YAML 1.1 reads a number with an exponent only with a dot and a signed "
        f"exponent): write {written}."
    )


def _error(path: str, expected: str, value: Any, fix: str = "") -> ProfileSchemaError:
    got = "missing" if value is dataclasses.MISSING else f"got {shown(value)}"
    if not fix and ("number" in expected or "integer" in expected):
        fix = yaml_number_hint(value)
    message = f"{path}: expected {expected}, {got}."
    if fix:
        message += f" {fix}"
    return ProfileSchemaError(message, field=path, value=None if value is dataclasses.MISSING else value)


def _convert(tp: Any, value: Any, path: str, meta: typing.Mapping[str, Any], ignored: list[str] | None = None) -> Any:
    ignored = [] if ignored is None else ignored
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(args) == 1:
            return _convert(args[0], value, path, meta, ignored)
        for arg in args:
            attempt: list[str] = []
            try:
                converted = _convert(arg, value, path, meta, attempt)
            except ProfileSchemaError:
                continue
            ignored.extend(attempt)
            return converted
        raise _error(path, _describe(tp), value)
    if (item := _array_item(tp)) is not None:
        if not isinstance(value, list):
            raise _error(path, _describe(tp), value)
        return tuple(_convert(item, v, f"{path}[{i}]", {}, ignored) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _error(path, _describe(tp), value)
        item = typing.get_args(tp)[1]
        return {_text(str(k), f"{path}.{k}"): _convert(item, v, f"{path}.{k}", meta, ignored) for k, v in value.items()}
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            close = suggest(str(value), [str(c) for c in choices], n=1) if isinstance(value, str) else []
            raise _error(path, _describe(tp), value, did_you_mean(close))
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a type hint: a class, never an instance
        return from_dict(tp, value, path, ignored)
    if tp is bool:
        if not isinstance(value, bool):
            raise _error(path, "true or false", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _error(path, "an integer", value)
        _check_bounds(value, path, meta)
        if abs(value) >= MAX_INT:  # every count becomes a float somewhere downstream
            raise _error(path, "an integer below 2^63", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) > sys.float_info.max:
            raise _error(path, "a finite number", value)
        if not math.isfinite(value):
            raise _error(path, "a finite number", value)
        _check_bounds(value, path, meta)
        return float(value)
    if tp is str:
        return _string(value, path, meta)
    if tp is Any:
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug in a document class, not in the input


# terminal control characters: C0 but tab, newline and carriage return, DEL, and C1 (CSI is \x9b). A name holding
# ESC reached the terminal raw ("\x1b]0;PWN\x07" retitles it; issue #36 L6) through every command that shows it
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _string(value: Any, path: str, meta: typing.Mapping[str, Any]) -> str:
    """A text field: a string, within its ``max_length``, of text (:func:`_text`)."""
    if not isinstance(value, str):
        raise _error(path, "a string", value)
    if "max_length" in meta and len(value) > meta["max_length"]:
        raise _error(path, f"text of at most {meta['max_length']} characters", f"{len(value):,} characters")
    return _text(value, path)


def _text(value: str, path: str) -> str:
    """``value`` if it is valid Unicode without terminal control characters: a lone UTF-16 surrogate (JSON
    "\\ud800") cannot be stored or echoed, and an escape sequence would reach the terminal or the report raw."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _error(
            path, "UTF-8 text", value, f"It holds a lone surrogate ({value[exc.start]!r} at position {exc.start})."
        ) from None
    bad = _CONTROL.search(value)
    if bad:
        raise _error(
            path,
            "text without control characters",
            value.encode("unicode_escape").decode("ascii")[:120],
            f"It holds {bad.group()!r} at position {bad.start()} (a terminal escape sequence, or a byte that is not "
            "text): remove it.",
        )
    return value


def _check_bounds(value: float, path: str, meta: typing.Mapping[str, Any]) -> None:
    if "min" in meta and value < meta["min"]:
        raise _error(path, f"a number >= {meta['min']}", value)
    if "exclusive_min" in meta and value <= meta["exclusive_min"]:
        raise _error(path, f"a number > {meta['exclusive_min']}", value)
    if "max" in meta and value > meta["max"]:
        raise _error(path, f"a number <= {meta['max']}", value)


def from_dict(cls: type[T], data: Any, path: str = "", ignored: list[str] | None = None) -> T:
    """Build document class ``cls`` from parsed JSON, or raise ProfileSchemaError naming the field.

    Fields this release does not know are ignored with one :class:`NewerDocumentWarning` for the whole document
    (``ignored`` collects them through the nesting; the outermost call warns)."""
    outermost = ignored is None
    ignored = [] if ignored is None else ignored
    where = path or cls.__name__
    if not isinstance(data, dict):
        raise _error(where, "an object", data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in (k for k in data if k not in fields):
        close = _typo_of(str(key), fields, data)
        if close:
            raise ProfileSchemaError(
                f"{_join(path, str(key))}: unknown field. {did_you_mean(close[:1])}",
                field=_join(path, str(key)),
                value=data[key],
            )
        ignored.append(_join(path, str(key)))
    hints = _hints(cls)
    kwargs = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _error(sub, _describe(hints[name]), dataclasses.MISSING, f"({f.metadata.get('doc', 'required')})")
            continue
        kwargs[name] = _convert(hints[name], data[name], sub, f.metadata, ignored)
    try:
        built = cls(**kwargs)
    except ValueError as exc:  # __post_init__ cross-field checks
        if isinstance(exc, ProfileSchemaError):
            raise
        raise ProfileSchemaError(f"{where}: {exc}", field=where) from exc
    if outermost and ignored:
        shown = ", ".join(ignored[:8]) + (f" and {len(ignored) - 8} more" if len(ignored) > 8 else "")
        warnings.warn(
            NewerDocumentWarning(
                f"{where}: {len(ignored)} field(s) this lightning-srifty does not know were ignored ({shown}): the "
                "document was written by a newer release of the same major version; upgrade to use them.",
                fields=ignored,
            ),
            stacklevel=3,
        )
    return built


def _typo_of(key: str, fields: typing.Iterable[str], data: dict[str, Any]) -> list[str]:
    """The known field ``key`` is a typo of: a near miss of one the document leaves out, or a very near miss of any
    (a newer release never adds a name one letter away from an existing one)."""
    absent = [name for name in fields if name not in data]
    return suggest(key, absent, n=1, cutoff=0.75) or suggest(key, fields, n=1, cutoff=0.85)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def to_dict(obj: Any) -> Any:
    """Dump a document to JSON-ready data; ``None`` fields are left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None:
                continue
            out[f.name] = to_dict(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def json_schema(cls: type, *, schema_id: str | None = None, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of document class ``cls``."""
    root = _object_schema(cls)
    head = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    if schema_id:
        head["$id"] = schema_id
    if title:
        head["title"] = title
    return {**head, **root}


def _object_schema(cls: type) -> dict[str, Any]:
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        prop = _type_schema(hints[f.name])
        if "doc" in f.metadata:
            prop["description"] = f.metadata["doc"]
        bounds = (
            ("min", "minimum"),
            ("exclusive_min", "exclusiveMinimum"),
            ("max", "maximum"),
            ("max_length", "maxLength"),
        )
        for key, schema_key in bounds:
            if key in f.metadata:
                prop[schema_key] = f.metadata[key]
        props[f.name] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if cls.__doc__:
        schema["description"] = cls.__doc__.strip().splitlines()[0]
    if required:
        schema["required"] = required
    return schema


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        options = [_type_schema(a) for a in args] + [{"type": "null"}]
        return {"anyOf": options}
    if (item := _array_item(tp)) is not None:
        return {"type": "array", "items": _type_schema(item)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(typing.get_args(tp)[1])}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _object_schema(tp)
    mapping = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if tp in mapping:
        return {"type": mapping[tp]}
    return {}


def markdown_reference(cls: type, shared: tuple[type, ...] = ()) -> str:
    """Markdown tables of every field: dotted path, type, required or default, description.

    Document classes in ``shared`` (used in many places, like ``Stats``) get one table of their own.
    """
    out = [_table(cls, shared)]
    for sub in shared:
        out.append(f"\n#### `{sub.__name__}`\n\n{(sub.__doc__ or '').strip()}\n\n" + _table(sub, shared))
    return "".join(out)


def _table(cls: type, shared: tuple[type, ...]) -> str:
    lines = ["| field | type | required | description |", "|---|---|---|---|"]
    for path, f, tp in _walk(cls, "", shared):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = (
            "yes" if required else ("no" if f.default in (None, dataclasses.MISSING) else f"default `{f.default}`")
        )
        bounds = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in f.metadata.items() if k != "doc")
        desc = f.metadata.get("doc", "") + (f" ({bounds})" if bounds else "")
        inner = _unwrap(tp)
        kind = _describe(tp)
        if inner in shared:
            kind = kind.replace("an object", f"`{inner.__name__}`")
        lines.append(f"| `{path}` | {kind} | {default} | {desc} |")
    return "\n".join(lines) + "\n"


def _walk(cls: type, prefix: str, shared: tuple[type, ...] = ()) -> typing.Iterator[tuple[str, dataclasses.Field, Any]]:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        path = _join(prefix, f.name)
        yield path, f, hints[f.name]
        inner = _unwrap(hints[f.name])
        if isinstance(inner, type) and dataclasses.is_dataclass(inner) and inner not in shared:
            yield from _walk(inner, path + _container_suffix(hints[f.name]), shared)


def iter_field_paths(cls: type, shared: tuple[type, ...] = ()) -> typing.Iterator[str]:
    """Every dotted field path of a document class (for documentation checks)."""
    for path, _, _ in _walk(cls, "", shared):
        yield path
    for sub in shared:
        for path, _, _ in _walk(sub, "", shared):
            yield path


def _container_suffix(tp: Any) -> str:
    """'[]' for an array, '.<key>' for a dict (after Optional is unwrapped), '' otherwise."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _container_suffix(args[0]) if len(args) == 1 else ""
    if _array_item(tp) is not None:
        return "[]"
    return ".<key>" if origin is dict else ""


def _unwrap(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    if (item := _array_item(tp)) is not None:
        return _unwrap(item)
    if origin is dict:
        return _unwrap(typing.get_args(tp)[1])
    return tp

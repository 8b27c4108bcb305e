"""The Terraform root is typed (issue #24 item 6): no ``any`` in terraform/, every input of the fleet module reachable
from the root with the module's own type, and what ``srifty terraform`` writes fits the root's types.

The .tf files are read with a small parser of Terraform type constraints (no HCL library needed): a variable's
``type`` becomes a tree of tuples, ``("object", {attr: (type, optional, has_default)})``, ``("list", type)``,
``"string"``, so that two declarations compare as data."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from _fleet import example
from _support import ROOT
from conftest import tf_run
from lightning_srifty.provision.terraform.generate import generate, tfvars

TERRAFORM = ROOT / "terraform"
MODULE = TERRAFORM / "modules" / "training_fleet"
ROOT_MODULE = TERRAFORM / "root"
# module inputs the root deliberately does not offer, each with its reason (none today: every input is passed)
INTERNAL: dict[str, str] = {}
# inputs of the root alone: the provider's
ROOT_ONLY = {"region", "aws_endpoint", "aws_max_retries"}

_TOKEN = re.compile(r'\s+|#[^\n]*|//[^\n]*|"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|-?[0-9.]+|\S')


def _tokens(text: str, newlines: bool = False) -> list[str]:
    """The tokens of HCL text, comments dropped; with ``newlines``, a line break is the token "\\n"."""
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"cannot read {text[pos : pos + 40]!r}"  # only an unterminated string
        pos = m.end()
        if m.group().isspace():
            if newlines and "\n" in m.group():
                out.append("\n")
        elif not m.group().startswith(("#", "//")):
            out.append(m.group())
    return out


def _expression(tokens: list[str], i: int) -> int:
    """The index after the expression starting at ``tokens[i]`` (brackets balanced; it ends at a comma, a closing
    bracket or a line break outside brackets)."""
    depth = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "\n":
            if depth == 0:
                return i
        elif t in "({[":
            depth += 1
        elif t in ")}]":
            if depth == 0:
                return i
            depth -= 1
        elif t == "," and depth == 0:
            return i
        i += 1
    return i


def _parse_type(tokens: list[str], i: int = 0) -> tuple[Any, int]:
    """(type tree, index after it) for the type constraint at ``tokens[i]``."""
    word = tokens[i]
    if word in ("string", "number", "bool", "any"):
        return word, i + 1
    assert tokens[i + 1] == "(", f"unexpected {word!r} in a type"
    if word in ("list", "set", "map"):
        inner, i = _parse_type(tokens, i + 2)
        assert tokens[i] == ")"
        return (word, inner), i + 1
    if word == "object":
        assert tokens[i + 2] == "{"
        attrs: dict[str, tuple[Any, bool, bool]] = {}
        i += 3
        while tokens[i] != "}":
            name, eq = tokens[i], tokens[i + 1]
            assert eq == "=", f"expected = after {name!r}"
            if tokens[i + 2] == "optional":
                inner, i = _parse_type(tokens, i + 4)
                has_default = tokens[i] == ","
                if has_default:
                    i = _expression(tokens, i + 1)
                assert tokens[i] == ")"
                attrs[name] = (inner, True, has_default)
                i += 1
            else:
                inner, i = _parse_type(tokens, i + 2)
                attrs[name] = (inner, False, False)
            if tokens[i] == ",":
                i += 1
        assert tokens[i + 1] == ")"
        return ("object", attrs), i + 2
    raise AssertionError(f"unknown type constructor {word!r}")


def _blocks(path: Path, kind: str) -> dict[str, str]:
    """The body of every top-level ``kind "name" { ... }`` block of a file, by name."""
    text = path.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(rf'^{kind} "([^"]+)" \{{\n(.*?)^\}}', text, re.M | re.S)}


def _argument(body: str, name: str) -> str | None:
    """The expression of the top-level argument ``name = ...`` of a block body, as text; None when absent."""
    m = re.search(rf"^  {name}\s*=\s*", body, re.M)
    if not m:
        return None
    tokens = _tokens(body[m.end() :], newlines=True)
    return " ".join(t for t in tokens[: _expression(tokens, 0)] if t != "\n")


def _variables(folder: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name, body in _blocks(folder / "variables.tf", "variable").items():
        expr = _argument(body, "type")
        assert expr is not None, f"{folder.name}: variable {name} has no type"
        tree, end = _parse_type(_tokens(expr))
        assert end == len(_tokens(expr)), f"{folder.name}: variable {name}: trailing text in its type"
        out[name] = {"type": tree, "default": _argument(body, "default"), "body": body}
    return out


def _without_defaults(tree: Any) -> Any:
    """The type as a caller of the module declares it: optional attributes keep no default (the module's applies)."""
    if isinstance(tree, tuple) and tree[0] == "object":
        return ("object", {k: (_without_defaults(t), opt, False) for k, (t, opt, _) in tree[1].items()})
    if isinstance(tree, tuple):
        return (tree[0], _without_defaults(tree[1]))
    return tree


def _mentions_any(tree: Any) -> bool:
    if isinstance(tree, tuple) and tree[0] == "object":
        return any(_mentions_any(t) for t, _, _ in tree[1].values())
    if isinstance(tree, tuple):
        return _mentions_any(tree[1])
    return tree == "any"


# ---------------------------------------------------------------------------------------------------------------------
# The declarations
# ---------------------------------------------------------------------------------------------------------------------


def test_the_type_parser_reads_nested_optionals_with_defaults() -> None:
    text = 'object({ a = optional(map(string), { x = "y(" }), b = list(object({ c = number })) # note\n })'
    tree, end = _parse_type(_tokens(text))
    assert end == len(_tokens(text))
    assert tree == (
        "object",
        {
            "a": (("map", "string"), True, True),
            "b": (("list", ("object", {"c": ("number", False, False)})), False, False),
        },
    )


def test_no_variable_in_terraform_is_typed_any() -> None:
    files = sorted(TERRAFORM.rglob("*.tf"))
    assert {MODULE / "variables.tf", ROOT_MODULE / "variables.tf"} <= set(files)
    for path in files:
        assert not re.search(r"^\s*type\s*=\s*any\b", path.read_text(), re.M), f"{path}: type = any"
    for folder in (MODULE, ROOT_MODULE):
        loose = [name for name, v in _variables(folder).items() if _mentions_any(v["type"])]
        assert not loose, f"{folder.relative_to(ROOT)}: variables typed with any: {loose}"


def test_every_module_input_is_passed_through_by_the_root_with_the_modules_type() -> None:
    module, root = _variables(MODULE), _variables(ROOT_MODULE)
    (call,) = _blocks(ROOT_MODULE / "main.tf", "module").values()
    passed = dict(re.findall(r"^  ([a-z_0-9]+)\s*=\s*var\.([a-z_0-9]+)\s*$", call, re.M))
    missing = sorted(set(module) - set(passed) - set(INTERNAL))
    assert not missing, f"module inputs the root neither passes nor lists in INTERNAL: {missing}"
    assert not set(INTERNAL) & set(passed), "an input listed as internal is passed after all"
    assert set(passed) <= set(module), f"the root passes inputs the module lacks: {set(passed) - set(module)}"
    assert set(root) == set(passed.values()) | ROOT_ONLY, "a root variable is neither passed nor the provider's"
    for name, var in passed.items():
        assert name == var, f"module input {name} takes var.{var}: keep one name"
        # attribute for attribute the module's type: terraform drops an attribute the root's type lacks, silently
        assert root[var]["type"] == _without_defaults(root[var]["type"]), f"{name}: a default in the root's type"
        assert root[var]["type"] == _without_defaults(module[name]["type"]), f"{name}: the root's type differs"
        # the same default (or none), so that leaving the value out of the root means what the module means
        assert root[var]["default"] == module[name]["default"], f"{name}: default {root[var]['default']!r}"
        assert "description" in root[var]["body"], f"{name}: no description"


# ---------------------------------------------------------------------------------------------------------------------
# What srifty terraform writes
# ---------------------------------------------------------------------------------------------------------------------


def _fits(value: Any, tree: Any, where: str) -> None:
    """``value`` (JSON) converts to the type ``tree`` without losing anything: no unknown attribute, every required
    attribute given, the right kind of leaf (null is a value of every type)."""
    if value is None or tree == "any":
        return
    kinds = {"string": str, "bool": bool, "number": (int, float)}
    if isinstance(tree, str):
        ok = isinstance(value, kinds[tree]) and not (tree == "number" and isinstance(value, bool))
        assert ok, f"{where}: {value!r} is not a {tree}"
        return
    kind, inner = tree
    if kind in ("list", "set"):
        assert isinstance(value, list), f"{where}: not a list"
        for n, item in enumerate(value):
            _fits(item, inner, f"{where}[{n}]")
    elif kind == "map":
        assert isinstance(value, dict), f"{where}: not a map"
        for k, item in value.items():
            _fits(item, inner, f"{where}.{k}")
    else:
        assert isinstance(value, dict), f"{where}: not an object"
        unknown = set(value) - set(inner)
        assert not unknown, f"{where}: attributes the type lacks (terraform would drop them): {sorted(unknown)}"
        required = {k for k, (_, optional, _) in inner.items() if not optional}
        assert required <= set(value), f"{where}: required attributes missing: {sorted(required - set(value))}"
        for k, item in value.items():
            _fits(item, inner[k][0], f"{where}.{k}")


EXAMPLES = sorted(p.name for p in (TERRAFORM / "examples").iterdir() if (p / "choice.json").is_file())
EVERY_OPTION = {
    "secret_env": ("HF_TOKEN=ssm:/team/hf-token", "WANDB_API_KEY=secretsmanager:team/wandb"),
    "bucket": "my-runs",
    "vpc_id": "vpc-0123456789abcdef0",
    "subnet_ids": ("subnet-0123456789abcdef0",),
    "resume_from": "s3://my-runs/checkpoints/last.ckpt",
    "image": "nvcr.io/nvidia/pytorch:25.01-py3",
    "key_name": "team-key",
    "handover": True,
    "aws_endpoint": "http://127.0.0.1:5000",
    "aws_max_retries": 2,
    "max_hourly_usd": 1000.0,
    "ssh_cidr": ("203.0.113.7/32",),
}


@pytest.mark.parametrize("every_option", [False, True], ids=["as-given", "every-option"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_generated_values_fit_the_root_types(name, every_option, catalog) -> None:
    plan, choice, options = example(name)
    code = None
    if every_option:
        options = dataclasses.replace(options, **EVERY_OPTION)
        code = SimpleNamespace(path=Path("a" * 64 + ".tar.gz"), sha256="a" * 64)  # what tfvars reads of a Snapshot
    values = json.loads(json.dumps(tfvars(plan, choice, options, catalog, code=code)))
    root = _variables(ROOT_MODULE)
    assert set(values) <= set(root), f"values for no root variable: {set(values) - set(root)}"
    required = {n for n, v in root.items() if v["default"] is None}
    assert required <= set(values), f"required root variables not written: {required - set(values)}"
    for key, value in values.items():
        _fits(value, root[key]["type"], key)
    if every_option:
        assert values["train"]["code"]["sha256"] == "a" * 64 and values["secrets"] and values["key_name"]


def test_terraform_refuses_bad_root_inputs_with_their_sentences(tf_env, tmp_path, catalog) -> None:
    """The root's own validations and a passed-through input's (the module's), all in one plan: terraform names every
    refused variable before it reads anything from AWS."""
    plan, choice, options = example("single-node-on-demand")
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    bad = {"region": "mars-1", "aws_endpoint": "ftp://x", "aws_max_retries": "-1", "metadata_hop_limit": "0"}
    bad["network"] = '{create_vpc=false, vpc_id="myvpc", subnet_ids=["subnet_bad"]}'  # an infra team's trial
    bad |= {"iam_path": "ml", "iam_permissions_boundary": "team-boundary"}
    args = [f"-var={k}={v}" for k, v in bad.items()]
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false", *args)
    stderr = " ".join(result.stderr.split())
    assert result.returncode != 0
    for sentence in (
        "The region must be an AWS region code",
        "The aws_endpoint must be an http:// or https:// URL",
        "The aws_max_retries must be a whole number of at least 0",
        "The metadata_hop_limit must be between 1 and 64",
        "The network.vpc_id must be a VPC ID (vpc- and 8 or 17 hexadecimal characters",
        "The iam_path must be / or a path that starts and ends with /",
        "The iam_permissions_boundary must be a managed policy's ARN",
    ):
        assert sentence in stderr, (sentence, stderr)

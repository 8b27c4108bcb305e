"""The fuzz pass of issue #23: valid documents mutated at random (a leaf replaced by a value of any JSON type or by an
odd number, a key deleted or added, the whole thing nested deep), fed to the CLI's file inputs (profiles, plans, a
catalog extra file, raw YAML) and to the service's endpoints. Whatever the input: the CLI ends with exit 0 or 2 and
no traceback, the service answers no 5xx. Bounded: a fixed number of examples, derandomized (the same inputs every
run, so CI never flakes), in-process."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
import yaml  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _support import MINIMAL  # noqa: E402
from conftest import ROOT  # noqa: E402
from lightning_srifty.cli import main  # noqa: E402

# the mutations add fields this release does not know: the documents say so (NewerDocumentWarning), as they must
pytestmark = pytest.mark.filterwarnings("ignore::predictor.exceptions.NewerDocumentWarning")

PROFILE = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())
LLAMA = json.loads((ROOT / "examples" / "profiles" / "llama-7b-bf16-handwritten.json").read_text())  # sharded layouts
PLAN = json.loads((ROOT / "terraform" / "examples" / "heterogeneous-mixed" / "plan.json").read_text())
EXTRA = yaml.safe_load((ROOT / "tests" / "data" / "extra_example.yaml").read_text())
FUZZ = settings(
    max_examples=int(os.environ.get("SRIFTY_FUZZ_EXAMPLES", "40")),  # a longer hunt: SRIFTY_FUZZ_EXAMPLES=2000
    deadline=None,
    derandomize=os.environ.get("SRIFTY_FUZZ_RANDOM") is None,  # CI: the same inputs every run
    database=None,
    suppress_health_check=list(HealthCheck),
)

ODD_NUMBERS = st.sampled_from([0, -1, 1e300, -1e300, 2**63, 10**30, 1e-300, 0.5, math.inf, -math.inf, math.nan])
ODD_TEXT = st.sampled_from(
    ["[/x]", "[bold]", "\u0662", "../../etc/passwd", "x;rm -rf /", "a" * 5000, "", "\ud800", " "]
)
ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _odd_like(value: Any) -> Any:
    """Values of the kind ``value`` has, at the edges (what a typo or an attacker writes), or of another kind."""
    if isinstance(value, bool):
        return st.one_of(st.just(not value), ANY)
    if isinstance(value, (int, float)):
        return st.one_of(ODD_NUMBERS, st.integers(min_value=-(2**64), max_value=2**64), st.floats(), ANY)
    if isinstance(value, str):
        return st.one_of(ODD_TEXT, st.text(max_size=12), ANY)
    if isinstance(value, list):
        return st.one_of(st.just([]), st.just(value * 3), st.just(value[:1]), ANY)
    return ANY


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in ``doc`` (the root included)."""
    out = [prefix]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out += _paths(value, (*prefix, key))
    return out


@st.composite
def mutated(draw: Any, base: Any, rounds: int = 3) -> Any:
    """``base`` with up to ``rounds`` mutations at random places: mostly a value replaced by an odd one of its kind,
    sometimes a key deleted or added, or a value nested one level deeper."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=rounds))):
        path = draw(st.sampled_from(_paths(doc)[1:] or [()]))
        if not path:
            return draw(ANY)
        *head, last = path
        parent = doc
        for key in head:
            parent = parent[key]
        action = draw(st.sampled_from(["odd", "odd", "odd", "delete", "add", "nest"]))
        if action == "odd":
            parent[last] = draw(_odd_like(parent[last]))
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(ANY)
        elif action == "nest":
            parent[last] = [parent[last]] if draw(st.booleans()) else {"x": parent[last]}
    return doc


def _write_json(path: Path, doc: Any) -> str:
    try:
        path.write_text(json.dumps(doc))  # NaN and Infinity as Python writes them
    except (UnicodeEncodeError, ValueError):  # a lone surrogate: as bytes that are not UTF-8
        path.write_bytes(json.dumps(doc, ensure_ascii=True).encode().replace(b"\\ud800", b"\xed\xa0\x80"))
    return str(path)


def _cli(capsys: Any, argv: list[str]) -> None:
    """``srifty argv`` ends with 0 or 2, says one clear thing on failure, and never shows a traceback."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusing an option
        code = exc.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        assert "error:" in err, err[-2000:]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-project")
    (folder / "train.py").write_text("print('train')\n")
    return folder


@FUZZ
@given(doc=st.one_of(mutated(PROFILE), mutated(LLAMA)))
def test_mutated_profiles(tmp_path_factory, capsys, doc) -> None:
    path = _write_json(tmp_path_factory.mktemp("p") / "profile.json", doc)
    _cli(capsys, ["profile", "show", path])
    _cli(capsys, ["predict", "--profile", path, "--fleet", "p3.2xlarge:1", "--format", "json"])


@FUZZ
@given(doc=st.one_of(mutated(PROFILE, rounds=2), mutated(LLAMA, rounds=1)))
def test_mutated_profiles_ranked(tmp_path_factory, capsys, doc) -> None:
    path = _write_json(tmp_path_factory.mktemp("r") / "profile.json", doc)
    _cli(capsys, ["recommend", "--profile", path, "--steps", "100", "--max-instances", "2", "--format", "json"])


@FUZZ
@given(doc=mutated(PLAN))
def test_mutated_plans(tmp_path_factory, capsys, monkeypatch, project, doc) -> None:
    monkeypatch.chdir(project)
    folder = tmp_path_factory.mktemp("plan")
    path = _write_json(folder / "plan.json", doc)
    _cli(capsys, ["terraform", "--plan", path, "--out", str(folder / "infra"), "--no-code", "--setup-command", "true"])


@FUZZ
@given(doc=mutated(EXTRA))
def test_mutated_catalog_extra(tmp_path_factory, capsys, doc) -> None:
    path = tmp_path_factory.mktemp("y") / "extra.yaml"
    try:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    except (yaml.YAMLError, UnicodeEncodeError):
        path.write_text(repr(doc))
    _cli(capsys, ["--catalog-extra", str(path), "catalog", "gpus"])
    _cli(capsys, ["--catalog-extra", str(path), "catalog", "show", "--format", "json"])


YAML_BITS = st.sampled_from(
    ["gpus:", "instance_types:", "  - ", "name: X", "memory_gb: ", "&a ", "*a", "!!python/object:os.system ", "{", "[",
     "? ", ": ", "\t", "\n", "'", '"', "---", "...", "%YAML 1.1", "<<: ", "1e400", ".nan", "0x1F", "~"]
)  # fmt: skip


@FUZZ
@given(text=st.lists(st.one_of(YAML_BITS, st.text(max_size=6)), max_size=25).map("".join))
def test_raw_yaml(tmp_path_factory, capsys, text) -> None:
    path = tmp_path_factory.mktemp("t") / "extra.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    _cli(capsys, ["--catalog-extra", str(path), "catalog", "gpus"])


# --- the service ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient

    from predictor.catalog import Catalog
    from predictor.service.app import ServiceSettings, create_app

    folder = tmp_path_factory.mktemp("fuzz-service")
    app = create_app(
        catalog=Catalog.load(use_refreshed=False, use_env=False),
        observations=folder / "o.sqlite",
        settings=ServiceSettings(allow_unauthenticated_writes=True, allowed_hosts=("testserver",)),
    )
    return TestClient(app, raise_server_exceptions=False)


def _post(client: Any, path: str, body: Any) -> None:
    try:
        content = json.dumps(body).encode()
    except (UnicodeEncodeError, ValueError):
        content = json.dumps(body, ensure_ascii=True).encode()
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, r.status_code, r.text[:2000])


@FUZZ
@given(body=mutated({"profile": MINIMAL, "fleet": "p3.2xlarge:1"}))
def test_mutated_predict_requests(client, body) -> None:
    _post(client, "/v1/predict", body)


@FUZZ
@given(profile=mutated(MINIMAL))
def test_mutated_rank_requests(client, profile) -> None:
    _post(client, "/v1/rank", {"profile": profile, "constraints": {"steps": 100, "max_instances": 2}})


@FUZZ
@given(body=mutated({"profile": MINIMAL, "fleet": "g5.xlarge:1", "throughput_samples_s": 500.0, "source": "fuzz"}))
def test_mutated_observations(client, body) -> None:
    _post(client, "/v1/observations", body)

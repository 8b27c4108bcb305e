"""The service's OpenAPI document is enough to generate a client (issue #24 item 13): every answer it declares,
success or error, has a JSON schema; the document is valid OpenAPI; and real answers validate against their schemas."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from _support import MINIMAL
from predictor.service.app import ServiceSettings, create_app

TOKEN = "openapi-token-" + "o" * 24  # at least 32 bytes
JSON = "application/json"


@pytest.fixture
def app(tmp_path, catalog):
    settings = ServiceSettings(max_body_bytes=200_000, token=TOKEN, allowed_hosts=("testserver",))
    return create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=settings)


@pytest.fixture
def client(app):
    with TestClient(app, headers={"authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, methods in spec["paths"].items() for method, op in methods.items()]


def _schema(spec: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    return spec["paths"][path][method.lower()]["responses"][str(status)]["content"][JSON]["schema"]


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        assert schema["$ref"].startswith("#/components/schemas/"), schema
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_a_predictions_fields_are_described(app) -> None:
    """The prediction's answer documents every field it carries (the string under each field of the dataclass, one
    declaration for Python's help and the document): a client generated from it reads what cannot_run or breakdown
    mean (a new user's trial found none described)."""
    spec = app.openapi()
    for name in ("Prediction", "GroupPrediction"):
        props = spec["components"]["schemas"][name]["properties"]
        bare = sorted(field for field, schema in props.items() if not schema.get("description"))
        assert not bare, f"{name}: fields without a description: {bare}"
    assert "TYPE: reason" in spec["components"]["schemas"]["Prediction"]["properties"]["cannot_run"]["description"]


def test_every_declared_answer_has_a_schema(app) -> None:
    spec = app.openapi()
    operations = _operations(spec)
    assert len(operations) == 7  # /docs is left out of the document; the others are all here
    missing = []
    for method, path, op in operations:
        codes = set(op["responses"])
        if not any(code.startswith("2") for code in codes):
            missing.append(f"{method} {path}: no 2xx answer")
        for code, answer in op["responses"].items():
            schema = answer.get("content", {}).get(JSON, {}).get("schema")
            if not code.startswith(("2", "4", "5")):
                continue
            if not schema or "properties" not in _resolve(spec, schema):  # {} or a bare "object": nothing to generate
                missing.append(f"{method} {path} {code}: no schema")
            elif code.startswith(("4", "5")) and _resolve(spec, schema) != spec["components"]["schemas"]["ErrorBody"]:
                missing.append(f"{method} {path} {code}: not the one error shape")
    assert not missing, "\n".join(missing)
    # what the routes would add on their own is declared: the Host check everywhere, the body limit and bad input
    for method, path, op in operations:
        assert {"400", "413"} <= set(op["responses"]), (method, path)
        if method == "POST":
            assert {"408", "422"} <= set(op["responses"]), (method, path)
    assert spec["paths"]["/v1/predict"]["post"]["responses"]["429"]["headers"]["Retry-After"]


def test_the_document_is_valid_openapi(app) -> None:
    spec = app.openapi()
    try:
        from openapi_spec_validator import validate
    except ImportError:  # the structural check: every schema is valid JSON Schema and every $ref resolves
        validate = None
    if validate is not None:
        validate(spec)
    assert spec["openapi"].startswith("3.1")
    for schema in spec["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            refs.extend([node["$ref"]] if isinstance(node.get("$ref"), str) else [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)
    unresolved = {r for r in refs if r.rsplit("/", 1)[-1] not in spec["components"]["schemas"]}
    assert refs and not unresolved, unresolved
    # operations a generator can name: unique ids
    ids = [op["operationId"] for _, _, op in _operations(spec)]
    assert len(ids) == len(set(ids))


def test_the_plan_and_profile_are_the_published_schemas(app) -> None:
    from predictor.documents.plan import plan_json_schema

    spec = app.openapi()
    published = {k: v for k, v in plan_json_schema().items() if k not in ("$schema", "$id")}
    assert _resolve(spec, _schema(spec, "POST", "/v1/rank", 200)) == published
    assert _resolve(spec, _schema(spec, "POST", "/v1/predict", 200))["title"] == "Prediction"


def _check(spec: dict[str, Any], method: str, path: str, response: Any) -> None:
    """``response``'s JSON validates against the schema the document declares for its status."""
    assert str(response.status_code) in spec["paths"][path][method.lower()]["responses"], response.text
    schema = {**_schema(spec, method, path, response.status_code), "components": spec["components"]}
    jsonschema.Draft202012Validator(schema).validate(response.json())


def test_real_answers_validate_against_their_schemas(client, app) -> None:
    spec = app.openapi()
    infeasible = {"profile": MINIMAL, "constraints": {"steps": 10**9, "deadline_h": 0.001}}
    obs = {"profile": MINIMAL, "fleet": "g5.xlarge:1", "throughput_samples_s": 100.0, "source": "run-1"}
    calls = [
        ("GET", "/healthz", {}, 200),
        ("GET", "/v1/catalog", {"params": {"region": "us-east-1"}}, 200),
        ("GET", "/v1/catalog", {"params": {"gpu": "A100"}}, 200),
        ("POST", "/v1/predict", {"json": {"profile": MINIMAL, "fleet": "p3.8xlarge:2"}}, 200),
        ("POST", "/v1/rank", {"json": {"profile": MINIMAL, "constraints": {"steps": 100_000, "max_types": 2}}}, 200),
        ("POST", "/v1/observations", {"json": obs}, 201),
        ("GET", "/v1/observations", {}, 200),
        ("POST", "/v1/runs", {"json": {}}, 201),
        ("POST", "/v1/runs", {"json": {"ttl_s": 5}}, 422),
        # errors: each kind of body the service sends
        ("GET", "/v1/observations", {"params": {"limit": 0}}, 422),
        ("POST", "/v1/predict", {"json": {"profile": MINIMAL, "fleet": "p3.2xlarg:1"}}, 422),  # unknown_name
        ("POST", "/v1/predict", {"content": b"{not json", "headers": {"content-type": JSON}}, 422),
        ("POST", "/v1/rank", {"json": infeasible}, 422),
        ("POST", "/v1/predict", {"json": {"profile": {**MINIMAL, "notes": ["x" * 1000] * 300}, "fleet": "g5"}}, 413),
        ("GET", "/healthz", {"headers": {"host": "evil.example"}}, 400),
        ("POST", "/v1/observations", {"json": obs, "headers": {"authorization": "Bearer wrong"}}, 401),
    ]
    for method, path, kwargs, status in calls:
        r = client.request(method, path, **copy.deepcopy(kwargs))
        assert r.status_code == status, (method, path, r.text)
        _check(spec, method, path, r)
    detail = client.post("/v1/rank", json=infeasible).json()["detail"][0]
    assert detail["type"] == "infeasible" and detail["binding"]  # the extra fields the schema declares


def test_a_broken_answer_fails_its_schema(client, app) -> None:
    """The schemas are not vacuous: a prediction without its iteration time, or an error without ``loc``, fails."""
    spec = app.openapi()
    prediction = client.post("/v1/predict", json={"profile": MINIMAL, "fleet": "p3.8xlarge:2"}).json()
    del prediction["iteration_time_s"]
    schema = {**_schema(spec, "POST", "/v1/predict", 200), "components": spec["components"]}
    with pytest.raises(jsonschema.ValidationError, match="iteration_time_s"):
        jsonschema.Draft202012Validator(schema).validate(prediction)
    schema = {**_schema(spec, "POST", "/v1/predict", 422), "components": spec["components"]}
    with pytest.raises(jsonschema.ValidationError, match="loc"):
        jsonschema.Draft202012Validator(schema).validate({"detail": [{"msg": "x", "type": "value_error"}]})

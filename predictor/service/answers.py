"""What ``srifty serve`` answers, declared once for its OpenAPI document (so that clients can be generated).

Each answer's schema comes from the declaration the code already returns: the prediction from the
:class:`~predictor.model.predict.Prediction` dataclass, an observation from
:class:`~predictor.service.observations.Observation`, a catalog row from
:class:`~predictor.catalog.instances.InstanceRow`, the plan from the published
``srifty.plan/v1`` JSON Schema (:func:`~predictor.documents.plan.plan_json_schema`). Only the small envelopes the
service adds (health, the catalog and observation lists, the error shape) are declared here. The routes return plain
JSON, not these types: the declarations describe the wire format, they do not re-serialise it
(``tests/recommendation/test_service_openapi.py`` checks that real answers validate against them).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import RootModel, WithJsonSchema
from typing_extensions import NotRequired, TypedDict  # pydantic needs typing_extensions' TypedDict before 3.12

from predictor.catalog.instances import InstanceRow
from predictor.documents.plan import plan_json_schema
from predictor.model.predict import Prediction
from predictor.service.observations import Observation


def _published(schema: dict[str, Any]) -> dict[str, Any]:
    """A published JSON Schema as an OpenAPI component: without ``$schema`` and ``$id`` (the document's dialect
    and base URI are OpenAPI's)."""
    return {k: v for k, v in schema.items() if k not in ("$schema", "$id")}


class Plan(RootModel[Annotated[dict[str, Any], WithJsonSchema(_published(plan_json_schema()))]]):
    """A ``srifty.plan/v1`` document (docs/plan-schema.md)."""


class Health(TypedDict):
    """``GET /healthz``: the service is up; what it runs and on which catalog."""

    status: str
    version: str
    api: str
    catalog_snapshot: str
    catalog_source: str


class CatalogListing(TypedDict):
    """``GET /v1/catalog``: the catalog's source and date, and the instance types that pass the filters."""

    source: str
    snapshot: str
    instance_types: list[InstanceRow]


class ObservationAdded(TypedDict):
    """``POST /v1/observations`` (201): the stored observation, the run it counts under (None: it was posted without
    a run token and counts toward no run), the calibration it leaves (GPU key -> factor on compute time; empty until
    enough issued runs agree) and a note saying how it counts."""

    id: int
    model_key: str
    fleet: str
    gpu: str
    run_id: str | None
    calibration: dict[str, float]
    note: str


class RunIssued(TypedDict):
    """``POST /v1/runs`` (201): a run and its token (a secret: give it to that run's jobs only); the token posts
    observations counted under the run until ``expires_at`` (ISO 8601, UTC)."""

    run_id: str
    token: str
    expires_at: str


class Observations(TypedDict):
    """``GET /v1/observations``: stored observations, newest first."""

    observations: list[Observation]


class ErrorItem(TypedDict):
    """One error: where (``loc``: ``["body", "profile", ...]``, ``["header", "host"]``, ``["query", ...]``), what
    (``msg``, with the fix) and its ``type``; some types carry more fields."""

    loc: list[str | int]
    msg: str
    type: str
    name: NotRequired[str]  # unknown_name: the name given
    suggestions: NotRequired[list[str]]  # unknown_name: close known names, best first
    binding: NotRequired[list[str]]  # infeasible: the constraints that bind
    best: NotRequired[dict[str, float]]  # infeasible: time_h, cost_usd, usd_per_hour achievable without them
    excluded: NotRequired[dict[str, int]]  # infeasible: candidates left out, by reason
    hints: NotRequired[list[str]]  # infeasible: what to relax


class ErrorBody(TypedDict):
    """Every error the service answers (4xx/5xx), whatever raised it."""

    detail: list[ErrorItem]


# a route's responses= as FastAPI types it: status code (or "default", "2XX") -> the OpenAPI answer
Responses = dict[int | str, dict[str, Any]]
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}


def error(description: str, **extra: Any) -> dict[str, Any]:
    """An error answer for a route's ``responses=``: its description and the one error shape."""
    return {"description": description, "model": ErrorBody, **extra}


GUARD: Responses = {  # Guard answers these before any route
    400: error("a Host header this service does not answer to (DNS rebinding)"),
    413: error("request body over the size limit"),
}
ERRORS: Responses = {
    **GUARD,
    422: error("bad input (detail names the field) or no feasible fleet (type 'infeasible')"),
}
BODY: Responses = {**ERRORS, 408: error("the request body did not arrive within the read timeout")}
HEAVY: Responses = {
    **BODY,
    429: error("too many rankings/predictions at once (Retry-After says when to retry)", headers=_RETRY_AFTER),
    503: error(
        "not answered within the request timeout (Retry-After says when to retry), or the observations store cannot "
        "be used now (replaced or damaged while the service ran: no Retry-After)",
        headers=_RETRY_AFTER,
    ),
}
STORE: Responses = {
    503: error("the observations store cannot be used now (replaced or damaged while the service ran)"),
}
WRITE: Responses = {
    **BODY,
    401: error(
        "no or a wrong bearer token",
        headers={"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    ),
    403: error("writes are disabled (the service has no token), or a run token asked to issue a run"),
    **STORE,
}


def answer(code: int, model: Any, description: str, errors: Responses) -> Responses:
    """A route's ``responses=``: its success answer (``model``'s schema) and its errors."""
    return {code: {"description": description, "model": model}, **errors}


__all__ = [
    "BODY",
    "ERRORS",
    "GUARD",
    "HEAVY",
    "STORE",
    "WRITE",
    "CatalogListing",
    "ErrorBody",
    "ErrorItem",
    "Health",
    "ObservationAdded",
    "Observations",
    "Plan",
    "Prediction",
    "RunIssued",
    "answer",
    "error",
]

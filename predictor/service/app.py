"""The predictor as an HTTP service (FastAPI): ``srifty serve``.

    GET  /healthz            liveness, version and catalog snapshot
    GET  /v1/catalog         instance types with prices (filters: region, gpu, cuda_only)
    POST /v1/predict         one fleet from a profile
    POST /v1/rank            a plan (srifty.plan/v1) from a profile and constraints, calibrated by observations
    POST /v1/observations    a measured throughput of a fleet (the feedback loop); GET lists them
    POST /v1/runs            a run and its token: what an observation is counted under (predictor.service.runs)

Bad input is a 422 whose ``detail`` names the field (``loc``), says what is wrong and how to fix it; an
infeasible ranking is a 422 of type ``infeasible``; a body over the size limit is a 413. Rankings and predictions
are bounded (``predictor.service.guard``): 429 when too many are asked at once, 503 past the request timeout; writes
need the bearer token (401/403; an observation may carry a run token instead); a foreign ``Host`` header is a 400.
Torch-free, like the rest of ``predictor``; FastAPI is imported only here and in ``predictor.service.guard``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Body, FastAPI, Query, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from predictor.catalog.catalog import Catalog
from predictor.catalog.instances import instance_to_dict
from predictor.documents.checks import suggest
from predictor.documents.plan import TransportName
from predictor.documents.profile import Profile, load_profile
from predictor.documents.work import global_batch
from predictor.exceptions import (
    ConfigError,
    NewerDocumentWarning,
    NoFeasibleConfigError,
    PredictionError,
    ProfileSchemaError,
    ServiceError,
    SriftyError,
    UnknownNameError,
    did_you_mean,
)
from predictor.model.predict import Prediction, predict
from predictor.ranking import Constraints, rank
from predictor.ranking.constraints import SPECS, Spec, check_percent, constraint_defaults, parse_market
from predictor.ranking.words import PYTHON, WORDS, Vocabulary, doc
from predictor.service.answers import (
    ERRORS,
    GUARD,
    HEAVY,
    STORE,
    WRITE,
    CatalogListing,
    Health,
    ObservationAdded,
    Observations,
    Plan,
    RunIssued,
    answer,
)
from predictor.service.guard import (
    MAX_BODY_BYTES,
    RUN_STATE,
    Guard,
    HeavyWork,
    SafeJSONResponse,
    ServiceSettings,
    error_response,
    server_config,
)
from predictor.service.observations import (
    FACTOR_LIMITS,
    MIN_RUNS,
    Observation,
    ObservationStore,
    measured_over_predicted,
    model_key,
    step_samples_agree,
)
from predictor.service.runs import DEFAULT_TTL_S, MAX_TTL_S, RunTokens

API_VERSION = "v1"

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return metadata.version("lightning-srifty")
    except metadata.PackageNotFoundError:  # running from a source tree that was not installed
        return "0+unknown"


def _profile_schema() -> dict[str, Any]:
    text = resources.files("predictor").joinpath("schemas/profile.v1.schema.json").read_text()
    schema = json.loads(text)
    schema.pop("$schema", None)
    schema.pop("$id", None)
    return schema


_PROFILE_FIELD = Field(
    description="A srifty.profile/v1 document (what SriftyCallback writes); see docs/profile-schema.md",
    json_schema_extra=_profile_schema(),
)


_D = constraint_defaults()  # one place for the defaults: predictor.ranking.constraints.Constraints


def _utf8(value: str) -> str:
    """Text that can be stored and echoed: a lone UTF-16 surrogate (JSON "\\ud800") cannot be encoded."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text with a lone surrogate ({value[exc.start]!r} at position {exc.start}) is not valid Unicode; "
            "send UTF-8 text (a surrogate must be half of a \\ud83d\\ude00-style pair)"
        ) from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]


def _json_value(kind: str) -> Callable[[Any], Any]:
    """A check before pydantic's: a JSON value of the ``kind`` asked, not one pydantic's lax mode would turn into it
    (a trial's ``"steps": "1000"`` was taken as 1,000 steps, ``true`` as 1 step and ``"yes"`` as true). A whole number
    written with a fraction of zero (1e6) is a JSON integer, as JSON Schema counts it, so it is taken, and one too
    large to be a number pydantic parses meets the field's bound instead of its parser's words."""

    def check(value: Any) -> Any:
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"true or false (a JSON boolean) is needed, got {_shown(value)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            unquoted = f": send {value} without the quotes" if isinstance(value, str) and _is_number(value) else ""
            raise ValueError(f"a JSON number is needed, got {_shown(value)}{unquoted}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"a finite number is needed, got {value} (a number beyond 1.8e308 reads as infinite)")
        if kind == "int" and isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return check


def _is_number(text: str) -> bool:
    """Whether ``text`` is a JSON number as written (not Python's wider float(): 1_000, inf, 0x10)."""
    return len(text) <= 40 and re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", text) is not None


def _shown(value: Any) -> str:
    """A value sent, as JSON, cut to 80 characters: a refusal is never larger than what was refused."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


_INT, _NUMBER = BeforeValidator(_json_value("int")), BeforeValidator(_json_value("number"))
JsonBool = Annotated[bool, BeforeValidator(_json_value("bool"))]


def _json(kind: str, **bounds: Any) -> Any:
    """A JSON number or boolean field's type, checked by :func:`_json_value` first, with its ``bounds`` (``ge``,
    ``le``, ...) in the type itself, as the fields below have them: on an optional field's ``Field`` they would reach
    its JSON Schema as ``ge`` and ``le`` instead of ``minimum`` and ``maximum`` (pydantic 2.14, a union with a
    validator)."""
    if kind == "bool":
        return JsonBool
    return Annotated[int, Field(**bounds), _INT] if kind == "int" else Annotated[float, Field(**bounds), _NUMBER]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PredictRequest(_Strict):
    profile: dict[str, Any] = _PROFILE_FIELD
    fleet: Text = Field(
        min_length=1, max_length=500, description="instance_type:count[,instance_type:count]", examples=["p3.8xlarge:2"]
    )
    scaling: Literal["strong", "weak"] = _D["scaling"]
    layout: Text = Field(
        "auto",
        max_length=40,
        description="the parallel layout, e.g. fsdp:full_shard+ac; auto (the default, as srifty predict's): the one "
        "srifty recommend runs the fleet with",
    )
    transport: TransportName = Field(_D["transport"], description=doc("transport", PYTHON))
    use_observations: JsonBool = Field(True, description="calibrate with observed runs of this model")


def _market(value: str) -> str:
    """A market as the CLI takes it: one of MARKETS, or ``spot:SHARE`` (mixed with that spot share)."""
    try:
        parse_market(value)
    except ConfigError as exc:
        raise ValueError(exc.in_words("service")) from None
    return value


def _constraint_field(name: str, spec: Spec) -> tuple[Any, Any]:
    """(type, Field) of one constraint for the request model, from its :class:`Spec`: the library's bounds, the
    service's tighter ``service_max``, the library's default."""
    default = _D[name]
    bounds: dict[str, Any] = {}
    if spec.kind in ("int", "number"):
        if spec.minimum is not None:
            bounds["gt" if spec.exclusive else "ge"] = spec.minimum
        high = min(b for b in (spec.maximum, spec.service_max, math.inf) if b is not None)
        if high < math.inf:
            bounds["le"] = high
    elif spec.kind in ("texts", "text"):
        if spec.service_max is not None:
            bounds["max_length"] = int(spec.service_max)
        if spec.kind == "texts" and spec.minimum:
            bounds["min_length"] = int(spec.minimum)
    kind: Any
    if spec.kind in ("int", "number", "bool"):  # the bounds in the type (:func:`_json`)
        kind, bounds = _json(spec.kind, **bounds), {}
    else:
        kind = {"text": Text, "texts": list[Text], "choice": Literal[spec.choices] if spec.choices else str}[spec.kind]
    if name == "market":  # "spot:0.75" too, as its description and the CLI say: mixed with that spot share
        kind = Annotated[str, Field(max_length=20, examples=["spot", "spot:0.75"]), AfterValidator(_market)]
    if default is None:
        kind = kind | None
    if isinstance(default, tuple):
        items = list(default)
        return kind, Field(default_factory=lambda: list(items), description=doc(name, PYTHON), **bounds)
    return kind, Field(default, description=doc(name, PYTHON), **bounds)


# the request's constraints: generated from the one declaration (predictor.ranking.constraints.SPECS); mypy sees
# the strict base model, whose fields the declaration gives at run time
if TYPE_CHECKING:
    RankConstraints = _Strict
else:
    RankConstraints = create_model(
        "RankConstraints",
        __base__=_Strict,
        __doc__="The constraints of :class:`predictor.ranking.Constraints`; give exactly one of steps (optimizer "
        "steps of the profiled global batch), samples or epochs.",
        **{name: _constraint_field(name, spec) for name, spec in SPECS.items()},
    )


class RankRequest(_Strict):
    profile: dict[str, Any] = _PROFILE_FIELD
    constraints: RankConstraints
    use_observations: JsonBool = Field(True, description="calibrate with observed runs of this model")
    words: Vocabulary = Field(
        "python",
        description="the names of the constraints in the plan's prose (reasons, notes, an infeasible ranking's hints): "
        "'python' (these fields' names) or 'flags' (srifty recommend's flags); a refused field is named as sent",
    )


class ObservationRequest(_Strict):
    profile: dict[str, Any] = _PROFILE_FIELD
    fleet: Text = Field(min_length=1, max_length=500, examples=["g5.12xlarge:2"])
    throughput_samples_s: Annotated[float, Field(gt=0, le=1e12), _NUMBER] = Field(
        description="measured samples per second on the fleet"
    )
    iteration_time_s: Annotated[float, Field(gt=0, le=1e6), _NUMBER] | None = None
    source: Text = Field(
        "",
        max_length=200,
        description="a label (e.g. 'SriftyCallback run-42'); which run the observation counts under is the run token's "
        "(POST /v1/runs), never this",
    )
    transport: TransportName | None = Field(
        None,
        description="how the fleet's nodes met, as its plan was ranked (auto: EFA where the type has it; tcp: NCCL's "
        "sockets); absent: auto. The calibration predicts the fleet that way, so a run over TCP is not read as a slow "
        "GPU",
    )


class RunRequest(_Strict):
    ttl_s: Annotated[int, Field(ge=60, le=MAX_TTL_S), _INT] = Field(
        DEFAULT_TTL_S, description="seconds the run token is accepted"
    )


_BEARER = HTTPBearer(auto_error=False, description="the token given to `srifty serve --token-file`")


class _JSONRequest(Request):
    """A request whose JSON body is parsed with every failure a JSON error (so a 422 naming the body): too deeply
    nested (Python's parser stops near 1,000 levels), not UTF-8, an integer over 4,300 digits."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, object_pairs_hook=_unique_keys)
            except json.JSONDecodeError:
                raise
            except RecursionError:
                raise json.JSONDecodeError(
                    "nested too deeply to parse (a srifty request is a few levels deep)", "", 0
                ) from None
            except UnicodeDecodeError as exc:
                raise json.JSONDecodeError("not UTF-8 text", "", exc.start) from None
            except ValueError as exc:  # e.g. an integer literal over sys.get_int_max_str_digits()
                raise json.JSONDecodeError(str(exc), "", 0) from None
        return self._json


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose names are unique, as I-JSON requires (RFC 7493, section 2.3): a name given twice is refused
    (Python's parser keeps the last, so a trial's ``{"steps": 10, "steps": 20}`` ranked 20 steps without a word)."""
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise json.JSONDecodeError(f"the name {name!r} is given twice in one object: give it once", "", 0)
        seen.add(name)
    return dict(pairs)


def _query_names(dependant: Any) -> set[str]:
    """The query parameters a route takes: its own and its dependencies'."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


# the routes that take any query and read none of it: a monitor's cache-busting ?_=<time> on a liveness check is not a
# mistake (it was answered 422, a service marked down)
_ANY_QUERY = frozenset({"/healthz"})


class _Route(APIRoute):
    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()
        known = sorted(_query_names(self.dependant))
        strict = self.path not in _ANY_QUERY

        async def parse_safely(request: Request) -> Any:
            refused = _query_refused(request, known) if strict else None
            if refused is not None:
                return refused
            return await handler(_JSONRequest(request.scope, request.receive))

        return parse_safely


def _query_refused(request: Request, known: list[str]) -> JSONResponse | None:
    """The refusal of a query parameter the route does not take, or of one given twice; None when the query is sound."""
    names = [name for name, _ in request.query_params.multi_items()]
    unknown = [name for name in names if name not in known]
    if unknown:  # a trial's ?regoin=us-east-1 listed every region's types, its typo ignored
        said = f"there is no query parameter {unknown[0]!r} on {request.url.path}"
        close = suggest(unknown[0], known, n=1)
        said += f". {did_you_mean(close)}" if close else f" (it takes {', '.join(known) or 'none'})"
        return _error(["query", unknown[0]], said, "extra_forbidden")
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # ?region=a&region=b was read as b alone
        said = f"the query parameter {twice!r} is given {names.count(twice)} times on {request.url.path}: give it once"
        return _error(["query", twice], said, "duplicate")
    return None


def _error(loc: list[Any], message: str, kind: str, status: int = 422, **extra: Any) -> JSONResponse:
    return error_response(loc, message, kind, status, **extra)


def _profile(data: dict[str, Any]) -> tuple[Profile, tuple[str, ...]]:
    """The request's profile, and what the answer says of it: fields a newer release wrote are ignored, said in the
    answer's notes (a raw HTTP caller sees them; a trial found them ignored without a word) and in the service's log,
    not raised as a warning of the service's process (where warnings are errors it answered 500; the Python client
    says it on the client's side before sending)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            profile = load_profile(data)
    except ProfileSchemaError as exc:
        raise _BadField(["body", "profile", *exc.field.split(".")], str(exc)) from None
    said: list[str] = []
    for w in caught:
        if issubclass(w.category, NewerDocumentWarning):
            log.warning("srifty serve: %s", w.message)
            said.append(f"request: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return profile, tuple(said)


class _BadField(Exception):
    def __init__(self, loc: list[Any], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def create_app(
    *,
    catalog: Catalog | None = None,
    observations: ObservationStore | str | Path | None = None,
    settings: ServiceSettings | None = None,
) -> FastAPI:
    """The service.

    Args:
        catalog: instance types and prices (default: ``Catalog.load()``).
        observations: a store or a SQLite path (default: ``predictor.service.observations.default_path()``).
        settings: limits, the write token and the allowed ``Host`` names (default: ``ServiceSettings()``: no token,
            so writes are refused).

    The steps: the application and its state, the one error shape (:func:`_add_error_handlers`), the routes
    (:func:`_add_read_routes`, :func:`_add_model_routes`, :func:`_add_observation_routes`), then the guard.
    """
    settings = settings or ServiceSettings()
    catalog = catalog or Catalog.load()
    store = observations if isinstance(observations, ObservationStore) else ObservationStore(observations)
    heavy = HeavyWork(settings)
    version = _version()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        heavy.close()  # its threads end with the app (a process that started many apps, the tests', kept them all)

    app = FastAPI(
        lifespan=lifespan,
        title="lightning-srifty predictor",
        version=version,
        description="Predict and rank EC2 GPU fleets for a profiled PyTorch Lightning run.",
        docs_url=None,  # Swagger UI and ReDoc load from a CDN: a blank page offline; /docs is served below
        redoc_url=None,
    )
    app.router.route_class = _Route
    app.state.catalog, app.state.observations, app.state.settings, app.state.heavy = catalog, store, settings, heavy
    _add_error_handlers(app)
    # Every route declares its answers (the success one from the declaration the code returns, the errors as the one
    # error shape) and returns plain JSON: response_model=None, so nothing is re-serialised (predictor.service.answers)
    _add_read_routes(app, catalog, version)
    _add_model_routes(app, catalog, store, heavy)
    _add_observation_routes(app, catalog, store)
    app.state.run_tokens = runs = RunTokens(settings.token)
    _add_run_routes(app, runs)
    app.add_middleware(Guard, settings=settings, runs=runs)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as the one error shape (:func:`predictor.service.guard.error_response`): a 422 whose ``loc``
    names the field, of type ``value_error``, ``infeasible`` (with the binding constraint, the best value, the
    exclusions and hints), ``unknown_name`` (with suggestions), ``cannot_predict`` or the library error's class; a
    request that does not validate keeps pydantic's errors, a body that is not JSON says why."""

    @app.exception_handler(_BadField)
    async def bad_field(_: Request, exc: _BadField) -> JSONResponse:
        return _error(exc.loc, str(exc), "value_error")

    @app.exception_handler(NoFeasibleConfigError)
    async def infeasible(_: Request, exc: NoFeasibleConfigError) -> JSONResponse:
        return _error(
            ["body", "constraints"],
            str(exc),
            "infeasible",
            binding=list(exc.binding),
            best=exc.best,
            excluded=exc.excluded,
            hints=list(exc.hints),
        )

    @app.exception_handler(ConfigError)
    async def config_error(request: Request, exc: ConfigError) -> JSONResponse:
        # a refused value in the service's words: the JSON field, not a Python parameter (its parts, or its template)
        return _error(_loc(request, exc.parameter or "body"), exc.in_words("service"), "value_error")

    @app.exception_handler(UnknownNameError)
    async def unknown(request: Request, exc: UnknownNameError) -> JSONResponse:
        if exc.kind == "GPU":  # a catalog query's, else the profile's GPU
            field = "gpu" if request.url.path == "/v1/catalog" else "profile.hardware.gpu"
        else:  # an instance type: a prediction's fleet, a ranking's current fleet (its allow / deny: ConfigError)
            field = "current_fleet" if request.url.path == "/v1/rank" else "fleet"
        return _error(_loc(request, field), str(exc), "unknown_name", name=exc.name, suggestions=exc.suggestions)

    @app.exception_handler(PredictionError)
    async def cannot_predict(_: Request, exc: PredictionError) -> JSONResponse:
        return _error(["body", "profile"], str(exc), "cannot_predict")

    @app.exception_handler(ServiceError)
    async def unavailable(_: Request, exc: ServiceError) -> JSONResponse:
        return _error(["body"], str(exc), "unavailable", status=exc.status or 503)

    @app.exception_handler(SriftyError)
    async def other(_: Request, exc: SriftyError) -> JSONResponse:
        return _error(["body"], str(exc), type(exc).__name__)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            error = {k: v for k, v in e.items() if k in ("loc", "msg", "type")}
            error["msg"] = _not_json(request, e) or _explained(e)
            errors.append(error)
        return SafeJSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def _not_json(request: Request, error: Mapping[str, Any]) -> str | None:
    """What to say of a body that is not JSON: its parser's error, or, for a whole body that is not an object and
    was not sent as JSON (curl -d sends a form by default: a trial got "a valid dictionary ... got b'{...}'"), to send
    it as JSON; None otherwise."""
    if error.get("type") == "json_invalid" and error.get("ctx", {}).get("error"):
        return f"the body is not valid JSON: {error['ctx']['error']}"
    sent = request.headers.get("content-type", "")
    if list(error.get("loc", ())) == ["body"] and sent.split(";")[0].strip().lower() != "application/json":
        return (
            f"the body was sent as {sent or 'no content type'}: send JSON with Content-Type: application/json "
            "(curl -H 'Content-Type: application/json' -d @request.json)"
        )
    return None


def _explained(error: Mapping[str, Any]) -> str:
    """pydantic's message for a request that does not validate, with what was given and, for a constraint, what it
    means and its unit; an unknown constraint with the closest name (a trial read "Input should be greater than 0"
    for deadline_h -5 and "Extra inputs are not permitted" for deadline, where the CLI names the value and the fix)."""
    msg, loc = str(error.get("msg", "")), list(error.get("loc", ()))
    if error.get("type") == "value_error":  # a check of ours: its words, without pydantic's prefix
        msg = msg.removeprefix("Value error, ")
    field = loc[-1] if loc and isinstance(loc[-1], str) else None
    constraint = "constraints" in loc and field in SPECS
    if error.get("type") == "extra_forbidden" and field is not None:
        known = SPECS if "constraints" in loc else {n for m in _Strict.__subclasses__() for n in m.model_fields}
        close = suggest(field, sorted(known), n=1)
        return f"{msg}: there is no field {field!r}" + (f". {did_you_mean(close)}" if close else "")
    if "input" in error and error.get("type") != "missing" and "got " not in msg.lower():  # said once
        given = _as_sent(error["input"])
        msg += f"; got {given[:80] + '...' if len(given) > 80 else given}"
    if constraint and "must be one of" not in msg:  # a choice's refusal lists the choices: the doc would again
        spec = SPECS[str(field)]
        msg += f" ({field}: {spec.doc}" + (f", in {UNITS.get(spec.unit, spec.unit)}" if spec.unit else "") + ")"
        if error.get("type") == "less_than_equal" and spec.service_max is not None and spec.maximum != spec.service_max:
            msg += "; the service's limit, tighter than the library's (srifty recommend takes more)"
        if field == "confidence":  # a percentage: the library's and the CLI's words for it (an audit)
            try:
                check_percent(error.get("input"))
            except ConfigError as exc:
                msg += f". {exc}"
    return msg


UNITS = {"h": "hours"}


def _as_sent(value: Any) -> str:
    """A value for a refusal: a whole number sent as 1e30 reaches the bound as the int it is, said as sent; one past
    a float's range (a 400-digit literal) by its digits."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) < 10**15:
        return repr(value)
    digits = len(str(abs(value)))
    return f"{value:.6g}" if digits <= 308 else f"an integer of {digits} digits"


def _loc(request: Request, field: str) -> list[str]:
    """Where a refused field is in the request, as pydantic's own errors say it: a catalog query's parameter, a
    ranking's constraint under ``constraints``, else the body's field (a trial found them all at ``["body", name]``
    or ``["body"]``: a generated client maps ``loc`` to its form's field)."""
    if request.url.path == "/v1/catalog":
        return ["query", field]
    if request.url.path == "/v1/rank" and field in SPECS:
        return ["body", "constraints", field]
    return ["body", *field.split(".")]


def _add_read_routes(app: FastAPI, catalog: Catalog, version: str) -> None:
    """The routes that only read: /docs (the API reference, :func:`docs_html`), /healthz and /v1/catalog."""

    @app.get("/docs", include_in_schema=False)
    def docs_page() -> HTMLResponse:
        return HTMLResponse(
            docs_html(app.openapi()),
            headers={"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"},
        )

    @app.get("/healthz", response_model=None, responses=answer(200, Health, "the service is up", GUARD))
    def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "version": version,
            "api": API_VERSION,
            "catalog_snapshot": catalog.info.snapshot,
            "catalog_source": catalog.info.source,
        }

    @app.get("/v1/catalog", response_model=None, responses=answer(200, CatalogListing, "the instance types", ERRORS))
    def get_catalog(
        region: Annotated[str | None, Query(max_length=32)] = None,
        gpu: Annotated[str | None, Query(max_length=64)] = None,
        cuda_only: bool = True,
    ) -> dict[str, Any]:
        if region is not None:  # as /v1/rank refuses it, not an empty listing
            catalog.check_region(region, "region")
        types = catalog.filter(region=region, gpu=gpu, cuda_only=cuda_only)
        return {
            "source": catalog.info.source,
            "snapshot": catalog.info.snapshot,
            "instance_types": [instance_to_dict(it, region) for it in types],
        }


def _add_model_routes(app: FastAPI, catalog: Catalog, store: ObservationStore, heavy: HeavyWork) -> None:
    """/v1/predict and /v1/rank: the model's work, each in a :class:`HeavyWork` thread (bounded; the event loop
    stays free), calibrated by the observations of the model when asked."""

    @app.post("/v1/predict", responses=answer(200, Prediction, "the prediction of the fleet", HEAVY))
    async def post_predict(request: Annotated[PredictRequest, Body()]) -> JSONResponse:
        def work() -> JSONResponse:  # in a HeavyWork thread: the event loop stays free
            profile, said = _profile(request.profile)
            calibration = store.calibration(profile, catalog) if request.use_observations else None
            prediction = predict(
                profile,
                request.fleet,
                catalog=catalog,
                scaling=request.scaling,
                calibration=calibration.factors if calibration else None,
                layout=request.layout,
                transport=request.transport,
            )
            if said:
                prediction = dataclasses.replace(prediction, assumptions=(*said, *prediction.assumptions))
            return SafeJSONResponse(prediction.to_dict())

        return await heavy.run("prediction", work)

    @app.post("/v1/rank", responses=answer(200, Plan, "a plan (srifty.plan/v1)", HEAVY))
    async def post_rank(request: Annotated[RankRequest, Body()]) -> JSONResponse:
        def work() -> JSONResponse:
            profile, said = _profile(request.profile)
            constraints = Constraints.build(**request.constraints.model_dump(exclude_unset=True))
            calibration = store.calibration(profile, catalog) if request.use_observations else None
            # a JSONResponse skips FastAPI's jsonable_encoder (3.7 ms for a plan; the dict is plain JSON already)
            words = WORDS[request.words]
            plan = rank(profile, constraints, catalog=catalog, calibration=calibration, words=words)
            if said:
                plan = dataclasses.replace(plan, notes=(*said, *(plan.notes or ())))
            return SafeJSONResponse(plan.to_dict())

        return await heavy.run("ranking", work)


def _add_observation_routes(app: FastAPI, catalog: Catalog, store: ObservationStore) -> None:
    """/v1/observations: POST stores a measured throughput of a fleet (the feedback loop; the bearer token is
    checked by :class:`Guard`) and answers the model's calibration; GET lists them, newest first."""

    @app.post(
        "/v1/observations",
        status_code=201,
        response_model=None,
        responses=answer(201, ObservationAdded, "the observation, stored", WRITE),
        dependencies=[Security(_BEARER)],
    )  # the token is checked by Guard before the body is read; the dependency documents it in the OpenAPI
    def post_observation(http: Request, request: Annotated[ObservationRequest, Body()]) -> dict[str, Any]:
        profile, said = _profile(request.profile)
        run_id = getattr(http.state, RUN_STATE, None)  # set by Guard from a verified run token only
        obs = store.add(
            profile,
            request.fleet,
            request.throughput_samples_s,
            iteration_time_s=request.iteration_time_s,
            source=request.source,
            run_id=run_id,
            catalog=catalog,
            transport=request.transport,
        )
        calibration = store.calibration(profile, catalog)
        note = " ".join((*said, _observation_note(profile, obs, catalog, run_id)))
        return {
            "id": obs.id,
            "model_key": obs.model_key,
            "fleet": obs.fleet,
            "gpu": obs.gpu,
            "run_id": run_id,
            "calibration": dict(calibration.factors) if calibration else {},
            "note": note,
        }

    @app.get(
        "/v1/observations",
        response_model=None,
        responses=answer(200, Observations, "stored observations, newest first", {**ERRORS, **STORE}),
    )
    def get_observations(
        model_key_: Annotated[str | None, Query(alias="model_key", max_length=300)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        return {"observations": [o.__dict__ for o in store.list(model_key_, limit)]}


def _add_run_routes(app: FastAPI, runs: RunTokens) -> None:
    """/v1/runs: POST issues a run and its token (the service's own token only, checked by :class:`Guard`): what
    an observation is counted under (:mod:`predictor.service.runs`)."""

    @app.post(
        "/v1/runs",
        status_code=201,
        response_model=None,
        responses=answer(201, RunIssued, "a run and its token", WRITE),
        dependencies=[Security(_BEARER)],
    )
    def post_run(request: Annotated[RunRequest, Body()]) -> dict[str, Any]:
        return runs.issue(request.ttl_s).__dict__


def docs_html(spec: dict[str, Any]) -> str:
    """The API reference as one HTML page that needs nothing else (no script, no stylesheet, no CDN): every endpoint
    with its summary, parameters, request schema and answers, from the OpenAPI document."""
    import html

    def esc(value: Any) -> str:
        return html.escape(str(value))

    def schema(ref_or_schema: dict[str, Any]) -> str:
        name = str(ref_or_schema.get("$ref", "")).rsplit("/", 1)[-1]
        body = spec.get("components", {}).get("schemas", {}).get(name, ref_or_schema)
        return (
            f"<details><summary>{esc(name or 'schema')}</summary><pre>{esc(json.dumps(body, indent=2))}</pre></details>"
        )

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>",
        esc(spec["info"]["title"]),
        "</title><style>body{font:14px sans-serif;max-width:60em;margin:2em auto}code,pre{background:#f4f4f4}"
        "pre{padding:.5em;overflow:auto}h2{border-top:1px solid #ccc;padding-top:.5em}</style></head><body>",
        f"<h1>{esc(spec['info']['title'])} {esc(spec['info']['version'])}</h1>",
        f"<p>{esc(spec['info'].get('description', ''))} The machine-readable description is "
        "<a href='/openapi.json'><code>/openapi.json</code></a>.</p>",
    ]
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            parts.append(f"<h2><code>{esc(method.upper())} {esc(path)}</code></h2><p>{esc(op.get('summary', ''))}</p>")
            params = op.get("parameters") or []
            if params:
                rows = "".join(
                    f"<li><code>{esc(p['name'])}</code> ({esc(p.get('in'))}){' required' if p.get('required') else ''}"
                    "</li>"
                    for p in params
                )
                parts.append(f"<p>Parameters:</p><ul>{rows}</ul>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                parts.append("<p>Request body (JSON):</p>" + schema(body))
            answers = "".join(
                f"<li><code>{esc(code)}</code> {esc(r.get('description', ''))}</li>"
                for code, r in op.get("responses", {}).items()
            )
            parts.append(f"<p>Answers:</p><ul>{answers}</ul>")
    parts.append("</body></html>")
    return "".join(parts)


@contextlib.contextmanager
def background_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread (port 0: a free one); yields the base URL; stops on exit."""
    import threading

    import uvicorn

    config = server_config(app, app.state.settings, host, port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="srifty-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the service did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{host}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _observation_note(profile: Profile, obs: Observation, catalog: Catalog, run_id: str | None) -> str:
    """What became of an observation: left out of every calibration (a step that is not the profiled training's, a
    fleet of mixed GPUs, or a throughput beyond what an observation is read as), or counted under its run, or under
    none."""
    if not step_samples_agree(profile, obs):
        implied = obs.throughput_samples_s * (obs.iteration_time_s or 0.0)
        return (
            f"stored, but left out of every calibration: throughput x iteration_time_s is {implied:,.4g} samples a "
            f"step, where the profiled training's global batch is {global_batch(profile):,}: throughput_samples_s is "
            "the whole fleet's samples per second (every GPU's together) and iteration_time_s one optimizer step "
            "(its accumulated batches); a run with another global batch is another profile"
        )
    if "," in obs.gpu:  # the calibration's own rule (ObservationStore.calibration); a trial read "counted under"
        return (
            f"stored, but left out of every calibration: {obs.fleet} mixes GPU types ({obs.gpu}), and a mixed "
            "fleet's throughput cannot say which GPU was off; an observation of one GPU type calibrates it"
        )
    ratio = measured_over_predicted(profile, obs, catalog)
    if ratio is not None and not FACTOR_LIMITS[0] <= ratio <= FACTOR_LIMITS[1]:  # a trial read "counted under"
        return (
            f"stored, but left out of every calibration: it is x{ratio:.3g} the model's throughput for "
            f"{obs.fleet}, beyond the x{FACTOR_LIMITS[0]:g}-x{FACTOR_LIMITS[1]:g} an observation is read as (a "
            "wrong fleet, or samples counted in another unit?)"
        )
    if run_id is None:
        return (
            "stored, counted toward no run: it was not posted with a run token (POST /v1/runs issues one); "
            f"a GPU's calibration moves when {MIN_RUNS} issued runs agree"
        )
    return f"counted under {run_id}; a GPU's calibration moves when {MIN_RUNS} issued runs agree"


__all__ = ["MAX_BODY_BYTES", "ServiceSettings", "background_server", "create_app", "model_key"]

"""Every error lightning-srifty raises on purpose, in one hierarchy.

    SriftyError
    ├── ConfigError (also ValueError)      a parameter or option has a bad value
    ├── ProfileError                       a profile cannot be produced or read
    │   └── ProfileSchemaError (also ValueError)   a profile field is missing or malformed
    ├── CatalogError
    │   └── UnknownNameError (also KeyError)       an unknown GPU / instance type, with suggestions
    ├── PredictionError
    ├── NoFeasibleConfigError
    ├── ServiceError                       the predictor service could not be reached or refused a request
    ├── ProvisionError
    ├── MigrationError
    └── MissingExtraError (also ImportError)   an optional part (an extra of the package) is not installed

    LaunchInterrupted (a BaseException, like KeyboardInterrupt)   srifty launch got SIGINT/SIGTERM/SIGHUP

    SriftyWarning (a UserWarning)
    └── NewerDocumentWarning              a document has fields this release does not know (written by a newer one)

Every exception carries structured fields so that callers (the CLI, the HTTP service) can render them
without parsing the message.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence

from typing_extensions import Self


class SriftyError(Exception):
    """Base class of every error raised on purpose by lightning-srifty.

    A message that names settings is raised from a template (:meth:`named`; :meth:`ConfigError.between` for a
    refusal): each ``{name}`` a parameter, said by each front end in its own words (:meth:`in_words`: Python the
    name, ``srifty`` the running command's flag, the service the JSON field); ``facts`` fill the other fields.
    """

    template: str | None = None
    facts: Mapping[str, object] = {}

    @classmethod
    def named(cls, template: str, **facts: object) -> Self:
        """The error raised from ``template`` (the class's constructor must take the message alone)."""
        exc = cls(_said(template, facts, str))
        exc.template, exc.facts = template, dict(facts)
        return exc

    def template_names(self) -> list[str]:
        """The parameters the template names, its facts apart (none without a template)."""
        if self.template is None:
            return []
        return [n for n in dict.fromkeys(_fields(self.template)) if n not in self.facts]

    def in_words(self, front: str = "python", name_of: Callable[[str], str | None] | None = None) -> str:
        """The message for one front end: ``"python"`` (the message as raised), ``"cli"`` (``name_of``: a
        parameter's flag) or ``"service"`` (a parameter's JSON field), rebuilt from its template; a message without
        one (prose) is the same for every front end."""
        if front == "python" or self.template is None:
            return str(self)
        return _said(self.template, self.facts, lambda n: _front_name(n, front, name_of))


def _said(template: str, facts: Mapping[str, object], name: Callable[[str], str]) -> str:
    """``template`` filled in: its facts as given, every other field a parameter said as ``name`` says it."""
    return template.format_map({n: facts[n] if n in facts else name(n) for n in _fields(template)})


def _front_name(parameter: str, front: str, name_of: Callable[[str], str | None] | None) -> str:
    """A parameter as a front end says it: ``name_of``'s answer, else the flag spelt from it (cli) or the quoted
    JSON field (service)."""
    given = name_of(parameter) if name_of is not None else None
    return given or (f"--{parameter.replace('_', '-')}" if front == "cli" else repr(parameter))


class ConfigError(SriftyError, ValueError):
    """A parameter or option has a value that cannot work.

    A refusal made by :mod:`predictor.documents.checks` keeps its parts (scikit-learn's ``InvalidParameterError``
    idea), so that each front end says it in its own words (:meth:`in_words`): Python names the parameter of the
    function (the message as raised), ``srifty`` the flag, the service the JSON field.

    Attributes:
        parameter: the parameter's name.
        value: the value that was given.
        owner: the function or class whose parameter it is (``"rank()"``), when known.
        expected: what the value must be (``"an int >= 1"``), when the refusal has parts.
        got: the value as the message shows it.
        fix: what to do, when there is more to say.
        template: a message naming several parameters, each as ``{name}`` (:meth:`between`), when it has one.
        facts: the template's fields that are values shown as given (a path, a count), the same in every front end.
    """

    def __init__(
        self,
        message: str,
        *,
        parameter: str | None = None,
        value: object = None,
        owner: str | None = None,
        expected: str | None = None,
        got: str | None = None,
        fix: str = "",
        template: str | None = None,
        facts: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value
        self.owner, self.expected, self.got, self.fix, self.template = owner, expected, got, fix, template
        self.facts = dict(facts or {})

    @classmethod
    def between(cls, template: str, *, parameter: str, value: object = None, **facts: object) -> ConfigError:
        """A refusal that names settings: ``template`` names each parameter as ``{name}`` (Python reads ``name``,
        ``srifty`` its flag, the service its field); ``parameter`` is the one to change. ``facts`` fill the
        template's other fields with what was given (``{path}``, ``{count!r}``), the same in every front end: a
        value is never written into the template itself, where a brace in it would be read as a field."""
        message = _said(template, facts, str)
        return cls(message, parameter=parameter, value=value, template=template, facts=facts)

    def in_words(self, front: str = "python", name_of: Callable[[str], str | None] | None = None) -> str:
        """The message for one front end (see :meth:`SriftyError.in_words`), rebuilt from the refusal's parts or
        its template; a message with neither (prose) is the same for every front end."""
        if front == "python" or self.template is not None or self.expected is None or not self.parameter:
            return super().in_words(front, name_of)
        message = f"{_front_name(self.parameter, front, name_of)} must be {self.expected}. Got {self.got}."
        return f"{message} {self.fix}" if self.fix else message


def did_you_mean(close: Sequence[str]) -> str:
    """The sentence that offers the names closest to a mistyped one (``predictor.documents.checks.suggest``'s,
    best first): "Did you mean 'a'?" or "Did you mean 'a' or 'b'?"; empty when none is close."""
    return f"Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _fields(template: str) -> list[str]:
    """The ``{name}`` fields of a message template, each a name (``{a.b}``, ``{a[0]}`` or ``{0}`` would fail when
    the error is raised, far from the mistake: refused where the template is read)."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    bad = [f for f in fields if not f.isidentifier()]
    if bad:
        raise ValueError(f"a message template's fields are names, got {bad[0]!r} in {template!r}")
    return fields


class ProfileError(SriftyError):
    """A profile cannot be produced or read."""


class ProfileSchemaError(ProfileError, ValueError):
    """A profile (or another versioned document) does not match its schema.

    Attributes:
        field: dotted path of the offending field, e.g. ``timing.step_time_s.p50``.
        value: the offending value (``None`` when the field is missing).
    """

    def __init__(self, message: str, *, field: str, value: object = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class CatalogError(SriftyError):
    """The instance / GPU catalog cannot answer."""


class UnknownNameError(CatalogError, KeyError):
    """An instance type, GPU or region name that the catalog does not know.

    Attributes:
        kind: what was looked up ("GPU", "instance type", ...).
        name: the name given.
        suggestions: close known names, best first.
    """

    def __init__(self, kind: str, name: str, suggestions: Sequence[str] = (), hint: str = "") -> None:
        self.kind = kind
        self.name = name
        self.suggestions = list(suggestions)
        message = f"Unknown {kind} {name!r}."
        if self.suggestions:
            message += " " + did_you_mean(self.suggestions)
        if hint:
            message += " " + hint
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class PredictionError(SriftyError):
    """A prediction cannot be made from the given profile and fleet."""


class NoFeasibleConfigError(SriftyError):
    """No fleet satisfies the constraints.

    Attributes:
        binding: the parameters of ``rank()`` that bind, e.g. ``("deadline_h",)``; a constraint binds when relaxing
            it alone would leave a fleet (all of them when none does alone). Feasibility rather than a limit binds
            as ``"memory"`` (no fleet holds the model), ``"instance_types"`` (none left after allow/deny, prices
            and the hardware checks) or ``"market"`` (no price in the markets and regions asked).
        best: the best values achievable without the binding constraints: ``time_h`` (the fastest fleet),
            ``cost_usd`` (the cheapest), ``usd_per_hour`` (the lowest price per hour), where known.
        excluded: candidates (or instance types) left out, by reason.
        hints: what to relax, in the parameters' names.
    """

    def __init__(
        self,
        message: str,
        *,
        binding: Sequence[str] = (),
        best: Mapping[str, float] | None = None,
        excluded: Mapping[str, int] | None = None,
        hints: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.binding = tuple(binding)
        self.best = dict(best or {})
        self.excluded = dict(excluded or {})
        self.hints = tuple(hints)


class ServiceError(SriftyError):
    """The predictor service (``srifty serve``) could not be reached or refused a request.

    Attributes:
        status: the HTTP status (None when no answer came back).
        retry_after_s: for a 429 (too many requests at once) or a 503 (timed out), the service's Retry-After.
    """

    def __init__(self, message: str, *, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ProvisionError(SriftyError):
    """Provisioning infrastructure (Terraform) failed."""


class PreflightError(ProvisionError):
    """The pre-flight of a fleet found a problem (quota, offering, bucket, credentials, script): nothing was started.

    Attributes:
        report: the whole pre-flight (``srifty.preflight/v1``), every check with its fix.
    """

    def __init__(self, message: str, *, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


class CapacityError(ProvisionError):
    """EC2 could not start the fleet now: no capacity (``InsufficientInstanceCapacity``, spot capacity not available),
    a vCPU quota, or the type not offered where asked. ``srifty launch`` moves to the next entry of the plan.

    Attributes:
        code: the EC2 error code (or ``preflight:quota`` / ``preflight:offering``).
    """

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class MigrationError(SriftyError):
    """Moving a training job between fleets failed."""


# the extra of pyproject.toml that brings each optional top-level module (tests/house/test_extras.py holds the two in
# step)
EXTRA_OF_MODULE = {
    "torch": "train",
    "lightning": "train",
    "fastapi": "serve",
    "uvicorn": "serve",
    "starlette": "serve",
    "pydantic": "serve",
    "boto3": "infra",
    "botocore": "infra",
    "python_terraform": "infra",
    "pathspec": "infra",
    "packaging": "infra",
    "fsspec": "infra",
    "s3fs": "infra",
    "aiobotocore": "infra",
    "matplotlib": "report",
    "sklearn": "report",
    "moto": "rehearse",  # srifty rehearse's local AWS
}
# modules two audiences share: the launcher's (infra, above) and the training job's, whose S3 checkpoints need them
# too; the job side (the package's names, srifty demo and capture) is told its own extra
JOB_EXTRA_OF_MODULE = {"fsspec": "train", "s3fs": "train", "aiobotocore": "train"}
JOB_SIDE = ("lightning_srifty.", "srifty demo", "srifty capture")


class MissingExtraError(SriftyError, ImportError):
    """What was asked needs an optional part of lightning-srifty that is not installed: one of the package's extras
    (``train``, ``infra``, ``serve``, ``report``; README "Installs that fit each user").

    Attributes:
        what: what needed it (``srifty serve``, ``lightning_srifty.SriftyCallback``).
        extra: the extra that brings it.
        module: the top-level module that is missing.
    """

    def __init__(self, what: str, extra: str, module: str) -> None:
        self.what, self.extra, self.module = what, extra, module
        super().__init__(
            f"{what} needs the {extra!r} extra ({module} is not installed): pip install 'lightning-srifty[{extra}]'",
            name=module,
        )

    @classmethod
    def of(cls, exc: ImportError, what: str) -> MissingExtraError | None:
        """The error to raise in place of ``exc`` when the module it misses is not installed and comes with an extra;
        else None: a module no extra brings, or an installed one that fails to import (a version without the name
        asked), is a real error and shows as one."""
        import importlib.util

        if isinstance(exc, cls):
            return exc
        module = (exc.name or "").split(".")[0]
        extra = EXTRA_OF_MODULE.get(module)
        if what.startswith(JOB_SIDE):
            extra = JOB_EXTRA_OF_MODULE.get(module, extra)
        if extra is None or importlib.util.find_spec(module) is not None:
            return None
        return cls(what, extra, module)


class LaunchInterrupted(BaseException):
    """``srifty launch`` (or another command that started something: ``srifty rehearse``) was stopped by SIGINT,
    SIGTERM or SIGHUP. Not a SriftyError: like KeyboardInterrupt it passes
    every ``except Exception``, so that the launcher releases every fleet it brought up before it ends.

    Attributes:
        signum: the signal's number; signal_name: its name (``SIGTERM``).
        exit_code: 128 + signum (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), what the shell expects.
        released: the names of the fleets released on the way out.
    """

    def __init__(self, signum: int, who: str = "srifty launch") -> None:
        import signal

        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.released: list[str] = []
        super().__init__(f"{who} stopped by {self.signal_name}")


class SriftyWarning(UserWarning):
    """Base class of the warnings lightning-srifty issues."""


class NewerDocumentWarning(SriftyWarning):
    """A profile or plan of this major version has fields this release does not know: they were ignored.

    Attributes:
        fields: the dotted paths of the ignored fields.
    """

    def __init__(self, message: str, *, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields = list(fields)

"""What a ranking is asked: :class:`Constraints`, built and defaulted here for the CLI, the callback, the service,
the plan and the re-plan (:meth:`Constraints.build`, :meth:`Constraints.from_plan`), with the objective and the
market as enums and the work as a :class:`predictor.documents.work.Work`."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from predictor.documents.checks import check_choice, check_int, check_number, refused, suggest
from predictor.documents.plan import MARKETS, OBJECTIVES, TRANSPORTS, FleetMarket, PlanConstraints, TransportName
from predictor.documents.profile import Profile
from predictor.documents.work import Work, global_batch
from predictor.exceptions import ConfigError, did_you_mean
from predictor.model.fleets import SCALINGS, Scaling
from predictor.model.layout import Layout, parse


class Objective(str, enum.Enum):
    """What is minimised."""

    COST = "cost"
    TIME = "time"
    COST_PER_SAMPLE = "cost_per_sample"

    def __str__(self) -> str:
        return self.value


class Market(str, enum.Enum):
    """Capacity markets considered: one, or ``any`` (on-demand, spot and mixed each)."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    MIXED = "mixed"  # an on-demand base plus a spot share
    ANY = "any"

    def __str__(self) -> str:
        return self.value

    def markets(self) -> tuple[str, ...]:
        """The markets candidates are priced in."""
        return get_args(FleetMarket) if self is Market.ANY else (self.value,)


# the layouts a ranking can consider (predictor.model.layout names; "pipeline" has one stage per node of each fleet)
LAYOUTS = (
    "ddp",
    "ddp+ac",
    "fsdp:shard_grad_op",
    "fsdp:shard_grad_op+ac",
    "fsdp:full_shard",
    "fsdp:full_shard+ac",
    "fsdp:hybrid_shard",
    "fsdp:hybrid_shard+ac",
    "pipeline",
    "pipeline+ac",
)
OWNER = "rank()"
# optimizer steps of any one training, however given (steps, or epochs x steps_per_epoch): the work's bounds hold
# everywhere (no training has come within 1,000x of them: a value past one is a typo)
MAX_STEPS = 10**12


@dataclass(frozen=True)
class Spec:
    """One constraint, declared once: the library's dataclass field carries it, and the service's request model
    (``predictor.service.app.RankConstraints``), the CLI's flags (``srifty recommend``) and the plan's record
    (:class:`~predictor.documents.plan.PlanConstraints`) are read from it (tests/recommendation/test_constraints.py
    holds them together).

    ``kind``: int, number, text, texts (a list), choice (``choices``), bool. ``minimum``/``maximum`` bound the value
    everywhere (``exclusive``: above the minimum); ``service_max`` is the service's tighter bound for requests from
    the network (for texts: the list's length). ``flag``: the CLI flag ("" = ``--`` and the name with dashes; None =
    not a flag, with the reason in ``doc``). ``plan``: the :class:`PlanConstraints` field recording it (None: not
    recorded; the work is recorded as ``work_samples``)."""

    doc: str
    kind: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    service_max: float | None = None
    choices: tuple[str, ...] = ()
    flag: str | None = ""
    unit: str = ""
    plan: str | None = None
    pattern: str = ""  # a text's form (re.fullmatch), with ``example`` saying it in words
    example: str = ""


def _c(default: Any, doc: str, kind: str, *, plan: str | None = "", **spec: Any) -> Any:
    """A :class:`Constraints` field with its :class:`Spec` (``plan`` "": recorded under the same name)."""
    return field(default=default, metadata={"spec": Spec(doc, kind, plan=plan, **spec)})


DRIVER_DOC = (
    "the NVIDIA driver of the image the nodes boot (default: the Deep Learning AMI's, the image srifty terraform boots "
    "without --ami); a GPU no build of the profiled torch runs on it is left out"
)
DRIVER_EXAMPLE = "an NVIDIA driver version such as 580.65.06 (what nvidia-smi prints on the image)"
TRANSPORT_DOC = (
    "how a multi-node fleet's nodes meet: auto, EFA on the types that have it (srifty terraform attaches it) and TCP "
    "on the others; tcp, NCCL's sockets on every type (a cluster without EFA: your own VPC or launch template, "
    "Kubernetes without the EFA device plugin), and srifty terraform attaches no EFA"
)


class _DefaultShare(float):
    """The mixed market's default spot share (0.5): a float whose class tells the default from a given 0.5 (and
    survives a pickle or a deep copy), so a market of ``"spot:0.75"`` beside a given ``spot_share`` can be refused
    however the constraints are built."""


class _DefaultBase(int):
    """The mixed market's default on-demand base (1), told from a given 1 by its class as :class:`_DefaultShare` is: a
    base given for a market that buys no mixed fleet is refused, the default is not (nor sent to a service)."""


_DEFAULT_SPOT_SHARE = _DefaultShare(0.5)
_DEFAULT_BASE = _DefaultBase(1)
MOVE_IF_LATE = (
    "the job carries MigrationTriggers (under srifty launch): an on-demand fleet under the confidence on its own is "
    "ranked with the move its deadline trigger makes when the measured speed is late, where a surer fleet can still "
    "finish the work after the check"
)


@dataclass(frozen=True)
class Constraints:
    """What the user wants.

    The work is one of ``steps`` (optimizer steps of the profiled global batch, as Lightning's ``max_steps``
    counts them), ``samples``, or ``epochs`` x ``steps_per_epoch`` (optimizer steps in one epoch).
    ``scaling``: "strong" (the default) trains every fleet with the profiled global batch; "weak" keeps the
    profiled per-GPU batch, so the global batch (and the training) changes with the fleet.
    ``allow_arm64``: rank arm64 (Graviton) instance types too, for a training image built for arm64 (a profile
    measured on arm64 allows them without it).

    Every field is declared with its :class:`Spec` (:data:`SPECS`): bounds, the CLI flag, the service's limit and
    the plan's record come from there.
    """

    steps: int | None = _c(
        None, "optimizer steps of the profiled global batch", "int", minimum=1, maximum=MAX_STEPS, plan=None
    )
    samples: float | None = _c(
        None, "training samples", "number", minimum=0, exclusive=True, maximum=1e18, service_max=1e15, plan=None
    )
    epochs: float | None = _c(
        None, "epochs (with {steps_per_epoch})", "number", minimum=0, exclusive=True, maximum=1e6, plan=None
    )
    steps_per_epoch: int | None = _c(None, "optimizer steps in one epoch", "int", minimum=1, maximum=10**12, plan=None)
    deadline_h: float | None = _c(
        None,
        "wall-time limit",
        "number",
        minimum=0,
        exclusive=True,
        service_max=1e6,
        flag="--deadline",
        unit="h",
    )
    confidence: float = _c(
        0.9,
        "chance of finishing within the deadline a fleet must have (its time at this quantile meets it)",
        "number",
        minimum=0.5,
        maximum=0.999,
    )
    move_if_late: bool = _c(False, MOVE_IF_LATE, "bool")
    budget_usd: float | None = _c(
        None, "cost limit, US dollars", "number", minimum=0, exclusive=True, service_max=1e12, flag="--budget"
    )
    objective: Objective = _c(Objective.COST, "what is minimised", "choice", choices=OBJECTIVES)
    regions: tuple[str, ...] = _c(("us-east-1",), "regions considered", "texts", minimum=1, service_max=8)
    market: Market = _c(
        Market.ANY,
        "capacity markets considered (any: on-demand, spot and mixed each; spot:0.75 is mixed with that spot share)",
        "choice",
        choices=MARKETS,
    )
    spot_share: float = _c(
        _DEFAULT_SPOT_SHARE,
        "mixed market: share of instances above the base bought on spot",
        "number",
        minimum=0,
        maximum=1,
        plan="spot_share",
    )
    on_demand_base: int = _c(
        _DEFAULT_BASE, "mixed market: on-demand instances before the share applies", "int", minimum=0, service_max=1000
    )
    max_instances: int = _c(16, "largest fleet considered", "int", minimum=1, service_max=64)
    max_types: int = _c(
        1,
        "instance types per fleet: 1 = homogeneous only, 2 or 3 = mixes allowed",
        "int",
        minimum=1,
        maximum=3,
        service_max=2,
    )
    max_hourly_usd: float | None = _c(
        None,
        "limit on the fleet's price per hour, US dollars",
        "number",
        minimum=0,
        exclusive=True,
        flag="--max-hourly",
    )
    allow: tuple[str, ...] = _c(
        (), "instance types, families or GPUs (A100, L4) considered (empty: all)", "texts", service_max=100
    )
    deny: tuple[str, ...] = _c((), "instance types, families or GPUs (A100, L4) left out", "texts", service_max=100)
    min_memory_headroom: float = _c(
        0.0, "GPU memory to keep free, as a share", "number", minimum=0, maximum=0.9, flag="--min-headroom"
    )
    current_fleet: str | None = _c(
        None, "the fleet savings and migration effort are measured against", "text", service_max=500, flag="--current"
    )
    top: int = _c(10, "fleets listed", "int", minimum=1, service_max=200, plan=None)
    scaling: Scaling = _c(
        "strong",
        "strong: the profiled global batch on every fleet (the same training); weak: the per-GPU batch kept",
        "choice",
        choices=SCALINGS,
    )
    allow_arm64: bool = _c(False, "rank arm64 (Graviton) instance types too", "bool")
    driver: str | None = _c(None, DRIVER_DOC, "text", pattern=r"\d{3}(\.\d+){0,2}", example=DRIVER_EXAMPLE)
    transport: TransportName = _c("auto", TRANSPORT_DOC, "choice", choices=TRANSPORTS)
    startup_s: float | None = _c(
        None,
        "a new fleet's whole start-up, seconds (default: per instance type)",
        "number",
        minimum=0,
        maximum=7 * 86400,
    )
    dataset_gb: float = _c(
        0.0, "data staged onto every new instance before training, GB", "number", minimum=0, maximum=1e6
    )
    layouts: tuple[str, ...] = _c(
        (),
        "parallel layouts each fleet may use (" + ", ".join(LAYOUTS) + "); empty: all",
        "texts",
        service_max=len(LAYOUTS),
    )

    def __post_init__(self) -> None:  # accept the enums' values (JSON, argparse) as well as the enums
        if isinstance(self.market, str) and str(self.market).strip().lower().startswith("spot:"):
            market, share = parse_market(self.market)  # "spot:0.75": mixed, with that spot share
            given = self.spot_share
            # the default told by its class, not its identity: a pickled or deep-copied Constraints keeps the class
            if not isinstance(given, _DefaultShare) and isinstance(given, (int, float)) and float(given) != share:
                raise ConfigError.between(  # which was meant?
                    "{market} {asked} says a spot share of {share:g} and {spot_share} says {given:g}: give one.",
                    parameter="spot_share",
                    value=given,
                    asked=repr(self.market),
                    share=share,
                    given=float(given),
                )
            object.__setattr__(self, "market", market)
            object.__setattr__(self, "spot_share", share)
        for name, kind in (("objective", Objective), ("market", Market)):
            value = getattr(self, name)
            if not isinstance(value, kind) and value in [k.value for k in kind]:
                object.__setattr__(self, name, kind(value))
        if self.objective is Objective.COST_PER_SAMPLE:
            object.__setattr__(self, "objective", _cost_per_sample())
        for name in ("regions", "allow", "deny", "layouts"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, tuple(value))
            elif isinstance(value, str):
                object.__setattr__(self, name, tuple(v.strip() for v in value.split(",") if v.strip()))

    @classmethod
    def build(cls, **given: Any) -> Constraints:
        """Constraints from keyword values where ``None`` means the default; ``market`` may be ``"spot:0.7"``
        (mixed with that spot share). The one place the CLI, the callback and the service build them."""
        values = {k: v for k, v in given.items() if v is not None}
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            from predictor.documents.checks import suggest

            names = [f.name for f in dataclasses.fields(cls)]
            close = suggest(unknown[0], names, n=1) or [n for n in names if n.startswith(unknown[0])][:1]
            hint = f" {did_you_mean(close)}" if close else ""
            raise ConfigError(  # said to a user of SriftyCallback(constraints=...), the service, Constraints.build
                f"There is no constraint {unknown[0]!r}.{hint} The constraints are {', '.join(names)} "
                "(docs/plan-schema.md).",
                parameter=unknown[0],
                value=values[unknown[0]],
            )
        market = values.get("market")
        if isinstance(market, str) and not market.strip().lower().startswith("spot:"):
            values["market"] = parse_market(market)[0]  # "spot:0.75" and its share: __post_init__
        return cls(**values)

    @classmethod
    def from_plan(cls, plan: PlanConstraints, **changes: Any) -> Constraints:
        """The constraints a plan was made under (for a re-plan), with ``changes`` (e.g. the remaining work)."""
        values = {
            "samples": plan.work_samples,
            "deadline_h": plan.deadline_h,
            # a plan that does not say held the predicted time (the median) to the deadline
            "confidence": plan.confidence if plan.confidence is not None else 0.5,
            "move_if_late": bool(plan.move_if_late),
            "budget_usd": plan.budget_usd,
            "objective": "cost" if plan.objective == "cost_per_sample" else plan.objective,  # the same ranking
            "regions": tuple(plan.regions),
            "market": plan.market,
            "spot_share": plan.spot_share,
            "on_demand_base": plan.on_demand_base,
            "max_instances": plan.max_instances,
            "max_types": plan.max_types,
            "max_hourly_usd": plan.max_hourly_usd,
            "min_memory_headroom": plan.min_memory_headroom,
            "allow": tuple(plan.allow or ()),
            "deny": tuple(plan.deny or ()),
            "current_fleet": plan.current_fleet,
            # a plan that does not say was made when every ranking kept the per-GPU batch
            "scaling": plan.scaling or "weak",
            "allow_arm64": plan.allow_arm64,
            "driver": plan.driver,
            "transport": plan.transport or "auto",  # a plan that does not say was priced on EFA where the type has it
            "startup_s": plan.startup_s,
            "dataset_gb": plan.dataset_gb,
            # a plan that does not say was made when every fleet ran ddp
            "layouts": tuple(plan.layouts) if plan.layouts else ("ddp",),
        }
        return cls.build(**{**values, **changes})

    def validate(self) -> None:
        """Raise ConfigError naming the parameter, the value and the fix."""
        given = [name for name in ("steps", "samples", "epochs") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError.between(
                "Give the work as exactly one of {steps} (optimizer steps, e.g. 100000), {samples} or {epochs} (with "
                "{steps_per_epoch}). Got " + (", ".join("{" + name + "}" for name in given) or "none") + ".",
                parameter="steps",
                value=self.steps,
            )
        _check_epochs(self.epochs, self.steps_per_epoch, given[0])
        _check_weak_steps(self.steps, str(self.scaling))
        check_percent(self.confidence)
        for name, spec in SPECS.items():
            _check_field(name, spec, getattr(self, name))
        _check_epoch_steps(self.epochs, self.steps_per_epoch)
        _check_mixed_only(self.spot_share, self.on_demand_base, str(self.market))
        self.layout_list()
        if not self.regions:
            raise ConfigError.between(
                "Give at least one region in {regions}, e.g. us-east-1.", parameter="regions", value=()
            )

    def layout_list(self) -> list[Layout]:
        """The layouts asked (all of :data:`LAYOUTS` when none), parsed (:func:`parse_layouts`)."""
        return parse_layouts(self.layouts)

    def work(self, profile: Profile) -> Work:
        """The work in samples, optimizer steps and batches, in the profiled global batch
        (:func:`predictor.documents.work.global_batch`)."""
        accumulation = int(profile.batch.accumulate_grad_batches or 1)
        gb = global_batch(profile)
        if self.samples is not None:
            return Work(float(self.samples), gb, accumulation)
        # a part of an epoch's last step is a whole optimizer step: --epochs 0.5 of 1,001 steps is 501 steps
        # (rounded to 1e-9 first: 0.07 x 100 is 7.000000000000001 in floating point, 7 steps, not 8)
        epoch_steps = round((self.epochs or 0) * (self.steps_per_epoch or 0), 9)
        steps = self.steps if self.steps is not None else math.ceil(epoch_steps)
        return Work.of_steps(steps, gb, accumulation)

    def to_request(self) -> dict[str, Any]:
        """JSON-ready values of the set fields (what ``POST /v1/rank`` takes as ``constraints``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "transport" and value == "auto"):  # a service before it takes the rest
                continue
            if isinstance(value, (_DefaultShare, _DefaultBase)):  # the mixed market's defaults: the service's own
                continue
            out[f.name] = (
                value.value if isinstance(value, enum.Enum) else list(value) if isinstance(value, tuple) else value
            )
        return out

    def limits(self) -> Mapping[str, float]:
        """The limits that are set: ``max_hourly_usd``, ``deadline_h``, ``budget_usd``."""
        named = {"max_hourly_usd": self.max_hourly_usd, "deadline_h": self.deadline_h, "budget_usd": self.budget_usd}
        return {k: float(v) for k, v in named.items() if v is not None}

    def to_plan(self, work: Work, current_fleet: str | None) -> PlanConstraints:
        """What the plan records of these constraints."""
        mixed = "mixed" in Market(self.market).markets()
        return PlanConstraints(
            work_samples=work.samples,
            objective=Objective(self.objective).value,
            market=Market(self.market).value,
            regions=tuple(self.regions),
            max_instances=self.max_instances,
            max_types=self.max_types,
            spot_share=self.spot_share if mixed else None,
            on_demand_base=self.on_demand_base if mixed else None,
            current_fleet=current_fleet,
            allow=tuple(self.allow) or None,
            deny=tuple(self.deny) or None,
            deadline_h=self.deadline_h,
            confidence=self.confidence,
            move_if_late=self.move_if_late or None,
            budget_usd=self.budget_usd,
            max_hourly_usd=self.max_hourly_usd,
            min_memory_headroom=self.min_memory_headroom,
            scaling=self.scaling,
            global_batch=work.global_batch if self.scaling == "strong" else None,
            allow_arm64=self.allow_arm64 or None,
            driver=self.driver,
            transport=None if self.transport == "auto" else self.transport,
            startup_s=self.startup_s,
            dataset_gb=self.dataset_gb or None,
            layouts=tuple(self.layouts) if self.layouts else tuple(LAYOUTS),  # as loaded back (a tuple)
        )


def parse_layouts(names: tuple[str, ...]) -> list[Layout]:
    """The layouts ``names`` asks (all of :data:`LAYOUTS` when none), parsed; a pipeline's stages are set per fleet.

    Raises:
        ConfigError: a name that is not in LAYOUTS, with the closest ones.
    """
    out = []
    for name in names or LAYOUTS:
        value = str(name).strip().lower()
        if value not in LAYOUTS:
            staged = value.partition("+")[0].startswith("pipeline:")
            close = ["pipeline+ac" if value.endswith("+ac") else "pipeline"] if staged else suggest(value, LAYOUTS, n=2)
            why = (
                ": a ranked pipeline has one stage per node, as many as each fleet's nodes: it is named without its "
                "stages (a plan's pipeline:2 is pipeline on a fleet of 2 nodes)"
                if staged
                else ", which is not a layout"
            )
            raise ConfigError.between(
                "{layouts} names {name!r}"
                + why
                + ". "
                + (f"{did_you_mean(close)} " if close else "")
                + f"Layouts: {', '.join(LAYOUTS)} (pipeline: one stage per node).",
                parameter="layouts",
                value=name,
                name=name,
            )
        out.append(parse(value.replace("pipeline", "pipeline:2")) if value.startswith("pipeline") else parse(value))
    return out


def _cost_per_sample() -> Objective:
    """The objective 'cost_per_sample' asks for, with its deprecation said."""
    warnings.warn(
        "objective 'cost_per_sample' ranks exactly as 'cost' (every fleet trains the same samples, so the cost per "
        "sample is the cost over a constant): use 'cost'; 'cost_per_sample' goes in 0.3",
        DeprecationWarning,
        stacklevel=4,
    )
    return Objective.COST


def _check_field(name: str, spec: Spec, value: Any) -> None:
    """``value`` against its :class:`Spec`: the kind, the bounds, the choices (texts are checked where used)."""
    if value is None:
        return
    if spec.kind == "int":
        low, high = (None if b is None else int(b) for b in (spec.minimum, spec.maximum))
        check_int(OWNER, name, value, minimum=low, maximum=high)
    elif spec.kind == "number":
        check_number(OWNER, name, value, minimum=spec.minimum, maximum=spec.maximum, exclusive=spec.exclusive)
    elif spec.kind == "choice":
        check_choice(OWNER, name, value, spec.choices)
    elif spec.kind == "bool" and not isinstance(value, bool):
        raise refused(f"The {name!r} parameter of {OWNER}", "True or False", value, parameter=name, owner=OWNER)
    elif spec.kind == "text" and spec.pattern and not re.fullmatch(spec.pattern, str(value)):
        raise refused(f"The {name!r} parameter of {OWNER}", spec.example, value, parameter=name, owner=OWNER)


SPECS: dict[str, Spec] = {
    f.name: dataclasses.replace(
        f.metadata["spec"], plan=f.name if f.metadata["spec"].plan == "" else f.metadata["spec"].plan
    )
    for f in dataclasses.fields(Constraints)
}


def _check_epochs(epochs: float | None, steps_per_epoch: int | None, given: str) -> None:
    """``steps_per_epoch`` with ``epochs`` and only with them (``given``: the work's one parameter)."""
    if epochs is None and steps_per_epoch is not None:  # a trial's --steps 100 --steps-per-epoch 50
        raise ConfigError.between(
            "{steps_per_epoch} counts {epochs} in steps, and the work is given as {" + given + "}: leave "
            "{steps_per_epoch} out, or give the work as {epochs}.",
            parameter="steps_per_epoch",
            value=steps_per_epoch,
        )
    if epochs is not None and steps_per_epoch is None:
        raise ConfigError.between(
            "{epochs} needs {steps_per_epoch} (the optimizer steps in one epoch, e.g. 5000).",
            parameter="steps_per_epoch",
            value=None,
        )


def _check_epoch_steps(epochs: float | None, steps_per_epoch: int | None) -> None:
    """The work given in epochs within the bound of the work given in steps (:data:`MAX_STEPS`)."""
    if epochs is not None and steps_per_epoch is not None and epochs * steps_per_epoch > MAX_STEPS:
        raise ConfigError.between(
            "{epochs} x {steps_per_epoch} is {total:.3g} optimizer steps, past the {limit:g} the work is bounded by "
            "(the bound of {steps}): check both.",
            parameter="epochs",
            value=epochs,
            total=float(epochs) * float(steps_per_epoch),
            limit=float(MAX_STEPS),
        )


def _check_weak_steps(steps: Any, scaling: str) -> None:
    """Under weak scaling a step trains the fleet's own global batch (the per-GPU batch x its GPUs): a count of steps
    is a different training on each fleet, and a script stopped at ``max_steps`` trains that many of them whatever
    the plan priced (an audit: ``--steps 1000 --scaling weak`` priced 4,000 samples, 9 steps of a 480-GPU fleet that
    the script would run 1,000 of). The work is asked in samples or epochs there."""
    if steps is not None and scaling == "weak":
        raise ConfigError.between(
            "{steps} counts optimizer steps of the profiled global batch, and under {scaling} weak every fleet's "
            "global batch grows with its GPUs: give the work as {samples} or {epochs} (with {steps_per_epoch}), "
            "and end the script at max_epochs, not max_steps (a run stopped at max_steps trains that many steps of "
            "the fleet's own batch, not the work priced); or rank the same training on every fleet with {scaling} "
            "strong.",
            parameter="steps",
            value=steps,
        )


def check_percent(confidence: Any) -> None:
    """A confidence given in percent (a trial's ``--confidence 95``) is refused with the fraction it meant."""
    if isinstance(confidence, (int, float)) and 50 <= confidence < 100:
        raise ConfigError.between(
            "{confidence} is a chance between 0.5 and 0.999, not a percentage: {given:g} % is {confidence} "
            "{fraction:g}.",
            parameter="confidence",
            value=confidence,
            given=confidence,
            fraction=confidence / 100,
        )


def _check_mixed_only(share: float, base: int, market: str) -> None:
    """A spot share or an on-demand base given for a market that buys no mixed fleet is refused (a trial's ``--market
    spot --spot-share 0.7`` was dropped without a word, and so was ``--on-demand-base 5``)."""
    if market not in ("spot", "on-demand"):
        return
    if not isinstance(share, _DefaultShare):
        raise ConfigError.between(
            "{spot_share} is the mixed market's share of instances on spot; {market} {asked} buys no mixed fleet. "
            "Give {market} mixed (or any, or spot:{share:g}), or leave {spot_share} out.",
            parameter="spot_share",
            value=float(share),
            asked=market,
            share=float(share),
        )
    if not isinstance(base, _DefaultBase):
        raise ConfigError.between(
            "{on_demand_base} is the mixed market's on-demand instances before its spot share; {market} {asked} buys "
            "no mixed fleet. Give {market} mixed (or any), or leave {on_demand_base} out.",
            parameter="on_demand_base",
            value=base,
            asked=market,
        )


def parse_market(text: str) -> tuple[str, float | None]:
    """``on-demand``, ``spot``, ``any``, ``mixed`` or ``spot:0.7`` (mixed with that spot share)."""
    value = str(text).strip().lower()
    if value.startswith("spot:"):
        try:
            share = float(value.split(":", 1)[1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 1:
            raise ConfigError(
                f"The spot share in market {text!r} must be a number from 0 to 1: write e.g. 'spot:0.75' (75% of the "
                "instances above the on-demand base on spot).",
                parameter="market",
                value=text,
            )
        return "mixed", share
    if value not in MARKETS:  # the choices once, with the spot:SHARE form a plain list of them leaves out
        expected = f"one of {', '.join(MARKETS)}, or spot:SHARE (mixed, that share on spot: e.g. spot:0.75)"
        fix = did_you_mean(suggest(value, MARKETS, n=1))
        raise refused(f"The 'market' parameter of {OWNER}", expected, text, fix, parameter="market", owner=OWNER)
    return value, None


def constraint_defaults() -> dict[str, Any]:
    """Every constraint's default (the service's request model and the CLI take theirs from here)."""
    out = {}
    for f in dataclasses.fields(Constraints):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:  # every constraint has a default
            raise TypeError(f"constraint {f.name!r} has no default")
        out[f.name] = (
            value.value
            if isinstance(value, enum.Enum)
            else float(value)
            if type(value) is _DefaultShare
            else int(value)
            if type(value) is _DefaultBase
            else value
        )
    return out

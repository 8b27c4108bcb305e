"""After the window, the callback's recommendation: its constraints (checked at construction, the work defaulting to
the run's own length), the 0.1 arguments folded into them, and the observation a run on EC2 posts to the service.
The ranking itself is :func:`predictor.recommend.recommend`, the function ``srifty recommend`` runs."""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_srifty.profiling.steps import optimizer_steps_per_batch
from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError, SriftyError, did_you_mean
from predictor.ranking.constraints import Constraints

log = logging.getLogger("lightning_srifty")

# the 0.1 recommendation arguments -> Constraints fields (None: folded into the service)
_DEPRECATED = {
    "total_steps": "steps",
    "deadline_h": "deadline_h",
    "budget_usd": "budget_usd",
    "objective": "objective",
    "market": "market",
    "regions": "regions",
    "max_instances": "max_instances",
    "max_types": "max_types",
    "scaling": "scaling",
    "allow_arm64": "allow_arm64",
    "predictor_url": None,
    "predictor_token": None,
    "post_observation": None,
}


def check_constraints(owner: str, given: Constraints | Mapping[str, Any] | None) -> Constraints:
    """The ranking's constraints, checked now (a typo fails at construction, not after the profile window); the work
    may be left out: it is then the Trainer's max_steps (or max_epochs x batches)."""
    if given is None:
        return Constraints()
    if isinstance(given, Mapping):
        given = Constraints.build(**dict(given))
    elif not isinstance(given, Constraints):
        raise ConfigError(
            f"The 'constraints' parameter of {owner} must be a predictor.ranking.Constraints (or a dict of its fields, "
            f"e.g. {{'deadline_h': 12, 'budget_usd': 500}}). Got {given!r}.",
            parameter="constraints",
            value=given,
        )
    # without work, the rest checked with a stand-in that every scaling takes (a step count is refused under weak)
    (given if has_work(given) else dataclasses.replace(given, samples=1)).validate()
    return given


def has_work(constraints: Constraints) -> bool:
    return any(getattr(constraints, name) is not None for name in ("steps", "samples", "epochs"))


def lightning_default_length(trainer: pl.Trainer) -> bool:
    """The Trainer runs Lightning's default length: 1000 epochs when neither max_epochs nor max_steps is given."""
    return trainer.max_epochs == 1000 and (trainer.max_steps is None or trainer.max_steps < 0)


def recommend_for_run(
    profile: Profile,
    constraints: Constraints,
    trainer: pl.Trainer,
    *,
    service: Any,
    post: bool,
    plan_path: Any,
    report_path: Any,
    owner: str = "SriftyCallback",
) -> Any:
    """Rank fleets for the whole run with :func:`predictor.recommend.recommend` (what ``srifty recommend`` runs),
    the work defaulting to the Trainer's length; with ``service`` and ``post``, the profile is posted there first as
    an observation. Never raises: None (and why, said) when there is no recommendation."""
    try:
        work = with_work(constraints, trainer)
        if work is None:
            rank_zero_info(
                f"{owner}: the run's length is unknown (no max_steps or max_epochs): pass "
                "constraints=Constraints(steps=...) to get a recommendation."
            )
            return None
        if work is not constraints and lightning_default_length(trainer):
            rank_zero_warn(
                "SriftyCallback: the recommendation prices 1000 epochs, Lightning's default when the Trainer has "
                "neither max_epochs nor max_steps; pass Trainer(max_epochs=...) or "
                "SriftyCallback(constraints=Constraints(steps=...)) for the run you mean."
            )
        from predictor.recommend import recommend

        if service is not None and post:
            post_observation(service, profile, owner)
        return recommend(profile, work, service=service, plan_path=plan_path, report_path=report_path)
    except SriftyError as exc:
        rank_zero_warn(f"{owner}: no fleet recommendation: {exc}")
    except Exception as exc:  # noqa: BLE001 - the predictor must never stop training
        log.error("%s: the fleet recommendation failed (%s: %s); training continues.", owner, type(exc).__name__, exc)
    return None


def planned_steps(trainer: pl.Trainer) -> int | None:
    """Optimizer steps the Trainer will run, as Lightning runs them: ``max_epochs`` x the epoch's steps (its batches
    over the accumulation, the last part a step of its own: Lightning steps at an epoch's last batch), no more than
    ``max_steps``; either alone where the other is unset (an audit: 10 batches, accumulate 3, 2 epochs read 6 steps,
    Lightning runs 8). A step is a batch of the global batch (:mod:`lightning_srifty.profiling.steps`): ``max_steps``
    counts every optimizer's step, k a batch for a manual loop of k optimizers, so it ends the run at max_steps / k."""
    k = optimizer_steps_per_batch(trainer)
    steps = math.ceil(int(trainer.max_steps) / k - 1e-6) if trainer.max_steps and trainer.max_steps > 0 else None
    batches = trainer.num_training_batches
    if trainer.max_epochs and trainer.max_epochs > 0 and batches and batches != float("inf"):
        by_epochs = int(trainer.max_epochs) * math.ceil(int(batches) / max(1, int(trainer.accumulate_grad_batches)))
        steps = by_epochs if steps is None else min(steps, by_epochs)
    return steps


def with_work(constraints: Constraints, trainer: pl.Trainer) -> Constraints | None:
    """``constraints`` with the run's own length as the work when they give none; None when that is unknown."""
    if has_work(constraints):
        return constraints
    batches, epochs = trainer.num_training_batches, trainer.max_epochs
    if constraints.scaling == "weak" and epochs is not None and epochs > 0 and batches and batches != float("inf"):
        # a step is each fleet's own global batch there: the run's length is its epochs, where they end it (a run
        # that max_steps ends first is refused by the constraints' check, with the way out)
        per_epoch = math.ceil(int(batches) / max(1, int(trainer.accumulate_grad_batches)))
        if not (trainer.max_steps and 0 < trainer.max_steps < epochs * per_epoch):
            return dataclasses.replace(constraints, epochs=float(epochs), steps_per_epoch=per_epoch)
    steps = planned_steps(trainer)
    # optimizer steps, as everywhere: the work is steps x the profiled global batch (accumulation included)
    return dataclasses.replace(constraints, steps=int(steps)) if steps else None


def fold_deprecated(
    owner: str, given: dict[str, Any], constraints: Any, service: Any, known: Iterable[str]
) -> tuple[Any, Any, bool]:
    """The recommendation's arguments of 0.1 (``total_steps=``, ``deadline_h=``, ..., ``predictor_url=``), folded
    into ``constraints`` and ``service`` (and whether to post observations) with a DeprecationWarning; anything else
    is an unknown parameter ("did you mean" among ``known``, the caller's own parameters, and the 0.1 ones)."""
    if not given:
        return constraints, service, True
    unknown = sorted(set(given) - set(_DEPRECATED))
    if unknown:
        from predictor.documents.checks import suggest

        close = suggest(unknown[0], [*known, *_DEPRECATED], n=1)
        raise ConfigError(
            f"{owner} has no parameter {unknown[0]!r}."
            + (f" {did_you_mean(close)}" if close else "")
            + " The ranking's settings go in constraints=Constraints(...).",
            parameter=unknown[0],
            value=given[unknown[0]],
        )
    warnings.warn(
        f"{owner}: {', '.join(sorted(given))} are deprecated (removed in 0.3): pass "
        "constraints=Constraints(steps=..., deadline_h=..., ...) and service=ServiceClient(url, token=...)",
        DeprecationWarning,
        stacklevel=4,
    )
    if "predictor_url" in given or "predictor_token" in given:
        url = given.pop("predictor_url", None)
        token = given.pop("predictor_token", None)
        if url is not None and service is None:
            service = service_client(owner, "predictor_url", url, token)
    post = bool(given.pop("post_observation", True))
    fields = {name: v for k, v in given.items() if v is not None and (name := _DEPRECATED[k]) is not None}
    if fields and isinstance(constraints, Constraints):
        constraints = dataclasses.replace(constraints, **fields)
    elif fields:
        constraints = {**(constraints or {}), **fields}
    return constraints, service, post


def service_client(owner: str, parameter: str, value: Any, token: str | None = None) -> Any:
    """A :class:`predictor.service.client.ServiceClient` for a URL (a client, or None, as given); a URL that is not
    http(s) is a ConfigError naming ``parameter``."""
    if not isinstance(value, str):
        return value
    if not value.startswith(("http://", "https://")):
        raise ConfigError(
            f"The '{parameter}' parameter of {owner} must be an http(s) URL such as http://127.0.0.1:8000 (where "
            f"`srifty serve` listens) or a predictor.service.client.ServiceClient. Got {value!r}.",
            parameter=parameter,
            value=value,
        )
    from predictor.service.client import ServiceClient

    return ServiceClient(value, token=token)


def launch_transport() -> str | None:
    """How this fleet's nodes meet, as the plan it was launched from priced them (``transport``); None outside a
    launch or where the plan cannot be read (the service then prices the fleet as "auto")."""
    try:
        from lightning_srifty.protocol import LaunchEnv
        from predictor.documents.plan import load_plan

        launch = LaunchEnv.from_env()
        if launch is None or not launch.plan:
            return None
        return load_plan(launch.plan).constraints.transport or "auto"
    except Exception:  # noqa: BLE001 - the observation goes without it, priced as before
        return None


def post_observation(client: Any, profile: Profile, owner: str = "SriftyCallback") -> None:
    """On EC2, tell the service what this fleet measured (the feedback loop); never raises."""
    hw = profile.hardware
    if not hw.instance_type:
        return
    try:
        timing = profile.timing
        batch = profile.batch
        step = timing.step_time_s.p50
        measured = timing.samples_per_s.p50 if timing.samples_per_s else None
        from predictor.documents.work import global_batch

        # step_time_s is per batch: a batch is global_batch / accumulation samples over the ranks; the observation's
        # iteration is an optimizer step (the service's vocabulary: throughput x it is the global batch)
        accumulation = batch.accumulate_grad_batches or 1
        throughput = measured or global_batch(profile) / accumulation / step
        fleet = f"{hw.instance_type}:{max(1, hw.nodes)}"
        answer = client.observe(
            profile,
            fleet,
            throughput,
            iteration_time_s=step * accumulation,
            source=f"{owner} {profile.model.name} run {run_identity()}",
            run=run_identity(),
            transport=launch_transport(),
        )
        log.info("%s: observation of %s posted (%s samples/s): %s", owner, fleet, f"{throughput:.1f}", answer)
    except SriftyError as exc:
        log.warning("%s: the observation was not posted: %s", owner, exc)


_PROCESS_RUN = uuid.uuid4().hex[:12]


def run_identity() -> str:
    """This run as the client names it to the service: the launch's id under ``srifty launch`` (its legs on several
    fleets are one run), else one id per process. With the service's own token the client has the service issue one
    run per identity (:meth:`ServiceClient.observe`); a job given a run token posts under that token's run."""
    from lightning_srifty.protocol import LaunchEnv

    launch = LaunchEnv.from_env()
    return f"launch {launch.launch_id}" if launch is not None and launch.launch_id else _PROCESS_RUN

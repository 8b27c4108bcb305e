"""The ranking in words: which constraint binds (measured, not guessed), why the first fleet is first, why none is
feasible (a structured :class:`NoFeasibleConfigError`), and the risk and effort labels of an entry."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from predictor.documents.plan import PerformanceRisk, PlanEntry, PlanGroup, Risk
from predictor.documents.profile import Profile
from predictor.exceptions import NoFeasibleConfigError, SriftyError
from predictor.model.memory import estimate_memory
from predictor.ranking.constraints import Constraints, Market, Objective
from predictor.ranking.words import PYTHON, Words, chance_beside, three

# performance risk from the prediction's relative sd: the 80% interval is within exp(+-1.28 sd)
PERFORMANCE_RISK_SD = (0.10, 0.25)
GOALS = {
    Objective.COST: "the lowest predicted cost",
    Objective.TIME: "the shortest predicted time",
}
# the measure each limit holds (the value it is compared with): a deadline holds the time at the confidence asked
# (``Constraints.confidence``), not the predicted time
LIMIT_OF = {"max_hourly_usd": "usd_per_hour", "deadline_h": "confident_time_h", "budget_usd": "cost_usd"}


# the surest fleet's chance of meeting the deadline below which a lower confidence is no way out (a trial's 1 min
# deadline was told to "lower --confidence 0.9" where every fleet's chance was 0 %)
HOPELESS = 0.01


def hint(
    name: str,
    constraints: Constraints,
    fastest_instances: int | None = None,
    words: Words = PYTHON,
    surest: float | None = None,
) -> str:
    """What to change when limit ``name`` binds, in the caller's ``words`` (:mod:`predictor.ranking.words`).
    ``fastest_instances``: how many instances the fastest fleet has; below ``max_instances`` more would not be faster
    (the model does not speed up with them), and the deadline's hint does not suggest them (issue #37 L).
    ``surest``: the surest fleet's chance of meeting the deadline; under :data:`HOPELESS` a lower confidence is not
    suggested."""
    if name == "deadline_h":
        confidence = words.setting("confidence", constraints.confidence)
        lower = "" if surest is not None and surest < HOPELESS else f" or lower {confidence}"
        if fastest_instances is not None and fastest_instances < constraints.max_instances:
            return (
                f"raise {words.name('deadline_h')}{lower} (more instances would not help: the fastest "
                f"fleet has {fastest_instances}, below {words.setting('max_instances', constraints.max_instances)})"
            )
        return (
            f"raise {words.name('deadline_h')}{lower}, or allow more instances "
            f"({words.name('max_instances')}) and mixes of types ({words.setting('max_types', 2)})"
        )
    text = f"raise {words.name(name)}"
    # said with a money limit only where the ranking did not consider spot capacity already (an on-demand market)
    if Market(constraints.market) is Market.ON_DEMAND:
        text += f", or allow spot capacity ({words.setting('market', 'any')})"
    return text


def unmeasured_note(profile: Profile) -> str | None:
    """The caveat of a ranking whose profile timed no step on a GPU (a CPU run or a capture), None otherwise: every
    fleet's time is then the performance model's alone, as ``srifty predict`` says of each prediction."""
    if profile.hardware.gpu is not None:
        return None
    table = profile.ops
    where = (
        "captured on the meta device, no step run"
        if table is not None and table.device in ("meta", "fake") and not profile.timing.step_time_s.p50
        else "measured on the CPU"
    )
    captured = where.startswith("captured")
    return (
        f"no GPU step was measured (the profile was {where}): every fleet's time is the performance model's alone "
        "(its intervals carry the model's held-out error on published runs)"
        + (
            ", and the input pipeline is not in it (a capture runs no DataLoader: a loader that decodes on the CPU "
            "can set the step on types with few vCPUs per GPU)"
            if captured
            else ""
        )
        + "; a profile of a few steps on one GPU of the chosen type narrows it"
    )


def manual_loop_note(profile: Profile) -> str | None:
    """The caveat of a profile whose module steps its own optimizers (``batch.manual_optimization``), None otherwise:
    no fleet is planned with gradient accumulation, and where each batch steps several optimizers, a step of the work
    is a batch, not one of Lightning's (a trial's GAN was planned twice its work)."""
    if not profile.batch.manual_optimization:
        return None
    k = float(profile.batch.optimizer_steps_per_batch or 1)
    said = (
        "the module steps its own optimizers (automatic_optimization=False): every fleet trains without gradient "
        "accumulation, which Lightning refuses for it"
    )
    if k > 1:
        said += (
            f"; each batch steps {k:.3g} optimizers{'' if k.is_integer() else ' on average'}, so a step of the work "
            f"here is one batch of the global batch and Lightning's global_step and max_steps count {k:.3g} a step "
            f"(max_steps = steps x {k:.3g})"
        )
    return said


NO_TABLE_NOTE = "the profile has no operator table"  # how the note of :func:`no_table_note` begins (the CLI shows it)


def no_table_note(profile: Profile) -> str | None:
    """The caveat of a ranking whose profile timed a step on a GPU but carries no operator table: every other GPU's
    time is then scaled from the step's roofline split, whose held-out error is the ``cross`` kinds' (issue #38 item
    6: no better than "the same speed everywhere" on unseen data); with a table it is priced operator by operator.
    Says which path and how to get a table. None when the profile has a table or measured no GPU step."""
    if profile.hardware.gpu is None or profile.ops is not None:
        return None
    from predictor.model.uncertainty import model_error

    split = (
        f"its roofline split from the profile's FLOPs (held-out relative error {model_error('cross-flops'):.0%}, "
        f"{model_error('cross-flops-tf32'):.0%} for an FP32 step across the TF32 line"
        if profile.model.flops is not None and profile.model.flops.per_sample  # counted, not only why they are not
        else f"its roofline split (held-out relative error {model_error('cross'):.0%}, "
        f"{model_error('cross-tf32'):.0%} for an FP32 step across the TF32 line"
    )
    return (
        f"{NO_TABLE_NOTE}: other GPUs' times are scaled from the step measured on the {profile.hardware.gpu} by "
        f"{split}; {model_error('cross-ops'):.0%} operator by operator). SriftyCallback records a table by default "
        "(capture_ops=True), or `srifty capture` builds one without a GPU from the LightningModule class, a "
        "transformers architecture (--config) or image classifier (--image-size), or a torchvision model "
        "(torchvision:resnet50 --image-size 224)"
    )


def chance(p: float | None) -> str:
    """A chance of meeting the deadline in whole percents, never a certainty ('>99%'); empty without a deadline."""
    if p is None:
        return ""
    return ">99%" if p >= 0.995 else "<1%" if p < 0.01 else f"{p:.0%}"


def fmt(name: str, value: float) -> str:
    """A value the way its parameter reads: a time in hours, minutes under an hour and seconds under a minute (so that
    a deadline given in minutes is answered in minutes: issue #37 L), dollars, dollars per hour."""
    if name in ("time_h", "deadline_h", "confident_time_h"):
        if 0 < value < 1 / 60:
            return f"{three(value * 3600)} s"
        if 0 < value < 1:
            return f"{three(value * 60)} min"
        return f"{three(value)} h"
    if name in ("usd_per_hour", "max_hourly_usd"):
        return f"${value:,.2f}/h"
    return f"${value:,.2f}"


def within(
    constraints: Constraints, ok: np.ndarray, values: Mapping[str, np.ndarray], *, leave_out: str | None = None
) -> np.ndarray:
    """Candidates that are ``ok`` and meet every set limit except ``leave_out``."""
    keep = ok.copy()
    for name, limit in constraints.limits().items():
        if name != leave_out:
            keep &= values[LIMIT_OF[name]] <= limit
    return keep


Relaxed = Callable[[str], "tuple[Mapping[str, np.ndarray], np.ndarray] | None"]


def binding(
    constraints: Constraints,
    ok: np.ndarray,
    values: Mapping[str, np.ndarray],
    key: np.ndarray,
    than: float,
    relaxed: Relaxed | None = None,
) -> dict[str, float]:
    """The set limits whose relaxation alone reaches a key below ``than``, with the best key it reaches.

    ``relaxed(name)``: the values and key as priced without that limit, where the limit changes the pricing itself
    (a deadline prices spot fleets with the fallback to on-demand its policy would take; without the deadline there
    is none), else None: the table's own values. The counterfactual must be priced as the world without the limit
    would be: "without it the best would reach $0.16" was a price with the deadline's fallback in it, where the best
    without the deadline is $0.058 (issue #37 M1)."""
    out = {}
    for name in constraints.limits():
        own = relaxed(name) if relaxed is not None else None
        vals, keys = own if own is not None else (values, key)
        best = float(np.min(np.where(within(constraints, ok, vals, leave_out=name), keys, np.inf)))
        if best < than * (1 - 1e-4):
            out[name] = best
    return out


def limit_words(name: str, limit: float) -> str:
    """A set limit as a user gave it: ``the deadline of 15 min``, ``the budget of $20``, ``the limit of $3/h``."""
    if name == "deadline_h":
        return f"the deadline of {fmt('time_h', limit)}"
    if name == "budget_usd":
        return f"the budget of {fmt('cost_usd', limit)}"
    return f"the limit of ${limit:,.4g}/h"


def why(
    constraints: Constraints,
    best: PlanEntry,
    ok: np.ndarray,
    values: Mapping[str, np.ndarray],
    key: np.ndarray,
    relaxed: Relaxed | None = None,
) -> str:
    """The first fleet in words: what it minimises, and which limits (if any) keep a better one out (``relaxed``:
    :func:`binding`'s)."""
    objective = Objective(constraints.objective)
    chosen = best.time_h if objective is Objective.TIME else best.cost_usd
    unit = "time_h" if objective is Objective.TIME else "cost_usd"
    strict = float(np.min(np.where(within(constraints, ok, values), key, np.inf)))
    goal = GOALS[objective]
    if strict < chosen * (1 - 1e-9):  # a tie's pick (the ranking's order, TIE): the best by the other measure
        other = "the lowest predicted cost" if objective is Objective.TIME else "the shortest predicted time"
        goal = (
            f"{other} of the fleets within {TIE:.0%} of {goal} ({fmt(unit, strict)}) with no more of their instances "
            "on spot (a difference no prediction resolves)"
        )
    # the time in the table's unit (minutes under an hour: a trial read 0.218 h beside the table's 12.7 min)
    text = f"{best.fleet} ({best.market}, {best.region}) has {goal}: {fmt('time_h', best.time_h)}, "
    text += f"${three(best.cost_usd)}"
    chosen = min(chosen, strict)  # a limit binds where its relaxation reaches past the best kept, a tie's or not
    for name, reach in binding(constraints, ok, values, key, chosen, relaxed).items():
        if fmt(unit, reach) == fmt(unit, chosen):  # better by less than the words show ("6.29 min" both): no bind
            continue  # a reader could see (a trial read "binds (without it the best would reach 6.29 min)")
        limit = constraints.limits()[name]
        text += f"; {limit_words(name, limit)} binds (without it the best would reach {fmt(unit, reach)})"
    return text


def layout_why(profile: Profile, best: PlanEntry, predict_ddp: Callable[[str], Any], gpu_gib: float) -> str:
    """Why the first fleet runs its layout, against plain DDP on the same fleet: its memory per GPU, and what DDP
    would need (or how much slower it is). ``predict_ddp(fleet)`` predicts the fleet under ddp."""
    layout = best.layout
    if layout is None:
        return ""
    if best.memory_known is False:
        text = (
            f"; layout {layout.name}: memory per GPU unknown (the profile has no activation memory: weights, "
            f"gradients, optimizer state and the CUDA context alone take {best.memory_gib:.1f} GiB of {gpu_gib:g}; "
            f"micro-batches are held to the profiled {profile.batch.per_device} a GPU, the largest known to fit)"
        )
    else:
        text = f"; layout {layout.name}: {best.memory_gib:.1f} GiB/GPU of {gpu_gib:g}"
    if layout.name == "ddp":
        return text
    try:
        ddp = predict_ddp(best.fleet)
    except SriftyError:
        return text
    if not ddp.fits_memory:
        per_node = max(g.gpus_per_instance for g in best.groups) if best.groups else 1
        # on the fleet's GPUs: DDP's bucket copy of the gradients on more than one (as srifty predict says it)
        need = estimate_memory(profile, 1.0, gpu_gib, "ddp", best.gpus, per_node).bytes_per_gpu / 2**30
        return text + f"; ddp would need {need:.1f} GiB/GPU even at 1 sample per micro-step"
    slower = ddp.iteration_time_s / best.iteration_time_s - 1
    return text + (f"; ddp fits but is {slower:.0%} slower" if slower > 0 else "")


def _capture_words(words: Words) -> str:
    """Where a captured profile's global batch comes from, in the caller's words."""
    return "srifty capture --global-batch N" if words.vocabulary == "flags" else "the profile's batch.global_batch"


def _holds_nothing(constraints: Constraints, excluded: Mapping[str, int], words: Words) -> NoFeasibleConfigError:
    """:func:`infeasible` where no fleet holds the model: the ways out, and the global batch's cap where it left out
    the fleets that would (a capture without its global batch: 1 sample capped every fleet at 1 GPU)."""
    capped = next((k for k, n in excluded.items() if k.startswith("more GPUs than the") and n), None)
    ways = (
        f"Use GPUs with more memory, more instances ({words.name('max_instances')}), a smaller batch, or more "
        f"layouts ({words.name('layouts')}: fsdp:full_shard+ac shards the model and checkpoints activations)."
    )
    if capped is not None:  # a trial's capture without --global-batch: a batch of 1 capped every fleet at 1 GPU
        ways = (
            f"Every fleet of {capped} was left out: strong scaling trains the profiled global batch, at least one "
            "sample a GPU, so no fleet has the GPUs that would hold the model sharded. Give the training's real "
            f"global batch ({_capture_words(words)}, or profile the run itself), or rank it with "
            f"{words.setting('scaling', 'weak')} (the profiled batch on every GPU, the work in samples or "
            f"epochs). {ways}"
        )
    return NoFeasibleConfigError(
        "No fleet holds the model in GPU memory (with the headroom asked"
        + (", even with gradient accumulation" if constraints.scaling == "strong" else "")
        + f", under the layouts {', '.join(x.name for x in constraints.layout_list())}). {ways}",
        binding=("memory",),
        excluded=excluded,
        hints=("larger GPUs", "a smaller batch", "FSDP / DeepSpeed"),
    )


def infeasible(
    constraints: Constraints,
    ok: np.ndarray,
    values: Mapping[str, np.ndarray],
    excluded: Mapping[str, int],
    words: Words = PYTHON,
    describe: Callable[[int], str] | None = None,
    unbound: Unbound | None = None,
) -> NoFeasibleConfigError:
    """Why no fleet is left, in the caller's ``words``: the binding limits and the best values within the others,
    each with the fleet that reaches it where ``describe`` (candidate index -> its fleet, market and price) is
    given. ``unbound()``: the values and words priced without the deadline, for a money limit's best where no fleet
    meets the deadline (:func:`_pool`)."""
    if not ok.any():
        return _holds_nothing(constraints, excluded, words)
    alone = binding(constraints, ok, values, np.zeros(len(ok)), np.inf)
    names = list(alone) or list(constraints.limits())
    what = {
        "time_h": "the fastest fleet",
        "confident_time_h": f"the fastest fleet at {constraints.confidence:.0%} confidence",
        "cost_usd": "the cheapest fleet",
        "usd_per_hour": "the lowest price",
    }
    best, parts, fastest_instances = {}, [], None
    for name in names:
        measure = LIMIT_OF[name]
        vals, say, scope, among = _pool(constraints, ok, values, name, words, describe, unbound)
        # the deadline's best is the fastest time at the confidence asked, under the key the service has answered with
        key = "time_h" if measure == "confident_time_h" else measure
        best[key] = float(np.min(vals[measure][among]))
        where = _named(vals, measure, among)
        if measure == "confident_time_h" and "instances" in values:  # the fastest itself, not a tie named for it
            fastest_instances = int(values["instances"][np.flatnonzero(among)[np.argmin(values[measure][among])]])
        part = f"{words.setting(name, constraints.limits()[name])} binds: {what[measure]}{scope} is "
        named = float(vals[measure][where])
        tie = f", the {TIE_WORD[measure]} of the fleets within {TIE:.0%} of it" if named > best[key] else ""
        part += fmt(measure, named) + (f" ({say(where)}{tie})" if say is not None else "")
        if measure == "confident_time_h" and "deadline_p" in values:
            best["deadline_probability"] = surest = float(np.max(values["deadline_p"][among]))
            said = chance_beside(surest, constraints.confidence)
            part += f" (the surest meets the deadline at {said}, under the {constraints.confidence:.0%} asked)"
        parts.append(part)
    if not alone and len(names) > 1:
        parts.append("relaxing one of them alone leaves no fleet either")
    hints = tuple(hint(n, constraints, fastest_instances, words, best.get("deadline_probability")) for n in names)
    return NoFeasibleConfigError(
        "No fleet meets the constraints: " + "; ".join(parts) + ". Hints: " + "; ".join(hints) + ".",
        binding=names,
        best=best,
        excluded=excluded,
        hints=hints,
    )


Unbound = Callable[[], "tuple[Mapping[str, np.ndarray], Callable[[int], str]]"]


def _pool(
    constraints: Constraints,
    ok: np.ndarray,
    values: Mapping[str, np.ndarray],
    name: str,
    words: Words,
    describe: Callable[[int], str] | None,
    unbound: Unbound | None,
) -> tuple[Mapping[str, np.ndarray], Callable[[int], str] | None, str, np.ndarray]:
    """Where limit ``name``'s best is taken: the values and words its candidates are priced in, the scope's words,
    and the candidates. Those within the other limits; where none is and a deadline no fleet meets is among them, a
    money limit's best is priced without it (``unbound``: a spot fleet's cost under such a deadline is its fallback's
    on-demand, a minimum budget no relaxation of the budget alone reaches); else every fleet that trains."""
    pool = within(constraints, ok, values, leave_out=name)
    if pool.any():
        return values, describe, " within the other limits" if len(constraints.limits()) > 1 else "", pool
    if unbound is None or LIMIT_OF[name] != "cost_usd" or constraints.deadline_h is None:
        return values, describe, "", ok
    free_values, free_describe = unbound()
    free = dataclasses.replace(constraints, deadline_h=None)
    pool = within(free, ok, free_values, leave_out=name)
    others = ", within the other limits" if pool.any() and len(free.limits()) > 1 else ""
    return free_values, free_describe, f" without {words.name('deadline_h')}{others}", pool if pool.any() else ok


# fleets within this share of the best value tie: a refusal names the cheapest of them (the fastest, for cost), not
# one 0.01 h faster at twice the price; any prediction's error is wider (its regime's sd, 0.1-0.55)
TIE = 0.01
# what breaks a tie of each measure
TIE_BREAK = {"time_h": "cost_usd", "confident_time_h": "cost_usd", "cost_usd": "time_h", "usd_per_hour": "time_h"}
TIE_WORD = {"time_h": "cheapest", "confident_time_h": "cheapest", "cost_usd": "fastest", "usd_per_hour": "fastest"}


def _named(values: Mapping[str, np.ndarray], measure: str, among: np.ndarray) -> int:
    """The candidate a refusal names for the best ``measure`` among ``among``: of those within :data:`TIE` of the
    best, the best by the other measure (:data:`TIE_BREAK`)."""
    rows = np.flatnonzero(among)
    own = values[measure][rows]
    tied = rows[own <= np.min(own) * (1 + TIE)]
    other = values.get(TIE_BREAK[measure])
    if other is None or not tied.size:  # none to break (a value that is nan: the least, as argmin takes it)
        return int(rows[np.argmin(own)])
    return int(tied[np.lexsort((values[measure][tied], other[tied]))[0]])


class CurrentFleet(NamedTuple):
    """The fleet the job runs on now, as the ranking compares it."""

    fleet: str  # type:count[,type:count]
    gpu: str  # its GPUs, joined with commas
    cost_usd: float  # on-demand cost of the work on it
    hours: float  # time of the work on it (no start-up: it runs)


def performance_risk(sd: float) -> PerformanceRisk:
    low, medium = PERFORMANCE_RISK_SD
    return "low" if sd <= low else "medium" if sd <= medium else "high"


def migration_effort(groups: list[PlanGroup], profile: Profile, current: CurrentFleet | None) -> Risk:
    gpus = {g.gpu for g in groups}
    if len(gpus) > 1:
        return "high"
    fleet = ",".join(f"{g.instance_type}:{g.count}" for g in groups)
    if current and fleet == current[0]:
        return "none"
    same_gpu = gpus == {current[1]} if current else gpus == {profile.hardware.gpu}
    single_node = sum(g.count for g in groups) == 1
    return "low" if same_gpu and single_node else "medium"

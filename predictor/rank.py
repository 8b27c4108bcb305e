"""``rank(profile, constraints)``: every candidate fleet predicted, priced with spot risk, filtered and ranked.

Candidates are fleet shapes (one CUDA type x 1..max instances; with ``max_types`` 2 or 3, mixes of distinct types
whose counts add up to at most ``max_instances``) x regions x markets (all on-demand, all spot, and mixed: an
on-demand base plus a spot share, as an Auto Scaling group's mixed instances policy buys them). Shapes are predicted
once with :func:`predictor.predict_many.predict_mixes`; prices and spot economics are numpy over every candidate.

Candidates that cannot be priced, do not fit in GPU memory, or break a constraint are excluded and counted by reason;
when none is left, :class:`NoFeasibleConfigError` says which constraint binds, the best achievable time under the
budget and the cheapest cost under the deadline.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from predictor._validation import check_choice, check_int, check_number
from predictor.catalog.catalog import Catalog
from predictor.catalog.instances import InstanceType
from predictor.exceptions import ConfigError, NoFeasibleConfigError, SriftyError
from predictor.fleet import parse_fleet
from predictor.plan import PLAN_SCHEMA, Plan, PlanCalibration, PlanConstraints, PlanEntry, PlanGroup
from predictor.predict_many import ManyPredictions, predict_many, predict_mixes, row_all, row_sum
from predictor.profile import Profile
from predictor.spot import DEFAULT_CHECKPOINT_S, risk_label, spot_cost

Objective = Literal["cost", "time", "cost_per_sample"]
MARKETS = ("on-demand", "spot", "any", "mixed")
MAX_CANDIDATES = 5_000_000  # ~2 s and ~2 GB of arrays; above it the request is almost surely a mistake
MIX3_TYPES = 12  # 3-type mixes are formed from this many most cost-efficient types (C(12,3) x counts)
# performance risk from the prediction's relative sd: the 80% interval is within exp(+-1.28 sd)
PERFORMANCE_RISK_SD = (0.10, 0.25)


@dataclass(frozen=True)
class Constraints:
    """What the user wants. Work is ``steps`` (of the profiled global batch), ``epochs`` x ``steps_per_epoch``,
    or ``samples``."""

    steps: int | None = None
    samples: float | None = None
    epochs: float | None = None
    steps_per_epoch: int | None = None
    deadline_h: float | None = None
    budget_usd: float | None = None
    objective: Objective = "cost"
    regions: tuple[str, ...] = ("us-east-1",)
    market: Literal["on-demand", "spot", "any", "mixed"] = "any"
    spot_share: float = 0.5  # mixed market: share of instances above the base bought on spot
    on_demand_base: int = 1  # mixed market: on-demand instances before the share applies
    max_instances: int = 16
    max_types: int = 1  # instance types per fleet: 1 = homogeneous only, 2 or 3 = mixes allowed
    max_hourly_usd: float | None = None
    allow: tuple[str, ...] = field(default=())  # instance types or families; empty = all
    deny: tuple[str, ...] = field(default=())
    min_memory_headroom: float = 0.0
    current_fleet: str | None = None  # what savings and migration effort are measured against
    top: int = 10

    def validate(self) -> None:
        owner = "rank()"
        given = [name for name in ("steps", "samples", "epochs") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError(
                "Give the work as exactly one of 'steps', 'samples' or 'epochs' (with 'steps_per_epoch'), "
                f"e.g. --steps 100000. Got {', '.join(given) or 'none'}.",
                parameter="steps",
                value=self.steps,
            )
        if self.steps is not None:
            check_int(owner, "steps", self.steps, minimum=1)
        if self.samples is not None:
            check_number(owner, "samples", self.samples, minimum=0, exclusive=True)
        if self.epochs is not None:
            check_number(owner, "epochs", self.epochs, minimum=0, exclusive=True)
            if self.steps_per_epoch is None:
                raise ConfigError(
                    "'epochs' needs 'steps_per_epoch' (the optimizer steps in one epoch), e.g. --epochs 3 "
                    "--steps-per-epoch 5000.",
                    parameter="steps_per_epoch",
                    value=None,
                )
            check_int(owner, "steps_per_epoch", self.steps_per_epoch, minimum=1)
        for name in ("deadline_h", "budget_usd", "max_hourly_usd"):
            if getattr(self, name) is not None:
                check_number(owner, name, getattr(self, name), minimum=0, exclusive=True)
        check_choice(owner, "objective", self.objective, ("cost", "time", "cost_per_sample"))
        check_choice(owner, "market", self.market, MARKETS)
        check_number(owner, "spot_share", self.spot_share, minimum=0, maximum=1)
        check_int(owner, "on_demand_base", self.on_demand_base, minimum=0)
        check_int(owner, "max_instances", self.max_instances, minimum=1)
        check_int(owner, "max_types", self.max_types, minimum=1, maximum=3)
        check_int(owner, "top", self.top, minimum=1)
        check_number(owner, "min_memory_headroom", self.min_memory_headroom, minimum=0, maximum=0.9)
        if not self.regions:
            raise ConfigError("Give at least one region, e.g. --regions us-east-1.", parameter="regions", value=())

    def work_samples(self, global_batch: float) -> float:
        if self.samples is not None:
            return float(self.samples)
        steps = self.steps if self.steps is not None else (self.epochs or 0) * (self.steps_per_epoch or 0)
        return float(steps) * global_batch


@dataclass(frozen=True)
class Calibration:
    """Measured/predicted throughput factors by GPU key for one model (from observed runs)."""

    factors: Mapping[str, float]
    observations: Mapping[str, int]

    def entries(self) -> list[PlanCalibration]:
        return [PlanCalibration(gpu, float(f), int(self.observations.get(gpu, 1))) for gpu, f in self.factors.items()]


def parse_market(text: str) -> tuple[str, float | None]:
    """``on-demand``, ``spot``, ``any``, ``mixed`` or ``spot:0.7`` (mixed with that spot share)."""
    value = text.strip().lower()
    if value.startswith("spot:"):
        try:
            share = float(value.split(":", 1)[1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 1:
            raise ConfigError(
                f"Cannot read the spot share in market {text!r}: write e.g. 'spot:0.75' (75% of the instances above "
                "the on-demand base on spot).",
                parameter="market",
                value=text,
            )
        return "mixed", share
    check_choice("rank()", "market", value, MARKETS)
    return value, None


def _allowed(it: InstanceType, constraints: Constraints) -> bool:
    if constraints.allow and it.name not in constraints.allow and it.family not in constraints.allow:
        return False
    return it.name not in constraints.deny and it.family not in constraints.deny


def _compositions(total_max: int, parts: int) -> np.ndarray:
    """Every tuple of ``parts`` counts >= 1 adding up to at most ``total_max`` (rows)."""
    if parts == 1:
        return np.arange(1, total_max + 1).reshape(-1, 1)
    rows = [c for c in itertools.product(range(1, total_max + 1), repeat=parts) if sum(c) <= total_max]
    return np.array(rows, dtype=int).reshape(-1, parts)


def _shapes(n_types: int, constraints: Constraints, efficient: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(type_index, counts) of every fleet shape, padded to ``max_types`` columns (count 0 = no group)."""
    k_max = min(constraints.max_types, n_types)
    blocks_t, blocks_c = [], []
    for k in range(1, k_max + 1):
        pool = range(n_types) if k <= 2 else efficient
        combos = np.array(list(itertools.combinations(pool, k)), dtype=int).reshape(-1, k)
        counts = _compositions(constraints.max_instances, k)
        if not len(combos) or not len(counts):
            continue
        t = np.repeat(combos, len(counts), axis=0)
        c = np.tile(counts, (len(combos), 1))
        pad = k_max - k
        blocks_t.append(np.pad(t, ((0, 0), (0, pad))))
        blocks_c.append(np.pad(c, ((0, 0), (0, pad))))
    return np.concatenate(blocks_t), np.concatenate(blocks_c)


@dataclass
class _Candidates:
    """Arrays over candidates (shape x region x market)."""

    shape: np.ndarray
    region: np.ndarray
    market: np.ndarray  # 0 on-demand, 1 spot, 2 mixed
    on_demand: np.ndarray  # (N, K) instances bought on demand
    spot: np.ndarray  # (N, K)
    group_usd: np.ndarray  # (N, K)
    rate_per_hr: np.ndarray  # interruption rate of the whole fleet


MARKET_NAMES = np.array(["on-demand", "spot", "mixed"])


def _price_candidates(
    many: ManyPredictions,
    types: list[InstanceType],
    constraints: Constraints,
    markets: tuple[str, ...],
    excluded: dict[str, int],
) -> _Candidates:
    tidx, cnt = many.type_index, many.counts
    present = cnt > 0
    nodes = row_sum(cnt)
    rate = np.array([it.interruption_rate_per_hr or 0.0 for it in types])[tidx]
    parts: list[_Candidates] = []
    for r, region in enumerate(constraints.regions):
        od = np.array([it.price_usd_hr(region, "on-demand") or np.nan for it in types])[tidx]
        sp = np.array([it.price_usd_hr(region, "spot") or np.nan for it in types])[tidx]
        od_known = row_all(~present | np.isfinite(od))
        sp_known = row_all(~present | np.isfinite(sp))
        for market in markets:
            priced = od_known if market == "on-demand" else sp_known if market == "spot" else od_known & sp_known
            if market == "on-demand":
                on, off, ok = cnt, np.zeros_like(cnt), od_known
            elif market == "spot":
                on, off, ok = np.zeros_like(cnt), cnt, sp_known
            else:  # on-demand base + share, the on-demand part on the cheapest on-demand types
                base = constraints.on_demand_base
                n_od = np.minimum(nodes, base + np.ceil((nodes - base).clip(0) * (1 - constraints.spot_share)))
                distinct = (n_od > 0) & (n_od < nodes)  # otherwise the same as all on-demand or all spot
                # groups come in ascending on-demand price (see rank()): the base fills the first ones
                before = np.cumsum(cnt, axis=1) - cnt
                on = np.clip(n_od[:, None] - before, 0, cnt).astype(int)
                off = cnt - on
                ok = priced & distinct
                _count(excluded, "mixed market same as all on-demand or all spot (fleet too small)", priced & ~distinct)
            _count(excluded, f"no {market} price in {region}", ~priced)
            keep = np.flatnonzero(ok)
            usd = np.nan_to_num(od[keep]) * on[keep] + np.nan_to_num(sp[keep]) * off[keep]
            parts.append(
                _Candidates(
                    keep,
                    np.full(len(keep), r),
                    np.full(len(keep), {"on-demand": 0, "spot": 1, "mixed": 2}[market]),
                    on[keep],
                    off[keep],
                    usd,
                    row_sum(off[keep] * rate[keep]),
                )
            )
    return _Candidates(*(np.concatenate([getattr(p, f) for p in parts]) for f in _Candidates.__dataclass_fields__))


def _count(excluded: dict[str, int], reason: str, mask: np.ndarray) -> None:
    n = int(mask.sum())
    if n:
        excluded[reason] = excluded.get(reason, 0) + n


def rank(
    profile: Profile,
    constraints: Constraints,
    *,
    catalog: Catalog | None = None,
    checkpoint_s: float | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """Rank fleets; raise NoFeasibleConfigError (with the binding constraint and hints) when none is feasible.

    ``checkpoint_s``: what one checkpoint costs (save, and load after an interruption); default: the profile's
    measured cost (``profile.checkpoint``), else :data:`predictor.spot.DEFAULT_CHECKPOINT_S`.
    """
    constraints.validate()
    measured = profile.checkpoint
    checkpoint_note = "assumed"
    if checkpoint_s is None:
        if measured is not None:
            checkpoint_s = max(measured.save_s, measured.load_s or 0.0)
            checkpoint_note = f"measured by the profile ({measured.where or 'local'}; remote storage adds its transfer)"
        else:
            checkpoint_s = DEFAULT_CHECKPOINT_S
    catalog = catalog or Catalog.load()
    global_batch = profile.batch.global_batch or profile.batch.per_device * (profile.hardware.world_size or 1)
    samples = constraints.work_samples(global_batch)
    markets = ("on-demand", "spot", "mixed") if constraints.market == "any" else (constraints.market,)
    excluded: dict[str, int] = {}
    excluded_types: dict[str, int] = {}

    def exclude_type(reason: str) -> None:
        excluded_types[reason] = excluded_types.get(reason, 0) + 1

    types: list[InstanceType] = []
    for it in catalog.filter(cuda_only=True):
        if not _allowed(it, constraints):
            exclude_type("not allowed by allow/deny")
        elif it.gpu not in catalog.gpus:
            exclude_type(f"GPU without specs ({it.gpu})")
        elif not any(it.price_usd_hr(region, m) for region in constraints.regions for m in ("on-demand", "spot")):
            exclude_type("no price in " + ", ".join(constraints.regions))
        else:
            types.append(it)
    if not types:
        raise NoFeasibleConfigError(
            "No instance type is left to rank: "
            + (", ".join(f"{n} {why}" for why, n in excluded_types.items()) or "the catalog has no CUDA types")
            + ". Check --allow/--deny and --regions (prices are bundled for us-east-1 and a few more)."
        )
    # in ascending on-demand price, so that every shape lists its groups cheapest first (the order in which a mixed
    # market's on-demand base is filled, and the launch-template priority of the generated Terraform)
    region0 = constraints.regions[0]
    types.sort(key=lambda it: (it.price_usd_hr(region0) or it.price_usd_hr(region0, "spot") or math.inf, it.name))
    names = [it.name for it in types]
    factors = dict(calibration.factors) if calibration else None
    efficient = (
        _efficient_types(profile, names, types, catalog, factors, constraints.regions[0])
        if constraints.max_types >= 3
        else []
    )
    shapes = sum(
        math.comb(len(types) if k <= 2 else len(efficient), k) * math.comb(constraints.max_instances, k)
        for k in range(1, min(constraints.max_types, len(types)) + 1)
    )
    if shapes * len(markets) * len(constraints.regions) > MAX_CANDIDATES:
        raise ConfigError(
            f"{shapes * len(markets) * len(constraints.regions):,} candidate fleets is over the limit of "
            f"{MAX_CANDIDATES:,}: lower max_instances ({constraints.max_instances}) or max_types "
            f"({constraints.max_types}), or narrow the types with allow.",
            parameter="max_instances",
            value=constraints.max_instances,
        )
    tidx, cnt = _shapes(len(types), constraints, efficient)
    many = predict_mixes(profile, names, tidx, cnt, catalog=catalog, calibration=factors)
    cand = _price_candidates(many, types, constraints, markets, excluded)
    if not len(cand.shape):
        raise NoFeasibleConfigError(
            f"No fleet has a {constraints.market} price in {', '.join(constraints.regions)}. "
            "Try --regions us-east-1 or --market any."
        )
    s = cand.shape
    work_s = samples / many.throughput_samples_s[s]
    spot = spot_cost(work_s, np.ones(len(s)), cand.rate_per_hr, checkpoint_s)
    time_h = spot.expected_time_s / 3600
    usd_hr = row_sum(cand.group_usd)
    cost = usd_hr * time_h
    step = many.iteration_time_s[s]
    scale_lo, scale_hi = many.iteration_time_lo_s[s] / step, many.iteration_time_hi_s[s] / step
    considered = len(s)

    ok = many.fits_memory[s] & (many.memory_share[s] <= 1 - constraints.min_memory_headroom)
    _count(excluded, "does not fit in GPU memory (with the headroom asked)", ~ok)
    keep = ok.copy()
    for name, limit, values in (
        ("max_hourly_usd", constraints.max_hourly_usd, usd_hr),
        ("deadline", constraints.deadline_h, time_h),
        ("budget", constraints.budget_usd, cost),
    ):
        if limit is not None:
            over = keep & (values > limit)
            _count(excluded, f"over the {name.replace('_', ' ')}", over)
            keep &= ~over
    if not keep.any():
        raise _infeasible(constraints, ok, time_h, cost)

    key = time_h if constraints.objective == "time" else cost
    keyed = np.where(keep, key, np.inf)
    n_keep = int(keep.sum())
    top = min(constraints.top, n_keep)
    head = np.argpartition(keyed, top - 1)[:top] if top < len(keyed) else np.arange(len(keyed))
    order = [int(i) for i in head[np.lexsort((time_h[head], keyed[head]))]][:top]
    pareto_idx = _pareto(np.flatnonzero(keep), time_h, cost)
    pareto_set = {int(i) for i in pareto_idx}
    current = _current(profile, constraints, catalog, samples, factors)

    def entry(i: int, rank_no: int) -> PlanEntry:
        sh = int(s[i])
        groups = []
        for k in range(many.counts.shape[1]):
            c = int(many.counts[sh, k])
            if c == 0:
                continue
            it = types[int(many.type_index[sh, k])]
            groups.append(
                PlanGroup(
                    instance_type=it.name,
                    count=c,
                    gpus_per_instance=it.gpus,
                    gpu=it.gpu or "",
                    on_demand=int(cand.on_demand[i, k]),
                    spot=int(cand.spot[i, k]),
                    usd_per_hour=float(cand.group_usd[i, k]),
                    per_device_batch=float(many.per_device_batch[sh, k]),
                    throughput_samples_s=float(
                        many.per_device_batch[sh, k] * many.group_gpus[sh, k] / many.iteration_time_s[sh]
                    ),
                )
            )
        nodes = sum(g.count for g in groups)
        tau = spot.checkpoint_interval_s[i]
        fleet = ",".join(f"{g.instance_type}:{g.count}" for g in groups)
        return PlanEntry(
            rank=rank_no,
            fleet=fleet,
            groups=tuple(groups),
            gpus=sum(g.count * g.gpus_per_instance for g in groups),
            nodes=nodes,
            region=constraints.regions[int(cand.region[i])],
            market=str(MARKET_NAMES[cand.market[i]]),
            spot_share=sum(g.spot for g in groups) / nodes,
            usd_per_hour=float(usd_hr[i]),
            iteration_time_s=float(step[i]),
            iteration_time_interval_s=(float(step[i] * scale_lo[i]), float(step[i] * scale_hi[i])),
            throughput_samples_s=float(many.throughput_samples_s[sh]),
            time_h=float(time_h[i]),
            cost_usd=float(cost[i]),
            cost_interval_usd=(float(cost[i] * scale_lo[i]), float(cost[i] * scale_hi[i])),
            expected_interruptions=float(spot.expected_interruptions[i]),
            interruption_overhead_s=float(spot.per_interruption_s[i]),
            risk=str(risk_label(spot.expected_interruptions[i : i + 1])[0]),
            performance_risk=_performance_risk(float(many.model_sd[sh])),
            migration_effort=_migration_effort(groups, profile, current),
            savings_vs_current=(1 - float(cost[i]) / current[2]) if current and current[2] > 0 else None,
            memory_gib=float(many.memory_gib[sh]),
            pareto=i in pareto_set,
            checkpoint_interval_s=float(tau) if np.isfinite(tau) else None,
        )

    entries = [entry(i, r + 1) for r, i in enumerate(order)]
    pareto = [entry(int(i), int((keyed < keyed[i]).sum()) + 1) for i in pareto_idx]
    notes = [
        f"work: {samples:,.0f} samples; spot overhead with a {checkpoint_s:.3g} s checkpoint ({checkpoint_note}) "
        "and Spot Advisor interruption rates; any lost instance stops a synchronous DDP step until it is replaced"
    ]
    if constraints.max_types >= 3 and len(types) > MIX3_TYPES:
        notes.append(
            f"3-type mixes formed from the {MIX3_TYPES} most cost-efficient types only: "
            + ", ".join(names[j] for j in efficient)
        )
    if calibration and calibration.factors:
        notes.append(
            "calibrated from observed runs of this model: "
            + ", ".join(f"{g} x{f:.2f} ({calibration.observations.get(g, 1)} runs)" for g, f in factors.items())
        )
    if current:
        notes.append(f"savings and migration effort against {current[0]} ({current[2]:,.2f} USD for the work)")
    return Plan(
        schema=PLAN_SCHEMA,
        constraints=PlanConstraints(
            work_samples=samples,
            objective=constraints.objective,
            market=constraints.market,
            regions=tuple(constraints.regions),
            max_instances=constraints.max_instances,
            max_types=constraints.max_types,
            spot_share=constraints.spot_share if "mixed" in markets else None,
            on_demand_base=constraints.on_demand_base if "mixed" in markets else None,
            current_fleet=current[0] if current else None,
            allow=tuple(constraints.allow) or None,
            deny=tuple(constraints.deny) or None,
            deadline_h=constraints.deadline_h,
            budget_usd=constraints.budget_usd,
            max_hourly_usd=constraints.max_hourly_usd,
            min_memory_headroom=constraints.min_memory_headroom,
        ),
        entries=tuple(entries),
        pareto=tuple(pareto),
        chosen=0,
        why=_why(constraints, entries[0], ok, time_h, cost, key),
        considered=considered,
        excluded=excluded,
        excluded_types=excluded_types or None,
        calibration=tuple(calibration.entries()) if calibration and calibration.factors else None,
        catalog_source=catalog.info.source,
        catalog_snapshot=catalog.info.snapshot,
        model=profile.model.name,
        profile_gpu=profile.hardware.gpu,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        notes=tuple(notes),
    )


def _efficient_types(
    profile: Profile,
    names: list[str],
    types: list[InstanceType],
    catalog: Catalog,
    factors: dict[str, float] | None,
    region: str,
) -> list[int]:
    """Indices of the MIX3_TYPES types with the most samples per dollar (one instance, cheapest market)."""
    if len(names) <= MIX3_TYPES:
        return list(range(len(names)))
    one = predict_many(profile, names, np.ones(len(names), dtype=int), catalog=catalog, calibration=factors)
    price = np.array(
        [
            min((p for p in (it.price_usd_hr(region, m) for m in ("on-demand", "spot")) if p), default=np.inf)
            for it in types
        ]
    )
    per_usd = np.where(one.fits_memory, one.throughput_samples_s / price, 0.0)
    return sorted(int(j) for j in np.argsort(-per_usd, kind="stable")[:MIX3_TYPES])


def _current(
    profile: Profile, constraints: Constraints, catalog: Catalog, samples: float, factors: dict[str, float] | None
) -> tuple[str, str, float] | None:
    """(fleet, GPU, on-demand cost of the work) of the current hardware, when known and priced."""
    text = constraints.current_fleet
    if text is None and profile.hardware.instance_type:
        text = f"{profile.hardware.instance_type}:{max(1, profile.hardware.nodes)}"
    if text is None:
        return None
    try:
        fleet = parse_fleet(text, catalog)
        from predictor.predict import predict

        pred = predict(profile, fleet, catalog=catalog, calibration=factors)
        usd = sum((g.instance.price_usd_hr(constraints.regions[0]) or math.nan) * g.count for g in fleet.groups)
    except SriftyError:
        if constraints.current_fleet is not None:
            raise
        return None  # the profiled instance is not in the catalog: no comparison
    if not math.isfinite(usd):
        return None
    gpu = ",".join(sorted({g.instance.gpu or "" for g in fleet.groups}))
    return str(fleet), gpu, usd * samples / pred.throughput_samples_s / 3600


def _performance_risk(sd: float) -> str:
    low, medium = PERFORMANCE_RISK_SD
    return "low" if sd <= low else "medium" if sd <= medium else "high"


def _migration_effort(groups: list[PlanGroup], profile: Profile, current: tuple[str, str, float] | None) -> str:
    gpus = {g.gpu for g in groups}
    if len(gpus) > 1:
        return "high"
    fleet = ",".join(f"{g.instance_type}:{g.count}" for g in groups)
    if current and fleet == current[0]:
        return "none"
    same_gpu = gpus == {current[1]} if current else gpus == {profile.hardware.gpu}
    single_node = sum(g.count for g in groups) == 1
    return "low" if same_gpu and single_node else "medium"


def _pareto(candidates: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices not dominated in (time, cost), fastest first.

    A front of a few thousand anchors (the fastest, the cheapest and a strided sample) first rules out every
    candidate one of them dominates (a binary search each), so that the exact sort runs on the few left.
    """
    if len(candidates) > 20_000:
        n = len(candidates)
        anchors = np.unique(
            np.concatenate(
                (
                    np.argpartition(time_h[candidates], 255)[:256],
                    np.argpartition(cost[candidates], 255)[:256],
                    np.arange(0, n, max(1, n // 2048)),
                )
            )
        )
        front = _exact_front(candidates[anchors], time_h, cost)
        ft, fc = time_h[front], cost[front]
        t, c = time_h[candidates], cost[candidates]
        j = np.searchsorted(ft, t, side="right") - 1  # the anchor with the largest time <= t (cheapest there)
        jj = np.clip(j, 0, None)
        dominated = (j >= 0) & (fc[jj] <= c) & ((ft[jj] < t) | (fc[jj] < c))
        candidates = candidates[~dominated]
    return _exact_front(candidates, time_h, cost)


def _exact_front(candidates: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> np.ndarray:
    if not len(candidates):
        return candidates
    order = candidates[np.lexsort((cost[candidates], time_h[candidates]))]
    c = cost[order]
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(c)[:-1]))
    return order[c < best_before]


def _why(
    constraints: Constraints, best: PlanEntry, fits: np.ndarray, time_h: np.ndarray, cost: np.ndarray, key: np.ndarray
) -> str:
    goal = {
        "cost": "the lowest expected cost",
        "time": "the shortest expected time",
        "cost_per_sample": "the lowest cost per sample",
    }[constraints.objective]
    text = f"{best.fleet} ({best.market}, {best.region}) has {goal}: {best.time_h:.3g} h, ${best.cost_usd:,.3g}"
    unconstrained = float(np.min(np.where(fits, key, np.inf)))
    chosen_key = best.time_h if constraints.objective == "time" else best.cost_usd
    if chosen_key > unconstrained * 1.0001:
        binding = "deadline" if constraints.deadline_h is not None else "budget"
        text += f"; the {binding} binds (without it the best would reach {unconstrained:,.2f})"
    return text


def _infeasible(constraints: Constraints, fits: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> Exception:
    if not fits.any():
        return NoFeasibleConfigError(
            "No fleet fits the model in GPU memory (with the headroom asked). Use larger "
            "GPUs, a smaller per-GPU batch, or shard the model (FSDP / DeepSpeed)."
        )
    parts = []
    under_budget = fits & (cost <= (constraints.budget_usd or np.inf))
    under_deadline = fits & (time_h <= (constraints.deadline_h or np.inf))
    if constraints.deadline_h is not None:
        fastest = float(np.min(np.where(under_budget, time_h, np.inf)))
        parts.append(
            f"the deadline of {constraints.deadline_h:g} h binds: the fastest fleet "
            + (f"within the budget takes {fastest:.1f} h" if np.isfinite(fastest) else "takes longer")
        )
    if constraints.budget_usd is not None:
        cheapest = float(np.min(np.where(under_deadline, cost, np.inf)))
        parts.append(
            f"the budget of ${constraints.budget_usd:,.0f} binds: the cheapest fleet "
            + (f"meeting the deadline costs ${cheapest:,.0f}" if np.isfinite(cheapest) else "costs more")
        )
    if constraints.max_hourly_usd is not None and not parts:
        parts.append(f"no fleet costs less than ${constraints.max_hourly_usd:g}/h")
    hints = (
        "Hints: relax the binding constraint, allow spot (--market any), more instances (--max-instances), "
        "mixes of instance types (--max-types 2)."
    )
    return NoFeasibleConfigError("No fleet meets the constraints: " + "; ".join(parts) + ". " + hints)

"""Candidate fleets: the instance types that can run the training (each one left out counted by reason), every
fleet shape over them, and each shape priced in every region and market (numpy over all candidates)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from predictor.catalog.catalog import Catalog
from predictor.catalog.feasible import exclusion
from predictor.catalog.gpus import CATALOG_EXTRA
from predictor.catalog.instances import InstanceType
from predictor.catalog.torch_builds import default_image
from predictor.catalog.zones import fleet_zones, spot_table
from predictor.documents.checks import suggest
from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError, did_you_mean
from predictor.model.fleets import ManyPredictions, predict_many, row_all, row_sum
from predictor.ranking.constraints import Constraints

MAX_CANDIDATES = 5_000_000  # ~2 s and ~2 GB of arrays; above it the request is almost surely a mistake
MIX3_TYPES = 12  # 3-type mixes are formed from this many most cost-efficient types (C(12,3) x counts)
MARKET_NAMES = np.array(["on-demand", "spot", "mixed"])


def count(excluded: dict[str, int], reason: str, mask: np.ndarray | int) -> None:
    """Add ``mask.sum()`` (or an int) candidates to ``excluded[reason]``."""
    n = int(mask.sum()) if isinstance(mask, np.ndarray) else int(mask)
    if n:
        excluded[reason] = excluded.get(reason, 0) + n


def check_names(constraints: Constraints, catalog: Catalog) -> None:
    """Every ``allow``/``deny`` entry names an instance type or family of the catalog and every region has prices
    there: a typo (``--deny p4d.24xlarg``) is an error with "did you mean", never a filter that does nothing."""
    types = list(catalog)
    known = {it.name for it in types} | {it.family for it in types}
    gpus = {it.gpu for it in types if it.gpu}
    for name in ("allow", "deny"):
        for value in getattr(constraints, name):
            if value not in known and not any(gpu_matches(g, value) for g in gpus):
                close = suggest(value, known | gpus, n=3)
                raise ConfigError.between(
                    "The {" + name + "} constraint names {given!r}, which is neither an instance type, a family nor "
                    "a GPU of the catalog ({source}, {snapshot}).{mean} Add your own types in {extra}.",
                    parameter=name,
                    value=value,
                    given=value,
                    source=catalog.info.source,
                    snapshot=catalog.info.snapshot,
                    mean=f" {did_you_mean(close)}" if close else "",
                    extra=CATALOG_EXTRA,
                )
    for region in constraints.regions:
        catalog.check_region(region, "regions")


def gpu_matches(gpu: str, value: str) -> bool:
    """Whether an allow/deny entry names this GPU: its catalog key (``A100-SXM-80GB``) or the model before a dash
    (``A100`` names both A100s, ``V100`` both V100s; ``L4`` is not ``L40S``), in any case (issue #37 M6: ``--allow
    A100`` was refused although the catalog knows which types carry one)."""
    key, asked = gpu.lower(), value.lower()
    return key == asked or key.startswith(asked + "-")


def _named(it: InstanceType, names: tuple[str, ...]) -> bool:
    return it.name in names or it.family in names or any(gpu_matches(it.gpu or "", n) for n in names if it.gpu)


def _allowed(it: InstanceType, constraints: Constraints) -> bool:
    if constraints.allow and not _named(it, constraints.allow):
        return False
    return not _named(it, constraints.deny)


def instance_types(
    profile: Profile, constraints: Constraints, catalog: Catalog, excluded: dict[str, int]
) -> list[InstanceType]:
    """The CUDA types that can run the training, in ascending on-demand price of the first region (the order in
    which a mixed market's on-demand base is filled, and the launch-template priority of the generated Terraform).
    Every type left out is counted in ``excluded`` by reason."""
    types: list[InstanceType] = []
    driver = constraints.driver or default_image()[1]  # the nodes boot srifty terraform's image unless told
    for it in catalog.filter(cuda_only=True):
        if not _allowed(it, constraints):
            count(excluded, "not among the types allowed", 1)
        elif it.gpu not in catalog.gpus:
            count(excluded, f"GPU without specs ({it.gpu})", 1)
        elif not any(it.price_usd_hr(region, m) for region in constraints.regions for m in ("on-demand", "spot")):
            count(excluded, "no price in " + ", ".join(constraints.regions), 1)
        else:
            why = exclusion(it, catalog.gpu(it.gpu or ""), profile, allow_arm64=constraints.allow_arm64, driver=driver)
            if why:
                count(excluded, why, 1)
            else:
                types.append(it)
    region0 = constraints.regions[0]
    types.sort(key=lambda it: (it.price_usd_hr(region0) or it.price_usd_hr(region0, "spot") or math.inf, it.name))
    return types


def _compositions(total_max: int, parts: int) -> np.ndarray:
    """Every tuple of ``parts`` counts >= 1 adding up to at most ``total_max`` (rows)."""
    if parts == 1:
        return np.arange(1, total_max + 1).reshape(-1, 1)
    rows = [c for c in itertools.product(range(1, total_max + 1), repeat=parts) if sum(c) <= total_max]
    return np.array(rows, dtype=int).reshape(-1, parts)


def shape_count(n_types: int, n_efficient: int, constraints: Constraints) -> int:
    """How many fleet shapes :func:`shapes` forms (checked against MAX_CANDIDATES before any work)."""
    return sum(
        math.comb(n_types if k <= 2 else n_efficient, k) * math.comb(constraints.max_instances, k)
        for k in range(1, min(constraints.max_types, n_types) + 1)
    )


def shapes(n_types: int, constraints: Constraints, efficient: list[int]) -> tuple[np.ndarray, np.ndarray]:
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


def efficient_types(
    profile: Profile,
    names: list[str],
    types: list[InstanceType],
    catalog: Catalog,
    factors: dict[str, float] | None,
    constraints: Constraints,
) -> list[int]:
    """Indices of the MIX3_TYPES types with the most samples per dollar (one instance, cheapest market)."""
    if len(names) <= MIX3_TYPES:
        return list(range(len(names)))
    region = constraints.regions[0]
    one = predict_many(
        profile,
        names,
        np.ones(len(names), dtype=int),
        catalog=catalog,
        calibration=factors,
        scaling=constraints.scaling,
    )
    price = np.array(
        [
            min((p for p in (it.price_usd_hr(region, m) for m in ("on-demand", "spot")) if p), default=np.inf)
            for it in types
        ]
    )
    per_usd = np.where(one.fits_memory, one.throughput_samples_s / price, 0.0)
    return sorted(int(j) for j in np.argsort(-per_usd, kind="stable")[:MIX3_TYPES])


@dataclass
class Candidates:
    """Arrays over candidates (shape x region x market)."""

    shape: np.ndarray
    region: np.ndarray
    market: np.ndarray  # 0 on-demand, 1 spot, 2 mixed
    on_demand: np.ndarray  # (N, K) instances bought on demand
    spot: np.ndarray  # (N, K)
    group_usd: np.ndarray  # (N, K)
    rate_per_hr: np.ndarray  # interruption rate of the whole fleet
    od_usd: np.ndarray  # the same fleet all on-demand, per hour (nan: a type without an on-demand price)


def _split(
    market: str, cnt: np.ndarray, nodes: np.ndarray, constraints: Constraints, priced: np.ndarray, excluded: dict
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(on-demand instances, spot instances, kept) of every shape in ``market``: a mixed one's on-demand base and
    share, the on-demand part on the cheapest on-demand types, counted out where it is either market alone or over
    two types."""
    if market == "on-demand":
        return cnt, np.zeros_like(cnt), priced
    if market == "spot":
        return np.zeros_like(cnt), cnt, priced
    base = constraints.on_demand_base
    n_od = np.minimum(nodes, base + np.ceil((nodes - base).clip(0) * (1 - constraints.spot_share)))
    distinct = (n_od > 0) & (n_od < nodes)  # otherwise the same as all on-demand or all spot
    # groups come in ascending on-demand price (instance_types()): the base fills the first ones
    before = np.cumsum(cnt, axis=1) - cnt
    on = np.clip(n_od[:, None] - before, 0, cnt).astype(int)
    # one Auto Scaling group gives its whole on-demand base to its first type ("prioritized", AWS's Auto Scaling user
    # guide): an on-demand part over two types is a fleet no group buys (a trial)
    one_type = row_sum((on > 0).astype(int)) <= 1
    count(excluded, "mixed market same as all on-demand or all spot (fleet too small)", priced & ~distinct)
    count(
        excluded,
        "mixed market: the on-demand part over two types (an Auto Scaling group gives its base to one)",
        priced & distinct & ~one_type,
    )
    return on, cnt - on, priced & distinct & one_type


def price(
    many: ManyPredictions,
    types: list[InstanceType],
    constraints: Constraints,
    markets: tuple[str, ...],
    excluded: dict[str, int],
) -> Candidates:
    """Every shape in every region and market that has its prices; the others counted by reason."""
    tidx, cnt = many.type_index, many.counts
    present = cnt > 0
    nodes = row_sum(cnt)
    rate = np.array([it.spot_rate_per_hr for it in types])[tidx]
    parts: list[Candidates] = []
    for r, region in enumerate(constraints.regions):
        od = np.array([it.price_usd_hr(region, "on-demand") or np.nan for it in types])[tidx]
        sp = np.array([it.price_usd_hr(region, "spot") or np.nan for it in types])[tidx]
        _, prices = spot_table(types, region)
        od_known = row_all(~present | np.isfinite(od))
        sp_known = row_all(~present | np.isfinite(sp))
        for market in markets:
            priced = od_known if market == "on-demand" else sp_known if market == "spot" else od_known & sp_known
            on, off, ok = _split(market, cnt, nodes, constraints, priced, excluded)
            count(excluded, f"no {market} price in {region}", ~priced)
            # the spot part in one zone, the fleet's (predictor.catalog.zones): an audit's mix was priced across two
            zone = fleet_zones(prices, tidx, off)
            if market != "on-demand":
                count(excluded, f"{market}: no zone of {region} offers spot capacity of each of its types",
                      ok & (zone < 0))  # fmt: skip
                ok = ok & (zone >= 0)
            keep = np.flatnonzero(ok)
            in_zone = prices[tidx[keep], np.maximum(zone[keep], 0)[:, None]]
            usd = np.nan_to_num(od[keep]) * on[keep] + np.nan_to_num(in_zone) * off[keep]
            parts.append(
                Candidates(
                    keep,
                    np.full(len(keep), r),
                    np.full(len(keep), {"on-demand": 0, "spot": 1, "mixed": 2}[market]),
                    on[keep],
                    off[keep],
                    usd,
                    row_sum(off[keep] * rate[keep]),
                    np.where(od_known[keep], row_sum(np.nan_to_num(od[keep]) * cnt[keep]), np.nan),
                )
            )
    return Candidates(*(np.concatenate([getattr(p, f) for p in parts]) for f in Candidates.__dataclass_fields__))

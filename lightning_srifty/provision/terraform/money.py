"""Money checks before anything is bought: a plan's counts, markets and $/h are recomputed from the catalog, never
trusted, and the fleet must fit the guards (``max_instances``, ``max_hourly_usd``).

``srifty terraform`` (:func:`check_entry`, then :func:`check_limits`) refuses a plan entry whose figures disagree with
the catalog (a stale plan, or an edited one: 1 x p5.48xlarge at "$0.50/h"); ``srifty apply`` and the launcher's
terraform provisioner check the written values again (:func:`check_values`), since the folder can be edited between
the two. Every refusal names the field, the plan's value and the catalog's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from predictor.catalog.catalog import Catalog
from predictor.catalog.gpus import CATALOG_EXTRA
from predictor.catalog.zones import group_spot_prices
from predictor.documents.plan import Plan, PlanEntry
from predictor.exceptions import ConfigError

REL_TOL = 1e-6
ABS_TOL = 1e-5  # the written values round $/h to 6 decimals

_REDO = "The plan is stale (the catalog changed since) or was edited: rank again with `srifty recommend`."
_REWRITE = (
    "The written values are stale (the catalog changed since) or were edited: write them again with `srifty "
    "terraform` (a fleet of other types: rank again with `srifty recommend`)."
)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _mismatch(
    field: str, plan_value: object, catalog_value: object, what: str, *, written: bool = False
) -> ConfigError:
    source, fix = ("The written values'", _REWRITE) if written else ("The plan's", _REDO)
    return ConfigError(
        f"{source} {field} is {plan_value!r}, but the catalog gives {catalog_value!r} ({what}). {fix}",
        parameter=field,
        value=plan_value,
    )


def group_usd_per_hour(
    catalog: Catalog,
    instance_type: str,
    region: str,
    on_demand: int,
    spot: int,
    field: str = "instance_type",
    spot_usd: float | None = None,
) -> float:
    """The catalog's price of ``on_demand`` + ``spot`` instances of ``instance_type`` in ``region``, per hour (its spot
    price: ``spot_usd``, the fleet's zone's, where given: :func:`fleet_spot_prices`; else its cheapest zone's).
    ``field`` is what set the type or the region: a parameter's name (said as the front end's), else a document's
    path (said as it is).

    Raises:
        ConfigError: the type is unknown, or has no price in a market the group buys.
    """
    if instance_type not in catalog:
        raise ConfigError.between(
            "The plan's {field} {type!r} is not in the catalog ({source}), so its price cannot be checked: give the "
            "catalog the plan was ranked with ({catalog}, and the types it added from {extra}).",
            parameter=field,
            value=instance_type,
            field=field,
            type=instance_type,
            source=catalog.info.source,
            extra=CATALOG_EXTRA,
        )
    it = catalog.get(instance_type)
    total = 0.0
    for market, n in (("on-demand", on_demand), ("spot", spot)):
        if n <= 0:
            continue
        own = it.price_usd_hr(region, market)  # type: ignore[arg-type]
        price = spot_usd if market == "spot" and spot_usd is not None else own
        if own and price != price:  # nan: the type has spot prices, none in a zone that offers the fleet's others
            raise _no_zone(field, instance_type, region)
        if not price:
            # a parameter (generate's region) is named in each front end's words; a document's path as it is
            said = "{" + field + "}" if field.isidentifier() else "{field}"
            raise ConfigError.between(
                "The catalog has no {market} price for {type} in {where}, but the plan buys {n} there (" + said + "). "
                "{redo}",
                parameter=field,
                value=instance_type,
                market=market,
                type=instance_type,
                where=region,
                n=n,
                redo=_REDO,
                **({} if field.isidentifier() else {"field": field}),
            )
        total += price * n
    return total


def _no_zone(field: str, instance_type: str, region: str) -> ConfigError:
    """A fleet's spot types no zone offers together (a plan ranked before the one-zone rule took each one's cheapest
    zone): why the price cannot be checked, and the way on."""
    return ConfigError.between(
        "No availability zone of {where} offers spot capacity of every spot type of the fleet, {type} among them, in "
        "the catalog: a fleet is one subnet, in one zone. Rank again with `srifty recommend`, which prices a fleet's "
        "spot part in one zone (a plan ranked before 2026-12-08 took each type's cheapest).",
        parameter=field,
        value=instance_type,
        type=instance_type,
        where=region,
    )


def fleet_spot_prices(catalog: Catalog, groups: list[tuple[str, int]], region: str) -> list[float | None]:
    """Each group's spot $/h in the fleet's zone (:func:`predictor.catalog.zones.group_spot_prices`, the ranking's
    rule), for ``groups`` of (instance type, spot count); None for all where a type is not in the catalog (the
    group's own check says so)."""
    if any(t not in catalog for t, _ in groups) or not any(n for _, n in groups):
        return [None] * len(groups)
    _, prices = group_spot_prices([catalog.get(t) for t, _ in groups], [n for _, n in groups], region)
    return list(prices)


def check_entry(plan: Plan, choice: int, catalog: Catalog) -> float:
    """Recompute ``plan.entries[choice]``'s counts, markets and $/h from the catalog; returns the $/h.

    Raises:
        ConfigError: a figure differs from the catalog's (field, plan value and catalog value named).
    """
    entry: PlanEntry = plan.entries[choice]
    at = f"entries[{choice}]"
    total = 0.0
    in_zone = fleet_spot_prices(catalog, [(g.instance_type, g.spot) for g in entry.groups], entry.region)
    for k, g in enumerate(entry.groups):
        field = f"{at}.groups[{k}]"
        if g.on_demand < 0 or g.spot < 0 or g.count != g.on_demand + g.spot:
            raise _mismatch(f"{field}.count", g.count, g.on_demand + g.spot, "on_demand + spot")
        usd = group_usd_per_hour(
            catalog, g.instance_type, entry.region, g.on_demand, g.spot, f"{field}.instance_type", in_zone[k]
        )
        gpus = catalog.get(g.instance_type).gpus
        if g.gpus_per_instance != gpus:
            raise _mismatch(f"{field}.gpus_per_instance", g.gpus_per_instance, gpus, f"GPUs of one {g.instance_type}")
        if not _close(g.usd_per_hour, usd):
            what = f"{g.on_demand} on-demand + {g.spot} spot {g.instance_type} in {entry.region}"
            raise _mismatch(f"{field}.usd_per_hour", g.usd_per_hour, round(usd, 6), what)
        total += usd
    nodes = sum(g.count for g in entry.groups)
    spot = sum(g.spot for g in entry.groups)
    on_demand = nodes - spot
    fleet = ",".join(f"{g.instance_type}:{g.count}" for g in entry.groups)
    for field, plan_value, value, what in (
        ("nodes", entry.nodes, nodes, "the groups' counts added up"),
        ("gpus", entry.gpus, sum(g.count * g.gpus_per_instance for g in entry.groups), "the groups' GPUs added up"),
        ("fleet", entry.fleet, fleet, "the groups' types and counts"),
    ):
        if plan_value != value:
            raise _mismatch(f"{at}.{field}", plan_value, value, what)
    market = "on-demand" if spot == 0 else "spot" if on_demand == 0 else "mixed"
    if entry.market != market:
        raise _mismatch(f"{at}.market", entry.market, market, f"{on_demand} on-demand and {spot} spot instances")
    if not _close(entry.spot_share, spot / nodes):
        raise _mismatch(f"{at}.spot_share", entry.spot_share, spot / nodes, "spot instances / instances")
    if not _close(entry.usd_per_hour, total):
        raise _mismatch(f"{at}.usd_per_hour", entry.usd_per_hour, round(total, 6), f"{entry.fleet} in {entry.region}")
    return total


# the fix when the guards were written into a root module (srifty apply, which sets neither): the command that writes
WRITTEN_AGAIN = (
    "a limit of the written values: write the module again with `srifty terraform` for {fleet} or a higher {flag}"
)


def check_limits(
    nodes: int, usd_per_hour: float, max_instances: int | None, max_hourly_usd: float | None, written: bool = False
) -> None:
    """The guards: at most ``max_instances`` instances and ``max_hourly_usd`` $/h (None: no limit); ``written``:
    they were read from a root module's values, and the fix is to write it again.

    Raises:
        ConfigError: naming the guard, the fleet's figure and the limit.
    """
    if max_instances is not None and nodes > max_instances:
        fix = "choose a smaller fleet ({choice}) or raise the guard ({max_instances})"
        raise ConfigError.between(
            "The fleet has {nodes} instances, more than max_instances = {limit}: "
            + (WRITTEN_AGAIN.format(fleet="a smaller fleet (--choice)", flag="--max-instances") if written else fix)
            + ".",
            parameter="max_instances",
            value=nodes,
            nodes=nodes,
            limit=max_instances,
        )
    if max_hourly_usd is not None and usd_per_hour > max_hourly_usd + ABS_TOL:
        fix = "choose a cheaper fleet ({choice}) or raise the guard ({max_hourly_usd})"
        raise ConfigError.between(
            "The fleet costs ${usd:,.4f}/h (catalog prices), more than max_hourly_usd = ${limit:,.4f}/h: "
            + (WRITTEN_AGAIN.format(fleet="a cheaper fleet (--choice)", flag="--max-hourly") if written else fix)
            + ".",
            parameter="max_hourly_usd",
            value=usd_per_hour,
            usd=usd_per_hour,
            limit=max_hourly_usd,
        )


def _count(n: object) -> TypeGuard[int]:
    """A whole count of instances (not a bool)."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _groups(values: Mapping[str, Any]) -> Iterable[tuple[int, dict[str, Any]]]:
    groups = values.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ConfigError(
            "The written values have no groups: write them again with `srifty terraform`.",
            parameter="groups",
            value=groups,
        )
    return enumerate(groups)


def _check_written_type(k: int, group: Mapping[str, Any], catalog: Catalog) -> None:
    """A written group's GPUs a node and its EFA interfaces are its type's (a trial: a group edited to p4d.24xlarge
    kept gpus_per_instance 1, one process on an 8-GPU node, and went to terraform plan)."""
    itype = catalog.get(str(group.get("instance_type")))  # known: group_usd_per_hour has refused an unknown one
    if group.get("gpus_per_instance") != itype.gpus:
        raise _mismatch(f"groups[{k}].gpus_per_instance", group.get("gpus_per_instance"), itype.gpus,
                        f"GPUs of one {itype.name}", written=True)  # fmt: skip
    if group.get("efa") and not itype.efa:
        raise _mismatch(f"groups[{k}].efa", True, False, f"{itype.name} has no EFA", written=True)
    cards = group.get("network_interfaces", 1)
    if group.get("efa") and not (isinstance(cards, int) and 1 <= cards <= max(1, itype.efa_interfaces)):
        raise _mismatch(f"groups[{k}].network_interfaces", cards, itype.efa_interfaces,
                        f"EFA interfaces of one {itype.name}", written=True)  # fmt: skip


def check_values(values: Mapping[str, Any], catalog: Catalog) -> float:
    """Check the values ``srifty terraform`` wrote (``srifty.auto.tfvars.json``) before an apply: the groups' $/h from
    the catalog against ``predicted.usd_per_hour``, and the guards in ``limits``; returns the $/h.

    Raises:
        ConfigError: a figure differs from the catalog's, or the fleet breaks a guard.
    """
    region = values.get("region")
    total, nodes = 0.0, 0
    # the spot part in the fleet's zone, as ranked (a count that is not a whole number is refused below)
    written = [(str(g.get("instance_type")), g.get("spot")) for _, g in _groups(values)]
    spots = [n for _, n in written if _count(n)]
    in_zone = (
        fleet_spot_prices(catalog, [(t, n) for (t, _), n in zip(written, spots)], str(region))
        if len(spots) == len(written)
        else [None] * len(written)
    )
    for k, g in _groups(values):
        od, sp = g.get("on_demand"), g.get("spot")
        if not (_count(od) and _count(sp)):
            raise ConfigError(
                f"groups[{k}] needs whole on_demand and spot counts; got {od!r} and {sp!r}. Write the values again "
                "with `srifty terraform`.",
                parameter=f"groups[{k}]",
                value=g,
            )
        total += group_usd_per_hour(
            catalog, str(g.get("instance_type")), str(region), od, sp, f"groups[{k}]", in_zone[k]
        )
        nodes += od + sp
        _check_written_type(k, g, catalog)
    predicted = values.get("predicted") or {}
    if "usd_per_hour" not in predicted:
        raise ConfigError(
            "The written values have no predicted.usd_per_hour to check: write them again with `srifty terraform`.",
            parameter="predicted.usd_per_hour",
        )
    if not _close(float(predicted["usd_per_hour"]), total):
        where = f"the groups in {region}"
        raise _mismatch("predicted.usd_per_hour", predicted["usd_per_hour"], round(total, 6), where, written=True)
    if nodes != (values.get("train") or {}).get("nnodes"):
        nnodes = (values.get("train") or {}).get("nnodes")
        raise _mismatch("train.nnodes", nnodes, nodes, "the groups' counts", written=True)
    limits = values.get("limits") or {}
    if "max_instances" not in limits:
        raise ConfigError(
            "The written values have no limits.max_instances: write them again with `srifty terraform`.",
            parameter="limits.max_instances",
        )
    check_limits(nodes, total, limits.get("max_instances"), limits.get("max_hourly_usd"), written=True)
    return total

"""Spot prices of a fleet in one availability zone: the rule the ranking, ``srifty terraform`` and its checks share.

A fleet is one subnet, so all its spot instances are bought in one zone. Each type's spot price had been its own
cheapest measured zone, so a mix was priced across zones no fleet can span: p4d.24xlarge x 5 at use1-az1's $2.47/h
beside p5en.48xlarge at use1-az6's $16.56/h ($28.88/h), where the one zone with both prices costs $55.95/h (an
audit). Here a type's spot price in a zone is its measured price there; a type with no measured zone keeps its
region-wide estimate (the Spot Advisor's savings), which holds in every zone. The catalog's zones of a type are the
ones its spot capacity was offered in (skypilot's catalog lists a type's offered zones), so a fleet's zone is one
that has every one of its spot types measured there, the cheapest of them (a single type: its cheapest measured zone,
as before); a mix no zone offers whole is no spot fleet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from predictor.catalog.instances import InstanceType


def spot_table(types: Sequence[InstanceType], region: str) -> tuple[tuple[str | None, ...], np.ndarray]:
    """(zones, prices) of ``types`` in ``region``: the zones any of them was measured in (sorted; ``(None,)`` when none
    was), ``prices[t, z]`` the spot $/h of ``types[t]`` there by the module's rule (nan: not offered there, or no spot
    price at all)."""
    own = [
        {
            p.availability_zone: p.usd_hr
            for p in it.prices
            if p.region == region and p.market == "spot" and p.availability_zone and not p.estimated
        }
        for it in types
    ]
    zones: tuple[str | None, ...] = tuple(sorted({z for o in own for z in o})) or (None,)
    prices = np.full((len(types), len(zones)), np.nan)
    for t, (it, found) in enumerate(zip(types, own)):
        if found:
            for z, zone in enumerate(zones):
                if zone in found:
                    prices[t, z] = found[zone]
        else:
            prices[t, :] = it.price_usd_hr(region, "spot") or np.nan
    return zones, prices


def fleet_zones(prices: np.ndarray, tidx: np.ndarray, spot: np.ndarray) -> np.ndarray:
    """For each fleet (row of ``tidx``: its groups' type indices into the table, ``spot``: each group's spot
    instances), the index of its zone: the least spot $/h among the zones that have a measured price for each of its
    spot types measured anywhere in the region (the catalog's spot zones are where the type was offered); -1 where
    no zone has them all. A fleet without spot, or whose spot types have only region-wide estimates, gets the
    first."""
    buying = spot > 0
    each = np.where(buying[:, :, None], prices[tidx], 0.0)  # (N, K, Z); nan where a bought type is not offered
    usd = (each * np.where(buying, spot, 0)[:, :, None]).sum(axis=1)  # (N, Z)
    usd = np.where(np.isfinite(usd), usd, np.inf)
    return np.where(np.isfinite(usd).any(axis=1), np.argmin(usd, axis=1), -1)


def group_spot_prices(
    types: Sequence[InstanceType], spot: Sequence[int], region: str
) -> tuple[str | None, list[float]]:
    """One fleet's zone and each of its groups' spot $/h there (nan: no spot price there), by the same rule as the
    ranking's (:func:`spot_table`, :func:`fleet_zones`): ``types`` its groups' types, ``spot`` their spot counts. The
    zone is read from the types it buys on spot alone (a mixed fleet's on-demand type, priced per region, places
    nothing: a review found its first zone named for a spot part of estimates only); None where none of them has a
    measured zone, or no zone offers them all (every price nan)."""
    buying = [t for t, n in enumerate(spot) if n > 0]
    zones, prices = spot_table([types[t] for t in buying], region)
    z = int(fleet_zones(prices, np.arange(len(buying))[None, :], np.asarray([spot[t] for t in buying])[None, :])[0])
    if not buying or z < 0:
        return None, [math.nan] * len(types)
    others = {t: types[t].price_usd_hr(region, "spot") for t in range(len(types)) if t not in buying}
    in_zone = {t: float(prices[i, z]) for i, t in enumerate(buying)}
    return zones[z], [in_zone[t] if t in in_zone else (others[t] or math.nan) for t in range(len(types))]

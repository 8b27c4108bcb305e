"""A fleet's spot instances in one availability zone (predictor.catalog.zones): the ranking, srifty terraform's
zone and its price checks share the rule."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from _support import MINIMAL
from predictor.catalog.instances import Price
from predictor.catalog.zones import fleet_zones, group_spot_prices, spot_table
from predictor.documents.profile import load_profile
from predictor.ranking import Constraints, rank


def test_a_spot_mix_is_priced_in_the_one_zone_that_offers_all_its_types(catalog) -> None:
    """An audit: p4d.24xlarge x 5 at use1-az1's $2.47/h beside p5en.48xlarge at use1-az6's $16.56/h read $28.88/h,
    a fleet no subnet can hold; the one zone with both is use1-az6, $55.95/h. A single type keeps its cheapest
    measured zone; a type with only the advisor's estimate holds it in every zone."""
    types = [catalog.get("p4d.24xlarge"), catalog.get("p5en.48xlarge")]
    assert group_spot_prices(types, [5, 1], "us-east-1") == ("use1-az6", [7.8799, 16.5551])
    p4de = [catalog.get("p4d.24xlarge"), catalog.get("p4de.24xlarge")]
    zone, prices = group_spot_prices(p4de, [7, 1], "us-east-1")
    assert zone == "use1-az6" and 7 * prices[0] + prices[1] == pytest.approx(63.8098)
    assert group_spot_prices(types[:1], [1], "us-east-1") == ("use1-az1", [2.4655])  # as before: its cheapest
    estimated = catalog.get("g5.xlarge")  # no measured zone: the advisor's estimate
    assert group_spot_prices([estimated], [2], "us-east-1") == (None, [estimated.price_usd_hr("us-east-1", "spot")])
    zone, prices = group_spot_prices([estimated, types[0]], [1, 1], "us-east-1")
    assert zone == "use1-az1" and prices == [estimated.price_usd_hr("us-east-1", "spot"), 2.4655]


def test_a_mix_no_zone_offers_whole_is_no_spot_fleet(catalog) -> None:
    """Two types whose spot capacity the catalog measured in no common zone: no zone for the fleet (-1), and no
    price; a fleet of only one of them, or one whose other group buys on demand, has its zone."""

    def only_in(name: str, zone: str):
        it = catalog.get(name)
        keep = [p for p in it.prices if p.market != "spot" or p.region != "us-east-1"]
        return dataclasses.replace(it, prices=(*keep, Price("us-east-1", "spot", 3.0, zone)))

    a, b = only_in("p4d.24xlarge", "use1-az1"), only_in("p4de.24xlarge", "use1-az2")
    zones, prices = spot_table([a, b], "us-east-1")
    assert zones == ("use1-az1", "use1-az2") and np.isnan(prices[0, 1]) and np.isnan(prices[1, 0])
    tidx = np.array([[0, 1], [0, 1], [0, 1]])
    spot = np.array([[1, 1], [1, 0], [0, 2]])
    assert list(fleet_zones(prices, tidx, spot)) == [-1, 0, 1]
    assert group_spot_prices([a, b], [1, 1], "us-east-1")[0] is None
    # a plan ranked before the rule with such a mix: its check says why, not "no spot price"
    from lightning_srifty.provision.terraform.money import group_usd_per_hour
    from predictor.exceptions import ConfigError

    with pytest.raises(ConfigError, match="No availability zone of us-east-1 offers spot capacity of every spot type"):
        group_usd_per_hour(catalog, "p4d.24xlarge", "us-east-1", 0, 1, "instance_type", float("nan"))


def test_the_rankings_spot_mixes_cost_what_one_zone_sells_them_for(catalog) -> None:
    """Every spot and mixed entry of a ranking of mixes is priced in one zone that offers each of its spot types,
    the zone srifty terraform puts its subnet in (priced_zone), and the terraform check of its price agrees."""
    from lightning_srifty.provision.terraform.generate import priced_zone
    from lightning_srifty.provision.terraform.money import check_entry

    profile = load_profile(copy.deepcopy(MINIMAL))
    c = Constraints(steps=10_000, allow=("p4d.24xlarge", "p5en.48xlarge", "p4de.24xlarge"), max_types=2,
                    max_instances=6, market="spot", top=40)  # fmt: skip
    plan = rank(profile, c, catalog=catalog)
    mixes = [e for e in plan.entries if len(e.groups) > 1]
    assert mixes
    for i, e in enumerate(plan.entries):
        types = [catalog.get(g.instance_type) for g in e.groups]
        zone, prices = group_spot_prices(types, [g.spot for g in e.groups], "us-east-1")
        assert zone is not None and zone == priced_zone(catalog, e, "us-east-1")
        assert e.usd_per_hour == pytest.approx(sum(g.spot * p for g, p in zip(e.groups, prices)))
        for g, p in zip(e.groups, prices):
            own = {x.availability_zone: x.usd_hr for x in catalog.get(g.instance_type).prices if x.market == "spot"}
            assert own[zone] == p  # measured there
        assert check_entry(plan, i, catalog) == pytest.approx(e.usd_per_hour)


def test_a_mixed_fleets_zone_is_its_spot_types_and_a_replan_prices_it_there(catalog) -> None:
    """A review: a mixed fleet whose spot type has only the advisor's estimate was pinned to its on-demand type's
    first measured zone (the subnet placed by alphabet), and a re-plan priced a spot mix at each type's cheapest zone,
    44 % under its plan (staying looked that much cheaper). The zone is read from the spot types alone, and
    price_now is the plan's price on an unchanged catalog, for every entry of a ranking of mixes."""
    from lightning_srifty.provision.terraform.generate import priced_zone
    from predictor.ranking.replan import price_now

    od, spot = catalog.get("p4d.24xlarge"), catalog.get("g6.xlarge")  # measured zones; an estimate only
    assert group_spot_prices([od, spot], [0, 2], "us-east-1")[0] is None
    profile = load_profile(copy.deepcopy(MINIMAL))
    for market in ("spot", "mixed"):
        c = Constraints(steps=10_000, allow=("p4d.24xlarge", "p4de.24xlarge", "p5en.48xlarge", "g6.xlarge"),
                        max_types=2, max_instances=6, market=market, top=40)  # fmt: skip
        plan = rank(profile, c, catalog=catalog)
        for e in plan.entries:
            assert price_now(e, catalog) == pytest.approx(e.usd_per_hour), e.fleet
            spot_types = {g.instance_type for g in e.groups if g.spot}
            zone = priced_zone(catalog, e, "us-east-1")
            assert (zone is None) == (spot_types == {"g6.xlarge"}), (e.fleet, zone)

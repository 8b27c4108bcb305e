"""Fleets: one or more groups of identical instances, e.g. ``p3.8xlarge:2,g5.12xlarge:1``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from predictor.catalog.catalog import Catalog
from predictor.catalog.instances import InstanceType
from predictor.documents.checks import shown
from predictor.exceptions import ConfigError

MAX_COUNT = 10_000  # instances of one type: far beyond any fleet one account can start
_GROUP = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?::\s*(-?[0-9]+)\s*)?$")  # ASCII digits: int() reads others


@dataclass(frozen=True)
class Group:
    """``count`` instances of one type."""

    instance: InstanceType
    count: int

    @property
    def gpus(self) -> int:
        return self.instance.gpus * self.count


@dataclass(frozen=True)
class Fleet:
    """The instances a data-parallel job runs on; every GPU is one rank."""

    groups: tuple[Group, ...]

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def nodes(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def heterogeneous(self) -> bool:
        return len({g.instance.gpu for g in self.groups}) > 1

    def __str__(self) -> str:
        return ",".join(f"{g.instance.name}:{g.count}" for g in self.groups)


def parse_fleet(text: str | Iterable[tuple[str, int]], catalog: Catalog, parameter: str = "fleet") -> Fleet:
    """A fleet from ``"type:count,type:count"`` (count defaults to 1) or ``[(type, count), ...]``; ``parameter``: the
    request's name for it, which a refusal names (a ranking's ``current_fleet``).

    Raises:
        ConfigError: the string does not parse, a count is not a positive whole number, or a type repeats.
        UnknownNameError: an instance type is not in the catalog (with suggestions).
    """
    pairs: list[tuple[str, int]] = []
    if isinstance(text, str):
        if not text.strip():
            raise ConfigError(
                "The fleet is empty. Give it as 'instance_type:count[,instance_type:count]', e.g. 'p4d.24xlarge:2'.",
                parameter=parameter,
                value=text,
            )
        for part in text.split(","):
            match = _GROUP.match(part)
            if not match:
                raise ConfigError(
                    f"Cannot read fleet group {part.strip()!r} in {text!r}: expected "
                    "'instance_type:count', e.g. 'p3.8xlarge:2'.",
                    parameter=parameter,
                    value=text,
                )
            pairs.append((match.group(1), int(match.group(2)) if match.group(2) is not None else 1))
    else:
        pairs = [(str(name), count) for name, count in text]
    groups: list[Group] = []
    seen: set[str] = set()
    for name, count in pairs:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise ConfigError.between(  # the count named in every front end's words ("--fleet must be" said less)
                "The count of {kind} in {"
                + parameter
                + "} must be a whole number from 1 to {most}. Got {got}. Give the number "
                "of instances of that type, e.g. 'p4d.24xlarge:2'.",
                parameter=parameter,
                value=count,
                kind=repr(name),
                most=f"{MAX_COUNT:,}",
                got=shown(count),
            )
        instance = catalog.get(name)
        if instance.name in seen:
            raise ConfigError(
                f"{instance.name!r} appears twice in the fleet: give it once with the total count.",
                parameter=parameter,
                value=name,
            )
        seen.add(instance.name)
        groups.append(Group(instance, count))
    return Fleet(tuple(groups))

"""The catalog the predictor queries: instance types, GPUs, prices, spot risk.

    cat = Catalog.load()                        # newest refreshed copy, else the bundled snapshot
    cat.get("p4d.24xlarge").price_usd_hr("us-east-1")
    cat.filter(gpu="A100", region="us-east-1", max_price=40)
    cat.gpu("NVIDIA A100-SXM4-40GB")

A catalog copy is a folder with the fixed-column ``instances.csv`` and ``prices.csv`` and a ``meta.json``
(``srifty.catalog/v1``); the bundled snapshot lives in ``predictor/data``, refreshed copies in the user cache
(``$SRIFTY_CACHE_DIR`` or ``$XDG_CACHE_HOME/lightning-srifty``) under ``catalog/v1/<UTC time>/``.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from predictor.catalog.extra import Extra, build_instance, load_extra
from predictor.catalog.gpus import CATALOG_EXTRA, GPU, GpuTable, bundled_gpus
from predictor.catalog.instances import InstanceType, Market, bundled_rows, read_instances, read_prices
from predictor.documents.checks import suggest
from predictor.exceptions import CatalogError, UnknownNameError

CATALOG_SCHEMA = "srifty.catalog/v1"
BUNDLED_SNAPSHOT = "2026-07-20"  # newest on-demand price date of the bundled data (predictor/data/PROVENANCE.md)
EXTRA_ENV = "SRIFTY_CATALOG_EXTRA"


def cache_dir() -> Path:
    """Where refreshed catalog copies live."""
    if os.environ.get("SRIFTY_CACHE_DIR"):
        return Path(os.environ["SRIFTY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lightning-srifty"


def catalog_root() -> Path:
    return cache_dir() / "catalog" / "v1"


def newest_refreshed() -> Path | None:
    """The newest complete refreshed copy (a folder with meta.json), or None."""
    root = catalog_root()
    if not root.is_dir():
        return None
    copies = sorted(p for p in root.iterdir() if p.is_dir() and (p / "meta.json").exists())
    return copies[-1] if copies else None


@dataclass(frozen=True)
class CatalogInfo:
    """Where the catalog came from."""

    source: str  # "bundled" or the folder of a refreshed copy
    snapshot: str  # date of the data
    extras: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


class Catalog:
    """Typed queries over instance types and GPUs. Build with :meth:`load`."""

    def __init__(
        self, instances: dict[str, InstanceType], gpus: GpuTable, info: CatalogInfo, transport: str = "auto"
    ) -> None:
        self._instances = dict(sorted(instances.items()))
        self.gpus = gpus
        self.info = info
        # how a multi-node fleet's nodes meet (predictor.documents.plan.TRANSPORTS): "auto", EFA on the types that
        # have it; "tcp", every type as NCCL's sockets over its primary interface see it (:meth:`over_tcp`)
        self.transport = transport

    # ---------------------------------------------------------------- construction
    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        extra: Sequence[str | os.PathLike[str]] = (),
        use_refreshed: bool = True,
        use_env: bool = True,
    ) -> Catalog:
        """The catalog from ``path`` (a catalog folder), else the newest refreshed copy, else the bundled snapshot,
        with user-defined GPUs and types from ``extra`` YAML files and ``$SRIFTY_CATALOG_EXTRA`` merged over it.

        Raises:
            CatalogError: a copy or an extra file is unreadable or invalid (the message names file, entry and field).
        """
        folder = Path(path) if path is not None else (newest_refreshed() if use_refreshed else None)
        if folder is None:
            base = read_instances(bundled_rows("instances.csv"), read_prices(bundled_rows("prices.csv")))
            info = CatalogInfo(source="bundled", snapshot=BUNDLED_SNAPSHOT)
        else:
            base, info = _read_copy(folder)
        files = [str(p) for p in extra]
        if use_env and os.environ.get(EXTRA_ENV):
            files += [p for p in os.environ[EXTRA_ENV].split(os.pathsep) if p]
        catalog = cls(base, bundled_gpus(), info)
        for file in files:
            catalog = catalog.merged(load_extra(file))
        return catalog

    def merged(self, extra: Extra) -> Catalog:
        """A new catalog with a YAML file's GPUs and instance types added (same names replace)."""
        gpus = self.gpus.merged(list(extra.gpus))
        instances = dict(self._instances)
        for fields in extra.instances:
            try:
                gpu = gpus.get(fields["gpu"])
            except UnknownNameError as exc:
                raise CatalogError(
                    f"{extra.path}: {fields['_where']}.gpu: {exc} Define it under 'gpus:' in the "
                    "same file if it is new."
                ) from None
            instances[fields["name"]] = build_instance(fields, gpu, extra.path)
        info = CatalogInfo(self.info.source, self.info.snapshot, (*self.info.extras, extra.path), self.info.notes)
        merged = Catalog(instances, gpus, info)
        return merged.over_tcp() if self.transport == "tcp" else merged  # the extra's EFA types meet over TCP too

    @property
    def regions(self) -> list[str]:
        """The regions any of its types has a price in."""
        return sorted({r for it in self for r in it.regions})

    def check_region(self, region: str, parameter: str) -> None:
        """Refuse a region without prices here, naming the closest and every known one (``parameter``: the request's
        name for it: a ranking's ``regions``, a catalog query's ``region``).

        Raises:
            ConfigError: the region has no prices in this catalog.
        """
        from predictor.exceptions import ConfigError, did_you_mean

        known = self.regions
        if region in known:
            return
        close = suggest(region, known, n=2, cutoff=0.85)
        raise ConfigError.between(
            "The catalog has no prices in region {given!r} ({" + parameter + "}).{mean} Regions with prices: {known} "
            "(`srifty catalog refresh` adds more).",
            parameter=parameter,
            value=region,
            given=region,
            mean=f" {did_you_mean(close)}" if close else "",
            known=", ".join(known),
        )

    def over_tcp(self) -> Catalog:
        """This catalog as a cluster without EFA sees it (the ``tcp`` transport): every type's nodes meet through
        NCCL's socket transport over the one interface on its first network card (:func:`over_tcp`)."""
        instances = {name: over_tcp(it) for name, it in self._instances.items()}
        return Catalog(instances, self.gpus, self.info, "tcp")

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._instances)

    def __iter__(self) -> Iterator[InstanceType]:
        return iter(self._instances.values())

    def __contains__(self, name: object) -> bool:
        return name in self._instances

    @property
    def names(self) -> list[str]:
        return list(self._instances)

    def get(self, name: str) -> InstanceType:
        """An instance type by name; UnknownNameError with suggestions otherwise."""
        try:
            return self._instances[name]
        except KeyError:
            lowered = {n.lower(): n for n in self._instances}
            if name.lower() in lowered:
                return self._instances[lowered[name.lower()]]
            # a family without its size (p4d, g5): its types, smallest first (difflib finds none that short)
            family = [n for n in self._instances if n.split(".")[0] == name.strip().lower()]
            family.sort(key=lambda n: (self._instances[n].gpus, self._instances[n].vcpus, n))
            raise UnknownNameError(
                "instance type",
                name,
                family[:4] or suggest(name, self._instances),
                hint=self._gpu_named_hint(name) or f"Add your own in {CATALOG_EXTRA}.",
            ) from None

    def _gpu_named_hint(self, name: str) -> str | None:
        """Where ``name`` is a GPU, not an instance type: the types that carry it, as ``srifty catalog show --gpu``
        lists them (:meth:`filter`, cheapest first), so the user can write the fleet."""
        try:
            types = [it.name for it in self.filter(gpu=name)] if name.strip() else []
        except UnknownNameError:
            return None
        if not types:
            return None
        shown = ", ".join(types[:6]) + (f" and {len(types) - 6} more" if len(types) > 6 else "")
        return (
            f"{name!r} is a GPU, not an instance type: the types with it are {shown} "
            f"(srifty catalog show --gpu {name} lists them with their prices); a fleet is type:count, e.g. "
            f"{types[0]}:2."
        )

    def gpu(self, name: str) -> GPU:
        """GPU specs by canonical key or any name torch reports."""
        return self.gpus.get(name)

    def filter(
        self,
        *,
        gpu: str | None = None,
        min_gpu_memory_gib: float | None = None,
        region: str | None = None,
        cuda_only: bool = True,
        max_price: float | None = None,
        market: Market = "on-demand",
        min_gpus: int | None = None,
        family: str | None = None,
    ) -> list[InstanceType]:
        """Instance types matching every given condition, cheapest first (unpriced last).

        ``gpu`` matches a canonical key exactly or a key prefix ("A100" matches both A100 sizes); ``region`` keeps
        types with a price there (user-defined types without a region always pass); ``max_price`` compares the
        price in ``region`` for ``market``.
        """
        if gpu is not None:
            keys = self._gpu_keys(gpu)
        out = []
        for it in self:
            if cuda_only and not it.cuda:
                continue
            if gpu is not None and it.gpu not in keys:
                continue
            if min_gpu_memory_gib is not None and it.gpu_memory_gib < min_gpu_memory_gib:
                continue
            if min_gpus is not None and it.gpus < min_gpus:
                continue
            if family is not None and it.family != family:
                continue
            if region is not None and it.prices and region not in it.regions and not it.origin.startswith("user"):
                continue
            if max_price is not None:
                price = it.price_usd_hr(region, market)
                if price is None or price > max_price:
                    continue
            out.append(it)
        return sorted(
            out,
            key=lambda it: (it.price_usd_hr(region, market) is None, it.price_usd_hr(region, market) or 0.0, it.name),
        )

    def _gpu_keys(self, gpu: str) -> set[str]:
        upper = gpu.upper()
        prefixed = {k for k in self.gpus.gpus if k.upper() == upper or k.upper().startswith(upper + "-")}
        prefixed |= {
            it.gpu for it in self if it.gpu and (it.gpu.upper() == upper or it.gpu.upper().startswith(upper + "-"))
        }
        if prefixed:
            return prefixed
        return {self.gpus.canonical(gpu)}  # raises UnknownNameError with suggestions


def over_tcp(instance: InstanceType) -> InstanceType:
    """``instance`` without EFA: one ENA interface (on the first network card, at its per-card rate,
    :meth:`InstanceType.provisioned_network_gbps`) that NCCL's sockets carry the inter-node traffic over. Its
    ``efa_interfaces`` stay, so the words can say "EFA not used"; without ``efa`` nothing prices or attaches them."""
    return replace(instance, efa=False, gpudirect_rdma=None) if instance.efa else instance


def _read_copy(folder: Path) -> tuple[dict[str, InstanceType], CatalogInfo]:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        with (folder / "prices.csv").open(encoding="utf-8") as handle:
            prices = read_prices(csv.DictReader(handle))
        with (folder / "instances.csv").open(encoding="utf-8") as handle:
            instances = read_instances(csv.DictReader(handle), prices, origin=f"refreshed {meta.get('created_at')}")
    except FileNotFoundError as exc:
        raise CatalogError(f"{folder} is not a catalog copy: {Path(exc.filename).name} is missing.") from None
    except (ValueError, KeyError) as exc:
        raise CatalogError(
            f"{folder} holds an unreadable catalog copy ({type(exc).__name__}: {exc}); delete it or "
            "run `srifty catalog refresh` again."
        ) from None
    if meta.get("schema") != CATALOG_SCHEMA:
        raise CatalogError(
            f"{folder}/meta.json: this lightning-srifty reads {CATALOG_SCHEMA!r}, the copy is "
            f"{meta.get('schema')!r}. Run `srifty catalog refresh` again."
        )
    return instances, CatalogInfo(
        source=str(folder), snapshot=str(meta.get("created_at", "?"))[:10], notes=tuple(meta.get("notes", ()))
    )

"""An instance type's fields and a GPU's, declared once.

Each :class:`Field` says what the field means and every place it crosses a boundary: the column of a catalog copy
(``instances.csv``, bundled or refreshed) and how a cell reads and writes, the key of its JSON form (``srifty catalog
show --format json``, ``GET /v1/catalog``), its YAML declaration in a catalog extra (type, bounds, choices: the
loader's checks and ``srifty catalog schema`` read it), the key of ``ec2.describe_instance_types`` a refresh copies
it from, and the column of shared/'s ``ec2_gpu_instances.csv`` that ``scripts/build_data.py`` copies it from. The
readers and writers of those forms are loops over :data:`FIELDS`; what is computed rather than copied (a GPU's
catalog name, the network's headline bandwidth, the interconnect no API reports) stays code beside them, and a test
holds each form to the declarations (``tests/model/test_instance_fields.py``). A GPU's fields (:data:`GPU_SPECS`)
are declared the same way: ``gpus.csv``'s and ``gpu_arch.csv``'s columns, ``srifty catalog gpus``' JSON keys, the
extra's GPU YAML and the columns of shared/'s ``gpu_specs.csv`` the build copies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("cuda", "neuron", "gaudi", "amd", "other")
INTERCONNECTS = ("single", "pcie", "nvlink", "nvswitch", "neuronlink", "other")
ARCHES = ("x86_64", "arm64")
BACKENDS = ("nccl", "gloo")


def normal_arch(text: str | None) -> str:
    """One architecture of ``ARCHES`` from a catalog cell or DescribeInstanceTypes' SupportedArchitectures joined
    with commas ('i386,x86_64' -> 'x86_64', 'arm64' -> 'arm64'); empty means x86_64."""
    parts = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not parts or "x86_64" in parts:
        return "x86_64"
    if "arm64" in parts:
        return "arm64"
    return parts[0]


@dataclass(frozen=True)
class YamlField:
    """One field of a catalog extra, declared once: its YAML type, whether it is required, its bounds and choices.
    The loader's checks and messages (``predictor.catalog.extra._check``), the JSON Schema of the file
    (``extra_schema``, ``srifty catalog schema``) and the tests' negative case for every field are read from it.

    ``kind``: str, float (any number), int (a whole number), bool, list. Numbers are never negative; ``positive``:
    more than 0 too (a speed or size the predictor divides by); ``most``: the largest value, orders of magnitude
    beyond any hardware (the bundled catalog's largest: 141 GB, 4.8 TB/s, 989 TFLOPS, 6400 Gbit/s, 4 TiB), so that a
    wrong unit is caught. ``choices``: the values a text may take; ``pattern``: a regular expression a text must
    match somewhere (the JSON Schema's ``pattern``); ``number_too``: a text that may be written as a number (YAML
    reads an unquoted 8.0 as one)."""

    kind: type
    doc: str
    required: bool = False
    positive: bool = False
    most: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    number_too: bool = False


_SAME = "="  # a column, JSON key or YAML key named as the field


@dataclass(frozen=True)
class Field:
    """One field of an instance type (:data:`FIELDS`) or a GPU (:data:`GPU_SPECS`).

    ``name``: the attribute of :class:`~predictor.catalog.instances.InstanceType` or
    :class:`~predictor.catalog.gpus.GPU` (``record=False``: a column the catalog keeps for provenance that the record
    does not carry). ``kind``: str, int, float, bool or tuple (a list in one cell, ``sep``-joined), what a cell
    reads as (``optional``: an empty cell is None; else an empty or missing cell is ``default``, and a field with
    neither must be given). ``normal``: a function a read value passes through (the architecture's name).
    ``column`` / ``json`` / ``yaml_key``: its name in the CSV, the JSON form and a catalog extra (``"="``: the field's
    name; None: not there). ``yaml``: its declaration in a catalog extra. ``aws``: the dotted key of an
    ``ec2.describe_instance_types`` item a refresh copies it from (a list is joined with commas), None when it is
    computed or in no API. ``shared``: the column of shared/'s ``ec2_gpu_instances.csv`` the bundled copy takes it
    from as is, None when ``scripts/build_data.py`` computes it. ``missing_ok``: a column a row may lack
    (added within ``srifty.catalog/v1``, so a copy written before has none; or in a second table with no row for
    every key): it then reads the default; any other missing column makes the copy unreadable (a cut-down copy would
    price every p4d as PCIe). ``table``: the file of the column; ``sep``: how a list is joined in a cell."""

    name: str
    kind: type
    doc: str
    optional: bool = False
    default: Any = None
    normal: Callable[[str], Any] | None = None
    column: str | None = _SAME
    json: str | None = _SAME
    yaml_key: str | None = _SAME
    yaml: YamlField | None = None
    aws: str | None = None
    shared: str | None = None
    record: bool = True
    missing_ok: bool = False
    table: str = "instances.csv"
    sep: str = ","

    def key(self, which: str) -> str | None:
        """Its name in ``column``, ``json`` or ``yaml_key``: the field's own where declared ``"="``."""
        given = getattr(self, which)
        return self.name if given == _SAME else given

    def read(self, cell: str | None) -> Any:
        """A catalog cell as the record holds it: empty or missing is None (optional) or the default.

        Raises:
            ValueError: a number that is not one; KeyError: a cell the field must have, missing or empty, or its
                column missing (``None``) where the field is not ``missing_ok``.
        """
        if cell is None and not self.missing_ok:
            raise KeyError(self.key("column") or self.name)
        text = cell.strip() if isinstance(cell, str) else "" if cell is None else str(cell).strip()
        if not text:
            if self.optional:
                return None
            if self.default is None:
                raise KeyError(self.key("column") or self.name)
            return self.default
        if self.kind is tuple:
            return tuple(part for part in text.split(self.sep) if part)
        value: Any = text.lower() == "true" if self.kind is bool else self.kind(text)
        return self.normal(value) if self.normal is not None else value

    def cell(self, value: Any) -> str:
        """A value as a catalog cell: booleans lower-case, None empty, a list joined with ``sep``."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, (list, tuple)):
            return self.sep.join(str(v) for v in value)
        return str(value)

    def from_aws(self, item: Mapping[str, Any]) -> Any:
        """Its value in one ``describe_instance_types`` item (``aws`` is its dotted key); absent: the default."""
        assert self.aws is not None, self.name
        value: Any = item
        for part in self.aws.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is None:
            return self.default
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        return self.normal(value) if self.normal is not None else value


_Y = YamlField
_F = Field
_MANUAL = "in no AWS API: set by hand in shared/, carried over by a refresh"
# in the bundled CSV's column order (the order the copy writes; its bytes are in predictor/data/sources.json)
FIELDS: tuple[Field, ...] = (
    _F("name", str, "the instance type's name", column="instance_type", json="instance_type",
       yaml=_Y(str, "the instance type's name", required=True), aws="InstanceType", shared="instance_type"),
    _F("family", str, "its family, the name before the first dot",
       yaml=_Y(str, "the family (default: the name before the first dot)"), shared="family"),
    _F("accelerator", str, "the accelerator as AWS names it (GpuInfo or NeuronInfo)", default="", json=None,
       yaml_key=None, shared="accelerator"),
    _F("accelerator_kind", str, f"what the accelerator is: {', '.join(KINDS)} (only cuda is ranked)",
       yaml_key=None),
    _F("gpu", str, "its GPU as the catalog's GPU table names it (empty: not a CUDA GPU)", optional=True,
       yaml=_Y(str, "its GPU: a name of the catalog or of this file's gpus", required=True)),
    _F("gpus", int, "GPUs (or accelerators) per instance", shared="accelerator_count",
       yaml=_Y(int, "GPUs per instance", required=True, positive=True, most=1_024)),
    _F("gpu_memory_gib", float, "memory per GPU, GiB", shared="accelerator_memory_gib",
       yaml=_Y(float, "memory per GPU, GiB (default: the GPU's)", positive=True, most=10_000)),
    _F("vcpus", int, "vCPUs", aws="VCpuInfo.DefaultVCpus", shared="vcpus",
       yaml=_Y(int, "vCPUs", required=True, positive=True, most=100_000)),
    _F("memory_gib", float, "host memory, GiB (MemoryInfo.SizeInMiB / 1024)", shared="memory_gib",
       yaml=_Y(float, "host memory, GiB", required=True, positive=True, most=1_000_000)),
    _F("network_gbps", float, "network bandwidth, Gbit/s (NetworkInfo.NetworkPerformance)", optional=True,
       shared="network_gbps",
       yaml=_Y(float, "network bandwidth, Gbit/s", required=True, positive=True, most=1_000_000)),
    _F("network_up_to", bool, "the bandwidth is a burst ('Up to ...'), not sustained", default=False,
       yaml_key=None, shared="network_up_to"),
    _F("network_baseline_gbps", float, "the bandwidth an 'Up to' network sustains once its burst credits are spent, "
       "Gbit/s (NetworkInfo.NetworkCards[].BaselineBandwidthInGbps, summed); empty: not given", optional=True,
       missing_ok=True, yaml_key=None, shared="network_baseline_gbps_sum"),
    _F("network_cards", int, "network cards", default=1, aws="NetworkInfo.MaximumNetworkCards", missing_ok=True,
       shared="network_cards",
       yaml=_Y(int, "network cards (NetworkInfo.MaximumNetworkCards)", positive=True, most=1_024)),
    _F("efa", bool, "Elastic Fabric Adapter support", default=False, aws="NetworkInfo.EfaSupported", shared="efa",
       yaml=_Y(bool, "Elastic Fabric Adapter support")),
    _F("efa_interfaces", int, "EFA interfaces, at most one per network card", default=0,
       column="efa_max_interfaces", aws="NetworkInfo.EfaInfo.MaximumEfaInterfaces", shared="efa_max_interfaces",
       missing_ok=True,
       yaml=_Y(int, "EFA interfaces (EfaInfo.MaximumEfaInterfaces)", most=1_024)),
    _F("gpu_interconnect", str, f"how its GPUs talk to each other: {', '.join(INTERCONNECTS)}; {_MANUAL}",
       default="pcie", yaml=_Y(str, "how its GPUs talk to each other", choices=INTERCONNECTS)),
    _F("gpu_interconnect_detail", str, "the interconnect as the source said it", default="", json=None,
       yaml_key=None, shared="gpu_interconnect", record=False),
    _F("local_nvme_gb", float, "local NVMe storage, GB", default=0.0, aws="InstanceStorageInfo.TotalSizeInGB",
       shared="local_nvme_gb",
       yaml=_Y(float, "local NVMe storage, GB", most=100_000_000)),
    _F("arch", str, "CPU architecture: x86_64 or arm64", default="x86_64", normal=normal_arch,
       aws="ProcessorInfo.SupportedArchitectures", shared="arch",
       yaml=_Y(str, "CPU architecture: x86_64 or arm64 (or AWS's comma-joined SupportedArchitectures that names "
               "one)", pattern=r"^\s*$|(^|,)\s*(" + "|".join(ARCHES) + r")\s*(,|$)")),
    _F("placement_strategies", str, "placement group strategies it supports", default="", json=None,
       yaml_key=None, aws="PlacementGroupInfo.SupportedStrategies", shared="placement_strategies", record=False),
    _F("usage_classes", str, "on-demand and/or spot", default="", json=None, yaml_key=None,
       aws="SupportedUsageClasses", shared="usage_classes", record=False),
    _F("spot_interruption_bucket", str, "the Spot Instance Advisor's interruption frequency (no API)",
       optional=True, yaml_key=None, shared="spot_interruption_bucket", missing_ok=True),
    _F("spot_savings_pct", str, "the Spot Instance Advisor's savings over on-demand, %", default="", json=None,
       yaml_key=None, shared="spot_advisor_savings_pct_us_east_1", record=False),
    _F("spot_advisor_as_of", str, "the date of the advisor's figures", default="", json=None, yaml_key=None,
       record=False),
    _F("specs_source", str, "where the specs come from", default="", json=None, yaml_key=None,
       shared="source_specs", record=False),
    # not columns: derived from a column, or given in a catalog extra
    _F("interruption_rate_per_hr", float, "spot interruptions per instance-hour (from the bucket)", optional=True,
       column=None, yaml=_Y(float, "spot interruptions per instance-hour", most=100)),
    _F("process_group_backend", str, "the process-group backend a job on it runs", default="nccl", column=None,
       yaml=_Y(str, "nccl for CUDA GPUs; gloo for a CPU lab", choices=BACKENDS)),
    _F("gpudirect_rdma", bool, "its EFA moves GPU memory by GPUDirect RDMA, not through the host (empty: as AWS's NCCL "
       "plugin requires it per type)", optional=True, column=None,
       yaml=_Y(bool, "its EFA (or RDMA network) moves GPU memory by GPUDirect RDMA, not staged through host memory "
               "(default: as AWS's NCCL plugin requires it for the type's name; false for any other name)")),
    _F("origin", str, "where the entry comes from: bundled, refreshed TIME, user: FILE", default="bundled",
       column=None, yaml_key=None),
)  # fmt: skip
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
JSON_FIELDS: tuple[Field, ...] = tuple(f for f in FIELDS if f.key("json") is not None)


_SPEED = 1_000_000  # the bound of a speed or bandwidth: TFLOPS, GB/s
_PEAK = "peak, TFLOPS (dense)"
_ARCH = "gpu_arch.csv"  # the architecture facts, hand-sourced per GPU (predictor/data/PROVENANCE.md)
# a GPU's fields, in gpus.csv's column order, then gpu_arch.csv's (its bytes are in predictor/data/sources.json)
GPU_SPECS: tuple[Field, ...] = (
    _F("key", str, "the GPU's name, as the catalog and torch's device name call it", yaml_key="name",
       yaml=_Y(str, "the GPU's name, as the catalog and torch's device name call it", required=True), table="gpus.csv"),
    _F("arch", str, "the architecture's name (Ampere, Hopper, ...)", default="user-defined", shared="arch",
       yaml=_Y(str, "the architecture's name (Ampere, Hopper, ...)"), table="gpus.csv"),
    _F("memory_gb", float, "memory per GPU, GB", shared="memory_gb", table="gpus.csv",
       yaml=_Y(float, "memory per GPU, GB", required=True, positive=True, most=10_000)),
    _F("memory_bw_gbps", float, "memory bandwidth, GB/s", optional=True, shared="memory_bw_gbps", table="gpus.csv",
       yaml=_Y(float, "memory bandwidth, GB/s", positive=True, most=_SPEED)),
    _F("fp32_tflops", float, f"FP32 {_PEAK}", optional=True, shared="fp32_tflops", table="gpus.csv",
       yaml=_Y(float, f"FP32 {_PEAK}", positive=True, most=_SPEED)),
    _F("tf32_tflops", float, f"TF32 tensor-core {_PEAK}", optional=True, shared="tf32_tflops", table="gpus.csv",
       yaml=_Y(float, f"TF32 tensor-core {_PEAK}", positive=True, most=_SPEED)),
    _F("fp16_tflops", float, f"FP16 tensor-core {_PEAK}", optional=True, shared="fp16_tflops", table="gpus.csv",
       yaml=_Y(float, f"FP16 tensor-core {_PEAK}", positive=True, most=_SPEED)),
    _F("bf16_tflops", float, f"BF16 tensor-core {_PEAK}", optional=True, shared="bf16_tflops", table="gpus.csv",
       yaml=_Y(float, f"BF16 tensor-core {_PEAK}", positive=True, most=_SPEED)),
    _F("nvlink_gbps", float, "NVLink bandwidth per GPU, GB/s (bidirectional datasheet figure; 0: none)",
       optional=True, shared="nvlink_gbps", table="gpus.csv",
       yaml=_Y(float, "NVLink bandwidth per GPU, GB/s (bidirectional datasheet figure; 0: none)", most=_SPEED)),
    _F("pcie", str, "the PCIe link as the datasheet says it", default="", json=None, yaml_key=None, shared="pcie",
       table="gpus.csv"),
    _F("aliases", tuple, "other names torch may report for it", default=(), sep=";", table="gpus.csv",
       yaml=_Y(list, "other names torch may report for it")),
    _F("shared_name", str, "its row's name in shared/'s gpu_specs.csv", default="", json=None, yaml_key=None,
       shared="gpu", table="gpus.csv", record=False),
    _F("source", str, "where its figures come from (user: FILE for a catalog extra's)", default="", json=None,
       yaml_key=None, shared="source", table="gpus.csv"),
    _F("sms", int, "streaming multiprocessors (the kernel model's waves)", optional=True, json=None, table=_ARCH,
       missing_ok=True, yaml=_Y(int, "streaming multiprocessors (the kernel model's waves)", positive=True,
                                most=100_000)),
    _F("clock_mhz", float, "boost clock, MHz", optional=True, json=None, table=_ARCH, missing_ok=True,
       yaml=_Y(float, "boost clock, MHz", positive=True, most=100_000)),
    _F("l2_mb", float, "L2 cache, MB", optional=True, json=None, table=_ARCH, missing_ok=True,
       yaml=_Y(float, "L2 cache, MB", positive=True, most=_SPEED)),
    _F("compute_capability", str, "CUDA compute capability MAJOR.MINOR", optional=True, json=None, table=_ARCH,
       missing_ok=True, yaml=_Y(str, 'CUDA compute capability MAJOR.MINOR, e.g. "9.0"', pattern=r"^\s*\d+\.\d+\s*$",
                                number_too=True)),
)  # fmt: skip


def by_yaml_key(fields: tuple[Field, ...] = FIELDS) -> dict[str, Field]:
    """The fields a catalog extra may set, by YAML key: an instance type's (the prices and their region are the
    extra's own: ``predictor.catalog.extra``) or, given :data:`GPU_SPECS`, a GPU's."""
    return {key: f for f in fields if f.yaml is not None and (key := f.key("yaml_key")) is not None}


def yaml_fields(fields: tuple[Field, ...] = FIELDS) -> dict[str, YamlField]:
    """Their YAML declarations (:func:`by_yaml_key`), by YAML key."""
    return {key: f.yaml for key, f in by_yaml_key(fields).items() if f.yaml is not None}


def columns(fields: tuple[Field, ...], table: str) -> list[str]:
    """The columns of ``table`` (``instances.csv``, ``gpus.csv``; ``gpu_arch.csv``'s facts, beside its ``key`` and
    ``source``), in order."""
    return [c for f in fields if f.table == table and (c := f.key("column")) is not None]


COLUMNS: list[str] = columns(FIELDS, "instances.csv")


@functools.cache
def _readers(fields: tuple[Field, ...]) -> tuple[tuple[str, str, Callable[[str | None], Any]], ...]:
    return tuple((f.name, f.key("column") or "", f.read) for f in fields if f.record and f.key("column") is not None)


def read_row(row: Mapping[str, str], fields: tuple[Field, ...] = FIELDS) -> dict[str, Any]:
    """A catalog copy's row as the record's fields (provenance columns left out), each cell read by its field: an
    instance type's, or given :data:`GPU_SPECS` a GPU's (``gpus.csv``'s row with its ``gpu_arch.csv`` facts)."""
    return {name: read(row.get(column)) for name, column, read in _readers(fields)}


def write_row(values: Mapping[str, Any]) -> dict[str, str]:
    """A row of :data:`COLUMNS` from values by field name (a field not given: its default)."""
    return {f.key("column") or "": f.cell(values.get(f.name, f.default)) for f in FIELDS if f.key("column")}


def from_aws(item: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a refresh copies from one ``describe_instance_types`` item as they are, by field name."""
    return {f.name: f.from_aws(item) for f in FIELDS if f.aws is not None}


def from_shared(row: Mapping[str, str]) -> dict[str, str]:
    """The fields ``scripts/build_data.py`` copies from a row of shared/'s ``ec2_gpu_instances.csv``: the text as it
    is (a number keeps its digits), a boolean lower-case, an empty cell the default ("0")."""

    def text(f: Field, cell: str) -> str:
        if not cell and not f.optional and f.default is not None:
            return format(f.default, "g") if isinstance(f.default, float) else f.cell(f.default)
        return cell.lower() if f.kind is bool else cell

    return {f.name: text(f, row[f.shared]) for f in FIELDS if f.shared is not None}

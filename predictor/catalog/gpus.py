"""GPU specifications and canonical GPU keys, torch-free.

``canonical_gpu("NVIDIA A100-SXM4-40GB") == "A100-SXM-40GB"``: the names torch reports are mapped to the keys
of the bundled table (``predictor/data/gpus.csv``, built by ``scripts/build_data.py``). Architecture facts (SM
count, boost clock, L2 size, compute capability) come from the hand-sourced ``predictor/data/gpu_arch.csv``.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

from predictor.catalog.fields import GPU_SPECS, read_row
from predictor.documents.checks import suggest
from predictor.exceptions import UnknownNameError

# where a user adds GPUs and instance types, said the same to every front end (the files are a setting of the
# catalog, not a parameter of the call that found one missing)
CATALOG_EXTRA = "a catalog extra file (srifty --catalog-extra FILE.yaml, or Catalog.load(extra=[...]); docs/catalog.md)"
_VENDOR_WORDS = re.compile(r"\b(NVIDIA|TESLA|GEFORCE|QUADRO)\b")


# the numeric spec columns of a GPU, in table order, and its architecture facts (predictor/data/gpu_arch.csv, optional
# for user-defined GPUs): from the declarations (predictor.catalog.fields.GPU_SPECS)
SPEC_FIELDS = tuple(f.name for f in GPU_SPECS if f.table == "gpus.csv" and f.kind is float)
ARCH_FIELDS = tuple(f.name for f in GPU_SPECS if f.table == "gpu_arch.csv")


@dataclass(frozen=True)
class GPU:
    """Specs of one GPU model (dense peaks, per GPU).

    The architecture facts ``sms`` (streaming multiprocessors), ``clock_mhz`` (boost clock), ``l2_mb`` (L2 cache)
    and ``compute_capability`` (CUDA, e.g. ``"8.0"``) are optional: ``None`` where unknown (a user-defined GPU that
    does not give them). The per-operator kernel model needs the first three.
    """

    key: str
    arch: str
    memory_gb: float
    memory_bw_gbps: float | None
    fp32_tflops: float | None
    tf32_tflops: float | None
    fp16_tflops: float | None
    bf16_tflops: float | None
    nvlink_gbps: float | None
    pcie: str
    aliases: tuple[str, ...]
    source: str
    sms: int | None = None
    clock_mhz: float | None = None
    l2_mb: float | None = None
    compute_capability: str | None = None

    @property
    def capability(self) -> tuple[int, int] | None:
        """(major, minor) of the compute capability, None where unknown or unreadable."""
        major, _, minor = str(self.compute_capability or "").partition(".")
        try:
            return int(major), int(minor or 0)
        except ValueError:
            return None

    @property
    def tf32_convolutions(self) -> bool:
        """Whether FP32 convolutions run on TF32 tensor cores here: compute capability 8.0 (Ampere) or later, where
        PyTorch lets cuDNN use TF32 by default (``torch.backends.cudnn.allow_tf32 = True``,
        docs.pytorch.org/docs/stable/notes/cuda.html#tf32-on-ampere); matmuls join them only when
        ``torch.set_float32_matmul_precision`` allows ("high" / "medium")."""
        return (self.capability or (0, 0)) >= (8, 0)


def normalize(name: str) -> str:
    """Upper-case, vendor words dropped, separators unified: 'Tesla V100-SXM2-16GB' -> 'V100-SXM2-16GB'."""
    text = _VENDOR_WORDS.sub(" ", name.upper())
    text = re.sub(r"[\s_]+", "-", text.strip())
    text = text.replace("SXM4", "SXM").replace("SXM5", "SXM")
    return re.sub(r"-+", "-", text).strip("-")


class GpuTable:
    """A set of GPUs with name resolution (canonical keys, torch names, family names plus memory)."""

    def __init__(self, gpus: dict[str, GPU]) -> None:
        self.gpus = dict(gpus)
        self._index: dict[str, str] = {}
        for key, gpu in self.gpus.items():
            for name in (key, *gpu.aliases):
                self._index[normalize(name)] = key

    def merged(self, extra: list[GPU]) -> GpuTable:
        """A new table with ``extra`` GPUs added (a GPU of the same key replaces the bundled one)."""
        return GpuTable({**self.gpus, **{g.key: g for g in extra}})

    def canonical(self, name: str, memory_gb: float | None = None) -> str:
        """Canonical key of a GPU name as torch, nvidia-smi or a person writes it.

        Args:
            name: e.g. ``"NVIDIA A100-SXM4-40GB"``, ``"Tesla V100-SXM2-16GB"``, ``"a10g"``.
            memory_gb: the device's memory, used to tell apart boards sold in several sizes ("V100-SXM2").

        Raises:
            UnknownNameError: no GPU matches; the error suggests close keys.
        """
        norm = normalize(name)
        if norm in self._index:
            return self._index[norm]
        # a family name without the memory size: pick the size closest to the device's memory
        family = sorted({key for alias, key in self._index.items() if alias.startswith(norm + "-")})
        if len(family) == 1:
            return family[0]
        if family and memory_gb is not None:
            return min(family, key=lambda k: abs(self.gpus[k].memory_gb - memory_gb))
        known = list(self.gpus)
        suggestions = family or suggest(norm, known) or suggest(name, known)
        raise UnknownNameError(
            "GPU", name, suggestions, hint="Known GPUs: " + ", ".join(known) + f". Add a new one in {CATALOG_EXTRA}."
        )

    def get(self, name: str) -> GPU:
        """Specs of a GPU by key or by any name :meth:`canonical` understands."""
        return self.gpus[self.canonical(name)]

    def __contains__(self, key: object) -> bool:
        return key in self.gpus


def _arch_facts() -> dict[str, dict[str, str]]:
    with resources.files("predictor.data").joinpath("gpu_arch.csv").open(encoding="utf-8") as handle:
        return {row["key"]: row for row in csv.DictReader(handle)}


@functools.cache
def bundled_gpus() -> GpuTable:
    """The bundled GPU table (loaded once), with the architecture facts of ``gpu_arch.csv`` merged in."""
    arch = _arch_facts()
    table: dict[str, GPU] = {}
    with resources.files("predictor.data").joinpath("gpus.csv").open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            facts = {k: v for k, v in arch.get(row["key"], {}).items() if k in ARCH_FIELDS}
            table[row["key"]] = GPU(**read_row({**row, **facts}, GPU_SPECS))
    return GpuTable(table)


def gpu_table() -> dict[str, GPU]:
    """All bundled GPUs by canonical key."""
    return bundled_gpus().gpus


def canonical_gpu(name: str, memory_gb: float | None = None) -> str:
    """Canonical key of a GPU name in the bundled table (see :meth:`GpuTable.canonical`)."""
    return bundled_gpus().canonical(name, memory_gb)


def get_gpu(name: str) -> GPU:
    """Specs of a bundled GPU by key or by any name :func:`canonical_gpu` understands."""
    return bundled_gpus().get(name)


def form_factor(gpu: GPU) -> str:
    """``sxm``, ``pcie`` or ``nvl`` as the catalog key names it, else ``""`` (a card sold in one form)."""
    tokens = re.split(r"[^a-z0-9]+", gpu.key.lower())
    return next((re.sub(r"\d+$", "", t) for t in tokens if re.fullmatch(r"sxm\d*|pcie|nvl", t)), "")


def same_die(a: GPU, b: GPU, tolerance: float = 0.01) -> bool:
    """Whether two GPUs have the same die, clocks and form factor: SMs, boost clock, L2 and FP32 peak, each within
    ``tolerance``, in the same form (:func:`form_factor`; the H200 and the H100 SXM, not the A100 SXM and PCIe parts:
    a form factor sets the power limit, which sets the clock a part sustains, 1440 MHz of 1980 under bf16 GEMMs on a
    700 W H200, and the PCIe A100s run at 250-300 W where the SXM ones have 400). False where a fact is unknown."""
    if form_factor(a) != form_factor(b):
        return False
    mine = (a.sms, a.clock_mhz, a.l2_mb, a.fp32_tflops)
    theirs = (b.sms, b.clock_mhz, b.l2_mb, b.fp32_tflops)
    if any(v is None or not v > 0 for v in (*mine, *theirs)):
        return False
    return all(abs(float(x) / float(y) - 1.0) <= tolerance for x, y in zip(mine, theirs, strict=True) if x and y)


def die_twin(gpu: GPU, candidates: Iterable[GPU]) -> GPU | None:
    """Of ``candidates`` (the GPUs a fitted model has seen), the one with ``gpu``'s die (:func:`same_die`) and the
    nearest memory bandwidth; None for one of the candidates itself, or where none has its die. A model that has
    seen the twin prices this GPU through it, on this GPU's own memory."""
    pool = list(candidates)
    bandwidth = gpu.memory_bw_gbps
    if not bandwidth or any(c.key == gpu.key for c in pool):
        return None
    twins = [(c, c.memory_bw_gbps) for c in pool if c.memory_bw_gbps and same_die(gpu, c)]
    if not twins:
        return None
    return min(twins, key=lambda t: abs(math.log(bandwidth / t[1])))[0]

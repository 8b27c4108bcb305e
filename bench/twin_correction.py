"""The learned correction's die twin, held out: the lent H200's profiles with their operator tables and FLOPs taken
away (the analytic split, where the learned correction applies), predicted on Lambda's published GPUs of the same
model, precision and batch, with the twin rule (``predictor.catalog.gpus.die_twin`` in ``basis._cross_path``) and
without it; the lent H100's profiles as the control (the H100 is the correction's own).

    python bench/twin_correction.py

Nothing is fitted here; the H200 is in no fit. BENCHMARKS.md, "A lent H200".
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import devicecli  # noqa: E402
import ops_validation as ov  # noqa: E402

from predictor.documents.profile import load_profile  # noqa: E402
from predictor.model import basis  # noqa: E402
from predictor.model.predict import predict  # noqa: E402
from predictor.validation import Case, case_catalog  # noqa: E402

ARCHIVES = (ROOT / "bench" / "data" / "h200_profiles_2026-12-04.tar.xz", devicecli.ARCHIVE)


def run(archive: Path) -> list[tuple[str, str, float, bool]]:
    """(case, target GPU, predicted / published throughput, inside the 80 % interval) of every pair."""
    pts = ov.points()
    out = []
    with devicecli.unpacked(archive) as folder:
        log = folder / "measure.jsonl" if (folder / "measure.jsonl").exists() else folder / "measure-lambda.jsonl"
        measured = {r["case"]: r for r in map(json.loads, log.read_text().splitlines()) if "error" not in r}
        for name, m in sorted(measured.items()):
            prof = load_profile(folder / f"{name}.json")
            bare = dataclasses.replace(prof, ops=None, model=dataclasses.replace(prof.model, flops=None))
            for p in pts:
                if (p.model, p.precision, p.batch) != (m["model"], m["precision"], m["batch"]) or p.gpu == m["gpu"]:
                    continue
                r = predict(
                    bare, f"bench-{p.gpu}-x1-pcie:1", catalog=case_catalog([Case("cross", p.model, p, p)]), layout="ddp"
                )
                lo, hi = r.interval["throughput_samples_s"]
                out.append((name, p.gpu, r.throughput_samples_s / p.throughput, lo <= p.throughput <= hi))
    return out


def summary(tag: str, rows: list[tuple[str, str, float, bool]]) -> None:
    ratios = sorted(x for _, _, x, _ in rows)
    mape = sum(abs(x - 1) for x in ratios) / len(ratios)
    inside = sum(i for *_, i in rows)
    print(f"{tag}: {len(rows)} cases, MAPE {mape:.1%}, median predicted / published {ratios[len(ratios) // 2]:.2f}, "
          f"{inside} inside the 80 % interval")  # fmt: skip


def main() -> int:
    for archive in ARCHIVES:
        with_twin = run(archive)
        keep = basis.die_twin
        basis.die_twin = lambda gpu, candidates: None  # the rule off: analytic scaling only for an unseen GPU
        try:
            without = run(archive)
        finally:
            basis.die_twin = keep
        summary(f"{archive.name}, without the twin", without)
        summary(f"{archive.name}, with the twin", with_twin)
    return 0


if __name__ == "__main__":
    sys.exit(main())

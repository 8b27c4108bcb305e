"""The command line every lent-GPU bench shares: ``measure`` (on the GPU machine, into ``--out``, stopping new work
after ``--budget-s``) and ``score`` (here, from what came back: a folder, or its committed copy)."""

from __future__ import annotations

import argparse
import contextlib
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parent / "data" / "h100_profiles_2026-11-27.tar.xz"


@contextlib.contextmanager
def unpacked(path: Path) -> Iterator[Path]:
    """A folder of raw results: ``path`` itself, or the archive ``path`` unpacked into a temporary folder (removed
    after)."""
    if not path.is_file():
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="srifty-device-") as tmp, tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp)


def parse(
    doc: str,
    argv: list[str] | None,
    budget_s: float,
    measure_options: Callable[[argparse.ArgumentParser], None] = lambda p: None,
    score_options: Callable[[argparse.ArgumentParser], None] = lambda p: None,
) -> argparse.Namespace:
    """``args.cmd`` is "measure" (with ``out``, ``budget_s``) or "score" (with ``path``), plus each verb's options."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    measure = sub.add_parser("measure", help="on a CUDA machine")
    measure.add_argument("--out", type=Path, required=True, help="folder for the raw results")
    measure.add_argument("--budget-s", type=float, default=budget_s, help="start no new case after this many seconds")
    measure_options(measure)
    score = sub.add_parser("score", help="here, no GPU: from the raw results")
    score.add_argument("path", type=Path, help="the folder measure wrote, or its committed copy in bench/data")
    score_options(score)
    return parser.parse_args(argv)

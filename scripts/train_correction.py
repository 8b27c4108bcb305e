"""Train the cross-GPU correction from the bundled measurements and write predictor/data/correction.json.

    python scripts/train_correction.py [--check]

Reproducible: Ridge regression, no randomness; the artefact records the data's sha256 and the scikit-learn version.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor._io import atomic_write_text  # noqa: E402
from predictor.perf.correction import train  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the artefact differs from a fresh training")
    args = parser.parse_args()
    _, artefact = train()
    text = json.dumps(artefact, indent=2) + "\n"
    target = ROOT / "predictor" / "data" / "correction.json"
    if args.check:
        same = target.exists() and json.loads(target.read_text()) == json.loads(text)
        print(f"{target} is {'up to date' if same else 'out of date: run python scripts/train_correction.py'}")
        return 0 if same else 1
    atomic_write_text(target, text)
    print(f"wrote {target}: {artefact['n_samples']} cross-GPU pairs, residual sd {artefact['residual_sd']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which model names gave `srifty terraform` a root AWS refuses: the default run name against S3's 63 characters.

The module names the checkpoint bucket it creates ``<run name>-checkpoints-<12-digit account id>``, and S3 takes bucket
names of 3 to 63 characters ("Bucket naming rules", https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
Without ``--name`` the run name is ``srifty-<model>-<choice>-<the plan's digest>``; before the fifty-second session
the model kept 24 characters of its name, so a model whose name is 23 characters or more (after lower-casing and
hyphens) made a 64-65 character bucket, which the AWS provider refuses at plan. The model's name is what the
profile records: the LightningModule's class name (``SriftyCallback``), or the class ``srifty capture`` built, with
``+ LoRA r<k>`` for a LoRA capture. This counts, over the class names the installed transformers maps for its task
heads and torchvision's classifiers (the names a capture records), how many such roots were refused before and after.

    python bench/run_names.py            # a table; --json for machines
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_srifty.provision.terraform.generate import (  # noqa: E402
    BUCKET_SUFFIX,
    NAME_MAX,
    NAME_MAX_OWN_BUCKET,
    default_name,
)

BUCKET_MAX = 63


def name_before(model: str, choice: int, digest: str) -> str:
    """The default run name as `srifty terraform` wrote it up to the fifty-first session (the model cut at 24)."""
    base = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")[:24] or "run"
    return f"srifty-{base}-{choice}-{digest}"


class _Plan:
    """What default_name reads of a plan: its model and a dictionary to digest."""

    def __init__(self, model: str) -> None:
        self.model = model

    def to_dict(self) -> dict[str, str]:
        return {"model": self.model}


def model_names() -> dict[str, list[str]]:
    """The class names a profile or a capture records, by source (each source only where it is installed)."""
    sources: dict[str, list[str]] = {}
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        pass
    else:
        heads = sorted(
            {
                cls
                for attr in dir(modeling_auto)
                if attr.startswith("MODEL_FOR_") and attr.endswith("_MAPPING_NAMES")
                for cls in getattr(modeling_auto, attr).values()
                if isinstance(cls, str)
            }
        )
        sources["transformers task heads"] = heads
        sources["the same + LoRA r8"] = [f"{h} + LoRA r8" for h in heads]
    try:
        import torchvision.models as tvm
    except (ImportError, RuntimeError):  # a CUDA torchvision beside a CPU torch fails at import: left out
        pass
    else:
        sources["torchvision classifiers"] = sorted(tvm.list_models(module=tvm))
    return sources


def score(names: list[str]) -> dict[str, object]:
    before = after = 0
    longest = 0
    for name in names:
        digest = hashlib.sha256(name.encode()).hexdigest()[:6]
        old = name_before(name, 1, digest)
        new = default_name(_Plan(name), 1, NAME_MAX_OWN_BUCKET)  # type: ignore[arg-type]
        before += len(old) + BUCKET_SUFFIX > BUCKET_MAX
        after += len(new) + BUCKET_SUFFIX > BUCKET_MAX
        longest = max(longest, len(new) + BUCKET_SUFFIX)
    return {"names": len(names), "refused_before": before, "refused_after": after, "longest_bucket_after": longest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {source: score(names) for source, names in model_names().items()}
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"run name at most {NAME_MAX_OWN_BUCKET} without --bucket ({NAME_MAX} with one); bucket names at most 63")
    print(f"{'source':<28} {'names':>6} {'refused before':>15} {'after':>6} {'longest bucket after':>21}")
    for source, row in rows.items():
        print(
            f"{source:<28} {row['names']:>6} {row['refused_before']:>15} {row['refused_after']:>6} "
            f"{row['longest_bucket_after']:>21}"
        )


if __name__ == "__main__":
    main()

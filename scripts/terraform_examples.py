"""(Re)write terraform/examples/*: a plan (kept once written) and the values `srifty terraform` generates from it
(the golden files tests/infra/test_terraform.py compares against).

python scripts/terraform_examples.py            # regenerate the golden values from the committed plans
python scripts/terraform_examples.py --plans    # also re-rank and rewrite the plans (changes every golden file)
python scripts/terraform_examples.py --plans heterogeneous-mixed    # only that example's plan
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_srifty.provision.terraform.generate import Options, tfvars  # noqa: E402
from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.plan import load_plan  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402

PROFILE = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())  # hand-written

# name -> (constraints, how to pick the entry, options)
EXAMPLES = {
    "single-node-on-demand": (
        Constraints(steps=100_000, market="on-demand", max_instances=1, allow=("g5", "g6")),
        lambda plan: 0,
        Options(name="resnet-single", train_command="python train.py --epochs 90"),
    ),
    "multi-node-spot": (
        Constraints(steps=5_000_000, objective="time", market="spot", max_instances=4, allow=("p4d.24xlarge",)),
        lambda plan: 0,
        Options(
            name="resnet-p4d-spot",
            train_command="python train.py --epochs 90",
            setup_command="pip install -r requirements.txt",
            ssh_cidr=("203.0.113.0/24",),
            mode="asg",
        ),
    ),
    "heterogeneous-mixed": (
        Constraints(
            steps=2_000_000, objective="time", market="mixed", max_types=2, max_instances=3, allow=("g5", "g6"), top=30
        ),
        lambda plan: next(i for i, e in enumerate(plan.entries) if len(e.groups) == 2),
        # the group may fill its spot units with the slower type: 4 instances at worst (check_mixed_group)
        Options(name="resnet-mixed", train_command="python train.py --epochs 90", mode="asg", max_instances=4),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--plans", nargs="*", default=None, help="re-rank and rewrite the example plans (named ones only, if given)"
    )
    args = parser.parse_args()
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    for name, (constraints, pick, options) in EXAMPLES.items():
        folder = ROOT / "terraform" / "examples" / name
        folder.mkdir(parents=True, exist_ok=True)
        plan_path = folder / "plan.json"
        if (args.plans is not None and (not args.plans or name in args.plans)) or not plan_path.exists():
            plan = rank(load_profile(PROFILE), constraints, catalog=catalog)
            plan.save(plan_path)
        plan = load_plan(plan_path)
        choice = pick(plan)
        values = tfvars(plan, choice, options, catalog)
        (folder / "choice.json").write_text(
            json.dumps({"choice": choice, "options": options.__dict__}, indent=2) + "\n"
        )
        (folder / "expected.auto.tfvars.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
        print(f"{name}: {plan.entries[choice].fleet} ({plan.entries[choice].market})")


if __name__ == "__main__":
    main()

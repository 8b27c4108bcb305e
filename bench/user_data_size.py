"""How many bytes of user data the module's instances get, per variant of srifty terraform / srifty launch (issue #35
H3): EC2 takes 16,384 bytes of raw user data at most (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html).

user_data is a fixed first stage (templates/boot.sh.tftpl) that fetches the group's boot script
(templates/user_data.sh.tftpl, which was user_data itself before) from the fleet's bucket. Both are rendered here by
``terraform console`` (``templatefile``: no provider, no cloud) with the values the module passes, and their sizes
printed; the boot script's size is what user_data would have been.

    python bench/user_data_size.py            # a table; --json for machines
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "terraform" / "modules" / "training_fleet" / "templates"
LIMIT = 16_384


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def stage2_values(**overrides: object) -> dict:
    """The values main.tf passes to user_data.sh.tftpl for a srifty terraform fleet with its code snapshot."""
    name = str(overrides.pop("name", "resnet50-v100-a1b2c3"))
    prefix = f"s3://{name}-checkpoints-123456789012/checkpoints/{name}/"
    values = {
        "name": name,
        "setup_command": "",
        "argv": "'train.py'",
        "nnodes": 2,
        "nproc_per_node": 1,
        "group": "g5.xlarge",
        "weights_json": "{}",
        "units": 1,
        "efa": False,
        "rdzv_port": 29400,
        "rendezvous_timeout_s": 1800,
        "checkpoint_uri_b64": b64(prefix),
        "code_sha256": "a" * 64,
        "image_b64": "",
        "code_uri_b64": b64(f"{prefix}code/{'a' * 64}.tar.gz"),
        "resume_from": "",
        "handover": False,
        "env_count": 0,
        "env_b64": b64("{}"),
        "max_life_s": 7200,
        "max_life_min": 120,
        "heartbeat": False,
        "watchdog_b64": base64.b64encode((TEMPLATES / "watchdog.sh").read_bytes()).decode(),
        "watchdog_interval_s": 60,
        "watchdog_grace_s": 110,
        "watchdog_max_age_s": 300,
        "watchdog_asg": 1,
        "watch_s": 1200,
        "teardown_s": 300,
        "stall_s": 1200,
        "after_fit_s": 1800,
        "secrets": [],
        "data": [],
    }
    values.update(overrides)
    return values


FSDP_ARGS = {
    "sharding_strategy": "FULL_SHARD",
    "auto_wrap_policy": ["LlamaDecoderLayer"],
    "activation_checkpointing_policy": ["LlamaDecoderLayer"],
}
FSDP = {"SRIFTY_STRATEGY": json.dumps({"name": "fsdp", "args": FSDP_ARGS})}
SECRETS = [{"name": f"SECRET_{k}", "source": "ssm", "id": f"/team/a-rather-long-parameter-name-{k}"} for k in range(8)]
DATA = [
    {"name": "TRAIN_DATA", "uri": "s3://a-team-datasets/imagenet/train/", "copy": True},
    {"name": "VAL_DATA", "uri": "s3://a-team-datasets/imagenet/val/", "copy": False},
]
VARIANTS = {
    "default (code snapshot, asg)": {},
    "srifty launch (handover, heartbeat)": {
        "handover": True,
        "heartbeat": True,
        "stall_s": 0,
    },  # main.tf: the launcher watches the training; the node its teardown and its script after training
    "one --secret-env": {"secrets": SECRETS[:1]},
    "an FSDP plan (strategy in env)": {"env_count": 1, "env_b64": b64(json.dumps(FSDP))},
    "two data folders, one copied": {"data": DATA},
    "a 40-character --name": {"name": "a" * 40},
    "a 170-character --setup-command": {"setup_command": "pip install " + "x" * 158},
    "everything at once (8 secrets, 5 KB setup)": {
        "name": "a" * 40,
        "handover": True,
        "heartbeat": True,
        "stall_s": 0,
        "secrets": SECRETS,
        "env_count": 1,
        "env_b64": b64(json.dumps(FSDP)),
        "setup_command": "pip install " + " ".join(f"package-number-{k}==1.0" for k in range(200)),
        "resume_from": "'s3://b/checkpoints/" + "r" * 200 + ".ckpt'",
    },
}


def render(template: Path, values: dict, work: Path) -> str:
    expr = f"templatefile({json.dumps(str(template))}, jsondecode({json.dumps(json.dumps(values))}))"
    run = subprocess.run(
        ["terraform", f"-chdir={work}", "console"], input=expr, capture_output=True, text=True, timeout=120, check=True
    )
    out = run.stdout.strip()
    return out[len("<<EOT") :].rsplit("EOT", 1)[0].lstrip("\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for label, overrides in VARIANTS.items():
            values = stage2_values(**overrides)
            boot = render(TEMPLATES / "user_data.sh.tftpl", values, Path(work))
            first = render(
                TEMPLATES / "boot.sh.tftpl",
                {
                    "name": values["name"],
                    "max_life_min": values["max_life_min"],
                    "boot_uri_b64": b64("s3://bucket/checkpoints/x/boot/x/g5.xlarge-" + "b" * 64 + ".sh"),
                    "boot_sha256": hashlib.sha256(boot.encode()).hexdigest(),
                },
                Path(work),
            )
            rows.append(
                {"variant": label, "user_data_bytes": len(first.encode()), "boot_script_bytes": len(boot.encode())}
            )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'variant':46} {'user_data':>10} {'boot script':>12}  (EC2 limit {LIMIT:,} B)")
    for r in rows:
        over = "  <- over the limit as user_data" if r["boot_script_bytes"] > LIMIT else ""
        print(f"{r['variant']:46} {r['user_data_bytes']:>10,} {r['boot_script_bytes']:>12,}{over}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

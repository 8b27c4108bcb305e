"""The training command of a fleet as torchrun's argv: what users write ("python train.py ...") becomes what
torchrun takes ("train.py ..."), -m goes to torchrun's own -m, and commands torchrun cannot run are refused with
the parameter, the value and the fix."""

from __future__ import annotations

import pytest

from lightning_srifty.provision.terraform.command import train_argv
from predictor.exceptions import ConfigError


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("train.py --epochs 90", ["train.py", "--epochs", "90"]),
        ("python train.py --epochs 90", ["train.py", "--epochs", "90"]),
        ("python3 -u train.py", ["train.py"]),
        ("/opt/pytorch/bin/python3.11 train.py", ["train.py"]),
        ("python -m pkg.train --lr 0.1", ["-m", "pkg.train", "--lr", "0.1"]),
        ("python train.py --name 'a b' \"c'd\"", ["train.py", "--name", "a b", "c'd"]),
        ("scripts/train.sh", ["scripts/train.sh"]),
    ],
)
def test_commands_become_torchrun_argv(command: str, argv: list[str]) -> None:
    assert train_argv(command) == argv


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("python", "no script"),
        ("python -m", "-m without a module"),
        ("python -c 'print(1)'", "Python option '-c'"),
        ("python -O train.py", "Python option '-O'"),
        ("torchrun --nproc_per_node 8 train.py", "starts a launcher"),
        ("python -m torch.distributed.run train.py", "starts a launcher"),
        ("train.py --name 'unbalanced", "cannot be split"),
    ],
)
def test_commands_torchrun_cannot_run_are_refused(command: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        train_argv(command)
    assert (info.value.parameter, info.value.value) == ("train_command", command)
    assert "e.g. train_command 'train.py --epochs 90'" in str(info.value)  # the option (srifty terraform: its flag)

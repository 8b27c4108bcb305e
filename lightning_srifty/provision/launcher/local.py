"""The ``local`` provisioner: a fleet of N instances x G GPUs becomes N x G processes on this machine under
``torch.distributed.run --standalone`` (for trying ``srifty launch`` out and for the tests; no capacity to bring up).

``simulate_notice_after``: the first fleet gets a local instance metadata service and a spot interruption notice
after that many seconds (what :class:`~lightning_srifty.migrate.preemption.SpotPreemption` reacts to on EC2).

torchrun runs as ``python -m lightning_srifty.migrate.torchrun`` (torchrun itself, with the same arguments), which
reports a planned leave (a worker exited 75, the others with it or stopped by torchrun) in one line instead of
torchrun's ``FAILED`` report and traceback, and in a session of its own: a Ctrl-C in the terminal reaches the launcher
only, which then stops the job in order (SIGTERM: the job checkpoints and leaves) and releases the fleet."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from typing import Any

from lightning_srifty.protocol import ALLOW_CPU, VARIABLES
from lightning_srifty.provision.aws import LocalIMDS
from lightning_srifty.provision.base import LaunchedFleet
from lightning_srifty.provision.terraform.command import torchrun_argv, torchrun_script
from predictor.documents.plan import Plan
from predictor.exceptions import ConfigError, MigrationError
from predictor.runs.spot import shutdown_grace_s

# what the local trial's stand-in metadata service answers: a spot instance (its notice comes later), and no instance
# type: the processes run on this machine, and a profile or an observation must not claim the plan's type for them
# (issue #37 L: a local launch's profile said g4dn.xlarge)
SIMULATED_METADATA = {"meta-data/instance-life-cycle": "spot"}


def local_argv(script: list[str]) -> list[str]:
    """What torchrun starts for ``script``, read as the fleet's nodes read a training command
    (:func:`~lightning_srifty.provision.terraform.command.torchrun_argv`): torchrun runs Python itself, so
    ``["python", "train.py"]`` is torchrun's ``["train.py"]``, not a file named ``python``.

    Raises:
        ConfigError: a script torchrun cannot start (a launcher, a Python option such as ``-c``, no script).
    """
    argv, why = torchrun_argv(shlex.join(script))
    if why:
        raise ConfigError.between(
            "The {script} {given} {why} Give the script and its arguments, e.g. ['train.py', 'config.yaml'] or "
            "['python', '-m', 'pkg.train'].",
            parameter="script",
            value=script,
            given=script,
            why=why,
        )
    return argv


class LocalProvisioner:
    kind = "local"
    ranks_in_join_order = False  # one torchrun on this machine: ranks in the plan's group order

    def __init__(
        self,
        script: list[str],
        *,
        max_processes: int = 8,
        simulate_notice_after: float | None = None,
        echo: Any = print,
    ) -> None:
        self.script, self.max_processes, self.echo = local_argv(script), max_processes, echo
        self.simulate_notice_after = simulate_notice_after
        self._started = 0

    def zones_after(self, plan: Plan, index: int, code: str, tried: list[str | None]) -> list[Any]:
        return []  # processes on this machine: no zones

    def up(self, plan: Plan, index: int, name: str, zone: str | None = None) -> LaunchedFleet:
        entry = plan.entries[index]
        ranks = sum(g.count * g.gpus_per_instance for g in entry.groups)
        if ranks > self.max_processes:
            raise MigrationError.named(
                "{fleet} has {ranks} GPUs: the local provisioner runs one process per GPU and is limited to {limit} "
                "({max_local_processes}).",
                fleet=entry.fleet,
                ranks=ranks,
                limit=self.max_processes,
            )
        return LaunchedFleet(plan, index, name, {"ranks": ranks})

    def start(self, fleet: LaunchedFleet, env: dict[str, str]) -> None:
        # a local trial runs one process per planned GPU on this machine, on its CPU where it has fewer GPUs: a
        # Trainer on the CPU is meant here, not GPUs paid for and left idle (launch_checks.refuse_idle_gpus)
        full = {**os.environ, ALLOW_CPU: "1", **env}
        imds = None
        if self.simulate_notice_after is not None and self._started == 0:
            imds = LocalIMDS(dict(SIMULATED_METADATA)).__enter__()
            full.update(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, AWS_EC2_METADATA_DISABLED="false")
            threading.Timer(self.simulate_notice_after, imds.notify).start()
        self._started += 1
        grace = shutdown_grace_s(fleet.plan.checkpoint_s)  # a leaving job's save is never cut by torchrun's SIGKILL
        command = [
            sys.executable,
            "-m",
            "lightning_srifty.migrate.torchrun",
            "--standalone",
            f"--shutdown_timeout={grace}",
        ]
        command += [f"--nproc_per_node={fleet.data['ranks']}", *torchrun_script(self.script)]
        self.echo(
            f"srifty launch: {fleet.entry.fleet} ({fleet.entry.market}) as {fleet.data['ranks']} local process(es), "
            f"batches [{env[VARIABLES['batch_sizes']].replace(',', ', ')}]"
            + (f", strategy {env[VARIABLES['strategy']]}" if VARIABLES["strategy"] in env else "")
        )
        fleet.data.update(process=subprocess.Popen(command, env=full, start_new_session=True), imds=imds)

    def poll(self, fleet: LaunchedFleet) -> int | None:
        process = fleet.data.get("process")
        code = process.poll() if process is not None else None
        if code is not None and fleet.data.get("imds") is not None:
            fleet.data.pop("imds").__exit__(None, None, None)
        return code

    def wait(self, fleet: LaunchedFleet, timeout: float) -> int | None:
        process = fleet.data.get("process")
        if process is None:
            return None
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll(fleet)

    def stop(self, fleet: LaunchedFleet) -> None:
        """SIGTERM to torchrun (it passes it to the ranks, which checkpoint and leave), waited for as long as torchrun
        waits for its ranks (its shutdown grace, from the plan's save) and a little more; then SIGKILL to torchrun and
        to every process below it. The ranks run in sessions of their own: killing torchrun alone left a rank that
        SIGTERM could not end (one hung in its step) running, orphaned, beside the next leg."""
        process = fleet.data.get("process")
        if process is not None and process.poll() is None:
            ranks = _tree(process.pid)  # now: once torchrun is gone, they are no longer found below it
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(shutdown_grace_s(fleet.plan.checkpoint_s) + 15)
            self._kill(process, ranks)
        self.poll(fleet)

    def kill(self, fleet: LaunchedFleet) -> None:
        """SIGKILL to torchrun and every process below it at once: a hung job has nothing to save."""
        process = fleet.data.get("process")
        if process is not None and process.poll() is None:
            self._kill(process, _tree(process.pid))
        self.poll(fleet)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes], ranks: dict[int, str]) -> None:
        """SIGKILL to what is left of ``process`` and ``ranks`` (each still the process it was: its start time)."""
        if process.poll() is None:
            ranks.update(_tree(process.pid))
        for pid, started in ranks.items():
            if _started(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)

    def down(self, fleet: LaunchedFleet) -> None:
        self.stop(fleet)


def _started(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat's 22nd field): a pid reused by another process
    has another one. None: gone, or no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def _tree(pid: int) -> dict[int, str]:
    """Every process below ``pid``, whatever session it started, with its start time (Linux's /proc; elsewhere none
    is found)."""
    parents: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(os.path.join(entry.path, "stat")) as f:
                        parents[int(entry.name)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {child: started for child in found if (started := _started(child)) is not None}

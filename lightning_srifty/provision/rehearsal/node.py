"""One instance of the fleet, played on this machine: its user_data run byte-for-byte with bash from ``/`` as
cloud-init runs it, its instance metadata served by
:class:`~lightning_srifty.provision.aws.LocalIMDS`, its AWS
calls signed with the instance role's credentials. Three things stand in for the instance itself, first on PATH:
``shutdown`` (records the call: the rehearsal terminates the instance, as EC2 does for an instance whose
instance_initiated_shutdown_behavior is terminate), ``python3`` (this interpreter, whose packages the bootstrap reuses
through $SRIFTY_BOOTSTRAP_BASE_PYTHON instead of downloading torch) and ``torchrun`` (the image's, which a torch
installed that way does not bring: ``python -m torch.distributed.run`` of the environment user_data activated). Every
process the node starts carries its token in the environment (``setsid`` does not lose it), which is how
:meth:`Node.power_off` finds them."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lightning_srifty.provision.aws import LocalIMDS

TOKEN_VARIABLE = "SRIFTY_REHEARSAL_NODE"

# what a node's log says as it boots (user_data.sh.tftpl and bootstrap.py), first sighting of each timed
MARKS = {
    "code": "srifty: the code ",
    "environment": "srifty bootstrap: ready:",
    "data": " MiB copied from s3://",  # the first folder of --data-copy on this node's disk
    "waiting": "waiting for the fleet's",
    "rendezvous": "nodes are ready; the c10d host is",
    "exited": "srifty: the training job exited with",
    "hung": "): it hangs; killing it",  # the stall watch's verdict
}


# an exception a process raised, as Python prints its last line (a rank's prefixed by torchrun, "[rank1]: ", or its
# tee, "[default1]:"): a name ending in Error or Exception (or those alone but a bare Error, which Python never
# raises), then its message after a colon or nothing; torchrun's own ChildFailedError, which only reports its
# workers' end, is not one
_RAISED = re.compile(
    r"^(?:\[(?:rank|default)\d+\]:\s*)?"
    r"((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception)|Exception|KeyboardInterrupt)(?::\s.*|:)?)$"
)


def first_error(text: str) -> str | None:
    """The first exception raised in ``text`` (its type and message, one line), torchrun's report of its workers
    aside; None where none was."""
    for line in text.splitlines():
        m = _RAISED.match(line.strip())
        if m and "ChildFailedError" not in m.group(1) and not line.lstrip().startswith(("raise ", "File ")):
            return m.group(1).strip()[:300]
    return None


@dataclass
class Node:
    instance_id: str
    group: str  # its instance type
    leg: int  # 1: the fleet as applied; 2: the Auto Scaling group's replacements
    index: int  # 1-based, in the order the rehearsal started them
    work: Path
    user_data: str
    market: str  # spot / on-demand (instance-life-cycle)
    imds: LocalIMDS | None = None
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0  # monotonic
    exit_code: int | None = None
    marks: dict[str, float] = field(default_factory=dict)  # seconds after its start
    terminated: bool = False
    noticed: bool = False
    env: dict[str, str] = field(default_factory=dict)  # more of the node's environment (the boot script's overrides)

    @property
    def token(self) -> str:
        return f"{self.work.name}-{self.instance_id}"

    @property
    def log_path(self) -> Path:
        return self.work / "user-data.log"

    def start(self, region: str, endpoint: str, credentials: dict[str, str], base_python: str) -> None:
        bin_dir = self.work / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        _script(bin_dir / "shutdown", f'#!/bin/bash\necho "$(date +%s) $*" >>"{self.work / "shutdown.log"}"\n')
        _script(bin_dir / "python3", f'#!/bin/sh\nexec "{base_python}" "$@"\n')
        # the image's torchrun, for the torch the bootstrap found already installed (it installs no console script
        # then): the environment's own python, which user_data has activated
        _script(bin_dir / "torchrun", '#!/bin/sh\nexec python -m torch.distributed.run "$@"\n')
        (self.work / "user_data.sh").write_text(self.user_data)
        self.imds = LocalIMDS(
            {
                "meta-data/instance-id": self.instance_id,
                "meta-data/instance-type": self.group,
                "meta-data/instance-life-cycle": self.market,
                "meta-data/local-ipv4": "127.0.0.1",  # every node is this machine
                "meta-data/placement/region": region,
                "meta-data/placement/availability-zone": region + "a",
            }
        ).__enter__()
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(
            {
                "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.endpoint,
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_DEFAULT_REGION": region,
                **credentials,
                # where this "instance" keeps its files (on EC2: /opt/srifty, /run/srifty and /var/log)
                "SRIFTY_HOME": str(self.work / "opt-srifty"),
                "SRIFTY_STATE_DIR": str(self.work / "run-srifty"),
                "SRIFTY_PER_BOOT_DIR": str(self.work / "per-boot"),  # never this machine's cloud-init
                "SRIFTY_USER_DATA_LOG": str(self.log_path),
                "SRIFTY_WATCHDOG_LOG": str(self.work / "watchdog.log"),
                "SRIFTY_WATCHDOG_INTERVAL_S": "1",
                # a lost peer seen within seconds, not the fleet's 30, and the log shipped every 15 s, not 30: each
                # look is two AWS CLI calls (0.5 CPU-s each here); at 2 s and 5 s the looks and uploads were 308 of
                # a full rehearsal's 448 calls, 150 of its 540 CPU-s (BENCHMARKS, "CI's time", forty-seventh session)
                "SRIFTY_PEER_CHECK_S": "6",
                "SRIFTY_LOG_INTERVAL_S": "15",
                "SRIFTY_BOOTSTRAP_BASE_PYTHON": base_python,
                "SRIFTY_ALLOW_CPU": "1",  # the GPUs are this machine's cores
                "OMP_NUM_THREADS": "1",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                TOKEN_VARIABLE: self.token,
                **self.env,
            }
        )
        self.started = time.monotonic()
        with open(self.work / "console.log", "wb") as console:
            self.proc = subprocess.Popen(
                on_its_own_disk(["bash", str(self.work / "user_data.sh")], env, self.work.parent / "node-tmp"),
                cwd="/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        if self.proc is not None and self.exit_code is None:
            self.exit_code = self.proc.poll()
        return self.exit_code

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 25) -> str:
        """The log's last ``lines`` (the node's console where it has none), after the first exception a process
        raised where those lines do not show it: torchrun's ChildFailedError table closes a failed job's log, and a
        trial's rank's own ``ValueError`` was only in the console."""
        log, console = self.log(), _read(self.work / "console.log")
        last = "\n".join((log or console).splitlines()[-lines:])
        first = first_error(log + "\n" + console)
        if first and first not in last:
            return f"(the first error raised: {first})\n{last}"
        return last

    def update_marks(self) -> list[str]:
        """The marks first seen now (the caller reports them)."""
        text = self.log()
        new = []
        for name, needle in MARKS.items():
            if name not in self.marks and needle in text:
                self.marks[name] = time.monotonic() - self.started
                new.append(name)
        return new

    def shut_down(self) -> bool:
        """The instance called ``shutdown -h now`` (the watchdog, or the first stage without its boot script)."""
        return " -h now" in _read(self.work / "shutdown.log")

    def notice(self, action: str = "terminate") -> None:
        assert self.imds is not None
        self.imds.notify(action)
        self.noticed = True

    def freeze(self) -> None:
        """Every process of this node stops where it is (SIGSTOP), its sockets left open: a machine that vanished,
        whose peers see no connection closed (a failed host; NCCL then waits on it). :meth:`power_off` ends them."""
        for pid in pids_with(f"{TOKEN_VARIABLE}={self.token}") | ({self.proc.pid} if self.proc is not None else set()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)

    def freeze_job(self) -> list[int]:
        """The job's rank processes stop where they are (SIGSTOP; those torchrun started, which carry LOCAL_RANK,
        not their own children, such as a DataLoader's workers, which see their rank gone once it is killed): a job
        that hangs in a call that never returns, its node running. Returns their ids."""
        job = pids_with(f"{TOKEN_VARIABLE}={self.token}") & pids_with("LOCAL_RANK=", prefix=True)
        ranks = sorted(pid for pid in job if _parent(pid) not in job)
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        return ranks

    def power_off(self) -> None:
        """Every process of this node ends (SIGKILL, as when an instance's power goes), its metadata server too."""
        for _ in range(3):
            pids = pids_with(f"{TOKEN_VARIABLE}={self.token}")
            if self.proc is not None and self.proc.poll() is None:
                pids.add(self.proc.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            self.poll()
        if self.imds is not None:
            self.imds.__exit__()
            self.imds = None


def on_its_own_disk(command: list[str], env: dict[str, str], disk: Path) -> list[str]:
    """``command`` run with a disk of its own at ``disk`` (the same path on every node), its TMPDIR, where
    :func:`private_disk` allows; else as it is. ``env`` gets the TMPDIR. The rehearsal's nodes, and the tests' and
    ``bench/two_node_disks.py``'s two-node fleets."""
    if private_disk() is not None:
        return command
    disk.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(disk)
    return ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=8g tmpfs "$TMPDIR" && exec "$@"', "node", *command]


@functools.cache
def private_disk() -> str | None:
    """Why the nodes cannot have local disks of their own here (None: they can). Each node then runs in a mount
    namespace of its own with a tmpfs at one path, its TMPDIR, as every instance has its own /tmp under one name: a
    job that leaves on one node a file another node needs (a sharded checkpoint's shards) fails here as on a fleet.
    That takes root (``unshare -m``); without it the nodes share this machine's TMPDIR."""
    if os.geteuid() != 0:
        return "not root: unshare -m needs it"
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "tmpfs", "/mnt"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m cannot mount a tmpfs: {probe.stderr.strip()[:120]}"


def pids_with(entry: str, prefix: bool = False) -> set[int]:
    """The processes of this user whose environment holds ``entry`` (``NAME=value``; with ``prefix``, a variable
    whose ``NAME=value`` starts with it)."""
    needle = (b"\0" + entry.encode()) if prefix else (entry.encode() + b"\0")
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in b"\0" + (proc / "environ").read_bytes() + b"\0":
                found.add(int(proc.name))
        except OSError:
            pass
    return found


def _parent(pid: int) -> int | None:
    """The parent of process ``pid`` (None once it has gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def base_python() -> str:
    """The interpreter the nodes' bootstrap reuses: this one."""
    return sys.executable

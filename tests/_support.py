"""Shared test data and small helpers (not a test module: test modules import this, never each other).

Light on purpose (no torch, no Lightning at import): the small Lightning models live in helpers.py.
"""

from __future__ import annotations

import ast
import base64
import copy
import hashlib
import importlib.util
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
BENCH = ROOT / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` (a lab the tests share with the benchmarks: one copy) loaded from its path, sys.path left
    as it is. Its sibling imports (``import netlab`` in bench/netns_validation.py) are loaded first, the same way, so
    they find the siblings in ``sys.modules``; a second call returns the module already loaded."""
    if name in sys.modules:
        return sys.modules[name]
    path = BENCH / f"{name}.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            siblings = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            siblings = [node.module]
        else:
            continue
        for sibling in siblings:
            if (BENCH / f"{sibling}.py").exists():
                bench_module(sibling)
    return load_path(name, path)


def load_path(name: str, path: Path) -> ModuleType:
    """The Python file at ``path`` loaded as module ``name`` (a script or a bench is not a package); a second call
    returns the module already loaded."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as an import does (dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# The smallest hand-written srifty.profile/v1 profile (docs/profile-schema.md's example).
MINIMAL = {
    "schema": "srifty.profile/v1",
    "model": {"name": "resnet50", "parameters": 25557032, "precision": "16-mixed"},
    "batch": {"per_device": 256},
    "hardware": {"gpu": "V100-SXM2-16GB", "devices": 1, "nodes": 1},
    "timing": {"step_time_s": {"p50": 0.31}},
}


def seen_samples(out: Path) -> dict[tuple[int, int], list[int]]:
    """The sample ids every rank of a run of tests/scripts/{hetero,migrate}_run.py saw, by (epoch, step)."""
    steps: dict[tuple[int, int], list[int]] = defaultdict(list)
    for path in sorted(out.glob("seen-rank*.txt")):
        for line in path.read_text().splitlines():
            epoch, step, *ids = line.split()
            steps[(int(epoch), int(step))].extend(int(i) for i in ids)
    return steps


def params_by_step(out: Path) -> dict[int, list[float]]:
    """The parameters such a run wrote after every step (params.txt: step, then the values)."""
    lines = (out / "params.txt").read_text().splitlines()
    return {int(line.split()[0]): [float(v) for v in line.split()[1:]] for line in lines}


def drift_plan(catalog, tmp_path: Path):
    """A ranked plan over g4dn.xlarge and g5.xlarge (on-demand, at most 2 instances) for a profile whose GPU step is
    5 ms, per-device batch 8: CPU test processes run far slower than it predicts, so the job sees a drift. The profile
    is saved as tmp_path/profile.json."""
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    profile = load_profile(
        {**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}, "timing": {"step_time_s": {"p50": 0.005}}}
    )
    profile.save(tmp_path / "profile.json")
    c = Constraints(steps=100_000, market="on-demand", allow=("g4dn.xlarge", "g5.xlarge"), max_instances=2)
    return rank(profile, c, catalog=catalog)


def plan_layout(name: str, block: str | None = "Block"):
    """The plan's record of layout ``name`` (:func:`predictor.model.layout.parse`) for a model whose block is
    ``block``."""
    from predictor.model.layout import parse
    from predictor.ranking.build import plan_layout as record

    return record(parse(name), block)


def moto_network(endpoint: str) -> tuple[str, tuple[str, ...]]:
    """A VPC and one subnet in moto's server (boto3), for an apply that is not about the module's own minimal VPC:
    the generated root then uses them (network.create_vpc = false), which spares the AWS provider's fixed waits after
    it creates a VPC and a subnet (10 s each for the DNS and public-IP attributes, one after the other)."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/20", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    return vpc, (subnet,)


class LocalServer:
    """A test server of ``self.server`` (an http.server on 127.0.0.1) run in a thread: ``with X(...) as url:``."""

    server: object

    def __enter__(self) -> str:
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{self.server.server_address[1]}"  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()  # type: ignore[attr-defined]
        self.server.server_close()  # type: ignore[attr-defined]


class Recorder:
    """A provisioner that records up / start / stop / down and runs nothing; it refuses the first ``spot_refusals``
    starts of a spot or mixed entry as EC2 does without capacity, and fails the bring-up of the fleets named in
    ``fail_up`` as a failed terraform apply does."""

    kind = "recorder"
    ranks_in_join_order = True  # as a fleet's nodes

    def __init__(self, spot_refusals: int = 0, fail_up: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.envs: dict[str, dict[str, str]] = {}
        self.markets: dict[str, str] = {}
        self.started_unix: dict[str, float] = {}
        self.spot_refusals = spot_refusals
        self.fail_up = fail_up

    def up(self, plan, index, name, zone=None):
        from lightning_srifty.provision.base import LaunchedFleet
        from predictor.exceptions import CapacityError, ProvisionError

        if name in self.fail_up:
            self.calls.append(("failed", name))
            raise ProvisionError(f"terraform apply failed in fleets/{name}; everything it had created was destroyed")

        market = plan.entries[index].market
        if market != "on-demand" and self.spot_refusals > 0:
            self.spot_refusals -= 1
            self.calls.append(("refused", name))
            raise CapacityError("no spot capacity", code="InsufficientInstanceCapacity")
        self.calls.append(("up", name))
        self.markets[name] = market
        return LaunchedFleet(plan, index, name)

    def start(self, fleet, env) -> None:
        self.calls.append(("start", fleet.name))
        self.envs[fleet.name] = env
        self.started_unix[fleet.name] = time.time()

    def poll(self, fleet):
        return None

    def stop(self, fleet) -> None:
        self.calls.append(("stop", fleet.name))

    def down(self, fleet) -> None:
        self.calls.append(("down", fleet.name))


class LosingNodes(Recorder):
    """A fleet whose nodes' boot scripts say how their job ended (the Terraform fleets: exited/<fleet>/<id>.json):
    their verdicts, what failed on their GPUs, and which of its instances went away without a word."""

    def __init__(self) -> None:
        super().__init__()
        self.verdicts: dict[str, list] = {}
        self.faults: dict[str, list[str]] = {}
        self.gone: dict[str, list[str]] = {}  # instances EC2 lists no more, that recorded no end
        self.still_up: dict[str, list[str]] = {}  # and those up without a record (a survivor, a replacement)
        self.retired: list[tuple[str, int]] = []  # fleets whose handover was withdrawn once the job left

    def node_verdicts(self, fleet):
        return self.verdicts.get(fleet.name, [])

    def vanished(self, fleet):
        return self.gone.get(fleet.name, []), self.still_up.get(fleet.name, [])

    def retire(self, fleet) -> None:
        self.retired.append((fleet.name, len(self.calls)))  # and how many calls came before

    def node_faults(self, fleet):
        return self.faults.get(fleet.name, [])


def run_bounded(cmd: list[str], timeout: float, **kwargs):
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a session of its own, bounded by ``timeout``: past
    it the whole process group is killed (a DDP run's other ranks too, which would otherwise keep a core busy for the
    rest of the suite) and the test fails with the last of what the command printed (subprocess.run's
    TimeoutExpired shows none of it)."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(map(str, cmd))} did not end within {timeout:g} s (killed with its process group); "
            f"its output's end:\n{(out or '')[-1500:]}\n--- stderr ---\n{(err or '')[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# variables a launcher (torchrun, Lightning's own, SLURM) sets for each rank it starts
EXTERNAL_LAUNCH_VARS = frozenset(
    {"LOCAL_RANK", "RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"}
)
LAUNCH_PREFIXES = ("TORCHELASTIC_", "SLURM_")
# the stack of a rank 0 still waiting for the other ranks to join (its faulthandler dump): the launch, not the run
RENDEZVOUS_FRAMES = ("_create_c10d_store", "_env_rendezvous_handler")
# gloo's TCP transport losing a peer (torch's third_party/gloo/gloo/transport/tcp/pair.cc): "Read error ...:
# Connection reset by peer", "Connection closed by peer"
GLOO_TRANSPORT_LOST = re.compile(r"gloo/transport/tcp/\S+\] .*Connection (reset|closed) by peer")
# Lightning's frames while the ranks set up, before any trains: the process group's start, and the first broadcast
# (the log directory, Trainer.__setup_profiler); "_run_stage" is where training begins
SETUP_FRAMES = ("_init_dist_connection", "setup_environment", "__setup_profiler")
TRAINING_FRAMES = ("_run_stage",)
RANK_LINE = re.compile(r"^\[rank(\d+)\]:(.*)$", re.MULTILINE)


def rank_errors(stderr: str) -> str:
    """The last line each rank printed with torch's ``[rankN]:`` prefix (its exception, for a rank that raised), one
    line a rank: a failed DDP run's stderr ends with one rank's traceback, and the rank that failed first is often the
    other one (CI: rank 1's "Connection reset by peer" filled the tail, rank 0's own error was cut off)."""
    last: dict[int, str] = {}
    for match in RANK_LINE.finditer(stderr):
        if match.group(2).strip():
            last[int(match.group(1))] = match.group(2).strip()
    return "\n".join(f"rank {rank}: {line}" for rank, line in sorted(last.items()))


def ddp_failure(result) -> str:
    """What a failed DDP run's assertion shows: each rank's last error line, then the end of its stderr."""
    return (
        f"each rank's last line:\n{rank_errors(result.stderr) or '(none with a [rankN]: prefix)'}\n--- stderr ---\n"
        + (result.stderr[-3000:])
    )


def _lost_a_peer_while_setting_up(stderr: str) -> bool:
    """A run that failed because gloo lost a peer while the ranks set up, before any trained (nothing written), and
    for nothing else: every rank's last line (:func:`rank_errors`) is gloo's lost peer. A rank that raised its own
    error first (its peers then lose it too) is the test's, never run again."""
    last = rank_errors(stderr).splitlines()
    return (
        GLOO_TRANSPORT_LOST.search(stderr) is not None
        and all(GLOO_TRANSPORT_LOST.search(line) for line in last)
        and any(frame in stderr for frame in SETUP_FRAMES)
        and not any(frame in stderr for frame in TRAINING_FRAMES)
    )


def run_ddp_script(cmd: list[str], env: dict[str, str], timeout: float, **kwargs):
    """:func:`run_bounded` for a script that starts Lightning's DDP itself, without a launcher's variables in its
    environment (said on stderr when there were any). Once, when rank 0 timed out waiting for the other ranks to join
    (CI, under load: rank 1 printed nothing, 3 of ~42 runs), or gloo lost a peer while the ranks set up, before any
    trained (CI, stop 95: rank 1's first broadcast read "Connection reset by peer" from rank 0, once in ~60 suites;
    torch's own gloo tests see it too, pytorch/pytorch#53270), the script is run again on a new port; a second such
    failure, and any other failure, is the test's. The retry is said on stderr, with each rank's last line."""
    import sys

    from conftest import _listening_port_outside_ephemeral_range

    # a launcher's variables in the environment make Lightning take the script for one rank of an external launch
    # (LightningEnvironment.creates_processes_externally: "LOCAL_RANK" in os.environ), so it starts no other rank and
    # rank 0 waits for them in the rendezvous: the symptom CI showed (rank 1 printed nothing, twice on new ports)
    inherited = {k: v for k, v in sorted(env.items()) if k in EXTERNAL_LAUNCH_VARS or k.startswith(LAUNCH_PREFIXES)}
    if inherited:
        print(f"run_ddp_script: removed a launcher's variables from the environment: {inherited}", file=sys.stderr)
        env = {k: v for k, v in env.items() if k not in inherited}
    result = run_bounded(cmd, timeout=timeout, env=env, **kwargs)
    if result.returncode == 0:
        return result
    if any(frame in result.stderr for frame in RENDEZVOUS_FRAMES):
        why = f"rank 0 timed out waiting for the other ranks to join on port {env.get('MASTER_PORT')}"
    elif _lost_a_peer_while_setting_up(result.stderr):
        why = "gloo lost a peer while the ranks set up, before any trained"
    else:
        why = ""
    if why:
        print(
            f"{why}; running again on a new port. Each rank's last line:\n{rank_errors(result.stderr)}\n"
            f"The first run's stderr:\n{result.stderr[-4000:]}",
            file=sys.stderr,
        )
        env = {**env, "MASTER_PORT": str(_listening_port_outside_ephemeral_range())}
        result = run_bounded(cmd, timeout=timeout, env=env, **kwargs)
    return result


BOOT_URI = re.compile(r"URI=\$\(printf '%s' '([A-Za-z0-9+/=]+)' \| base64 -d\)")


def boot_script(user_data: str, s3) -> str:
    """The boot script a fleet's user_data (the module's first stage, templates/boot.sh.tftpl) fetches: read from the
    bucket with ``s3`` (a boto3 client), its sha256 checked as the first stage checks it."""
    match = BOOT_URI.search(user_data)
    assert match, user_data[:500]
    bucket, _, key = base64.b64decode(match.group(1)).decode().removeprefix("s3://").partition("/")
    text = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    assert hashlib.sha256(text.encode()).hexdigest() in user_data
    return text


# torch's gloo teardown can abort a rank after its work is done (std::terminate from a worker thread as the process
# exits: pytorch/pytorch#190489, and the atexit fix proposed and withdrawn in #179291). CI saw it once in ~80 runs
# (stop 77: an FSDP leg's rank 0 exited -6 after "`Trainer.fit` stopped: `max_steps=12` reached", its
# destroy_process_group() already called); never reproduced here (24 legs under a CPU hog).
TEARDOWN_ABORT = "terminate called without an active exception"
# what a test script's rank prints when its work is written, before it tears the process group down ("... rank 0")
DONE = "srifty-leg: done rank"


def ended_after_its_work(returncode: int, log: str) -> bool:
    """Whether a run's exit is a success: 0, or torch's teardown abort (SIGABRT, with its message) after the script's
    rank 0, whose exit ``returncode`` is (Lightning starts the other ranks from it), said its work was written
    (:data:`DONE`; every rank writes to the one log, so another rank's line does not count). The callers' tests check
    everything the run wrote besides; the abort is said on stderr."""
    import signal
    import sys

    if returncode == 0:
        return True
    ended = log.rfind(f"{DONE} 0\n")
    if returncode in (-signal.SIGABRT, 128 + signal.SIGABRT) and ended >= 0 and log.rfind(TEARDOWN_ABORT) > ended:
        print(f"torch's teardown aborted the run after its work (exit {returncode}): taken as done", file=sys.stderr)
        return True
    return False


# torchrun's report when its one local process died of SIGABRT (elastic/multiprocessing/errors: the root cause first,
# "<NO_OTHER_FAILURES>" when it is the only one); the agent itself then exits 1 (its ChildFailedError)
TORCHRUN_ROOT_ABORT = re.compile(
    r"Root Cause \(first observed failure\):\s*\[0\]:.*?rank\s*: (\d+) \(local_rank: \d+\)"
    r"\s*exitcode\s*: -6 \(pid",
    re.S,
)


def agent_ended_after_its_work(returncode: int, log: str) -> bool:
    """Whether a torchrun agent of one process per node (its output in ``log``) ended after its work: exit 0, or exit
    1 with torch's report naming one failure only, its process's SIGABRT, and the log saying torch's teardown abort
    (:data:`TEARDOWN_ABORT`) after that process's rank said its work was written (:data:`DONE`): the abort of
    :func:`ended_after_its_work`, seen through the agent (stop 80's clean-clone CI, a two-node FSDP leg)."""
    if returncode == 0:
        return True
    root = TORCHRUN_ROOT_ABORT.search(log)
    if returncode != 1 or root is None or "<NO_OTHER_FAILURES>" not in log:
        return False
    ended = log.rfind(f"{DONE} {root.group(1)}\n")
    if ended >= 0 and log.rfind(TEARDOWN_ABORT) > ended:
        print(
            f"torch's teardown aborted rank {root.group(1)} after its work (its agent exit 1): taken as done",
            file=sys.stderr,
        )
        return True
    return False


def run_nodes(out: Path, nodes: list[tuple[list[str], dict[str, str]]], timeout_s: float = 300) -> None:
    """Start each node's command (a torchrun agent: its argv and environment) 2 s after the previous one, as a fleet's
    nodes never boot together, its output in ``out/node<i>.log``; wait for all, kill what a timeout leaves running,
    and fail with a node's log tail when it did not end after its work (:func:`agent_ended_after_its_work`)."""
    agents = []
    for i, (argv, env) in enumerate(nodes):
        if i:
            time.sleep(2)
        with (out / f"node{i}.log").open("w") as log:  # the agent writes through its own copy
            agents.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [agent.wait(timeout=timeout_s) for agent in agents]
    finally:
        for agent in agents:  # only after a timeout: nothing of the test is left running
            if agent.poll() is None:
                agent.kill()
    for i, rc in enumerate(codes):
        log = (out / f"node{i}.log").read_text()
        assert agent_ended_after_its_work(rc, log), f"node {i}: exit {rc}\n{log[-4000:]}"

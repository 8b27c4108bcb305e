"""Test configuration: no test reaches a real cloud endpoint; environment changes are undone."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _support import ROOT  # re-exported: tests do `from conftest import ROOT`

# the suite's jobs train on the CPU on purpose: on a machine with GPUs, a job srifty started with a Trainer pinned to
# the CPU is stopped (launch_checks.refuse_idle_gpus); tests of that take this away themselves
os.environ.setdefault("SRIFTY_ALLOW_CPU", "1")

# terraform and the AWS provider it starts (about 275 starts a suite run) are Go programs that allocate fast while they
# decode the provider's schema; with Go's collector at GOGC=400 (its default 100) a terraform run takes 20 % less CPU
# for 44 MB more memory (`python bench/terraform_gc.py`). The suite is CPU-bound on 2 cores; nothing else changes.
os.environ.setdefault("GOGC", "400")

# What makes a test slow whatever its module: a real external process that takes seconds. Tests using these are
# marked ``slow`` here, so that new ones land in the right tier without a second mark.
SLOW_FIXTURES = {
    "tf_env": "the real terraform CLI (init, plan, apply)",
    "moto_endpoint": "moto's server in its own process",
}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): one worker more than the machine's cores. A third of the suite's work is
    terraform and moto, whose AWS provider sleeps through fixed waits (an instance profile's propagation, a launch
    template's) while a core idles: on 2 cores the suite used 155 % of 200 % CPU with 2 workers, 162-178 % with 3,
    and ran in 12 min 28 s and 10 min 42 s to 11 min 50 s (BENCHMARKS.md, "CI's time"). On more than 4 cores the
    waits are covered already: one worker per core, as xdist's own ``auto``. ``-n N`` on the command line still
    wins."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 1 if cores <= 4 else cores


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` on every ``ddp`` test (real multi-process runs) and every test using a fixture of SLOW_FIXTURES; the
    fast tier for the edit loop, ``-m 'not slow'``, leaves them out."""
    for item in items:
        if item.get_closest_marker("slow"):
            continue
        if item.get_closest_marker("ddp") or SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _lock_dir(config: pytest.Config) -> Path:
    """A folder every xdist worker of this run shares (the run's id names it; the controller's pid outside xdist)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"srifty-pytest-{run}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def _exclusive_when_timed(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``exclusive`` compares a wall-clock measurement with a prediction, so it runs with no other test
    of the run on the machine's cores: it holds ``run.lock`` exclusively while every other test holds it shared. The
    ``gate`` lock gives the exclusive test precedence (no new shared holder starts while one waits), so it never waits
    for more than the tests already running to end."""
    folder = _lock_dir(request.config)
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(folder / "gate", "a") as gate, open(folder / "run.lock", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(run, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _no_launcher_variables_left() -> Iterator[None]:
    """Each test leaves a launcher's variables (LOCAL_RANK, NODE_RANK, MASTER_ADDR, ...) and the AWS endpoint a
    command sets for its process (``srifty launch --aws-endpoint`` writes ``AWS_ENDPOINT_URL``) in this worker's
    environment as it found them.

    A DDP fit in the test's own process sets the launcher's (Lightning's ``_call_children_scripts`` writes
    ``os.environ`` even for one process: CI caught test_plan_glue's srifty_auto fits doing it), and a DDP script the
    worker starts later inherits them: with LOCAL_RANK set Lightning takes it for one rank of an external launch,
    starts no other, and rank 0 waits in the rendezvous until it times out. An endpoint left behind sent every later
    terraform plan of the worker to a closed port, where the AWS provider retried each call for about 25 s (a test of
    six plans took 147 s in CI instead of 18)."""
    from _support import EXTERNAL_LAUNCH_VARS

    keys = EXTERNAL_LAUNCH_VARS | {"MASTER_PORT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"}
    before = {k: os.environ.get(k) for k in keys}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "s3fs" in sys.modules:
        # fsspec caches an s3fs instance per set of options, not per environment: one that Lightning made for a
        # plain s3:// path (no options) under this test's moto would send the next test's calls to a closed port
        sys.modules["s3fs"].S3FileSystem.clear_instance_cache()


# A suite started in the background (``cmd &`` in a non-interactive shell, as a CI script or ``nohup ... &`` starts
# it) has SIGINT ignored (POSIX, Shell Command Language 2.9.3: an asynchronous list's commands ignore SIGINT and
# SIGQUIT), and every process it starts inherits that through exec. The product does not care (terraform, a Go
# program, and srifty, through its own handlers, take SIGINT back), but a stand-in terraform written in bash cannot
# trap a signal it was started ignoring: four tests of Ctrl-C's path failed in a suite started with ``nohup ... &``.
# The worker takes Python's own handler back, as if started from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _signal_dispositions_restored() -> Iterator[None]:
    """Each test leaves this worker's SIGINT, SIGTERM and SIGHUP handlers as it found them: a Lightning fit that
    ends by an exception (the suite's refusals, preemptions and failed resumes) leaves its SIGTERM handler installed
    (``_HandlersCompose``, holding the trainer), and a fit that meets a KeyboardInterrupt ignores SIGINT for the rest
    of the process (``lightning.pytorch.trainer.call._call_and_handle_interrupt``), which every process the worker
    starts later would inherit."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _no_exit_mark_armed() -> Iterator[None]:
    """A fit in the worker's own process on a fleet node's folder (SRIFTY_NODE_STATE) arms the process's exit mark
    (lightning_srifty.migrate.exit_mark, written at exit): each test leaves it disarmed, as a later one expects and so
    that the worker's own exit writes nothing into a test's folder."""
    from lightning_srifty.migrate import exit_mark

    exit_mark.disarm()
    yield
    exit_mark.disarm()


@pytest.fixture(autouse=True)
def _offline_aws(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Fake credentials, no instance-metadata lookups unless a test points them at its own server, and a private
    catalog cache (a user's refreshed copies never leak into a test)."""
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path_factory.mktemp("srifty-cache")))
    monkeypatch.delenv("SRIFTY_CATALOG_EXTRA", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes: the repo importable, metadata lookups off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.pop("AWS_EC2_METADATA_SERVICE_ENDPOINT", None)
    return env


def _listening_port_outside_ephemeral_range() -> int:
    """A free port below Linux's ephemeral range (32768-60999). Lightning's own choice binds port 0 and closes it,
    and rank 0 listens there seconds later; in the suite, the other worker's outgoing connections (terraform and
    boto3 against moto) draw from the ephemeral range, and one took such a port twice in a CI run (EADDRINUSE). A port
    below the range is never handed out for an outgoing connection."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-31999")


@pytest.fixture
def ddp_env(subprocess_env) -> dict[str, str]:
    """``subprocess_env`` for a script that starts Lightning's DDP itself (one launch at a time), with a port."""
    return {**subprocess_env, "MASTER_PORT": str(_listening_port_outside_ephemeral_range())}


@pytest.fixture(scope="session")
def catalog():
    from predictor.catalog import Catalog

    return Catalog.load(use_refreshed=False, use_env=False)


@contextlib.contextmanager
def moto_server(s3_by_iam_action: bool = True) -> Iterator[str]:
    """moto's server in its own process on a free port of 127.0.0.1 (AWS managed IAM policies loaded): its URL. S3
    requests are authorized by their IAM action, as AWS does (moto 5.2.6 checks the operation's name instead: the
    rehearsal's ``moto_server.authorize_s3_by_iam_action``) and a copied image keeps its snapshots' encryption
    (``moto_server.keep_image_encryption``); ``s3_by_iam_action=False``: moto's own server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true"}
    serve = (
        "from lightning_srifty.provision.rehearsal import moto_server as m; m.authorize_s3_by_iam_action(); "
        "m.keep_image_encryption(); m.serve()"
    )
    command = [sys.executable, "-c", serve] if s3_by_iam_action else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*command, "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        proc.wait(timeout=10)
        pytest.fail("moto's server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # a loaded machine (a CI run on a slow VM, 2026-11-30): the server had not handled SIGTERM in 10 s, the
            # teardown errored and the still-running Popen's warning failed whichever test came next on that worker
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def moto_endpoint():
    """moto's server for one test (see :func:`moto_server`)."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws_rules(moto_endpoint):
    """``moto_endpoint`` behind the proxy that keeps real AWS's rules moto does not (tests/fault_proxy.py): the proxy,
    whose ``url`` is the endpoint to give terraform. A test whose fleet terraform may update in place (a second apply,
    an apply retried after a transient error) needs it: moto alone drops an Auto Scaling group's mixed instances
    policy on such an update."""
    from fault_proxy import FaultProxy

    proxy = FaultProxy(moto_endpoint)
    with proxy:
        yield proxy


@pytest.fixture(scope="session")
def checkov() -> str:
    """The checkov executable, in its own venv (checkov pins an older boto3 than ours): $SRIFTY_CHECKOV, else one on
    PATH, else the venv bench/checkov_scan.py makes. .ci/run installs it and sets SRIFTY_CHECKOV; under CI=true a
    missing checkov fails the test instead of skipping it. No test installs anything."""
    explicit = os.environ.get("SRIFTY_CHECKOV")
    if explicit:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            pytest.fail(f"SRIFTY_CHECKOV={explicit} is not an executable file")
        return explicit
    bench_venv = Path.home() / ".cache" / "srifty" / "checkov-venv" / "bin" / "checkov"
    found = shutil.which("checkov") or (str(bench_venv) if bench_venv.is_file() else None)
    if found:
        return found
    reason = (
        "checkov not found: set SRIFTY_CHECKOV to a checkov in its own venv, as .ci/run does "
        "(python3 -m venv /tmp/srifty-checkov && /tmp/srifty-checkov/bin/pip install checkov)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI=true, so this is a failure, not a skip")
    pytest.skip(reason)


# ---------------------------------------------------------------------------------------------------------------------
# The real terraform CLI, offline (the AWS provider from a filesystem mirror)
# ---------------------------------------------------------------------------------------------------------------------


def _mirror() -> Path | None:
    env = os.environ.get("SRIFTY_TF_PLUGIN_MIRROR")
    candidates = [Path(env)] if env else [Path("/opt/tf-plugins"), Path("/tf-plugins"), Path("/usr/share/tf-plugins")]
    return next((p for p in candidates if (p / "registry.terraform.io" / "hashicorp" / "aws").is_dir()), None)


def write_terraformrc(folder: Path) -> Path | None:
    """A terraform CLI configuration in ``folder`` that installs the AWS provider from the offline mirror (None when
    there is no terraform or no mirror)."""
    mirror = _mirror()
    if shutil.which("terraform") is None or mirror is None:
        return None
    config = folder / "terraformrc"
    config.write_text(
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path = "{mirror}"\n    include = ["registry.terraform.io/hashicorp/aws"]\n  }}\n'
        '  direct {\n    exclude = ["registry.terraform.io/hashicorp/aws"]\n  }\n}\n'
    )
    return config


@pytest.fixture
def tf_env(tmp_path, monkeypatch) -> dict[str, str]:
    config = write_terraformrc(tmp_path)
    if config is None:
        pytest.skip(
            "needs the terraform CLI and a filesystem mirror of the AWS provider (SRIFTY_TF_PLUGIN_MIRROR); "
            "terraform cannot init offline"
        )
    env = {"TF_CLI_CONFIG_FILE": str(config), "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **env}


def tf_run(env: dict[str, str], folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["terraform", f"-chdir={folder}", *args], env=env, capture_output=True, text=True, timeout=300
    )

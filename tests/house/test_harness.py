"""The test harness's own rules, where a wrong one would hide a failure (tests/_support.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from _support import DONE, TEARDOWN_ABORT, agent_ended_after_its_work, ended_after_its_work

FIT = "`Trainer.fit` stopped: `max_steps=12` reached.\n"


@pytest.mark.parametrize(
    ("code", "log", "ok"),
    [
        (0, "", True),
        (-signal.SIGABRT, f"{FIT}{DONE} 1\n{DONE} 0\n{TEARDOWN_ABORT}\n", True),  # stop 77's leg: work written, abort
        (134, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", True),  # the same through a shell
        (-signal.SIGABRT, f"{FIT}{TEARDOWN_ABORT}\n", False),  # aborted before the script said its work was written
        (-signal.SIGABRT, f"{TEARDOWN_ABORT}\n{DONE} 0\n", False),  # the message before rank 0's line: not after it
        (-signal.SIGABRT, f"{FIT}{DONE} 1\n{TEARDOWN_ABORT}\n", False),  # rank 1 done, rank 0 (the exit) not
        (-signal.SIGABRT, f"{FIT}{DONE} 10\n{TEARDOWN_ABORT}\n", False),  # rank 10 is not rank 0
        (-signal.SIGABRT, f"{FIT}{DONE} 0\n", False),  # SIGABRT without torch's message: something else
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", False),  # an exit code of its own
        (-signal.SIGSEGV, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", False),
    ],
)
def test_only_torchs_teardown_abort_after_the_work_passes_as_done(code, log, ok) -> None:
    assert ended_after_its_work(code, log) is ok


def _report(rank: int = 0, code: int = -6, others: str = "  <NO_OTHER_FAILURES>") -> str:
    """torchrun's report as stop 80's CI printed it (a node's agent, one local process)."""
    return (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "========================================================\n"
        "tests/scripts/fsdp_migrate_run.py FAILED\n"
        "--------------------------------------------------------\n"
        f"Failures:\n{others}\n"
        "--------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2026-12-05_04:04:56\n"
        "  host      : localhost\n"
        f"  rank      : {rank} (local_rank: 0)\n"
        f"  exitcode  : {code} (pid: 10354)\n"
        "  error_file: <N/A>\n"
        "========================================================\n"
    )


@pytest.mark.parametrize(
    ("code", "log", "ok"),
    [
        (0, "", True),
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n{_report(0)}", True),  # stop 80's node 0: work written, then the abort
        (1, f"{FIT}{DONE} 1\n{TEARDOWN_ABORT}\n{_report(1)}", True),  # the other node holds rank 1
        (1, f"{FIT}{DONE} 1\n{TEARDOWN_ABORT}\n{_report(0)}", False),  # the report's rank never said it was done
        (1, f"{FIT}{TEARDOWN_ABORT}\n{_report(0)}", False),  # aborted before its work was written
        (1, f"{FIT}{DONE} 0\n{_report(0)}", False),  # SIGABRT without torch's message
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n{_report(0, code=1)}", False),  # the process's own exit code
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n{_report(0, code=-11)}", False),  # a segfault
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n{_report(0, others='  [1]:')}", False),  # another failure besides
        (2, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n{_report(0)}", False),  # the agent's exit is not ChildFailedError's
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", False),  # no report: the agent failed some other way
    ],
)
def test_a_torchrun_agent_passes_as_done_only_after_its_processs_teardown_abort(code, log, ok) -> None:
    assert agent_ended_after_its_work(code, log) is ok


def test_a_boot_script_past_its_time_is_killed_with_everything_of_its_own(tmp_path) -> None:
    import subprocess

    from _fleet import _left_behind, run_boot

    (tmp_path / "boot.sh").write_text("( sleep 60 ) &\nsleep 60 &\nsleep 60\n")
    env = {**os.environ, "SRIFTY_STATE_DIR": str(tmp_path / "state")}
    with pytest.raises(subprocess.TimeoutExpired):
        run_boot(["bash", str(tmp_path / "boot.sh")], cwd=tmp_path, env=env, timeout=1)
    assert not _left_behind(str(tmp_path / "state").encode())


def test_the_boot_scripts_kill_tree_kills_its_own_jobs_tree_and_nothing_else(tmp_path) -> None:
    """``kill_tree`` (the template's, its text as bash gets it): a job of the script is killed with its children's
    children (a copy's ``timeout``, its ``aws``, a nap); a process that is not the script's child (a number reused
    since its own job ended) is left alone."""
    import subprocess

    from _fleet import MODULE

    template = (MODULE / "templates" / "user_data.sh.tftpl").read_text()
    (function,) = re.findall(r"^kill_tree\(\) \{\n.*?^\}\n", template, flags=re.M | re.S)
    script = function.replace("$${", "${") + (
        "( ( sleep 30; true ) & sleep 30; true ) &\nJOB=$!\n"  # a job, its nap, and a subshell with its own
        "inner() { pgrep -P $JOB -x bash; }\n"
        'until [ "$(pgrep -P $JOB | wc -l)" = 2 ] && pgrep -P "$(inner)" >/dev/null; do sleep 0.05; done\n'
        'TREE="$JOB $(pgrep -P $JOB) $(pgrep -P "$(inner)")"\n'
        "STRANGER=$(bash -c 'sleep 30 >/dev/null & echo $!')\n"  # its parent another shell, then init: not ours
        "kill_tree $STRANGER; kill_tree $JOB; wait $JOB 2>/dev/null\n"
        # a zombie is dead (this container's init may never reap the orphans)
        "alive() { local st; st=$(sed 's/.*) //' /proc/$1/stat 2>/dev/null | cut -c1); "
        '[ -n "$st" ] && [ "$st" != Z ]; }\n'
        'for p in $TREE; do alive $p && echo "alive $p"; done; true\n'
        "alive $STRANGER && echo stranger-alive; kill $STRANGER\n"
    )
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.split() == ["stranger-alive"], (run.stdout, run.stderr)


NAPPING = "until pgrep -P $W -x sleep >/dev/null; do sleep 0.05; done\n"  # the watch is in its nap (never before)


@pytest.mark.parametrize(
    ("script", "left"),
    [
        ("echo ready\n", False),
        ("sleep 30 &\necho ready\n", True),  # a nap the script never stopped: its own, left running
        (
            "( trap 'kill $(jobs -p); exit 0' TERM; while :; do sleep 30 & wait $!; done ) &\nW=$!\n"
            + NAPPING
            + "kill $W; wait $W\n",
            False,
        ),  # a watch stopped with its nap (the boot script's peer and stall watches)
        ("( while :; do sleep 30; done ) &\nW=$!\n" + NAPPING + "kill $W; wait $W\n", True),  # stopped, its nap not
        ("setsid nohup sleep 30 >/dev/null 2>&1 </dev/null &\necho ready\n", False),  # a session of its own: the
        # watchdog's, which end_watchdogs ends
    ],
    ids=["nothing", "a-nap-left", "a-watch-stopped-with-its-nap", "a-watch-stopped-without-its-nap", "setsid"],
)
def test_a_boot_script_that_leaves_a_process_of_its_own_behind_fails(tmp_path, script, left) -> None:
    """``_fleet.run_boot``, through which every boot-script test runs: a process of the script's session that
    outlives it fails the test (a watch's nap left running held the log's tee, and the captured output, open)."""
    import subprocess

    from _fleet import _left_behind, run_boot

    (tmp_path / "boot.sh").write_text(script)
    env = {**os.environ, "SRIFTY_STATE_DIR": str(tmp_path / "state")}
    try:
        if left:
            with pytest.raises(AssertionError, match=r"left 1 process\(es\) of its own running after its exit"):
                run_boot(["bash", str(tmp_path / "boot.sh")], cwd=tmp_path, env=env, timeout=20)
        else:
            run = run_boot(["bash", str(tmp_path / "boot.sh")], cwd=tmp_path, env=env, timeout=20)
            assert run.returncode == 0 and isinstance(run, subprocess.CompletedProcess)
        assert not _left_behind(str(tmp_path / "state").encode())  # killed by the harness when found
    finally:  # whatever the outcome, nothing of this case's left running (the setsid case's sleep: its own session)
        mine = f"SRIFTY_STATE_DIR={tmp_path / 'state'}".encode()
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if proc.name.isdigit() and mine in (proc / "environ").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)

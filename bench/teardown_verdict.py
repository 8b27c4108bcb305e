"""How a node reads a job that ended each way: real 2-rank Lightning DDP fits (gloo) under the real torchrun.

Each case trains ``tests/scripts/exit_mark_job.py``'s model under ``torch.distributed.run --standalone
--nproc_per_node 2`` with a node state folder (``SRIFTY_NODE_STATE``), then ends as its name says; the node's verdict
is the module's own (the ``finished_then_died`` reader, taken from ``templates/user_data.sh.tftpl``), run on what
torchrun wrote. A row: torchrun's exit, the ranks' exit marks, what torchrun's failure table says, the verdict, the
verdict's time, and torchrun's whole run (a rank that outlives its peer's failure is SIGKILLed 30 s after it). Then
the reader's time on a large log (it reads the last 256 KiB).

    python bench/teardown_verdict.py [--log-mb 100]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "terraform" / "modules" / "training_fleet" / "templates" / "user_data.sh.tftpl"

# the worker: a 2-rank DDP fit of 4 steps, then the ending (EXIT_HOW, EXIT_RANK: which rank)
WORKER = """import atexit, os, signal, sys, time
how, rank = os.environ["EXIT_HOW"], int(os.environ["RANK"])
me = rank == int(os.environ.get("EXIT_RANK", "0"))
# before lightning_srifty's import, so run after the mark's (atexit is last in, first out): as torch's teardown, after
# every handler
if me and how == "abort at exit":
    atexit.register(os.abort)
if me and how == "segfault at exit":
    atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))
state = os.environ["SRIFTY_NODE_STATE"]
def abort_once_the_peer_uploads():  # stop 79's race: torchrun SIGTERMs the peer in its exit handlers
    while not os.path.exists(os.path.join(state, "in-exit")):
        time.sleep(0.05)
    os.abort()
def upload():  # a logger's final upload (registered before the fit ended, as a logger's is)
    open(os.path.join(state, "in-exit"), "w").close()
    time.sleep(3)
uploading = how.startswith("abort at exit, the peer uploading")
if me and uploading:
    atexit.register(abort_once_the_peer_uploads)
if not me and how == "abort at exit, the peer uploading, its teardown hanging":
    atexit.register(time.sleep, 60)  # after its mark: a teardown that hangs (the SIGTERM held through the upload)
sys.path.insert(0, {tests!r})
from helpers import TinyModel, loader, trainer
from lightning_srifty.migrate.preemption import SpotPreemption
class Failing(TinyModel):
    def training_step(self, batch, batch_idx):
        if me and how == "fit raises" and batch_idx == 2:
            raise RuntimeError("a step that fails")
        return super().training_step(batch, batch_idx)
if not me and uploading:
    atexit.register(upload)
cb = SpotPreemption(dirpath=os.environ["EXIT_CKPT"])  # as every Trainer on a fleet gets it
t = trainer(max_steps=4, callbacks=[cb], strategy="ddp", devices=2, accelerator="cpu")
t.fit(Failing(), loader())
if me and how == "raise after the fit":
    raise RuntimeError("an export after the fit that fails")
if me and how == "sys.exit(3) after the fit":
    sys.exit(3)
"""

CASES = [
    "clean",
    "abort at exit",
    "abort at exit, the peer uploading",
    "abort at exit, the peer uploading, its teardown hanging",
    "segfault at exit",
    "sys.exit(3) after the fit",
    "raise after the fit",
    "fit raises",
]


def reader() -> str:
    """The module's ``finished_then_died`` Python, as the boot script runs it."""
    text = TEMPLATE.read_text()
    body = text[text.index("finished_then_died() {") :]
    return body[body.index("<<'PY'\n") + len("<<'PY'\n") : body.index("\nPY\n")]


def verdict(code: str, state: Path, log: Path) -> tuple[str, float]:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code, str(state), "2", str(log), "0"], capture_output=True, text=True)
    took = time.perf_counter() - started
    return (run.stdout.strip() if run.returncode == 0 else ""), took


def one(case: str, work: Path, code: str) -> dict:
    folder = work / re.sub(r"\W+", "-", case)
    state = folder / "state"
    state.mkdir(parents=True)
    (folder / "worker.py").write_text(WORKER.format(tests=str(ROOT / "tests")))
    env = {**os.environ, "SRIFTY_NODE_STATE": str(state), "EXIT_HOW": case, "EXIT_CKPT": str(folder / "ckpt")}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    log = folder / "job.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "worker.py"]
        rc = subprocess.run(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
    ran = time.monotonic() - started
    text = log.read_text(errors="replace")
    table = text[text.rfind("Failures:") :] if "Failures:" in text else ""
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", table)
    said, took = verdict(code, state, log) if rc != 0 else ("", 0.0)
    marks = sorted(p.name for p in state.glob("exit.*"))
    return {"case": case, "rc": rc, "marks": marks, "table": codes, "verdict": said, "verdict_s": took, "ran_s": ran}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-mb", type=int, default=100, help="the large log's size for the reader's time")
    args = p.parse_args()
    code = reader()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("| ending (rank 0) | torchrun | exit marks | failure table's exit codes | node's verdict | its time | "
              "torchrun's run |")  # fmt: skip
        print("|---|---|---|---|---|---|---:|")
        for case in CASES:
            r = one(case, work, code)
            finished = f"finished: {r['verdict']}" if r["verdict"] else ("finished (torchrun 0)" if r["rc"] == 0 else
                                                                           f"exit {r['rc']} stands")  # fmt: skip
            print(f"| {case} | {r['rc']} | {', '.join(r['marks']) or 'none'} | {', '.join(r['table']) or '-'} | "
                  f"{finished} | {r['verdict_s'] * 1000:.0f} ms | {r['ran_s']:.0f} s |", flush=True)  # fmt: skip
        big = work / "big.log"
        sample = (work / "abort-at-exit" / "job.log").read_bytes()
        line = b"[rank0]: Epoch 3: 100%|##########| 1000/1000 loss=0.123 Failures: not a table\n"
        with open(big, "wb") as f:
            for _ in range(args.log_mb * (1 << 20) // len(line)):
                f.write(line)
            f.write(sample)
        state = work / "abort-at-exit" / "state"
        times = sorted(verdict(code, state, big)[1] for _ in range(5))
        print(f"\nthe reader on a {big.stat().st_size / 1e6:.0f} MB log: median {times[2] * 1000:.0f} ms of 5 "
              f"({verdict(code, state, big)[0]})")  # fmt: skip


if __name__ == "__main__":
    main()

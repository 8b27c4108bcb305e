"""The hardening probe (issue #36): the kinds of probes the issue's tester ran, as a new user and as an attacker
would, counted the way the issue counts them.

    python bench/hardening_probe.py [--quick]

Every probe is one real `srifty` run (a subprocess, the installed entry point) or one HTTP request to a real
`srifty serve` on 127.0.0.1, in a folder of its own, with a time limit (30 s; a command that ends by it is a hang).
Each outcome is one of:

- **clear error**: exit 2 (1 for `check`) with at most 4 lines on stderr, no traceback, and (where the probe says
  which) naming the flag or field it is about; for the service, a 4xx/503 whose detail names what is wrong;
- **accepted**: exit 0 / 2xx, where the probe's input is one the product must take (valid edge cases: a name with
  a tab, a suffixless plot path, a resume-less first start) or must refuse (then it is a finding, listed);
- **traceback**: "Traceback (most recent call last)" in the output, a death by signal, or a 500;
- **hang**: the time limit reached;
- **data lost**: a file the probe guards (an input, a symlink's target, a file beside the output) changed;
- **left running**: a process of the probe's folder still alive after it ended.

Families: numbers (L7), documents that are not what they say (M6, L6, L7's YAML), outputs (M4, L1), AWS
credentials (L4), the service (M5, L5, L10 and the guard), checkpoints (M1, M3, L9). Prints a table by family and
writes bench/results/hardening_probe.json with every probe's command, outcome and first line of stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRIFTY = shutil.which("srifty") or str(Path(sys.executable).with_name("srifty"))
LIMIT_S = 30.0
TOKEN = "probe-token-" + "p" * 32
RESULTS = ROOT / "bench" / "results" / "hardening_probe.json"


@dataclass
class Probe:
    family: str
    name: str
    argv: list[str]
    must: str = "refuse"  # "refuse": a clear error is right; "accept": exit 0 is right
    names: str = ""  # a clear error must contain this (the flag or field)
    guard: list[Path] = field(default_factory=list)  # files that must not change
    env: dict[str, str | None] = field(default_factory=dict)  # None: removed
    stdin: bytes | None = None


def _digest(paths: list[Path]) -> list[Any]:
    out = []
    for p in paths:
        try:
            out.append((p.is_symlink(), p.read_bytes() if p.is_file() else None))
        except OSError:
            out.append(None)
    return out


def _left_running(marker: str) -> list[str]:
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            alive.append(f"{proc.name}: {cmd[:120]}")
    return alive


def run_cli(probe: Probe, cwd: Path) -> dict[str, Any]:
    before = _digest(probe.guard)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **probe.env, "SRIFTY_CACHE_DIR": str(cwd / "cache")}
    env = {k: v for k, v in env.items() if v is not None}
    started = time.monotonic()
    proc = subprocess.Popen(
        [SRIFTY, *probe.argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if probe.stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(probe.stdin, timeout=LIMIT_S)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    took = time.monotonic() - started
    text = (out + err).decode(errors="replace")
    lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
    if rc is None:
        outcome = "hang"
    elif "Traceback (most recent call last)" in text or rc < 0:
        outcome = "traceback"
    elif _digest(probe.guard) != before:
        outcome = "data lost"
    elif rc == 0:
        outcome = "accepted"
    elif rc in (1, 2) and 0 < len(lines) <= 4 and (not probe.names or probe.names in text):
        outcome = "clear error"
    else:
        outcome = "unclear error"
    time.sleep(0.05)
    alive = _left_running(str(cwd))
    if alive:
        outcome = "left running"
        for line in alive:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return {
        "family": probe.family,
        "name": probe.name,
        "argv": probe.argv,
        "rc": rc,
        "outcome": outcome,
        "right": outcome == ("clear error" if probe.must == "refuse" else "accepted"),
        "said": lines[-1][:300] if lines else "",
        "s": round(took, 2),
    }


# --------------------------------------------------------------------------------------------------------------------
# the probes
# --------------------------------------------------------------------------------------------------------------------


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def documents(work: Path) -> dict[str, Path]:
    """Valid inputs: a profile, its plan, a trace."""
    profile = _write(work / "in" / "profile.json", (ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())
    plan = work / "in" / "plan.json"
    subprocess.run(
        [SRIFTY, "recommend", "--profile", str(profile), "--steps", "20000", "--market", "spot", "--out", str(plan)],
        check=True,
        capture_output=True,
    )
    trace = _write(work / "in" / "trace.json", json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 200}))
    return {"profile": profile, "plan": plan, "trace": trace}


def bad_files(work: Path) -> dict[str, Path]:
    """Inputs that are not what they say (made once; read-only use)."""
    bad = work / "bad"
    bad.mkdir()
    os.mkfifo(bad / "fifo.json")
    (bad / "folder.json").mkdir()
    (bad / "loop.json").symlink_to(bad / "loop.json")
    files = {
        "fifo": bad / "fifo.json",
        "folder": bad / "folder.json",
        "missing": bad / "missing.json",
        "loop": bad / "loop.json",
        "dev-zero": Path("/dev/zero"),
        "empty": _write(bad / "empty.json", b""),
        "binary": _write(bad / "binary.json", bytes(range(256)) * 4),
        "not-utf8": _write(bad / "latin1.json", '{"schema": "caf\xe9"}'.encode("latin-1")),
        "deep": _write(bad / "deep.json", "[" * 100_000 + "]" * 100_000),
        "list": _write(bad / "list.json", "[1, 2, 3]"),
        "huge-int": _write(bad / "int.json", '{"schema": ' + "9" * 5000 + "}"),
        "nan": _write(bad / "nan.json", '{"schema": NaN}'),
        "big": _write(bad / "big.json", b'{"x": "' + b"a" * (70 << 20) + b'"}'),
    }
    profile = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())
    escape = json.loads(json.dumps(profile))
    escape["model"]["name"] = "x\x1b]0;PWN\x07"
    files["escape-name"] = _write(bad / "escape.json", json.dumps(escape))
    tiny = json.loads(json.dumps(profile))
    tiny["timing"]["step_time_s"] = {"p50": 1e-300, "p90": 1e-300}
    files["step-1e-300"] = _write(bad / "tiny-step.json", json.dumps(tiny))
    newer = json.loads(json.dumps(profile))
    newer["schema"] = "srifty.profile/v9"
    files["future-schema"] = _write(bad / "v9.json", json.dumps(newer))
    return files


def probes(work: Path, docs: dict[str, Path], bad: dict[str, Path], quick: bool) -> list[Probe]:
    p, plan, trace = str(docs["profile"]), str(docs["plan"]), str(docs["trace"])
    out: list[Probe] = []
    guard = [docs["profile"], docs["plan"], docs["trace"]]

    # numbers (L7): each flag with values that mean nothing
    numbers = {
        "--steps": ["0", "-1", "nan", "inf", "1e22", "abc", "1.5"],
        "--deadline": ["0", "-5", "nan", "inf", "5x", "1e30"],
        "--budget": ["0", "-1", "nan", "inf", "$5"],
        "--max-instances": ["0", "-1", "1e9", "x"],
        "--top": ["0", "-1", "x"],
    }
    for flag, values in numbers.items():
        for value in values[: 3 if quick else None]:
            argv = ["recommend", "--profile", p, "--steps", "1000", flag, value]
            if flag == "--steps":
                argv = ["recommend", "--profile", p, flag, value]
            out.append(Probe("numbers", f"recommend {flag} {value}", argv, names=flag.lstrip("-").split("-")[0]))
    for flag, value in [("--start-h", "-5"), ("--start-h", "nan"), ("--tick", "0"), ("--tick", "33"),
                        ("--choice", "-1"), ("--choice", "999"), ("--deadline", "0")]:  # fmt: skip
        out.append(
            Probe(
                "numbers",
                f"replay {flag} {value}",
                ["replay", "--plan", plan, "--trace", trace, "--deadline", "36h", flag, value],
                names=flag.lstrip("-").split("-")[0],
                guard=guard,
            )
        )
    for flag, value in [("--max-migrations", "-1"), ("--simulate-notice-after", "-5"), ("--heartbeat-s", "0"),
                        ("--max-life-h", "nan"), ("--max-hourly", "inf")]:  # fmt: skip
        out.append(Probe("numbers", f"launch {flag} {value}", ["launch", "--plan", plan, flag, value, "train.py"],
                         names=flag))  # fmt: skip
    for flag, value in [("--max-life-h", "0"), ("--root-volume-gb", "-1"), ("--max-instances", "0"),
                        ("--max-code-mb", "nan")]:  # fmt: skip
        out.append(Probe("numbers", f"terraform {flag} {value}",
                         ["terraform", "--plan", plan, "--out", str(work / "tf-num"), "--no-code", flag, value],
                         names=flag))  # fmt: skip
    out.append(Probe("numbers", "catalog show --region ../../x", ["catalog", "show", "--region", "../../x"],
                     names="region"))  # fmt: skip
    out.append(Probe("numbers", "profile step 1e-300 s", ["recommend", "--profile", str(bad["step-1e-300"]),
                     "--steps", "1000"], names="step_time_s"))  # fmt: skip
    yaml = _write(
        work / "in" / "extra.yaml",
        "instance_types:\n  - name: x1.big\n    gpu: A10G\n    gpus: 1\n    vcpus: 4\n"
        "    memory_gib: 16\n    network_gbps: 10\n    price_usd_hr: 1e300\n",
    )
    out.append(Probe("numbers", "YAML 1e300", ["--catalog-extra", str(yaml), "catalog", "show"], names="1.0e+300"))

    # documents that are not what they say (M6, L6): every reader
    readers = {
        "profile show": lambda f: ["profile", "show", f],
        "recommend --profile": lambda f: ["recommend", "--profile", f, "--steps", "1000"],
        "predict --profile": lambda f: ["predict", "--profile", f, "--fleet", "g5.xlarge:1"],
        "replay --plan": lambda f: ["replay", "--plan", f, "--trace", trace, "--deadline", "36h"],
        "replay --trace": lambda f: ["replay", "--plan", plan, "--trace", f, "--deadline", "36h"],
        "terraform --plan": lambda f: ["terraform", "--plan", f, "--out", str(work / "tf-doc"), "--no-code"],
        "eval --data": lambda f: ["eval", "--data", f],
        "--catalog-extra": lambda f: ["--catalog-extra", f, "catalog", "show"],
    }
    kinds = ["fifo", "folder", "missing", "loop", "dev-zero", "empty", "binary", "not-utf8", "deep", "list",
             "huge-int", "nan", "big", "escape-name", "future-schema"]  # fmt: skip
    for reader, argv in readers.items():
        for kind in kinds[: 6 if quick else None]:
            if kind in ("escape-name", "future-schema") and reader not in ("profile show", "recommend --profile"):
                continue
            accept = reader == "--catalog-extra" and kind == "empty"  # an empty overlay adds nothing (docs/catalog.md)
            out.append(
                Probe("documents", f"{reader} {kind}", argv(str(bad[kind])), must="accept" if accept else "refuse")
            )

    # outputs (M4, L1): never through a link, over a special file, or over the command's own input
    victims, links = [], {}
    for suffix in (".json", ".html", ".png"):  # each link to a victim of its own
        victims.append(_write(work / "out" / f"victim{suffix}.txt", "keep me"))
        links[suffix] = work / "out" / f"link{suffix}"
        links[suffix].symlink_to(victims[-1])
    replay = ["replay", "--plan", plan, "--trace", trace, "--deadline", "36h", "--policy", "srifty", "--plot"]
    capture = [
        "capture",
        "capture_models:TinyLM",
        "--batch",
        "capture_models:make_batch",
        "--batch-size",
        "2",
        "--out",
    ]  # fmt: skip; the tests' tiny LightningModule (tests/ on PYTHONPATH)
    writers = {  # the argv, the output's suffix, the command's own inputs
        "recommend --out": (["recommend", "--profile", p, "--steps", "1000", "--out"], ".json", {"the profile": p}),
        "recommend --report": (
            ["recommend", "--profile", p, "--steps", "1000", "--report"],
            ".html",
            {"the profile": p},
        ),
        "replay --plot": (replay, ".png", {"the plan": plan, "the trace": trace}),
        "eval --plot": (["eval", "--plot"], ".png", {}),
        "capture --out": (capture, ".json", {}),
    }
    for writer, (argv, suffix, inputs) in writers.items():
        if quick and writer in ("eval --plot", "capture --out"):
            continue
        targets = {
            "symlink": (str(links[suffix]), "symbolic link"),
            "folder": (str(work / "out"), "folder"),
            "fifo": (str(bad["fifo"]), "FIFO"),
            "/dev/null": ("/dev/null", "device"),
            "unwritable parent": (f"/proc/x/y{suffix}", "cannot write"),
            **{name: (path, "reads") for name, path in inputs.items()},
        }
        for target, (path, says) in targets.items():
            env = {"PYTHONPATH": str(ROOT / "tests")} if writer == "capture --out" else {}
            out.append(Probe("outputs", f"{writer} -> {target}", [*argv, path], names=says, env=env,
                             guard=[*victims, *links.values(), *guard]))  # fmt: skip
        if writer in ("replay --plot", "recommend --report"):
            out.append(Probe("outputs", f"{writer} -> suffixless", [*argv, str(work / "out" / "fresh")],
                             must="accept", guard=[*victims, *guard]))  # fmt: skip
    out.append(Probe("outputs", "recommend --out r.png --report r.html",
                     ["recommend", "--profile", p, "--steps", "1000", "--out", str(work / "out" / "r.png"), "--report",
                      str(work / "out" / "r.html")], names="same file"))  # fmt: skip

    # AWS credentials (L4): one line, the cause and the fix
    aws = {
        "AWS_PROFILE": "nope",
        "AWS_CONFIG_FILE": str(work / "nocfg"),
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "x"),
    }
    out.append(Probe("aws", "recommend --launchable, AWS_PROFILE=nope",
                     ["recommend", "--profile", p, "--steps", "1000", "--launchable"], env=aws,
                     names="AWS_PROFILE"))  # fmt: skip
    out.append(Probe("aws", "status, AWS_PROFILE=nope", ["status"], env=aws, names="AWS_PROFILE"))
    none = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_PROFILE": None,
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}  # fmt: skip
    out.append(Probe("aws", "status, no credentials", ["status", "--region", "us-east-1"], env=none,
                     names="credentials"))  # fmt: skip
    out.append(Probe("aws", "down without a root", ["down", "--dir", str(work / "no-root")], names="root module"))
    return out


# --------------------------------------------------------------------------------------------------------------------
# the service
# --------------------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, path: str, body: Any = None, token: str | None = None, raw: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int | None, str]:  # fmt: skip
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"content-type": "application/json", **(headers or {})}
    if token:
        h["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=data, headers=h, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=LIMIT_S) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except TimeoutError:
        return None, "timeout"
    except OSError as e:
        return -1, str(e)


def service_probes(work: Path, docs: dict[str, Path]) -> list[dict[str, Any]]:
    store = work / "svc" / "obs.sqlite"
    store.parent.mkdir()
    (work / "svc" / "token").write_text(TOKEN)
    os.chmod(work / "svc" / "token", 0o600)
    port = _free_port()
    proc = subprocess.Popen(
        [SRIFTY, "serve", "--port", str(port), "--observations", str(store), "--token-file",
         str(work / "svc" / "token"), "--max-connections", "32", "--read-timeout-s", "5", "--no-access-log"],
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while _request(url, "/healthz")[0] != 200:
        if time.monotonic() > deadline:
            raise SystemExit("srifty serve did not start")
        time.sleep(0.3)
    profile = json.loads(docs["profile"].read_text())
    obs = {"profile": profile, "fleet": "g5.xlarge:1", "throughput_samples_s": 100.0}
    results: list[dict[str, Any]] = []

    def probe(name: str, must: str, status: int | None, text: str) -> None:
        if status is None:
            outcome = "hang"
        elif status >= 500 and status != 503:
            outcome = "traceback"
        elif 200 <= status < 300:
            outcome = "accepted"
        else:
            outcome = "clear error" if '"msg"' in text else "unclear error"
        results.append({"family": "service", "name": name, "rc": status, "outcome": outcome,
                        "right": outcome == ("clear error" if must == "refuse" else "accepted"),
                        "said": text[:300]})  # fmt: skip

    probe("write without a token", "refuse", *_request(url, "/v1/observations", obs))
    probe("write with a wrong token", "refuse", *_request(url, "/v1/observations", obs, token="x" * 40))
    probe("deep JSON", "refuse", *_request(url, "/v1/rank", raw=b"[" * 50_000 + b"]" * 50_000))
    probe("not JSON", "refuse", *_request(url, "/v1/rank", raw=b"\xff\xfe{"))
    with socket.create_connection(("127.0.0.1", port), timeout=LIMIT_S) as raw:  # the head says 2 MiB; no body sent
        raw.sendall(f"POST /v1/rank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {2 << 20}\r\n\r\n".encode())  # fmt: skip
        chunks = []
        while chunk := raw.recv(65536):  # the guard closes the connection after its answer
            chunks.append(chunk)
        answer = b"".join(chunks).decode(errors="replace")
    probe("body over the limit", "refuse", int(answer.split()[1]) if answer.startswith("HTTP/") else None, answer)
    probe("foreign Host", "refuse", *_request(url, "/healthz", headers={"host": "evil.example"}))
    probe("escape in a model name", "refuse", *_request(url, "/v1/rank", {"profile": {**profile, "model": {
        **profile["model"], "name": "x\x1b]0;PWN\x07"}}, "constraints": {"steps": 1000}}))  # fmt: skip
    # M5: four posts under invented names (the service's token), then one run token four times: nothing moves
    before = json.loads(_request(url, "/v1/rank", {"profile": profile, "constraints": {"steps": 100000}})[1])
    for i in range(4):
        status, text = _request(url, "/v1/observations", {**obs, "throughput_samples_s": 1e5, "source": f"run-{i}"},
                                token=TOKEN)  # fmt: skip
        probe(f"M5 post under invented source run-{i}", "accept", status, text)
    status, text = _request(url, "/v1/runs", {}, token=TOKEN)
    probe("M5 issue a run", "accept", status, text)
    run_token = json.loads(text)["token"]
    for i in range(4):
        probe(f"M5 one run token, post {i + 1}", "accept",
              *_request(url, "/v1/observations", {**obs, "throughput_samples_s": 1e5}, token=run_token))  # fmt: skip
    probe("M5 a run token issues a run", "refuse", *_request(url, "/v1/runs", {}, token=run_token))
    head, run_id, expires, sig = run_token.split(".")
    probe("M5 a tampered run token", "refuse", *_request(url, "/v1/observations", obs,
                                                        token=f"{head}.{run_id}.{int(expires) + 9}.{sig}"))  # fmt: skip
    after = json.loads(_request(url, "/v1/rank", {"profile": profile, "constraints": {"steps": 100000}})[1])
    steered = before["entries"][0]["fleet"] != after["entries"][0]["fleet"] or "calibration" in after
    results.append({"family": "service", "name": "M5 the ranking after the eight posts", "rc": 200,
                    "outcome": "data lost" if steered else "accepted", "right": not steered,
                    "said": f"top pick {before['entries'][0]['fleet']} -> {after['entries'][0]['fleet']}"})  # fmt: skip
    # L10: idle connections up to the cap, then /healthz
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    started = time.monotonic()
    status, text = _request(url, "/healthz")
    probe(f"L10 /healthz beside 40 idle connections ({time.monotonic() - started:.1f} s)", "accept", status, text)
    for s in idle:
        s.close()
    # L5: the store deleted, then replaced by garbage, while the service runs
    store.unlink()
    probe("L5 post after the store was deleted", "accept", *_request(url, "/v1/observations", obs, token=TOKEN))
    store.write_bytes(b"not a database" * 100)
    for leftover in store.parent.glob("obs.sqlite-*"):
        leftover.unlink()
    status, text = _request(url, "/v1/observations", obs, token=TOKEN)
    probe("L5 post after the store was replaced", "refuse", 422 if status == 503 and '"msg"' in text else status, text)
    status, text = _request(url, "/v1/rank", {"profile": profile, "constraints": {"steps": 1000}})
    probe("L5 rank after the store was replaced", "refuse", 422 if status == 503 and '"msg"' in text else status, text)
    # the service ends on SIGTERM and leaves nothing
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=LIMIT_S)
        gone = not _left_running(str(store))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        gone = False
    results.append({"family": "service", "name": "SIGTERM ends srifty serve", "rc": proc.returncode,
                    "outcome": "accepted" if gone else "left running", "right": gone, "said": ""})  # fmt: skip
    return results


# --------------------------------------------------------------------------------------------------------------------
# checkpoints (M1, M3, L9): the resume's own vetting, in a process of its own
# --------------------------------------------------------------------------------------------------------------------

CHECKPOINT_PROBE = r"""
import json, os, sys, torch, hashlib, shutil
from lightning_srifty.migrate.checkpoints import find_checkpoint, vet_checkpoint
from lightning_srifty.store import filesystem
folder, kind = sys.argv[1], sys.argv[2]
os.makedirs(folder, exist_ok=True)
path = os.path.join(folder, "step=10.ckpt")
torch.save({"state_dict": {"w": torch.ones(4)}, "global_step": 10}, path)
digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
open(path + ".sha256", "w").write(digest + "  step=10.ckpt\n")
data = bytearray(open(path, "rb").read())
if kind == "flipped byte":
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
elif kind == "emptied digest, flipped byte":
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    open(path + ".sha256", "w").write("")
elif kind == "one-token digest":
    open(path + ".sha256", "w").write("abc")
elif kind == "truncated":
    open(path, "wb").write(bytes(data[:100]))
elif kind == "sound":
    pass
found = find_checkpoint(folder)
if found is not None:
    vet_checkpoint(filesystem(found), found)
print("resumed" if found else "refused")
"""


def checkpoint_probes(work: Path) -> list[dict[str, Any]]:
    results = []
    for kind, must in [("sound", "resumed"), ("flipped byte", "refused"), ("emptied digest, flipped byte", "refused"),
                       ("one-token digest", "refused"), ("truncated", "refused")]:  # fmt: skip
        folder = work / "ckpt" / kind.replace(" ", "-").replace(",", "")
        proc = subprocess.run([sys.executable, "-c", CHECKPOINT_PROBE, str(folder), kind], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        said = (proc.stdout.strip().splitlines() or [""])[-1]
        text = proc.stdout + proc.stderr
        if "Traceback" in text and "SriftyError" not in text and "Error:" in text and must == "resumed":
            outcome = "traceback"
        elif said == must or (must == "refused" and proc.returncode != 0 and "sha256" in text.lower()):
            outcome = "accepted" if must == "resumed" else "clear error"
        elif said == "resumed" and must == "refused":
            outcome = "data lost"  # a damaged checkpoint resumed
        else:
            outcome = "unclear error"
        results.append({"family": "checkpoints", "name": kind, "rc": proc.returncode, "outcome": outcome,
                        "right": outcome in ("accepted", "clear error"), "said": (proc.stderr.strip().splitlines()
                                                                               or [said])[-1][:300]})  # fmt: skip
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a third of the CLI probes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="srifty-probe-"))
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})  # fmt: skip
    docs = documents(work)
    bad = bad_files(work)
    todo = probes(work, docs, bad, args.quick)
    results = []
    started = time.monotonic()
    for i, probe in enumerate(todo, 1):
        cwd = work / "runs" / f"{i:03d}"
        cwd.mkdir(parents=True)
        results.append(run_cli(probe, cwd))
        if i % 25 == 0:
            print(f"  {i}/{len(todo)} CLI probes, {time.monotonic() - started:.0f} s", file=sys.stderr)
    results += service_probes(work, docs)
    results += checkpoint_probes(work)
    table: dict[str, Counter[str]] = {}
    for r in results:
        table.setdefault(r["family"], Counter())[r["outcome"]] += 1
    kinds = ["clear error", "accepted", "unclear error", "traceback", "hang", "data lost", "left running"]
    print(f"{'family':<12} {'probes':>6} " + " ".join(f"{k:>13}" for k in kinds))
    total: Counter[str] = Counter()
    for family, counts in table.items():
        total.update(counts)
        print(f"{family:<12} {sum(counts.values()):>6} " + " ".join(f"{counts[k]:>13}" for k in kinds))
    print(f"{'all':<12} {sum(total.values()):>6} " + " ".join(f"{total[k]:>13}" for k in kinds))
    wrong = [r for r in results if not r["right"]]
    print(f"\n{len(wrong)} probe(s) whose outcome is not the right one:")
    for r in wrong:
        print(f"  [{r['family']}] {r['name']}: {r['outcome']} (rc {r['rc']}): {r['said'][:160]}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"probes": results, "counts": dict(total), "wall_s": time.monotonic() - started},
                                  indent=1) + "\n")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    bad_kinds = total["traceback"] + total["hang"] + total["data lost"] + total["left running"]
    return 1 if bad_kinds else 0


if __name__ == "__main__":
    sys.exit(main())

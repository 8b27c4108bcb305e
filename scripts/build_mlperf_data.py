"""Build ``bench/data/mlperf_training.csv`` from MLCommons' published MLPerf Training results.

Source: a git mirror of one round's results repository (github.com/mlcommons/training_results_vX.Y, or a fork
that carries the round unchanged), read at the commit given on the command line; the commit is written into every
row. Nothing is fitted here: these rows are held-out validation data for the predictor.

Read, per round, with git (no work tree needed):

- ``[closed/|open/]<Submitter>/results/<system>/<benchmark>/result_N.txt``: the MLLOG lines of every run
  (``:::MLLOG {"key": ..., "value": ..., "time_ms": ..., "metadata": {...}}``) and, from v4.0 on, a ``:::SYSJSON``
  line;
- ``<Submitter>/systems/<system>.json``: accelerator model, accelerators per node, nodes, framework, division;
- ``<Submitter>/benchmarks/<benchmark>/implementations/*/config*.sh``: launch configs (batch sizes, FP8, CUDA
  graphs...), matched to a submission by node count, GPUs per node, batch size and name (see ``match_config``).

One output row per (round, submitter, system, benchmark) whose accelerator is of a GPU family EC2 sells (A100 40/80
GB SXM or PCIe, H100 SXM/PCIe/NVL, H200, L4, L40S, A10G, V100; ``ec2_family`` names the instance family when EC2 sells
that exact part). The runs of a submission are aggregated by median. How every
column is derived is in ``bench/data/mlperf_training.md``; only numbers from the logs are copied, never edited.

    python scripts/build_mlperf_data.py MIRROR_GIT_DIR --round v4.0 --commit <sha> \
        --repo mlcommons/training_results_v4.0 [--out bench/data/mlperf_training.csv]

Rows already in ``--out`` for the same round are replaced; rows of other rounds are kept. After the merge, rows whose
runs (the set of run_start timestamps) already appeared in an earlier row (an earlier round, or earlier in the same
round) get ``duplicate_of``: submitters republish earlier rounds' runs. ``--summary`` prints the counts by round x
benchmark x gpu of the merged CSV.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import json
import re
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "data" / "mlperf_training.csv"

COLUMNS = [
    "round",
    "repo",
    "upstream_repo",
    "commit",
    "path",
    "division",
    "submitter",
    "system",
    "system_json",
    "accelerator",
    "gpu",
    "ec2_family",
    "gpus_per_node",
    "nodes",
    "total_gpus",
    "framework",
    "framework_family",
    "framework_source",
    "pytorch_based",
    "log_code_file",
    "host_cpu",
    "interconnect",
    "benchmark",
    "benchmark_logged",
    "seq_len",
    "global_batch_size",
    "local_batch_size",
    "per_gpu_batch",
    "per_dp_rank_batch",
    "gradient_accumulation_steps",
    "tp",
    "pp",
    "cp",
    "dp",
    "precision",
    "fp8",
    "cuda_graphs",
    "packed_sequences",
    "dali",
    "transformer_engine",
    "fused_kernels",
    "dist_optimizer",
    "sharp_nvls",
    "config_file",
    "config_match",
    "runs",
    "runs_success",
    "train_samples_median",
    "train_samples_method",
    "epochs_median",
    "time_to_train_s_median",
    "time_to_train_s_min",
    "time_to_train_s_max",
    "throughput_samples_per_s_median",
    "throughput_source",
    "throughput_blocks_median",
    "derived_throughput_samples_per_s",
    "tracked_over_derived",
    "samples_per_s_per_gpu",
    "first_run_utc",
    "runs_signature",
    "duplicate_of",
]

# results <benchmark> dir -> canonical benchmark name (the brief's names; retinanet was called ssd until v4.1)
BENCH_ALIAS = {"ssd": "retinanet", "gnn": "rgat"}
SEQ_LEN = {"bert": 512, "gpt3": 2048, "llama2_70b_lora": 8192, "llama31_8b": 8192, "llama31_405b": 8192}
# training-set sizes used when the log's own train_samples is not the data-set size (see the .md)
DATASET = {
    "resnet": 1281167,  # ImageNet-1k train
    "retinanet": 1170301,  # MLPerf OpenImages subset train (the NVIDIA log's train_samples is iterations/epoch)
    "maskrcnn": 117266,  # COCO 2017 train (the NVIDIA log's train_samples 40000 is not the set size)
    "unet3d": 168,  # KiTS19 train cases
    "dlrm_dcnv2": 4195197692,  # Criteo 1TB multi-hot train
}

# accelerator model name (as the systems json writes it) -> (predictor gpu key, EC2 family selling that part)
EC2 = {
    "A100-SXM-40GB": "p4d",
    "A100-SXM-80GB": "p4de",
    "H100-SXM": "p5",
    "H200-SXM": "p5e/p5en",
    "L4": "g6/gr6",
    "L40S": "g6e",
    "A10G": "g5",
    "V100-SXM2-16GB": "p3",
    "V100-SXM2-32GB": "p3dn",
}


def gpu_key(name: str, mem_field: str = "") -> str:
    """Predictor gpu key for a systems-json accelerator name, '' if not one of the EC2 GPU families."""
    n = name.upper().replace(" ", "")
    mem = mem_field.upper().replace(" ", "")
    if any(x in n for x in ("GH200", "GB200", "B200", "B300", "BLACKWELL", "MI3", "GAUDI", "TPU")):
        return ""
    pcie = "PCI" in n
    if "A100" in n:
        gb = "40" if "40G" in n else "80" if "80G" in n else ("40" if "40" in mem else "80" if "80" in mem else "")
        return f"A100-{'PCIe' if pcie else 'SXM'}-{gb}GB" if gb else ""
    if "H100" in n:
        if "NVL" in n:
            return "H100-NVL"
        if pcie:
            return "H100-PCIe"
        return "H100-SXM-96GB" if "96G" in n else "H100-SXM"
    if "H200" in n:
        return "H200-NVL" if "NVL" in n else "H200-SXM"
    if "L40S" in n:
        return "L40S"
    if re.search(r"(^|[^0-9A-Z])L4($|[^0-9])", name.upper()) or n.endswith("L4"):
        return "L4"
    if "A10G" in n:
        return "A10G"
    if "V100" in n:
        gb = "32GB" if "32" in n or "32" in mem else "16GB"
        return f"V100-{'PCIe' if pcie else 'SXM2'}-{gb}"
    return ""


FAMILIES = (
    ("nemo", "NeMo"),
    ("megatron", "Megatron"),
    ("deepspeed", "DeepSpeed"),
    ("pytorch", "PyTorch"),
    ("torch", "PyTorch"),
    ("mxnet", "MXNet"),
    ("hugectr", "HugeCTR"),
    ("merlin", "HugeCTR"),
    ("dgl", "DGL"),
    ("jax", "JAX"),
    ("maxtext", "JAX"),
    ("maxdiffusion", "JAX"),
    ("tensorflow", "TensorFlow"),
    ("paddle", "Paddle"),
    ("tinygrad", "tinygrad"),
)
# the framework of NVIDIA's implementation of each benchmark (most submitters reuse it); last resort only
BENCH_FW = {
    "bert": "PyTorch",
    "resnet": "MXNet",
    "retinanet": "PyTorch",
    "unet3d": "MXNet",
    "maskrcnn": "PyTorch",
    "rnnt": "PyTorch",
    "dlrm_dcnv2": "HugeCTR",
    "rgat": "DGL",
    "gpt3": "NeMo",
    "llama2_70b_lora": "NeMo",
    "stable_diffusion": "NeMo",
    "llama31_8b": "NeMo",
    "llama31_405b": "NeMo",
    "flux1": "NeMo",
}
LLM = {"gpt3", "llama2_70b_lora", "llama31_8b", "llama31_405b", "stable_diffusion", "flux1"}
# frameworks that only ever ran some benchmarks (a systems json shared by several benchmarks may name one of them)
ONLY_FOR = {
    "DGL": {"rgat"},
    "HugeCTR": {"dlrm_dcnv2"},
    "MXNet": {"resnet", "unet3d"},
    "NeMo": LLM,
    "Megatron": LLM,
    "DeepSpeed": LLM,
}
PYTORCH_BASED = {
    "PyTorch": True,
    "NeMo": True,
    "Megatron": True,
    "DeepSpeed": True,
    "DGL": True,
    "MXNet": False,
    "HugeCTR": False,
    "JAX": False,
    "TensorFlow": False,
    "Paddle": False,
    "tinygrad": False,
}


def fams(s: str) -> list[str]:
    s = s.lower()
    out: list[str] = []
    for key, fam in FAMILIES:
        if key in s and fam not in out:
            out.append(fam)
    for wrapper in ("NeMo", "Megatron", "DeepSpeed"):  # PyTorch under a wrapper: keep the wrapper
        if wrapper in out and "PyTorch" in out:
            out.remove("PyTorch")
    return out


# the code path that logs run_start in NVIDIA's implementations (reused by most submitters) -> framework
LOG_PATH_FW = (
    ("/workspace/dlrm/", "HugeCTR"),
    ("/workspace/gnn/", "DGL"),
    ("/workspace/rgat/", "DGL"),
    ("/workspace/ft-llm/", "NeMo"),
    ("/workspace/llm/", "NeMo"),
    ("/workspace/sd/", "NeMo"),
    ("/workspace/image_classification/", "MXNet"),
    ("/workspace/bert/", "PyTorch"),
    ("/workspace/ssd/", "PyTorch"),
    ("maskrcnn", "PyTorch"),
)


def framework_family(
    fw: str, system: str, impl_dirs: list[str], cfg_impl: str, bench: str, log_file: str
) -> tuple[str, str]:
    """(family, how it was told). In order: the implementation directory of the matched config, the system
    directory's name, the code path that logged run_start when it is NVIDIA's implementation, the systems json
    (its framework field is often a list for all benchmarks of the system), the implementation directories of the
    benchmark, NVIDIA's framework for the benchmark. Families a benchmark never ran on are ignored."""

    def plausible(fs):
        return [f for f in fs if bench in ONLY_FOR.get(f, {bench})]

    listed = plausible(fams(fw))
    for how, s in (("implementation dir of the config", cfg_impl), ("system name", system)):
        g = plausible(fams(s))
        if len(g) == 1:
            return g[0], how
    for frag, fam in LOG_PATH_FW:
        if log_file and frag in log_file and plausible([fam]):
            return fam, "log code path (NVIDIA implementation)"
    if len(listed) == 1:
        return listed[0], "systems json"
    g = {tuple(plausible(fams(d))) for d in impl_dirs}
    if len(g) == 1 and len(next(iter(g))) == 1:
        return next(iter(g))[0], "implementation dir"
    d = BENCH_FW.get(bench)
    if d and (d in listed or not listed):
        return d, "NVIDIA's framework for the benchmark" + (" (one of the systems json's)" if listed else "")
    return "+".join(listed), "systems json lists several" if listed else ""


# ---------------------------------------------------------------------------------------------------- git access
class Git:
    def __init__(self, git_dir: str, commit: str):
        self.git_dir, self.commit = git_dir, commit
        out = subprocess.run(
            ["git", "--git-dir", git_dir, "ls-tree", "-r", "-l", commit], check=True, capture_output=True, text=True
        ).stdout
        self.blobs: dict[str, str] = {}
        self.missing: list[str] = []
        for line in out.splitlines():
            meta, path = line.split("\t", 1)
            parts = meta.split()
            if parts[1] == "blob":
                self.blobs[path] = parts[2]
        self._cat = subprocess.Popen(
            ["git", "--git-dir", git_dir, "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def read(self, path: str) -> str:
        sha = self.blobs[path]
        assert self._cat.stdin and self._cat.stdout
        self._cat.stdin.write(sha.encode() + b"\n")
        self._cat.stdin.flush()
        header = self._cat.stdout.readline().split()
        if len(header) < 3:  # blob absent from the mirror (its largest files may be listed but absent)
            self.missing.append(path)
            return ""
        data = self._cat.stdout.read(int(header[2]))
        self._cat.stdout.read(1)
        return data.decode("utf-8", "replace")


def load_json_lenient(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(re.sub(r",\s*([}\]])", r"\1", text))
    except ValueError:
        return {k: v for k, v in re.findall(r'"([^"]+)"\s*:\s*"([^"]*)"', text)}


# ------------------------------------------------------------------------------------------------- log parsing
KEYS = {
    "run_start",
    "run_stop",
    "global_batch_size",
    "d_batch_size",
    "local_batch_size",
    "gradient_accumulation_steps",
    "max_sequence_length",
    "train_samples",
    "trained_samples",
    "eval_accuracy",
    "tracked_stats",
    "throughput",
    "samples_per_epoch",
    "submission_benchmark",
    "submission_division",
    "submission_org",
    "submission_platform",
    "status",
}
KEY_RE = re.compile(r'"key":\s*"([^"]+)"')


def parse_log(text: str) -> dict:
    run: dict = {"evals": [], "tracked": [], "train_samples": [], "throughput": [], "sysjson": None}
    seen_tracked = set()
    for line in text.splitlines():
        if ":::SYSJSON" in line and run["sysjson"] is None:
            run["sysjson"] = load_json_lenient(line.split(":::SYSJSON", 1)[1].strip())
            continue
        i = line.find(":::MLLOG")
        if i < 0:
            continue
        m = KEY_RE.search(line, i)
        if not m or m.group(1) not in KEYS:
            continue
        try:
            rec = json.loads(line[i + 8 :].strip())
        except ValueError:
            continue
        k, v, t = rec.get("key"), rec.get("value"), rec.get("time_ms")
        md = rec.get("metadata") or {}
        if k == "run_start":
            run.setdefault("run_start", t)
            run.setdefault("run_start_file", md.get("file"))
        elif k == "run_stop":
            if "run_stop" not in run:
                run["run_stop"], run["status"], run["stop_md"] = t, md.get("status"), md
        elif k == "eval_accuracy":
            run["evals"].append((t, v, md))
        elif k == "tracked_stats":
            sig = (json.dumps(v, sort_keys=True), json.dumps(md, sort_keys=True))
            if sig not in seen_tracked and isinstance(v, dict):  # every rank may log the same line
                seen_tracked.add(sig)
                run["tracked"].append((t, v, md))
        elif k == "train_samples":
            run["train_samples"].append((t, v))
        elif k == "throughput":
            run["throughput"].append(v)
        else:
            run.setdefault(k, v)
    return run


def num(x):
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f


def samples_to_converge(
    bench: str, run: dict, seq_len: int | None, gbs: float | None = None
) -> tuple[float | None, float | None, str]:
    """(samples, epochs, method) of one run; see the per-benchmark notes in mlperf_training.md."""
    md = run.get("stop_md") or {}
    evals = [e for e in run["evals"] if run.get("run_start") is None or e[0] >= run["run_start"]]
    last_md = evals[-1][2] if evals else {}
    first_ts = num(run["train_samples"][0][1]) if run["train_samples"] else None
    last_ts = num(run["train_samples"][-1][1]) if run["train_samples"] else None
    if bench in ("gpt3",):
        tokens = num(run.get("trained_samples")) or (
            last_ts
            if run["train_samples"] and run.get("run_stop") and run["train_samples"][-1][0] >= run["run_stop"] - 1000
            else None
        )
        method = "trained tokens at run_stop / seq_len"
        if tokens is None and "epoch_num" in last_md:
            tokens, method = num(last_md["epoch_num"]), "last eval epoch_num (tokens) / seq_len"
        return (tokens / (seq_len or 2048) if tokens else None), None, method
    if "samples_count" in md and num(md["samples_count"]):
        return num(md["samples_count"]), None, "run_stop samples_count"
    if "samples_count" in last_md and num(last_md["samples_count"]):
        return num(last_md["samples_count"]), None, "last eval samples_count"
    for where, d in (("run_stop", md), ("last eval", last_md)):
        if num(d.get("step_num")) and gbs and bench == "stable_diffusion":
            return num(d["step_num"]) * gbs, None, f"{where} step_num x global_batch_size"
    if bench == "bert":
        if "epoch_num" in last_md:
            return num(last_md["epoch_num"]), None, "last eval epoch_num (samples)"
        if (
            last_ts is not None
            and len(run["train_samples"])
            and run["train_samples"][-1][0] >= (run.get("run_start") or 0)
        ):
            return last_ts, None, "train_samples at end"
        return None, None, ""
    ep = num(last_md.get("epoch_num")) if last_md else None
    if ep is None:
        ep = num(md.get("epoch_num")) if md.get("epoch_num") is not None else num(md.get("epoch"))
    if ep is None:
        return None, None, ""
    if bench == "unet3d":
        if ep > 20000:  # NVIDIA's unet3d counts epoch_num in samples (168 per epoch)
            return ep, ep / 168, "last eval epoch_num (samples)"
        return ep * 168, ep, "last eval epoch_num x 168"
    if bench in ("dlrm_dcnv2", "rgat"):
        size = first_ts or DATASET.get(bench)
        ep_stop = num(md.get("epoch_num"))
        e = ep_stop if ep_stop is not None else ep
        return (e * size if size else None), e, "run_stop epoch_num (fraction) x train_samples"
    size = DATASET.get(bench)
    if bench in ("rnnt",) or size is None:
        size = first_ts
    if bench == "resnet" and first_ts and abs(first_ts - 1281167) < 1000:
        size = first_ts
    return (ep * size if size else None), ep, f"last eval epoch_num x {int(size) if size else '?'}"


def tracked_throughput(run: dict, gbs: float | None, bench: str) -> tuple[float | None, int, str]:
    """Median of the per-block tracked_stats throughput, the first block left out (warm-up) when there are more;
    for gpt3, whose NVIDIA logs give per-step train_step_timing (s per global batch), global_batch / timing."""
    thr = [float(v["throughput"]) for t, v, md in run["tracked"] if num(v.get("throughput")) is not None]
    timing = [float(v["train_step_timing"]) for t, v, md in run["tracked"] if num(v.get("train_step_timing"))]
    if timing and gbs and (bench == "gpt3" or not thr):
        use = timing[1:] if len(timing) > 1 else timing
        return gbs / statistics.median(use), len(use), "tracked_stats train_step_timing"
    if thr:
        use = thr[1:] if len(thr) > 1 else thr
        return statistics.median(use), len(use), "tracked_stats throughput"
    return None, 0, ""


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# --------------------------------------------------------------------------------------------- config matching
TRUE = {"1", "true", "True", "TRUE", "yes", "on"}
FALSE = {"0", "false", "False", "FALSE", "no", "off", ""}


def parse_config(git: Git, path: str, env: dict | None = None, depth: int = 0) -> tuple[dict, str]:
    """A small reader for the exports of a config_*.sh (sourced files inlined); no shell is run."""
    env = {} if env is None else env
    text = git.read(path)
    texts = [text]
    base = path.rsplit("/", 1)[0]

    def subst(val: str) -> str:
        def rep(m):
            name, default = m.group(1), m.group(3)
            if name in env and env[name] != "":
                return env[name]
            return default if default is not None else ""

        prev = None
        while prev != val:
            prev = val
            val = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-=]([^{}]*))?\}", rep, val)
        val = re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: env.get(m.group(1), ""), val)
        return val

    for raw in text.splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^(?:source|\.)\s+(.+)$", line)
        if m and depth < 5:
            name = m.group(1).split()[0] if "$(" not in m.group(1) else m.group(1).rsplit(")", 1)[-1]
            name = name.strip("\"'; ").split("/")[-1]
            name = subst(name)
            inc = f"{base}/{name}"
            if inc not in git.blobs:  # some sourced files sit in a sub-directory of the implementation
                near = [q for q in git.blobs if q.startswith(base + "/") and q.endswith("/" + name)]
                inc = near[0] if len(near) == 1 else inc
            if inc in git.blobs:
                _, t = parse_config(git, inc, env, depth + 1)
                texts.append(t)
            continue
        for m in re.finditer(
            r'(?:^|&&\s*|;\s*)(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=("(?:[^"\\]|\\.)*"|'
            r"'[^']*'|\S*)",
            line,
        ):
            name, val = m.group(1), m.group(2)
            if val[:1] in "\"'":
                val = val[1:-1]
            val = subst(val)
            expr = val.strip()[3:-2] if re.fullmatch(r"\$\(\([^()]*\)\)", val.strip()) else ""
            if expr and re.fullmatch(r"[\d\s+\-*/()]+", expr):  # integer arithmetic on literals only
                with contextlib.suppress(SyntaxError, ZeroDivisionError, ValueError):
                    val = str(int(eval(expr, {"__builtins__": {}})))
            env[name] = val
    return env, "\n".join(texts)


def first_int(env: dict, *names: str):
    for n in names:
        v = env.get(n)
        if v is not None and re.fullmatch(r"\s*\d+\s*", str(v)):
            return int(v)
    return None


def norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


GPU_TOKENS = (
    ("H200", "H200"),
    ("H100", "H100"),
    ("A100", "A100"),
    ("L40S", "L40S"),
    ("A10G", "A10G"),
    ("V100", "V100"),
    ("GH200", "GH200"),
    ("B200", "B200"),
    ("GB200", "GB200"),
    ("A30", "A30"),
    ("L40", "L40"),
    ("L4", "L4"),
)


def gpu_tokens(fname: str) -> set[str]:
    up = fname.upper()
    found = set()
    for tok, fam in GPU_TOKENS:
        if re.search(rf"(^|[^A-Z0-9]|DGX|HGX){tok}(?![0-9S])" if tok in ("L40", "L4") else rf"{tok}", up):
            found.add(fam)
    if "GH200" in found or "GB200" in found:
        found.discard("H200")
        found.discard("B200")
    return found


def match_config(
    git: Git,
    prefix: str,
    bench_dir: str,
    system: str,
    sysjson_name: str,
    nodes,
    gpn,
    local_bs,
    gbs,
    ga,
    gkey: str,
    cache: dict,
):
    """Pick the config_*.sh of this submission: node count, GPUs per node, batch size (local, global, or MINIBS
    times the data-parallel size) and GPU model must not contradict the log and systems json; the name of the
    system counts most. Returns (path or None, how)."""
    cands = [
        p
        for p in git.blobs
        if p.startswith(f"{prefix}benchmarks/{bench_dir}/implementations/") and re.search(r"/config[^/]*\.sh$", p)
    ]
    fam = gkey.split("-")[0]
    scored = []
    for p in cands:
        fname = p.rsplit("/", 1)[1]
        if re.search(r"comm[ao]n|_fp8\.sh$|_tp_|^config\.sh$|_base", fname):  # xFusion spells it _comman.sh
            continue
        if p not in cache:
            try:
                cache[p] = parse_config(git, p)
            except (KeyError, ValueError, RecursionError):
                cache[p] = ({}, "")
        env, _ = cache[p]
        score, bad = 0, False
        toks = gpu_tokens(fname)
        if toks:  # NVIDIA ran H200 with some DGXH100-named configs: a mismatch only lowers the score
            score += 1 if fam in toks else -1
        cn = first_int(env, "DGXNNODES", "NNODES", "NUM_NODES", "MLPERF_NUM_NODES")
        cg = first_int(env, "DGXNGPU", "GPUS_PER_NODE", "NGPUS", "NUM_GPUS")
        m = re.search(r"_(\d+)x(\d+)x(\d+)", fname)
        if cn is None and m:
            cn = int(m.group(1))
        if cg is None and m:
            cg = int(m.group(2))
        if cn is not None and nodes is not None:
            if cn == nodes:
                score += 2
            else:
                bad = True
        if cg is not None and gpn is not None:
            if cg == gpn:
                score += 1
            else:
                bad = True
        total = nodes * gpn if nodes and gpn else None
        cb = first_int(env, "BATCHSIZE", "BATCH_SIZE", "LOCAL_BATCH_SIZE", "BS")
        mini = first_int(env, "MINIBS")
        if cb is None and mini is None and m:
            cb = int(m.group(3))
        cgb = first_int(env, "GLOBAL_BATCH_SIZE", "GBS")
        ok = None
        if cgb is not None and gbs is not None:
            ok = cgb == gbs
        elif mini is not None and gbs is not None and total:
            par = (
                (first_int(env, "TENSOR_MODEL_PARALLEL", "TP") or 1)
                * (first_int(env, "PIPELINE_MODEL_PARALLEL", "PP") or 1)
                * (first_int(env, "CONTEXT_PARALLEL", "CP") or 1)
            )
            ok = mini * (total // par) == gbs if total % par == 0 else False
        elif cb is not None and local_bs is not None:
            ok = cb == local_bs
        elif cb is not None and gbs is not None and total:  # HugeCTR's BATCHSIZE is the global batch
            ok = cb * total * int(ga or 1) == gbs or cb == gbs
        if ok is True:
            score += 2
        elif ok is False:
            bad = True
        stem = norm(fname[len("config_") : -3]) if fname.startswith("config_") else norm(fname)
        for nm in (system, sysjson_name):
            if nm and norm(nm) and (norm(nm) in stem or stem.startswith(norm(nm))):
                score += 3
                break
        impl_dir = p[len(prefix) :].split("/")[3]
        if (
            norm(impl_dir) == norm(system)
            and sum(1 for q in cands if q.startswith(p.rsplit("/", 1)[0] + "/") and "common" not in q.rsplit("/", 1)[1])
            == 1
        ):
            score, bad = score + 5, False  # the only config in an implementation dir named after the system
        if not bad and score >= 3:
            scored.append((score, p))
    if not scored:
        return None, "none"
    scored.sort(reverse=True)
    best = [p for s, p in scored if s == scored[0][0]]
    if len(best) == 1:
        return best[0], f"unique (score {scored[0][0]})"
    flags = {json.dumps(config_flags(*cache[p]), sort_keys=True) for p in best}
    if len(flags) == 1:
        return best[0], f"tied {len(best)}, same flags"
    return None, f"ambiguous ({len(best)} configs)"


def truthy(env: dict, *names: str):
    vals = [str(env[n]).strip() for n in names if n in env]
    if any(v in TRUE or v.lower() == "full" for v in vals):
        return True
    if vals and all(v in FALSE for v in vals):
        return False
    return None


def config_flags(env: dict, text: str) -> dict:
    out: dict = {}
    t = text
    cg = truthy(
        env,
        "USE_CUDA_GRAPH",
        "MXNET_ENABLE_CUDA_GRAPHS",
        "MCORE_CUDA_GRAPH",
        "LAYER_CUDA_GRAPH",
        "FULL_CUDA_GRAPH",
        "CUDA_GRAPH",
        "ENABLE_CUDA_GRAPH",
        "USE_CUDA_GRAPHS",
        "ACG",
    )
    if re.search(r"--cuda-graphs(?!-syn)|--use_cuda_graph|--cuda_graph|--use-cuda-graph", t):
        cg = True
    out["cuda_graphs"] = cg
    fp8 = truthy(env, "FP8")
    if fp8 is None:
        fp8 = truthy(env, "FP8_ACT", "FP8_ACTIVATION", "FP8_PARAMS")
    if re.search(r"--fp8\b", t):
        fp8 = True
    # NVIDIA's BERT (v2.1 on): --use_transformer_engine2 ("Enable FP8 layers" in run_pretraining.py; modeling.py runs
    # the encoder under transformer_engine's fp8_autocast)
    if re.search(r"--use_transformer_engine2\b", t):
        fp8 = True
    out["fp8"] = fp8
    pf = first_int(env, "PACKING_FACTOR")
    packed = True if ("--packed_samples" in t or (pf is not None and pf > 1)) else (False if pf == 1 else None)
    out["packed_sequences"] = packed
    out["dali"] = True if (re.search(r"--dali\b", t) or any(k.startswith("DALI_") for k in env)) else None
    out["transformer_engine"] = (
        True
        if (re.search(r"transformer_engine|USE_TE_|--use_te", t) or any(k.startswith("NVTE_") for k in env))
        else None
    )
    fused_env = any(("FUSED" in k or k.startswith("APEX")) and str(v).strip() not in FALSE for k, v in env.items())
    out["fused_kernels"] = True if (fused_env or re.search(r"--fused[_-]|--apex[_-]|--unpad_fmha|--fmha", t)) else None
    out["dist_optimizer"] = (
        True
        if (
            truthy(env, "USE_DIST_OPTIMIZER", "DIST_ADAM", "DIST_LAMB")
            or re.search(r"--dwu-|--dist[_-]lamb|--distributed[_-]", t)
        )
        else None
    )
    out["sharp_nvls"] = (
        True
        if (
            env.get("SBATCH_NETWORK") == "sharp"
            or truthy(env, "NCCL_NVLS_ENABLE", "USE_SHARP", "SHARP", "NCCL_COLLNET_ENABLE")
            or "--enable-sharp" in t
        )
        else None
    )
    out["tp"] = first_int(env, "TENSOR_MODEL_PARALLEL", "TP")
    out["pp"] = first_int(env, "PIPELINE_MODEL_PARALLEL", "PP")
    out["cp"] = first_int(env, "CONTEXT_PARALLEL", "CP")
    prec = ""
    if fp8:
        prec = "fp8"
    else:
        p = str(env.get("PRECISION", "")) + " " + str(env.get("DTYPE", ""))
        if "bf16" in p.lower():
            prec = "bf16"
        elif "fp16" in p.lower() or "16" in p:
            prec = "fp16"
        elif re.search(r"--bf16(?![-\w])", t):
            prec = "bf16"
        elif re.search(r"--fp16(?![-\w])|--fp16in\b|--half\b", t):
            prec = "fp16"
        elif truthy(env, "AMP", "USE_MIXED_PRECISION") or "AMP_LVL" in env or re.search(r"--amp\b", t):
            prec = "amp"
    out["precision"] = prec
    return out


def fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if x == int(x) and abs(x) < 1e15:
            return str(int(x))
        if abs(x) >= 1:
            return f"{x:.3f}".rstrip("0").rstrip(".")
        return f"{x:.6g}"
    return str(x)


# ------------------------------------------------------------------------------------------------------- build
RESULT_RE = re.compile(r"^((?:closed/|open/)?([^/]+)/)results/([^/]+)/([^/]+)/result_(\d+)\.txt$")


def build(git_dir: str, rnd: str, commit: str, repo: str, upstream: str) -> tuple[list[dict], Counter]:
    git = Git(git_dir, commit)
    skipped: Counter = Counter()
    groups: dict[tuple, list[str]] = defaultdict(list)
    for p in git.blobs:
        m = RESULT_RE.match(p)
        if m:
            groups[(m.group(1), m.group(2), m.group(3), m.group(4))].append(p)
    rows = []
    cfg_cache: dict = {}
    for (prefix, submitter, system, bench_dir), files in sorted(groups.items()):
        sj_path = f"{prefix}systems/{system}.json"
        sj = load_json_lenient(git.read(sj_path)) if sj_path in git.blobs else None
        if sj is None:
            low = {p.lower(): p for p in git.blobs if p.startswith(f"{prefix}systems/")}
            alt = low.get(sj_path.lower())
            if alt:
                sj_path, sj = alt, load_json_lenient(git.read(alt))
        files.sort(key=lambda p: int(re.search(r"result_(\d+)\.txt$", p).group(1)))
        if sj is None:
            # fall back on the SYSJSON line of the first log
            first = parse_log(git.read(files[0]))
            sj, sj_path = first.get("sysjson"), "(:::SYSJSON in result_*.txt)"
        if not sj:
            skipped["no systems json"] += 1
            continue
        acc = str(sj.get("accelerator_model_name", ""))
        gkey = gpu_key(acc, str(sj.get("accelerator_memory_capacity", "")))
        if not gkey:
            skipped[f"not an EC2 GPU: {acc}"] += 1
            continue
        bench = BENCH_ALIAS.get(bench_dir, bench_dir)
        texts = [git.read(f) for f in files]
        if not any(texts):
            skipped["result_*.txt blobs absent from the mirror"] += 1
            continue
        runs = [parse_log(t) for t in texts if t]
        nodes = int(num(sj.get("number_of_nodes")) or 0) or None
        gpn = int(num(sj.get("accelerators_per_node")) or 0) or None
        total = nodes * gpn if nodes and gpn else None
        gbs = med([num(r.get("global_batch_size")) for r in runs])
        lbs = med(
            [
                num(r.get("d_batch_size") if r.get("d_batch_size") is not None else r.get("local_batch_size"))
                for r in runs
            ]
        )
        ga = med([num(r.get("gradient_accumulation_steps")) for r in runs])
        seq = med([num(r.get("max_sequence_length")) for r in runs]) or SEQ_LEN.get(bench)
        ok = [r for r in runs if r.get("status") == "success" and r.get("run_start") and r.get("run_stop")]
        ttt = [(r["run_stop"] - r["run_start"]) / 1000.0 for r in ok]
        per_run = [samples_to_converge(bench, r, int(seq) if seq else None, gbs) for r in ok]
        samples = med([s for s, _, _ in per_run])
        epochs = med([e for _, e, _ in per_run])
        methods = Counter(m for s, _, m in per_run if s is not None)
        thr_runs = [tracked_throughput(r, gbs, bench) for r in ok]
        thr = med([t for t, _, _ in thr_runs])
        blocks = med([n for t, n, _ in thr_runs if t is not None])
        tsrc = Counter(s for t, _, s in thr_runs if t is not None)
        derived = med([s / t for (s, _, _), t in zip(per_run, ttt) if s and t])
        ratio = thr / derived if thr and derived else None
        source = tsrc.most_common(1)[0][0] if tsrc else ""
        if thr is not None and ratio is not None and not (0.6 <= ratio <= 3.0):
            # the unit of tracked_stats throughput varies: per GPU (retinanet), tokens/s (gpt3 v3.1)
            if total and 0.6 <= ratio * total <= 3.0:
                thr, source = thr * total, source + " x total_gpus (logged per GPU)"
            elif seq and 0.6 <= ratio / seq <= 3.0:
                thr, source = thr / seq, source + " / seq_len (logged in tokens/s)"
            else:
                thr, source = None, ""
        if thr is None and derived is not None:
            thr, source = derived, "derived: train_samples / time_to_train"
        # config
        impls = sorted(
            {
                p[len(prefix) :].split("/")[3]
                for p in git.blobs
                if p.startswith(f"{prefix}benchmarks/{bench_dir}/implementations/") and p.count("/") > 4
            }
        )
        fw = str(sj.get("framework", ""))
        cfg, how = match_config(
            git,
            prefix,
            bench_dir,
            system,
            str(sj.get("system_name", "")),
            nodes,
            gpn,
            int(lbs) if lbs else None,
            int(gbs) if gbs else None,
            ga,
            gkey,
            cfg_cache,
        )
        flags = config_flags(*cfg_cache[cfg]) if cfg else {}
        log_file = Counter(r.get("run_start_file") for r in runs if r.get("run_start_file")).most_common(1)
        log_file = log_file[0][0] if log_file else ""
        ff, ff_how = framework_family(
            fw, system, impls, cfg[len(prefix) :].split("/")[3] if cfg else "", bench, log_file
        )
        tp, pp, cp = flags.get("tp"), flags.get("pp"), flags.get("cp")
        dp = None
        if total and (tp or pp or cp):
            dp = total // ((tp or 1) * (pp or 1) * (cp or 1))
        starts = sorted(r["run_start"] for r in runs if r.get("run_start"))
        sig = hashlib.sha1(",".join(map(str, starts)).encode()).hexdigest()[:12] if starts else ""
        division = sj.get("division") or next(
            (r.get("submission_division") for r in runs if r.get("submission_division")), ""
        )
        logged = Counter(r.get("submission_benchmark") for r in runs if r.get("submission_benchmark"))
        rows.append(
            {
                "round": rnd,
                "repo": repo,
                "upstream_repo": upstream,
                "commit": commit,
                "path": f"{prefix}results/{system}/{bench_dir}",
                "division": division,
                "submitter": submitter,
                "system": system,
                "system_json": sj_path,
                "accelerator": acc,
                "gpu": gkey,
                "ec2_family": EC2.get(gkey, ""),
                "gpus_per_node": gpn,
                "nodes": nodes,
                "total_gpus": total,
                "framework": fw,
                "framework_family": ff,
                "framework_source": ff_how,
                "pytorch_based": PYTORCH_BASED.get(ff),
                "log_code_file": log_file,
                "host_cpu": sj.get("host_processor_model_name", ""),
                "interconnect": sj.get("host_networking", "") or sj.get("host_network_card_count", ""),
                "benchmark": bench,
                "benchmark_logged": logged.most_common(1)[0][0] if logged else "",
                "seq_len": seq if bench in SEQ_LEN or seq else None,
                "global_batch_size": gbs,
                "local_batch_size": lbs,
                "per_gpu_batch": (gbs / total) if gbs and total else None,
                "per_dp_rank_batch": (gbs / dp) if gbs and dp else None,
                "gradient_accumulation_steps": ga,
                "tp": tp,
                "pp": pp,
                "cp": cp,
                "dp": dp,
                "precision": flags.get("precision", ""),
                "fp8": flags.get("fp8"),
                "cuda_graphs": flags.get("cuda_graphs"),
                "packed_sequences": flags.get("packed_sequences") if bench == "bert" else None,
                "dali": flags.get("dali"),
                "transformer_engine": flags.get("transformer_engine"),
                "fused_kernels": flags.get("fused_kernels"),
                "dist_optimizer": flags.get("dist_optimizer"),
                "sharp_nvls": flags.get("sharp_nvls"),
                "config_file": cfg or "",
                "config_match": how,
                "runs": len(runs),
                "runs_success": len(ok),
                "train_samples_median": samples,
                "train_samples_method": "; ".join(methods) if methods else "",
                "epochs_median": epochs,
                "time_to_train_s_median": med(ttt),
                "time_to_train_s_min": min(ttt) if ttt else None,
                "time_to_train_s_max": max(ttt) if ttt else None,
                "throughput_samples_per_s_median": thr,
                "throughput_source": source,
                "throughput_blocks_median": blocks if source.startswith("tracked") else None,
                "derived_throughput_samples_per_s": derived,
                "tracked_over_derived": ratio,
                "samples_per_s_per_gpu": (thr / total) if thr and total else None,
                "first_run_utc": datetime.fromtimestamp(starts[0] / 1000, timezone.utc).strftime("%Y-%m-%d")
                if starts
                else "",
                "runs_signature": sig,
                "duplicate_of": "",
            }
        )
    return rows, skipped


ROUND_ORDER = lambda r: tuple(int(x) for x in re.findall(r"\d+", r))  # noqa: E731


def merge(out: Path, new_rows: list[dict], rnd: str) -> list[dict]:
    old = []
    if out.exists():
        with out.open(newline="") as f:
            old = [r for r in csv.DictReader(f) if r["round"] != rnd]
    rows = old + [{c: fmt(r.get(c)) for c in COLUMNS} for r in new_rows]
    rows.sort(key=lambda r: (ROUND_ORDER(r["round"]), r["submitter"], r["system"], r["benchmark"]))
    first: dict[str, dict] = {}
    for r in rows:
        r["duplicate_of"] = ""
        sig = r["runs_signature"]
        if not sig:
            continue
        if sig in first:
            r["duplicate_of"] = f"{first[sig]['round']}:{first[sig]['path']}"
        else:
            first.setdefault(sig, r)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    return rows


def summary(rows: list[dict]) -> str:
    c = Counter((r["round"], r["benchmark"], r["gpu"]) for r in rows)
    lines = [f"{'round':6} {'benchmark':18} {'gpu':15} rows"]
    lines += [
        f"{k[0]:6} {k[1]:18} {k[2]:15} {v}"
        for k, v in sorted(c.items(), key=lambda kv: (ROUND_ORDER(kv[0][0]), *kv[0][1:]))
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mirror", help="git dir of the fetched results repository")
    ap.add_argument("--round", required=True, help="e.g. v4.0")
    ap.add_argument("--commit", required=True, help="commit to read (written into every row)")
    ap.add_argument("--repo", required=True, help="owner/name of the repository the mirror is of")
    ap.add_argument("--upstream", default="", help="owner/name of the MLCommons repository when --repo is a fork")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--summary", action="store_true", help="print counts by round x benchmark x gpu of the merged CSV")
    a = ap.parse_args(argv)
    rows, skipped = build(a.mirror, a.round, a.commit, a.repo, a.upstream)
    merged = merge(Path(a.out), rows, a.round)
    print(f"{a.round}: {len(rows)} rows written; skipped submissions: {sum(skipped.values())}", file=sys.stderr)
    for k, v in skipped.most_common():
        print(f"  skipped {v:4d}  {k}", file=sys.stderr)
    if a.summary:
        print(summary(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())

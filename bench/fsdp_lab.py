"""The models, the Lightning module and the rank worker of the FSDP validation lab (CPU, gloo, 2 real processes).

Used by bench/fsdp_memory.py (peak memory per rank), bench/fsdp_netns_validation.py (step time over a shaped link)
and tests/job/test_fsdp_lab.py. Models are built from transformers configs (no weights are downloaded) or are a plain
MLP stack; each has a repeated block class, FSDP's wrap unit and the activation-checkpointing unit.

A rank runs as ``python bench/fsdp_lab.py worker SPEC.json OUT.json`` with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
NODE_RANK set (one rank per "node", Lightning's LightningEnvironment): the spec lists cases (model, layout,
micro-batch) and what to measure; the rank writes its results to OUT.json.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SEQ_LEN = 128
VOCAB = 8000
MIB = 2**20


class MLPBlock(nn.Module):
    """Pre-norm residual MLP block (the MLP stack's repeated unit)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLPStack(nn.Module):
    """``depth`` MLP blocks on sequences of ``SEQ_LEN`` vectors; the loss is the mean square of the output."""

    def __init__(self, width: int = 768, hidden: int = 3072, depth: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(width, hidden) for _ in range(depth))
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.pow(2).mean()


@dataclass(frozen=True)
class ModelSpec:
    """A lab model: how to build it, its block class and how to make a batch of it."""

    name: str
    build: Callable[[], nn.Module]
    block: str
    tokens: bool  # batches are token ids (a causal LM) rather than float vectors
    width: int = 0  # the MLP stack's input width


def _llama(hidden: int, layers: int, heads: int, ffn: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(cfg)


def _gpt2(hidden: int, layers: int, heads: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_positions=SEQ_LEN,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    return GPT2LMHeadModel(cfg)


MODELS: dict[str, ModelSpec] = {
    # ~36M parameters: 8 decoder layers of 512 wide + untied 8000-token embeddings
    "llama": ModelSpec("llama", lambda: _llama(512, 8, 8, 1408), "LlamaDecoderLayer", True),
    # ~23M parameters: 6 blocks of 512 wide, tied embeddings
    "gpt2": ModelSpec("gpt2", lambda: _gpt2(512, 6, 8), "GPT2Block", True),
    # ~38M parameters: 8 MLP blocks 768 -> 3072 -> 768
    "mlp": ModelSpec("mlp", lambda: MLPStack(768, 3072, 8), "MLPBlock", False, 768),
    # tiny ones for the test and the network lab (seconds per step, not minutes, on a shaped link)
    "mlp-tiny": ModelSpec("mlp-tiny", lambda: MLPStack(256, 1024, 4), "MLPBlock", False, 256),
    "gpt2-tiny": ModelSpec("gpt2-tiny", lambda: _gpt2(256, 4, 4), "GPT2Block", True),
}


def make_batch(spec: ModelSpec, micro: int, seed: int = 0) -> torch.Tensor:
    """``micro`` samples of ``SEQ_LEN``: random token ids, or random vectors for the MLP stack."""
    g = torch.Generator().manual_seed(seed)
    if spec.tokens:
        return torch.randint(0, VOCAB, (micro, SEQ_LEN), generator=g)
    return torch.randn(micro, SEQ_LEN, spec.width, generator=g)


def loss_of(net: nn.Module, spec: ModelSpec, batch: torch.Tensor) -> torch.Tensor:
    """The training loss of one batch (next-token cross-entropy for the LMs)."""
    if spec.tokens:
        return net(input_ids=batch, labels=batch, use_cache=False).loss  # a cache would grow on recomputation
    return net(batch)


def block_class(net: nn.Module, name: str) -> type[nn.Module]:
    """The class of ``net``'s modules named ``name`` (the block that FSDP wraps and checkpointing recomputes).

    Raises:
        ValueError: no module of ``net`` has that class name.
    """
    for m in net.modules():
        if type(m).__name__ == name:
            return type(m)
    raise ValueError(f"no module of class {name} in {type(net).__name__}")


# ---------------------------------------------------------------------------------------------------------- Lightning


def lightning_module(spec: ModelSpec, micro: int, steps: int, ddp_ac: bool) -> Any:
    """A LightningModule training ``spec`` with AdamW on ``steps`` fixed batches of ``micro`` samples
    (``ddp_ac``: checkpoint every block, for ddp+ac)."""
    import lightning.pytorch as pl

    class LabModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = spec.build()
            if ddp_ac:
                from lightning_srifty.strategies.ddp import apply_checkpointing  # what SriftyDDPStrategy applies

                apply_checkpointing(self.net, [spec.block])

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return loss_of(self.net, spec, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            data = [make_batch(spec, micro, seed=i) for i in range(steps)]
            return torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)

    return LabModule()


def strategy_for(layout_name: str, spec: ModelSpec, net_probe: nn.Module) -> Any:
    """Lightning's strategy for a layout, from predictor.model.layout's own arguments: the product's
    :class:`~lightning_srifty.strategies.fsdp.SriftyFSDPStrategy` (block classes by name, FSDP1 on CPU/gloo), what
    ``plan_strategy()`` starts under ``srifty launch``."""
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_srifty.strategies.fsdp import SriftyFSDPStrategy
    from predictor.model.layout import parse

    kind, kwargs = parse(layout_name).lightning(block=spec.block)
    if kind == "ddp":
        return DDPStrategy(process_group_backend="gloo")
    kwargs.pop("state_dict_type", None)  # the lab saves no checkpoints
    strategy = SriftyFSDPStrategy(process_group_backend="gloo", **kwargs)
    strategy.resolve_names(net_probe)
    return strategy


COLLECTIVES = {  # torch.distributed function -> kind (FSDP1 on CPU: all_gather into chunks, reduce_scatter_single)
    "all_gather": "allgather",
    "all_gather_single": "allgather",
    "all_gather_into_tensor": "allgather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_reduce": "allreduce",
}


class CollectiveTimer:
    """Wall time and bytes of the torch.distributed collectives FSDP1 calls, per training step (DDP all-reduces
    from C++, unseen here).

    FSDP1 calls ``dist.all_gather`` (on CPU; ``all_gather_single`` on CUDA) and ``dist.reduce_scatter_single``
    through the module (synchronous on CPU: no streams, so the call's duration is the collective's); every function
    of ``COLLECTIVES`` that torch has is wrapped while the timer is entered.
    ``mark_step()`` (from the training-batch hook) starts a step's tally.
    """

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self._saved: dict[str, Any] = {}

    def mark_step(self) -> None:
        self.steps.append({})

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        kind = COLLECTIVES[name]

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if kwargs.get("async_op") and out is not None:
                out.wait()
            if self.steps:
                tally = self.steps[-1]
                tally[f"{kind}_s"] = tally.get(f"{kind}_s", 0.0) + time.perf_counter() - t0
                big = args[0] if kind != "reduce_scatter" else args[1]  # the gathered / unsharded tensor(s)
                size = sum(t.numel() * t.element_size() for t in (big if isinstance(big, list) else [big]))
                tally[f"{kind}_bytes"] = tally.get(f"{kind}_bytes", 0.0) + size
                tally[f"{kind}_calls"] = tally.get(f"{kind}_calls", 0.0) + 1
            return out

        return timed

    def __enter__(self) -> CollectiveTimer:
        import torch.distributed as dist

        for name in (n for n in COLLECTIVES if hasattr(dist, n)):
            self._saved[name] = getattr(dist, name)
            setattr(dist, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)


class LiveBytes(TorchDispatchMode):
    """Peak live tensor-storage bytes of this process over a window (e.g. one training step), by kind.

    torch's MemTracker cannot follow an FSDP1 step (it registers post-accumulate-grad hooks on every parameter, and
    with ``use_orig_params`` FSDP1's parameters are views of its flat parameter: not leaves), so this counts what
    MemTracker counts, the same way: every storage an operator returns is held by a weak reference until freed, the
    storages that existed before (``track``: parameters, FSDP flat parameters, gradients, optimizer state) are
    registered up front, and ``UntypedStorage.resize_`` is followed (FSDP1 frees and re-allocates the gathered
    parameters by resizing a storage, which no operator reports). Allocations inside an operator that do not
    survive it are not seen (neither does MemTracker see them).
    """

    def __init__(self) -> None:
        super().__init__()
        self.sizes: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.kinds: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.live = 0
        self.peak = 0
        self.start = 0
        self.at_peak: dict[str, int] = {}
        self._orig_resize: Any = None

    def track(self, tensors: dict[str, list[torch.Tensor]]) -> None:
        """Register storages that exist before the window, by kind (params, grads, optimizer)."""
        for kind, ts in tensors.items():
            for t in ts:
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    self._register(t.untyped_storage(), kind)
        self.start = self.live
        self.start_parts = self._parts()

    def _register(self, st: torch.UntypedStorage, kind: str) -> None:
        if st in self.sizes:
            return
        box = [st.nbytes()]  # the storage's current size (resize_ updates it; the finalizer reads the last one)
        self.sizes[st] = box
        self.kinds[st] = kind
        self.live += box[0]

        def gone(box: list[int] = box) -> None:
            self.live -= box[0]

        weakref.finalize(st, gone)

    def _resized(self, st: torch.UntypedStorage, size: int) -> None:
        box = self.sizes.get(st)
        if box is None:
            self._register(st, "step")
        else:
            self.live += size - box[0]
            box[0] = size
        self._update()

    def _update(self) -> None:
        if self.live > self.peak:
            self.peak = self.live
            if self.live - self._parts_at > 1 << 20:  # the breakdown, each time the peak grew by 1 MiB
                self.at_peak = self._parts()
                self._parts_at = self.live

    def _parts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for st, kind in self.kinds.items():
            box = self.sizes.get(st)
            out[kind] = out.get(kind, 0) + (box[0] if box else 0)
        return out

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._register(t.untyped_storage(), "step")
        self._update()
        return out

    def __enter__(self) -> LiveBytes:
        self._parts_at = 0
        self.peak = self.live
        orig = torch.UntypedStorage.resize_
        self._orig_resize = orig

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = orig(st, size)
            self._resized(st, size)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
        super().__exit__(*exc)

    def summary(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak,
            "start_bytes": self.start,
            "start_parts": self.start_parts,
            "at_peak": self.at_peak,
        }


def state_tensors(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict[str, list[torch.Tensor]]:
    """The tensors that live across steps: parameters (FSDP1's flat parameters included), gradients, optimizer
    state, buffers."""
    params = list(model.parameters())
    for m in model.modules():
        handle = getattr(m, "_handle", None)
        if handle is not None and getattr(handle, "flat_param", None) is not None:
            params.append(handle.flat_param)
    grads = [p.grad for p in params if p.grad is not None]
    opt = [v for o in optimizers for s in o.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"params": params, "grads": grads, "optimizer": opt, "buffers": list(model.buffers())}


def _callbacks(measure: str, measure_batch: int, record: dict[str, Any], timer: CollectiveTimer | None) -> list[Any]:
    import lightning.pytorch as pl

    class Lab(pl.Callback):
        def __init__(self) -> None:
            self.tracker: LiveBytes | None = None
            self.starts: list[float] = []

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            self.starts.append(time.perf_counter())
            if timer:
                timer.mark_step()
            if measure == "memory" and batch_idx == measure_batch:
                self.tracker = LiveBytes()
                self.tracker.track(state_tensors(trainer.strategy.model, trainer.optimizers))
                self.tracker.__enter__()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if measure == "memory" and batch_idx == measure_batch:
                self.tracker.__exit__(None, None, None)
                record["memory"] = self.tracker.summary()
                self.tracker = None

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.starts.append(time.perf_counter())
            record["step_s"] = [b - a for a, b in zip(self.starts, self.starts[1:])]

    return [Lab()]


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """One Lightning fit of ``steps`` batches of a case on this rank; returns what was measured."""
    import lightning.pytorch as pl

    spec = MODELS[case["model"]]
    layout = case["layout"]
    steps = int(case["steps"])
    module = lightning_module(spec, int(case["micro"]), steps, ddp_ac=layout == "ddp+ac")
    record: dict[str, Any] = {}
    timer = CollectiveTimer() if case.get("collectives") else None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    callbacks = _callbacks(case["measure"], int(case.get("measure_batch", 1)), record, timer)
    if case.get("profile_out"):  # the 1-process srifty profile the network lab predicts from
        from lightning_srifty.profiling.callback import SriftyCallback

        warm = int(case.get("warmup", 3))
        callbacks.append(
            SriftyCallback(
                warmup_steps=warm,
                profile_steps=steps - warm,
                output=case["profile_out"],
                model_name=spec.name,
                verbose=False,
                measure_checkpoint=False,
                recommend=False,
                report=False,
            )
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=world,
        strategy=strategy_for(layout, spec, module.net) if world > 1 else "auto",
        precision="32-true",
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    if timer:
        with timer:
            trainer.fit(module)
        record["comm"] = timer.steps
    else:
        trainer.fit(module)
    record.update(case, parameters=sum(p.numel() for p in spec.build().parameters()))
    del trainer, module
    gc.collect()
    return record


def worker(spec_path: str, out_path: str) -> None:
    """One rank: run the spec's cases in order, writing the results after each (``fsdp_lab.py worker``)."""
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    results = []
    for case in spec["cases"]:
        t0 = time.time()
        results.append(run_case(case) | {"seconds": round(time.time() - t0, 1)})
        Path(out_path).write_text(json.dumps({"rank": int(os.environ.get("NODE_RANK", 0)), "results": results}))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def env(threads: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a rank: ``threads`` CPU threads, this checkout and bench/ importable, plus ``extra``."""
    e = dict(os.environ)
    e.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "bench"), e.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    e.update(extra)
    return e


def run_ranks(
    cases: list[dict[str, Any]],
    work: Path,
    world: int = 2,
    port: int | None = None,
    prefix: Callable[[int], list[str]] | None = None,
    rank_env: Callable[[int], dict[str, str]] | None = None,
    timeout: float = 1800,
) -> list[list[dict[str, Any]]]:
    """Run each of ``cases`` on ``world`` fresh real processes (gloo); returns each rank's results, rank order.

    One process group per case: a Lightning fit after another in the same processes does not shard (a FSDP fit
    after a DDP one measured the unsharded state), so nothing is carried from case to case.
    ``prefix(rank)``: a command prefix (e.g. ``ip netns exec NS``); ``rank_env(rank)``: extra environment (the
    master address and socket interface of the network lab). Default: all ranks on localhost.
    """
    out: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    for i, case in enumerate(cases):
        got = _run_case_on_ranks(case, work / f"case{i}", world, port, prefix, rank_env, timeout)
        for rank, result in enumerate(got):
            out[rank].append(result)
    return out


def _run_case_on_ranks(
    case: dict[str, Any],
    work: Path,
    world: int,
    port: int | None,
    prefix: Callable[[int], list[str]] | None,
    rank_env: Callable[[int], dict[str, str]] | None,
    timeout: float,
) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    if port is None:  # a free one: several labs may run at once
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({"cases": [case], "threads": 1}))
    procs = []
    for rank in range(world):
        out = work / f"rank{rank}.json"
        out.unlink(missing_ok=True)
        extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        extra.update(rank_env(rank) if rank_env else {})
        e = env(NODE_RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), **extra)
        cmd = [*(prefix(rank) if prefix else []), sys.executable, __file__, "worker", str(spec_path), str(out)]
        with (work / f"rank{rank}.log").open("w") as log:  # the rank writes through its own copy
            procs.append(subprocess.Popen(cmd, env=e, cwd=work, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.time() + timeout
    failed = []
    for rank, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            failed.append(f"rank {rank} exited {p.returncode}:\n" + (work / f"rank{rank}.log").read_text()[-3000:])
    if failed:
        raise RuntimeError("\n".join(failed))
    return [json.loads((work / f"rank{r}.json").read_text())["results"][0] for r in range(world)]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: fsdp_lab.py worker SPEC.json OUT.json (started by run_ranks)")

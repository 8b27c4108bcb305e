"""What the host spends to issue one GPU operator from eager PyTorch, on the machine it runs on (a CUDA GPU needed).

    python bench/host_dispatch.py [--calls 5000]

Each probe issues ``--calls`` operators on tiny CUDA tensors, so the GPU waits on the host throughout; the host's
wall-clock time over the calls (one synchronise at the end) is its dispatch cost per operator: the Python call,
torch's dispatcher and the kernel launch. Probes: a bare ``add`` (tensor + scalar), the same under autocast (fp16),
an ``nn.Linear`` module call (Python module overhead), and a small MLP's forward + backward + optimizer step per
launched kernel (autograd's C++ engine issues the backward). Prints one JSON object: the CPU, and microseconds per
operator per probe (median of five repeats).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    import torch
    from torch import nn

    dev = "cuda"
    x = torch.ones(256, device=dev)
    lin = nn.Linear(64, 64).to(dev)
    h = torch.ones(8, 64, device=dev)
    mlp = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(64, 64), nn.ReLU())]).to(dev)
    opt = torch.optim.AdamW(mlp.parameters(), foreach=True)

    def add() -> None:
        x.add(1.0)

    def linear_autocast() -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            lin(h)

    def module() -> None:
        lin(h)

    def train_step() -> None:
        mlp(h).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # kernels per train_step, counted once by the profiler (forward, backward, the foreach optimizer)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        train_step()
        torch.cuda.synchronize()
    step_kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    probes = {"add": (add, 1), "linear_module": (module, 1), "linear_module_autocast": (linear_autocast, 1),
              "mlp_train_step_per_kernel": (train_step, step_kernels)}  # fmt: skip
    out: dict = {"cpu": platform.processor() or platform.machine(), "gpu": torch.cuda.get_device_name(),
                 "torch": torch.__version__, "train_step_kernels": step_kernels}  # fmt: skip
    try:
        with open("/proc/cpuinfo") as fh:
            out["cpu"] = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    for name, (fn, kernels) in probes.items():
        calls = args.calls if kernels == 1 else max(1, args.calls // kernels)
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        reps = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            reps.append((time.perf_counter() - t) / (calls * kernels) * 1e6)
        out[f"{name}_us"] = statistics.median(reps)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

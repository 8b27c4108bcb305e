"""Screening harness for the gemm kernel model on the train-split leave-one-GPU-out protocol (issue #21 item 2).

    python bench/kernel_gemm_screen.py VARIANT [P4_SMS] [SEEDS] [CLASS]
    python bench/kernel_gemm_screen.py base 40 0,10,20                  # the shipped features, three ensembles
    python bench/kernel_gemm_screen.py base+floorgpu+drop10 20 0,10,20  # per-GPU floors, no log(FLOPs / SMs)
    python bench/kernel_gemm_screen.py wave+mintime 20                  # NeuSight-style tiles and waves

A scratch tool kept for the record of BENCHMARKS.md ("Tiles and waves, per-GPU launch floors"): it re-implements
the training loop of predictor/model/kernels.py on the same subsample, networks and seeds, with feature variants
(``base`` = the shipped features, ``wave`` = an explicit tile/wave baseline, ``hybrid`` = both) and floor modes
(``floorfamily``, ``floorgpu``, default the median). The test GPUs are never trained on or scored. Needs
scikit-learn.
"""

import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("tk", ROOT / "scripts" / "train_kernel_model.py")
tk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tk)
from sklearn.neural_network import MLPRegressor  # noqa: E402

from predictor.model.kernels import features as base_features  # noqa: E402

CLS = sys.argv[4] if len(sys.argv) > 4 else "gemm"
k = tk.read_kernels(ROOT.parent / "shared" / "data" / "kernels")[CLS]
TRAIN = ["P4", "P100-PCIe-16GB", "T4", "V100-PCIe-32GB", "A100-PCIe-40GB"]
FAMILY = {
    "P4": "Pascal",
    "P100-PCIe-16GB": "Pascal",
    "T4": "Turing",
    "V100-PCIe-32GB": "Volta",
    "A100-PCIe-40GB": "Ampere",
    "A100-PCIe-80GB": "Ampere",
    "L4": "Ada",
    "H100-SXM": "Hopper",
}
variant = sys.argv[1]
p4sms = int(sys.argv[2]) if len(sys.argv) > 2 else 40
seeds = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0]


def gpu_of(key):
    g = tk.gpu_of(key)
    return dataclasses.replace(g, sms=p4sms) if key == "P4" else g


def L(x):
    return np.log2(np.maximum(x, 1e-12))


TILES = [(128, 128), (128, 64), (64, 64), (64, 32), (32, 32)]


def wave_feats(b, m, n, kk, gpu, floor, opts):
    sms = float(gpu.sms)
    peak = gpu.fp32_tflops * 1e12
    bw = gpu.memory_bw_gbps * 1e9
    l2 = gpu.l2_mb * 2**20
    flops = 2 * b * m * n * kk
    nbytes = 4 * b * (m * kk + kk * n + m * n)
    t_c, t_m = flops / peak, nbytes / bw
    # tile choice: the largest tile that fills the GPU (tiles >= SMs), else the smallest
    chosen_t = np.full(len(b), np.inf)
    tm_ = np.zeros(len(b))
    tn_ = np.zeros(len(b))
    tiles_ = np.zeros(len(b))
    waves_ = np.zeros(len(b))
    split_ = np.ones(len(b))
    done = np.zeros(len(b), bool)
    for i, (tm, tn) in enumerate(TILES):
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        last = i == len(TILES) - 1
        take = (~done) & ((tiles >= sms) | last) if opts.get("fill", True) else ~done
        if opts.get("mintime"):
            take = np.ones(len(b), bool)
        s = np.ones(len(b))
        if opts.get("splitk"):
            s = np.where(tiles < sms, np.maximum(1, np.minimum(np.floor(sms / tiles), np.floor(kk / 256))), 1)
        t_all = tiles * s
        waves = np.maximum(np.ceil(t_all / sms), 1)
        tt = waves * 2 * tm * tn * np.ceil(kk / s) / (peak / sms)
        if opts.get("mintime"):
            take = tt < chosen_t
        chosen_t = np.where(take, tt, chosen_t)
        tm_ = np.where(take, tm, tm_)
        tn_ = np.where(take, tn, tn_)
        tiles_ = np.where(take, t_all, tiles_)
        waves_ = np.where(take, waves, waves_)
        split_ = np.where(take, s, split_)
        done |= take
    t_wave = np.maximum(chosen_t, t_m)
    eff = tiles_ / (waves_ * sms)
    tile_ai = 2 * tm_ * tn_ / (4 * (tm_ + tn_))
    cols = [
        L(t_wave / floor),
        eff,
        L(waves_),
        L(t_c) - L(t_m),
        L(chosen_t) - L(np.maximum(t_c, t_m)),
        L(nbytes / l2),
        L(tile_ai * bw / peak),
        L(split_),
    ]
    if opts.get("shapes", True):
        cols += [L(m), L(n), L(kk), L(b)]
    if opts.get("lanes"):
        cols += [L(peak / sms / (gpu.clock_mhz * 1e6) / 2)]
    if opts.get("persm"):
        cols += [L(flops / sms)]
    return np.stack(cols, 1), t_wave


def feats(rows, gpu, floor):
    if variant.split("+")[0] == "base":
        x, t, _ = base_features(CLS, rows, gpu, floor)
        for o in variant.split("+"):
            if o.startswith("drop"):
                keep = [i for i in range(x.shape[1]) if str(i) not in o[4:].split(",")]
                x = x[:, keep]
            if o == "lanes":
                x = np.concatenate(
                    [x, np.full((len(x), 1), L(gpu.fp32_tflops * 1e12 / gpu.sms / (gpu.clock_mhz * 1e6) / 2))], 1
                )
        return x, t
    if variant.split("+")[0] == "hybrid":
        x, t, _ = base_features(CLS, rows, gpu, floor)
        opts = {o: True for o in variant.split("+")[1:]}
        xw, tw = wave_feats(rows["b"], rows["m"], rows["n"], rows["k"], gpu, floor, opts)
        extra = [xw[:, 1], xw[:, 2], xw[:, 4], xw[:, 7]]
        if opts.get("lanes"):
            extra.append(xw[:, -1])
        return np.concatenate([x, np.stack(extra, 1)], 1), (tw if opts.get("tw") else t)
    opts = dict(o.split("=") if "=" in o else (o, "1") for o in variant.split("+")[1:])
    opts = {a: (b != "0") for a, b in opts.items()}
    if CLS == "conv":
        ho = np.floor((rows["h"] + 2 * rows["padding"] - rows["kh"]) / rows["stride"]) + 1
        mm = rows["b"] * ho * ho
        x, t = wave_feats(np.ones_like(mm), mm, rows["cout"], rows["cin"] * rows["kh"] * rows["kw"], gpu, floor, opts)
        return np.concatenate(
            [x, np.stack([L(rows["kh"] * rows["kw"]), L(rows["stride"]), L(rows["h"] * rows["w"])], 1)], 1
        ), t
    return wave_feats(rows["b"], rows["m"], rows["n"], rows["k"], gpu, floor, opts)


FLOORMODE = "median"
for o in variant.split("+"):
    if o.startswith("floor"):
        FLOORMODE = o[len("floor") :] or "family"


def p1(key):
    return float(np.percentile(k["latency_s"][k["gpu"] == key], 1))


def floors_for(train, held):
    own = {g: p1(g) for g in train}
    med = float(np.median(list(own.values())))
    if FLOORMODE == "median":
        return {g: med for g in [*train, held]}
    fl = dict(own) if FLOORMODE in ("family", "gpu") else {g: med for g in train}
    fam = [own[g] for g in train if FAMILY[g] == FAMILY[held]]
    fl[held] = float(np.median(fam)) if (fam and FLOORMODE == "family") else med
    return fl


rng = np.random.default_rng(0)
sub = {}
for key in TRAIN:
    idx = np.flatnonzero(k["gpu"] == key)
    sub[key] = np.sort(rng.choice(idx, tk.ROWS_PER_GPU[CLS], replace=False)) if len(idx) > tk.ROWS_PER_GPU[CLS] else idx
DIMS = (
    ("b", "m", "n", "k") if CLS == "gemm" else ("b", "cin", "cout", "kh", "kw", "h", "w", "stride", "padding", "groups")
)


def sel(idx):
    return {d: k[d][idx] for d in DIMS}


res = {}
t0 = time.time()
for held in TRAIN:
    train = [g for g in TRAIN if g != held]
    if not (k["gpu"] == held).any():
        continue
    fl = floors_for(train, held)
    xs, ys = [], []
    for g in train:
        x, t = feats(sel(sub[g]), gpu_of(g), fl[g])
        xs.append(x)
        ys.append(np.log(k["latency_s"][sub[g]]) - np.log(t + fl[g]))
    X = np.concatenate(xs)
    Y = np.concatenate(ys)
    mu = X.mean(0)
    sd = X.std(0) + 1e-9
    lo, hi = X.min(0), X.max(0)
    hidx = np.flatnonzero(k["gpu"] == held)
    xh, th = feats(sel(hidx), gpu_of(held), fl[held])
    xh = np.clip(xh, lo, hi)
    true = k["latency_s"][hidx]
    errs = []
    for seed in seeds:
        outs = []
        for mem in range(3):
            r = MLPRegressor(
                hidden_layer_sizes=(32, 32),
                alpha=1e-4,
                learning_rate_init=1e-3,
                batch_size=512,
                max_iter=60,
                tol=1e-6,
                n_iter_no_change=20,
                random_state=seed + mem,
            )
            r.fit((X - mu) / sd, Y)
            outs.append(r.predict((xh - mu) / sd))
        lm = np.clip(np.mean(outs, 0), np.log(0.25), np.log(64))
        pred = (th + fl[held]) * np.exp(lm)
        errs.append(np.mean(np.abs(pred - true) / true) * 100)
    res[held] = np.mean(errs)
    r = pred / true
    small = th < 0.3 * fl[held]
    big = th > 3 * fl[held]
    print(
        f"    small n={small.sum()} x{np.median(r[small]):.2f} mape {np.mean(np.abs(r[small] - 1)) * 100:.0f}"
        f" | big n={big.sum()} x{np.median(r[big]):.2f} mape {np.mean(np.abs(r[big] - 1)) * 100:.0f}"
        f" | mid mape {np.mean(np.abs(r[~small & ~big] - 1)) * 100:.0f}",
        flush=True,
    )
    print(f"  {held:16s} {res[held]:5.1f}  x{np.median(pred / true):.2f}  [{time.time() - t0:.0f}s]", flush=True)
print(
    f"{variant} p4sms={p4sms} seeds={seeds} {CLS} MEAN {np.mean(list(res.values())):.1f} | "
    + " ".join(f"{g.split('-')[0]} {v:.1f}" for g, v in res.items()),
    flush=True,
)

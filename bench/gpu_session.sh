#!/usr/bin/env bash
# The device checks of a session lent one GPU, in one call (each stage bounded in time, the most valuable first):
#   1. tests/job/test_cuda.py (CUDA-event clock, callback on CUDA, the CUDA operator table against the meta capture)
#   2. bench/gpu_lambda.py measure  (the Lambda models profiled for real: the ratio path's source step)
#   3. bench/kernel_replay.py measure (NeuSight's H100 GEMM shapes timed again)
#   4. bench/profile_overhead.py --accelerator cuda (the callback's cost on a GPU step)
#   5. srifty demo on CUDA, with srifty_ddp on one GPU (the NCCL comm hook's timing path)
# Usage, from the repository root on the GPU machine: OUT=<folder> bash bench/gpu_session.sh [kernel-data-folder]
# Everything lands in /tmp/gpu-session; after every stage it is packed into $OUT/session.tgz (with $OUT/summary.txt),
# so a stage cut off by the call's limit still returns the earlier ones. Read it back with the 'score' verbs.
set -u
OUT=${OUT:-/tmp/gpu-session-out}
DATA=${1:-../shared/data/kernels}
S=/tmp/gpu-session
mkdir -p "$OUT" "$S"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
pack() { echo "== $(date +%T) $1 done (rc $2)" >> "$OUT/summary.txt"; tar -czf "$OUT/session.tgz" -C "$S" . ; }

{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER | head -60
  python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'lightning', lightning.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"; } \
  > "$S/env.txt" 2>&1
pack env $?

timeout 150 python3 -m pytest tests/job/test_cuda.py -p no:cacheprovider -o addopts="-ra" -q > "$S/pytest.txt" 2>&1
rc=$?; tail -5 "$S/pytest.txt" >> "$OUT/summary.txt"; pack pytest $rc

timeout 200 python3 bench/gpu_lambda.py measure --out "$S/lambda" --budget-s 140 > "$S/lambda.log" 2>&1
pack lambda $?

timeout 80 python3 bench/kernel_replay.py measure --out "$S/kernels" --data "$DATA" --budget-s 55 > "$S/kernels.log" 2>&1
pack kernels $?

timeout 90 python3 bench/profile_overhead.py --accelerator cuda --rounds 3 --warmup 20 --profile 100 --after 100 \
  --out "$S/overhead" > "$S/overhead.log" 2>&1
pack overhead $?

timeout 60 python3 -m lightning_srifty.cli demo --accelerator cuda --strategy srifty_ddp --devices 1 --no-progress \
  --profile-steps 100 --output "$S/demo_ddp/profile.json" > "$S/demo_ddp.log" 2>&1
pack demo-ddp $?
timeout 60 python3 -m lightning_srifty.cli demo --model lm --accelerator cuda --precision bf16-mixed --no-progress \
  --profile-steps 100 --output "$S/demo_lm/profile.json" > "$S/demo_lm.log" 2>&1
pack demo-lm $?

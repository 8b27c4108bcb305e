#!/usr/bin/env bash
# The device checks of a session lent one GPU, in one call, the most valuable first, each stage bounded in time and
# the whole held inside TOTAL_S seconds (a stage starts only with the time it needs left):
#   1. bench/kernel_replay.py measure: NeuSight's H100 GEMM shapes in its orientation and transposed (#38 item 2)
#   2. bench/cnn_kernels.py measure: batch norm, layout conversions, pooling, convolutions over shapes (#40 item 2)
#   3. bench/kernel_breakdown.py measure: ResNet-50 and BERT steps per kernel (#40's per-class figures on this GPU)
#   4. bench/gpu_lambda.py measure: the Lambda models profiled by the callback (absolute and ratio paths, held out)
#   5. bench/gpu_clocks.py measure: the clock and rate sustained under FP32 / TF32 / bf16 GEMM load (#38 items 4, 5)
#   6. srifty demo on CUDA (the CNN with srifty_ddp on one GPU: NCCL hook; #40's demo step), and the small LM in bf16
#   7. tests/job/test_cuda.py (CUDA-event clock, callback on CUDA, the CUDA operator table against the meta capture)
# Usage, from the repository root on the GPU machine:
#   OUT=<folder> TOTAL_S=<seconds> bash bench/gpu_session.sh [kernel-data-folder]
# The kernel data folder holds NeuSight's linear.csv and bmm.csv (../shared does not travel: carry a copy).
# Everything lands in /tmp/gpu-session; after every stage it is packed into $OUT/session.tgz (with $OUT/summary.txt),
# so a stage cut off by the call's limit still returns the earlier ones. Read it back with the 'score' verbs.
set -u
OUT=${OUT:-/tmp/gpu-session-out}
TOTAL_S=${TOTAL_S:-540}
DATA=${1:-../shared/data/kernels}
S=/tmp/gpu-session
START=$(date +%s)
mkdir -p "$OUT" "$S"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
pack() { echo "== $(date +%T) +$(( $(date +%s) - START ))s $1 done (rc $2)" >> "$OUT/summary.txt"; tar -czf "$OUT/session.tgz" -C "$S" . ; }
# stage NAME LIMIT_S COMMAND...: runs COMMAND under `timeout` of LIMIT_S or what is left (minus 10 s to pack), and
# skips it when under 20 s would be left
stage() {
  local name=$1 limit=$2; shift 2
  local left=$(( TOTAL_S - ($(date +%s) - START) - 10 ))
  if [ "$left" -lt 20 ]; then echo "== $name skipped: ${left}s left" >> "$OUT/summary.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" > "$S/$name.log" 2>&1
  local rc=$?
  tail -3 "$S/$name.log" | sed "s/^/  $name: /" >> "$OUT/summary.txt"
  pack "$name" $rc
}

{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER | head -60
  python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'lightning', lightning.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name())"; } > "$S/env.txt" 2>&1
pack env $?

stage kernels 70 python3 bench/kernel_replay.py measure --out "$S/kernels" --data "$DATA" --budget-s 50
stage cnn 110 python3 bench/cnn_kernels.py measure --out "$S/cnn" --budget-s 85
stage breakdown 100 python3 bench/kernel_breakdown.py measure --out "$S/breakdown" --budget-s 60
stage lambda 150 python3 bench/gpu_lambda.py measure --out "$S/lambda" --budget-s 110
stage clocks 45 python3 bench/gpu_clocks.py measure --out "$S/clocks" --seconds 7
stage demo-ddp 50 python3 -m lightning_srifty.cli demo --accelerator cuda --strategy srifty_ddp --devices 1 \
  --no-progress --profile-steps 100 --output "$S/demo_ddp/profile.json"
stage demo-lm 50 python3 -m lightning_srifty.cli demo --model lm --accelerator cuda --precision bf16-mixed \
  --no-progress --profile-steps 100 --output "$S/demo_lm/profile.json"
stage pytest 120 python3 -m pytest tests/job/test_cuda.py -p no:cacheprovider -o addopts="-ra" -q
echo "== total $(( $(date +%s) - START ))s" >> "$OUT/summary.txt"

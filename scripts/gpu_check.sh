#!/usr/bin/env bash
# GPU checks in one prepared script (issues 7 and 22), sized for 10 minutes of device time including the machine's
# start-up: every stage has its own timeout and budget (listed in experiments/speed/README.md), prints progress, and
# writes its result to the output folder as soon as it finishes, so a cut-off run still returns what finished.
# Run from the repository root on a CUDA machine whose python3 has torch and triton:   bash scripts/gpu_check.sh
# fla comes from the carried wheels in .whl/ (installed to /tmp/site) unless python3 already imports it.
# Result JSON goes to <root>/paper/speed/ (root: $OUT/results when $OUT is set, the device tool's folder, else
# results/), where `state-reduction render table19 --profile paper` reads it; logs, env.txt, the kernel report, the
# rehearsal and the rendered tables go to $OUT (else results/paper/speed/gpu_check/).
#
# Stages, most important first (seconds: own timeout; all of them within GPU_CHECK_BUDGET_S, default 420):
#   kernels        75  fla's Triton kernels vs the torch references at the 1.3B shapes, forward and backward,
#                      bf16 (relative RMS <= 2e-2) and fp32 (<= 5e-3, TF32 dots) (tests/backend/test_kernels_gpu.py)
#   mixer_b32      80  Table 19 cell: one GDN mixer, T 2048, batch 32, d_k 128 vs 64 vs 32
#   decode_b64     80  Table 17 cell: 1.3B-shaped GDN, 24 layers, bf16, batch 64 after a 512-token prompt, CUDA graphs
#   rft_bf16       60  RFT throughput in bf16 at the 1.3B shape (4 blocks, 5 steps of 2 x 2048, the paper recipe)
#   rehearsal     100  `state-reduction rehearse` on CUDA: GDN 1.3B (4 blocks) l1/drrqr/grad at 50%, RFT, evaluate, speed
#   recurrence     25  one decode step: fla's fused recurrent kernel, one layer, a 2-layer model (Amdahl bound)
#
# Lessons from the 2026-11-30 H200 run (experiments/speed/gpu_runs/2026-11-30-h200/): Triton compilation and
# autotuning dominate (a 6-point chunk-GDN forward timing took > 90 s), and fla 0.6.0 refuses the gated-delta-rule
# chunk *backward* on Hopper with triton < 3.7.1 (the kernels stage records that as a failed test, not a hang).
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET_S=${GPU_CHECK_BUDGET_S:-420}  # stages only; rendering after them takes seconds
if [ -n "${OUT:-}" ]; then RESULTS_ROOT="$OUT/results"; OUT_DIR="$OUT"; else RESULTS_ROOT=results; OUT_DIR=results/paper/speed/gpu_check; fi
JSON_DIR="$RESULTS_ROOT/paper/speed"
mkdir -p "$OUT_DIR" "$JSON_DIR"
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"

say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }

# stage NAME SECONDS CMD...: runs CMD with a hard timeout, never past the total budget
stage() {
  local name=$1 want=$2; shift 2
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  local limit=$(( want < left ? want : left ))
  if (( limit < 20 )); then say "SKIP $name: only ${left}s of the ${BUDGET_S}s budget left"; return 0; fi
  say "START $name (timeout ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$name.out" 2>&1
  local rc=$?
  tail -n 25 "$OUT_DIR/$name.out" >> "$LOG"
  if (( rc == 124 || rc == 137 )); then say "TIMEOUT $name after ${limit}s"; else say "END $name rc=$rc"; fi
}

export PYTHONPATH="$PWD/src:/tmp/site:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! python3 -c "import fla" 2>/dev/null; then
  say "installing fla from .whl/ to /tmp/site"
  python3 -m pip install --quiet --no-deps --no-index --target /tmp/site .whl/*.whl >> "$LOG" 2>&1 || say "fla install failed"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__)" 2>&1
  git rev-parse HEAD 2>/dev/null; git status --porcelain --untracked-files=no 2>/dev/null | head -20
} > "$OUT_DIR/env.txt"
cat "$OUT_DIR/env.txt" >> "$LOG"

BENCH=(python3 -m state_reduction.speed.cli bench)
COMMON=(--device cuda --profile paper --threads 1)

# 1. kernels at the paper's shapes (forward and backward; the report is written when the stage ends)
stage kernels 75 env SR_KERNEL_SHAPES=paper python3 -m pytest -q -m gpu tests/backend/test_kernels_gpu.py \
  -p no:cacheprovider --junitxml "$OUT_DIR/kernels_paper_shapes.xml"
# 2. Table 19 headline: one mixer layer, T 2048, batch 32, d_k 128 vs 64 vs 32 (paper: 1.28x, 1.51x)
stage mixer_b32 80 "${BENCH[@]}" mixer "${COMMON[@]}" --batch-sizes 32 --seq-len 2048 --keep \
  --warmup 3 --steps 10 --repeats 3 --out "$JSON_DIR/mixer_gdn_cuda_b32.json"
# 3. Table 17: full 1.3B-shaped GDN (24 layers, bf16), decode after a 512-token prompt, CUDA graphs
stage decode_b64 80 "${BENCH[@]}" decode "${COMMON[@]}" --model gdn-1.3b --batch-sizes 64 --prompt-len 512 \
  --cuda-graphs on --warmup 10 --steps 50 --repeats 3 --out "$JSON_DIR/decode_gdn-1.3b_cuda_b64.json"
# 4. RFT throughput, bf16 autocast over fp32 master weights, 1.3B width (4 blocks), the paper recipe's shapes
stage rft_bf16 60 python3 -m state_reduction.cli rehearse gated_deltanet-1.3b --layers 4 --stages rft \
  --batch-size 2 --seq-len 2048 --rft-steps 5 --out /tmp/sr_rft_bf16 --results-root "$RESULTS_ROOT"
# 5. the rehearsal on CUDA (prune all at once and streamed, reload, RFT, evaluate, speed)
stage rehearsal 100 python3 -m state_reduction.cli rehearse gated_deltanet-1.3b --layers 4 --methods l1 drrqr grad \
  --ratios 0.5 --n-calib 4 --seq-len 2048 --out /tmp/sr_rehearsal --results-root "$RESULTS_ROOT"
# 6. one decode step: fla's fused recurrent kernel alone, one layer, a 2-layer model, with the Amdahl bound
stage recurrence 25 "${BENCH[@]}" recurrence "${COMMON[@]}" --batch-sizes 64 --layers 2 \
  --warmup 10 --steps 100 --repeats 3 --out "$JSON_DIR/recurrence_gdn_cuda.json"

for t in table17 table19; do  # LaTeX/Markdown from whatever results exist (no GPU time; tables need no matplotlib)
  python3 -m state_reduction.cli render $t --profile paper --results-root "$RESULTS_ROOT" --out-root "$OUT_DIR" >> "$LOG" 2>&1 || say "render $t: no results"
done
say "done in $(( $(date +%s) - START ))s; results in $JSON_DIR, logs and tables in $OUT_DIR"
ls -l "$OUT_DIR" "$JSON_DIR" >> "$LOG"

#!/usr/bin/env bash
# make test-gpu: fsdp-cpp on a machine with an NVIDIA GPU, one script, one
# results file (docs/GPU.md).
#
#   bash tests/gpu/run.sh                   # = make test-gpu
#   BUILD=build SKIP_BUILD=1 DEVICE=cpu SPEED_SHAPE=small bash tests/gpu/run.sh   # the plumbing, on a CPU
#   BUILD_ONLY=1 bash tests/gpu/run.sh; SKIP_BUILD=1 bash tests/gpu/run.sh
#                                           # the same in two calls (a machine lent by the
#                                           # call: docs/GPU.md, "The device machine")
#
# Steps, each timed and under `timeout`, each a row of $OUT/test-gpu.md (its
# log in $OUT/logs/STEP.log); a failed step is recorded as FAILED with its
# log's last lines and the script goes on:
#   environment        nvidia-smi -L; torch, CUDA and NCCL versions; the build's
#                      packages (headers) that are missing, and the bundle
#   configure, build   cmake with FSDP_CUDA against $PYTHON's torch; only the
#                      binaries the steps below run. Where the system lacks the
#                      build packages, from $BUNDLE (make gpu-bundle)
#   gpu_tests          fsdp_tests --gtest_filter='Gpu.*'
#   parity_*           GPT-mini (L=2, d=64) trained $PARITY_STEPS steps in fp32 by
#                      plain libtorch on the GPU (fsdp_test_worker gpt_reference),
#                      by FULL_SHARD at N=1 over NCCL and at N=2 with both ranks on
#                      cuda:0 (Gloo, tensors staged through host memory): every
#                      tensor and every loss within 1e-5 of plain libtorch's
#   plan, speed        GPT-mini d=768 L=12 T=1024 h=12, bf16, N=1: bench_train
#                      (FULL_SHARD) and PyTorch FSDP2 (bench/ddp_reference.py)
#                      alternating in $SPEED_ROUNDS rounds; step time, tokens/s,
#                      MFU, peak device memory against `fsdp plan`
#   goals              step <= 1.0 x FSDP2's, MFU >= 40%, peak within 10% of the plan
#
# Exit status: 1 when a step failed, else 2 when a goal is not met, else 0.
#
# Variables (defaults):
#   OUT (runs/test-gpu)   results: test-gpu.md, and the rest in test-gpu-logs.tar.gz
#                         (steps.tsv, logs/, speed/, parity/*.txt); parity/*.safetensors
#   PYTHON (python3)      an interpreter with torch: libtorch for the build, FSDP2
#   BUILD (build-gpu)     the build folder;  JOBS (nproc) parallel compile jobs
#   SKIP_BUILD (0)        1: use BUILD's binaries as they are when all are there
#                         (else configure and build as without it)
#   BUILD_ONLY (0)        1: environment, configure and build only
#   BUNDLE (gpu-bundle)   headers, CMake files and GoogleTest's sources of the build
#                         packages (make gpu-bundle); used when the system lacks them
#   DEVICE (cuda)         cpu: the dry run (Gloo, the CPU, no goals judged)
#   SPEED_SHAPE (full)    small: d=64 L=2 T=128 h=4 (the dry run's)
#   SPEED_BATCH (8)  SPEED_ROUNDS (2)  SPEED_STEPS (5)  SPEED_WARMUP (3)
#   ATTENTIONS ("matmul sdpa")  GPT-mini's attention on both sides, each in every round
#   PARITY_STEPS (20)     PEAK_TFLOPS (989: an H200's dense bf16, by the datasheet)
#   MATMUL_TFLOPS (790: what a large bf16 matmul reaches on an H200; a second MFU column)
#   TIME_BUDGET (560; 280 with BUILD_ONLY=1, 300 with SKIP_BUILD=1: one call each
#                         on a machine lent by the call)
#                         seconds for the whole script: each step's limit is cut
#                         to what is left, and one with under 30 s left is not
#                         started (FAILED)
#   BUILD_TIMEOUT (330)   the build step's own limit
#   TIME_SCALE (1)        every limit above and each step's own, times this: a
#                         machine with fewer cores than the one the limits are
#                         sized for (the rehearsal's build, make rehearse-gpu)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
export DEVICE=${DEVICE:-cuda}
export PYTHON=${PYTHON:-python3}
export JOBS=${JOBS:-$(nproc)}
export SKIP_BUILD=${SKIP_BUILD:-0}
export BUILD_ONLY=${BUILD_ONLY:-0}
export SPEED_SHAPE=${SPEED_SHAPE:-full}
export SPEED_BATCH=${SPEED_BATCH:-8}
export SPEED_ROUNDS=${SPEED_ROUNDS:-2}
export ATTENTIONS=${ATTENTIONS:-matmul sdpa}
export SPEED_STEPS=${SPEED_STEPS:-5}
export SPEED_WARMUP=${SPEED_WARMUP:-3}
export PARITY_STEPS=${PARITY_STEPS:-20}
export PEAK_TFLOPS=${PEAK_TFLOPS:-989}
export MATMUL_TFLOPS=${MATMUL_TFLOPS:-790}
# The budgets of a machine lent by the call (docs/GPU.md): the build's call
# and the measuring call each fit one call with room to rerun one of them.
if [ "$BUILD_ONLY" = 1 ]; then TIME_BUDGET=${TIME_BUDGET:-280}
elif [ "$SKIP_BUILD" = 1 ]; then TIME_BUDGET=${TIME_BUDGET:-300}
else TIME_BUDGET=${TIME_BUDGET:-560}; fi
BUILD_TIMEOUT=${BUILD_TIMEOUT:-330}
TIME_SCALE=${TIME_SCALE:-1}
[[ $TIME_SCALE =~ ^[1-9][0-9]*$ ]] || { echo "tests/gpu/run.sh: TIME_SCALE=$TIME_SCALE: expected a whole number >= 1" >&2; exit 2; }
TIME_BUDGET=$((TIME_BUDGET * TIME_SCALE)) BUILD_TIMEOUT=$((BUILD_TIMEOUT * TIME_SCALE))
OUT=${OUT:-runs/test-gpu}
BUILD=${BUILD:-build-gpu}
BUNDLE=${BUNDLE:-gpu-bundle}
mkdir -p "$OUT" "$BUILD"
export OUT=$(cd "$OUT" && pwd) BUILD=$(cd "$BUILD" && pwd) ROOT
export BUNDLE=$(cd "$BUNDLE" 2>/dev/null && pwd || echo "$ROOT/$BUNDLE")
export BIN=$BUILD/bin
case $DEVICE in
  cuda) export FSDP_BACKEND_N1=nccl PARITY_DEVICE_N1=cuda PARITY_DEVICE_N2=cuda:0 REF_DEVICE=cuda:0 ;;
  cpu) export FSDP_BACKEND_N1=gloo PARITY_DEVICE_N1=cpu PARITY_DEVICE_N2=cpu REF_DEVICE=cpu ;;
  *) echo "tests/gpu/run.sh: DEVICE=$DEVICE: expected cuda or cpu" >&2; exit 2 ;;
esac
case $SPEED_SHAPE in
  full) export S_DIM=768 S_LAYERS=12 S_SEQ=1024 S_HEADS=12 ;;
  small) export S_DIM=64 S_LAYERS=2 S_SEQ=128 S_HEADS=4 ;;
  *) echo "tests/gpu/run.sh: SPEED_SHAPE=$SPEED_SHAPE: expected full or small" >&2; exit 2 ;;
esac

# ---- the steps (each runs as `run.sh __step NAME` under timeout) -------------
# A step writes its log to stdout; a one-line summary to $DETAIL and, where it
# has a table, Markdown to $FRAGMENT; its exit status is its result.

# The build packages (the Makefile's BUILD_DEBS) that find_package needs
# beside torch, each known by one header: prints those the system lacks.
missing_packages() {
  local h missing=()
  for h in nlohmann/json.hpp:nlohmann-json3-dev CLI/CLI.hpp:libcli11-dev gtest/gtest.h:libgtest-dev; do
    [ -e "/usr/include/${h%%:*}" ] || [ -e "/usr/local/include/${h%%:*}" ] || missing+=("${h#*:}")
  done
  echo "${missing[*]}"
}

# Where the system lacks any build package, the bundle gives all of them
# (one consistent set: the versions this project's own machines test), with
# GoogleTest built from its sources by this machine's compiler. Where
# GoogleTest is still missing, the tests are left out and the step fails, but
# the build goes on without them: the speed table needs none of them.
TARGETS_FILE=$OUT/logs/build-targets
# FSDP_CUDA: ON for a GPU run; on a CPU, CMake's default (ON where torch has
# CUDA libraries: a CPU rehearsal then still compiles and links the plugin
# as the GPU run will).
cuda_of_build() { grep -q '^FSDP_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && echo ON || echo OFF; }
step_configure() {
  local cuda missing note=""
  local args=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDP_PYTHON="$PYTHON"
              -DFSDP_BUILD_BENCH=ON -DFSDP_BUILD_EXAMPLES=ON -DFSDP_INSTALL=OFF)
  if [ "$DEVICE" = cuda ]; then args+=(-DFSDP_CUDA=ON); fi
  # Ninja where there is one (a new build folder only: the generator is
  # fixed at the first configure): it starts a target's compiles without
  # waiting for the libraries below it to be linked, where Makefiles build
  # the layers one after another and leave most of 16 cores idle.
  if [ ! -f "$BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
  missing=$(missing_packages)
  if [ -n "$missing" ] && [ -f "$BUNDLE/MANIFEST" ]; then
    args+=(-DCMAKE_PREFIX_PATH="$BUNDLE/usr" -DFSDP_GTEST_SOURCE_DIR="$BUNDLE/usr/src/googletest/googletest")
    note="; the system lacks $missing: all from the bundle"
  elif [ -n "$missing" ]; then
    note="; the system lacks $missing and there is no bundle ($BUNDLE: make gpu-bundle)"
  fi
  if cmake "${args[@]}" -DFSDP_BUILD_TESTS=ON; then
    cuda=$(cuda_of_build)
    echo "fsdp fsdp_tests fsdp_test_worker gpt tiny bench_train$([ $cuda = ON ] && echo ' fsdp_cuda')" >"$TARGETS_FILE"
    echo "FSDP_CUDA=$cuda, torch of $PYTHON$note" >"$DETAIL"
    return 0
  fi
  echo "== again without the tests (FSDP_BUILD_TESTS=OFF)"
  cmake "${args[@]}" -DFSDP_BUILD_TESTS=OFF
  cuda=$(cuda_of_build)
  echo "fsdp gpt tiny bench_train$([ $cuda = ON ] && echo ' fsdp_cuda')" >"$TARGETS_FILE"
  echo "FSDP_CUDA=$cuda; configured only WITHOUT the tests (see the log: a package missing?)$note" >"$DETAIL"
  return 1
}

step_build() {
  local targets
  read -r -a targets <"$TARGETS_FILE"
  cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
  echo "${targets[*]}, -j $JOBS" >"$DETAIL"
}

step_environment() {
  local rc=0
  { echo '```'
    if command -v nvidia-smi >/dev/null; then nvidia-smi -L || rc=1; else echo "nvidia-smi: not on this machine"; fi
    "$PYTHON" - <<'EOF' || rc=1
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("devices", torch.cuda.device_count(), "|", torch.cuda.get_device_name(0), "| NCCL",
          ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?")
EOF
    echo "cmake $(cmake --version | head -1 | awk '{print $3}'), $(${CXX:-c++} --version | head -1)"
    if command -v nvcc >/dev/null; then nvcc --version | tail -1; else echo "nvcc: not on PATH"; fi
    # What the build finds with find_package beside torch (Makefile's BUILD_DEBS).
    local missing
    missing=$(missing_packages)
    echo "build packages missing: ${missing:-none}"
    if [ -f "$BUNDLE/MANIFEST" ]; then
      echo "bundle $(basename "$BUNDLE"): $(cut -f1,2 "$BUNDLE/MANIFEST" | tr '\t\n' '= ')"
    else
      echo "bundle: none at $BUNDLE"
    fi
    echo '```'; } >"$FRAGMENT" 2>&1
  cat "$FRAGMENT"
  if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "torch sees no CUDA device" >"$DETAIL"
    return 1
  fi
  { grep -m1 -E '^GPU 0|^python' "$FRAGMENT" || true; } | cut -c1-120 >"$DETAIL"
  return $rc
}

step_gpu_tests() {
  local rc=0
  "$BIN/fsdp_tests" --gtest_filter='Gpu.*' --gtest_color=no || rc=$?
  local log=$LOG ok skipped failed
  ok=$(grep -c '^\[       OK \]' "$log" || true)
  skipped=$(grep -c '^\[  SKIPPED \] Gpu\.' "$log" || true)
  failed=$(grep -c '^\[  FAILED  \] Gpu\..* ms)$' "$log" || true)
  echo "$ok passed, $skipped skipped, $failed failed" >"$DETAIL"
  { echo "| test | result |"; echo "|---|---|"
    { grep -E '^\[ +(OK|SKIPPED|FAILED) +\] Gpu\.[^ ]+ \(' "$log" || true; } |
      sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+) \((.*)\)$/| `\2` | \1 (\3) |/'
  } >"$FRAGMENT"
  [ "$rc" = 0 ] || return "$rc"
  if [ $((ok + skipped + failed)) = 0 ]; then echo "no test named Gpu.* in this build" >"$DETAIL"; return 1; fi
  # On a GPU only the tests that need more GPUs than the machine has may skip.
  local unexpected
  unexpected=$(grep -A0 -B1 '^\[  SKIPPED \] Gpu\.' "$log" | grep -c 'no CUDA device' || true)
  if [ "$DEVICE" = cuda ] && [ "$unexpected" != 0 ]; then echo "$unexpected skipped for want of a GPU on a machine with one" >>"$DETAIL"; return 1; fi
  return 0
}

PARITY=$OUT/parity
# The worker's options, those at their defaults (device=cpu, steps=3) left
# out: the CPU dry run then also runs with a worker built before they existed.
worker_opts() {  # worker_opts DEVICE
  [ "$1" = cpu ] || printf '%s\n' "device=$1"
  [ "$PARITY_STEPS" = 3 ] || printf '%s\n' "steps=$PARITY_STEPS"
}
step_parity_reference() {
  local opts
  mapfile -t opts < <(worker_opts "$REF_DEVICE")
  "$BIN/fsdp_test_worker" gpt_reference "$PARITY/reference.safetensors" "${opts[@]}"
  echo "plain libtorch on $REF_DEVICE, $PARITY_STEPS steps" >"$DETAIL"
}

# parity_run N BACKEND DEVICE
parity_run() {
  local n=$1 backend=$2 device=$3 rc=0 opts
  mapfile -t opts < <(worker_opts "$device")
  FSDP_BACKEND=$backend "$BIN/fsdp" run -n "$n" -- "$BIN/fsdp_test_worker" gpt_parity full "$PARITY/n$n.safetensors" \
    "${opts[@]}" || return $?
  "$PYTHON" "$ROOT/tests/gpu/compare_weights.py" "$PARITY/reference.safetensors" "$OUT/logs/parity_reference.log" \
    "$PARITY/n$n.safetensors" "$LOG" --steps "$PARITY_STEPS" --tol 1e-5 >"$PARITY/compare_n$n.txt" || rc=$?
  cat "$PARITY/compare_n$n.txt"
  echo "FULL_SHARD N=$n on $device, FSDP_BACKEND=$backend vs plain libtorch: $(head -1 "$PARITY/compare_n$n.txt")" \
    >"$DETAIL"
  return $rc
}
step_parity_n1() { parity_run 1 "$FSDP_BACKEND_N1" "$PARITY_DEVICE_N1"; }
step_parity_n2() { parity_run 2 gloo "$PARITY_DEVICE_N2"; }

# bounded LIMIT CMD...: CMD under a timeout of its own, in its own process
# group (timeout makes one); a TERM to this step (the step's own limit) is
# passed on, so nothing CMD started outlives the step.
bounded() {
  local limit=$1 pid rc=0
  shift
  timeout -k 5 "$limit" "$@" &
  pid=$!
  trap 'kill -TERM $pid 2>/dev/null' TERM
  wait "$pid" || rc=$?
  if kill -0 "$pid" 2>/dev/null; then  # the wait was cut short by the TERM: wait for the end
    rc=0
    wait "$pid" || rc=$?
  fi
  trap - TERM
  return "$rc"
}

SPEED=$OUT/speed
step_plan() {
  local att
  for att in $ATTENTIONS; do
    "$BIN/fsdp" plan --model gpt --layers "$S_LAYERS" --dim "$S_DIM" --heads "$S_HEADS" --seq "$S_SEQ" \
      --batch "$SPEED_BATCH" --world 1 --strategy full --dtype bf16 --prefetch 2 --attention "$att" --json \
      >"$SPEED/plan-$att.json"
  done
  for att in $ATTENTIONS; do
    "$PYTHON" -c 'import json, sys; p = json.load(open(sys.argv[1]))["plan"]; print("%s: peak %.1f MiB at %s" % (sys.argv[2], p["peak"] / 2**20, p.get("peak_at", "?")))' \
      "$SPEED/plan-$att.json" "$att"
  done | tee "$DETAIL"
}

step_speed() {
  local round att ours_ok=0 peer_ok=0 runs=0
  local shape=(--dim "$S_DIM" --layers "$S_LAYERS" --heads "$S_HEADS" --seq "$S_SEQ" --batch "$SPEED_BATCH")
  # bench_train's flags, those at its defaults (cpu, T=128, h=4) left out: the
  # CPU dry run then also runs with a bench_train built before they existed.
  local ours=(--dim "$S_DIM" --layers "$S_LAYERS" --batch "$SPEED_BATCH")
  [ "$DEVICE" = cpu ] || ours+=(--device "$PARITY_DEVICE_N1")
  [ "$S_SEQ" = 128 ] || ours+=(--seq "$S_SEQ")
  [ "$S_HEADS" = 4 ] || ours+=(--heads "$S_HEADS")
  rm -f "$SPEED/ours.jsonl" "$SPEED/fsdp2.jsonl"
  # Every round runs each attention on both sides before the next round:
  # a slow moment of the machine lands on all of them.
  for round in $(seq 1 "$SPEED_ROUNDS"); do
    for att in $ATTENTIONS; do
      runs=$((runs + 1))
      echo "== round $round, attention $att: fsdp-cpp bench_train"
      if bounded "${SPEED_RUN_TIMEOUT:-120}" env FSDP_BACKEND="$FSDP_BACKEND_N1" "$BIN/fsdp" run -n 1 -- \
          "$BIN/bench_train" "${ours[@]}" --attention "$att" --strategies full --prefetch on \
          --dtypes bf16 --steps "$SPEED_STEPS" --warmup "$SPEED_WARMUP" --rounds 1 --json "$SPEED/ours.jsonl"; then
        ours_ok=$((ours_ok + 1))
      fi
      echo "== round $round, attention $att: PyTorch FSDP2"
      if bounded "${SPEED_RUN_TIMEOUT:-120}" "$PYTHON" "$ROOT/bench/ddp_reference.py" --device "$DEVICE" --world 1 \
          --modes fsdp2 --dtype bf16 --attention "$att" "${shape[@]}" --steps "$SPEED_STEPS" \
          --warmup "$SPEED_WARMUP" --json "$SPEED/fsdp2.jsonl"; then
        peer_ok=$((peer_ok + 1))
      fi
    done
  done
  local plans=("$SPEED/plan-matmul.json")
  [ -e "$SPEED/plan-sdpa.json" ] && plans+=(--plan-sdpa "$SPEED/plan-sdpa.json")
  "$PYTHON" "$ROOT/tests/gpu/speed_table.py" "$SPEED/ours.jsonl" "$SPEED/fsdp2.jsonl" "${plans[@]}" \
    --peak-tflops "$PEAK_TFLOPS" --matmul-tflops "$MATMUL_TFLOPS" --device "$DEVICE" --goals "$SPEED/goals.tsv" \
    "${shape[@]}" >"$FRAGMENT" || true
  cat "$FRAGMENT"
  echo "runs that ran ($SPEED_ROUNDS rounds x attentions $ATTENTIONS): fsdp-cpp $ours_ok / $runs, FSDP2 $peer_ok / $runs" \
    >"$DETAIL"
  [ "$ours_ok" = "$runs" ] && [ "$peer_ok" = "$runs" ]
}

if [ "${1:-}" = __step ]; then
  "step_$2"
  exit $?
fi

# ---- the driver ---------------------------------------------------------------
MD=$OUT/test-gpu.md
rm -rf "$OUT/logs" "$PARITY" "$SPEED" "$MD" "$OUT/test-gpu-logs.tar.gz"
mkdir -p "$OUT/logs" "$PARITY" "$SPEED"
: >"$OUT/steps.tsv"
START=$(date +%s)
DEADLINE=$((START + TIME_BUDGET))
FAILED=0
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")
DIRTY=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo " (with uncommitted changes)" || true)

# The results file, rewritten after every step: a run cut short still leaves
# what it measured.
render() {
  {
    echo "# make test-gpu"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT$DIRTY, DEVICE=$DEVICE, SPEED_SHAPE=$SPEED_SHAPE," \
      "$(hostname), $(nproc) cores; docs/GPU.md says what each step does."
    echo
    echo "| step | result | seconds | detail |"
    echo "|---|---|---:|---|"
    local name result secs detail
    while IFS=$'\t' read -r name result secs detail; do
      echo "| $name | $result | $secs | ${detail//|/\\|} |"
    done <"$OUT/steps.tsv"
    for name in environment gpu_tests speed; do
      [ -s "$OUT/logs/$name.md" ] || continue
      echo
      echo "## $name"
      echo
      cat "$OUT/logs/$name.md"
    done
    if [ -s "$OUT/logs/goals.md" ]; then
      echo
      echo "## goals"
      echo
      cat "$OUT/logs/goals.md"
    fi
    while IFS=$'\t' read -r name result secs detail; do
      case $result in
        FAILED*)
          echo
          echo "## $name: $result, the last lines of logs/$name.log"
          echo
          echo '```'
          tail -n 25 "$OUT/logs/$name.log" 2>/dev/null | cut -c1-300
          echo '```' ;;
      esac
    done <"$OUT/steps.tsv"
  } >"$MD.tmp"
  mv "$MD.tmp" "$MD"
}

record() {  # record NAME RESULT SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(echo "$4" | tr '\t\n' '  ' | cut -c1-400)" >>"$OUT/steps.tsv"
  printf '%-18s %-22s %7s s  %s\n' "$1" "$2" "$3" "$4"
  render
}

# run_step NAME LIMIT_S: runs step_NAME under timeout, records the row.
run_step() {
  local name=$1 limit=$2 left rc=0 t0 t1
  left=$((DEADLINE - $(date +%s) - 20))  # 20: the kill grace (-k 10) and the summary after
  if [ "$left" -lt 10 ]; then
    FAILED=1
    record "$name" "FAILED (not started)" 0 "TIME_BUDGET=$TIME_BUDGET s spent before it"
    return 1
  fi
  limit=$((limit * TIME_SCALE))
  [ "$limit" -le "$left" ] || limit=$left
  export LOG=$OUT/logs/$name.log DETAIL=$OUT/logs/$name.detail FRAGMENT=$OUT/logs/$name.md
  : >"$DETAIL"
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" bash "$ROOT/tests/gpu/run.sh" __step "$name" >"$LOG" 2>&1 </dev/null || rc=$?
  t1=$(date +%s.%N)
  local secs detail
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  detail=$(head -c 400 "$DETAIL" | tr '\n' ' ')
  if [ "$rc" = 0 ]; then
    record "$name" ok "$secs" "$detail"
  else
    FAILED=1
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      record "$name" FAILED "$secs" "timed out after $limit s; $detail"
    else
      record "$name" FAILED "$secs" "exit status $rc; $detail"
    fi
  fi
  return "$rc"
}

# The results file, the archive beside it, and the exit status.
goals_missed=0
finish() {
  render
  # Everything but the weights in one file, to carry the run away beside test-gpu.md.
  tar -czf "$OUT/test-gpu-logs.tar.gz" -C "$OUT" steps.tsv logs speed $(cd "$OUT" && ls parity/*.txt 2>/dev/null) ||
    echo "tests/gpu/run.sh: could not write $OUT/test-gpu-logs.tar.gz"
  echo "tests/gpu/run.sh: $(( $(date +%s) - START )) s; results in $MD and $OUT/test-gpu-logs.tar.gz"
  if [ "$FAILED" != 0 ]; then exit 1; fi
  if [ "$goals_missed" != 0 ]; then exit 2; fi
  exit 0
}

echo "tests/gpu/run.sh: DEVICE=$DEVICE BUILD=$BUILD OUT=$OUT TIME_BUDGET=$TIME_BUDGET s (results: $MD)"
run_step environment 60 || true
have_bins=1
for b in fsdp fsdp_tests fsdp_test_worker bench_train; do [ -x "$BIN/$b" ] || have_bins=0; done
if [ "$SKIP_BUILD" = 1 ] && [ "$have_bins" = 1 ]; then
  record configure skipped 0 "SKIP_BUILD=1: the binaries of $BUILD as they are"
  record build skipped 0 "SKIP_BUILD=1"
else
  run_step configure 120 || true
  if [ -s "$TARGETS_FILE" ]; then
    run_step build "$BUILD_TIMEOUT" || true
  else
    record build "FAILED (not started)" 0 "configure failed"
  fi
fi
# The first of two calls ends here: the second (SKIP_BUILD=1) finds the build.
if [ "$BUILD_ONLY" = 1 ]; then finish; fi
run_step gpu_tests 150 || true
if run_step parity_reference 90; then
  run_step parity_n1 90 || true
  run_step parity_n2 90 || true
else
  record parity_n1 "FAILED (not started)" 0 "no reference: parity_reference failed"
  record parity_n2 "FAILED (not started)" 0 "no reference: parity_reference failed"
  FAILED=1
fi
run_step plan 30 || true
run_step speed 300 || true

# The goals, from the speed step's table.
{
  if [ -s "$SPEED/goals.tsv" ]; then
    while IFS=$'\t' read -r name value target status; do
      echo "- **$status** $name: $value (target $target)"
      [ "$status" != FAIL ] || goals_missed=1
    done <"$SPEED/goals.tsv"
    [ "$DEVICE" = cuda ] || echo "- (DEVICE=cpu: the dry run judges no goal)"
  else
    echo "- no goal judged: the speed step measured nothing"
    [ "$DEVICE" = cpu ] || goals_missed=1
  fi
} >"$OUT/logs/goals.md"
cat "$OUT/logs/goals.md"
finish

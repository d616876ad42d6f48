#!/usr/bin/env bash
# A model no rank can hold: GPT d=768 L=12 h=12 T=256 (85.7 M parameters:
# 342 MB of fp32 parameters, ~1.4 GB of training state with AdamW) trained
# for a few steps on N ranks of this host, each under a per-rank budget that
# lies between the sharded plan and the unsharded parameters.
#
#   examples/gpt/scale.sh BUILD_DIR
#
# Shows, in order: the planner's view; the same model refused at start at
# N = 1, under NO_SHARD and with eager construction (the planner's message);
# then the run (sharded construction, every block's activations recomputed
# in backward: --ac block; prefetch on, gpt's default) with a table per rank:
# the plan's peak, the counting allocator's peak of construction and of
# training, the process's VmHWM in its parts (libtorch at start, the
# allocator's tensors + comm buffers + cache, malloc's heap, the rest),
# checked against the planner's process budget. Environment: SCALE_N
# (ranks, default 8), SCALE_BUDGET (tensors, default 320MiB),
# SCALE_BUDGET_RSS (the whole process, default 512MiB), SCALE_STEPS
# (default 3), RUN_DIR (outputs; default runs/scale).
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BUILD=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
N=${SCALE_N:-8}
BUDGET=${SCALE_BUDGET:-320MiB}
BUDGET_RSS=${SCALE_BUDGET_RSS:-512MiB}
STEPS=${SCALE_STEPS:-3}
RUN=${RUN_DIR:-$ROOT/runs/scale}
for bin in fsdp gpt; do
  if [[ ! -x "$BUILD/bin/$bin" ]]; then
    echo "scale: $BUILD/bin/$bin not found; build it first: cmake --build $BUILD --target fsdp gpt" >&2
    exit 1
  fi
done
mkdir -p "$RUN"
# At T=256 the activations alone (A = 183 MiB) would pass the budget with the
# rest (163 MiB per rank at N=8): recomputing them block by block (activation
# checkpointing) keeps only each block's input, 11.3 MiB in all.
MODEL=(--dim 768 --layers 12 --heads 12 --seq 256 --batch 1)
AC=(--ac block)
# Text: the repository's own documents (any text does: a few steps only).
TEXT=("$ROOT"/docs/*.md "$ROOT"/README.md)
COMMON=(--text "${TEXT[@]}" "${MODEL[@]}" --steps "$STEPS" --eval-every 0 --log-every 1 --threads 1
        --lr 3e-4 --warmup 0 --no-progress)
start=$(date +%s)

echo "== the planner: FULL_SHARD at N=$N, --ac block, prefetch; tensors $BUDGET, the whole process $BUDGET_RSS"
# As the run below trains: gpt's loop drops the logits once the loss is computed; and with
# fsdp plan's default --share-host auto, host-shared units as the run has them on this host.
# So the plan's peak is the one the run prints with --plan.
PLAN=(plan --world "$N" --strategy full "${MODEL[@]}" --ac block --prefetch 1 --logits dropped --budget "$BUDGET"
      --budget-rss "$BUDGET_RSS")
"$BUILD/bin/fsdp" "${PLAN[@]}" | grep -E '^plan:|^host-shared units:|rest = |predicted peak|P_full|process budget|tensors get|nothing is left|^=>' || true
# The tensors' limit: the smaller of SCALE_BUDGET and what the process budget leaves them.
read -r LIMIT FITS < <("$BUILD/bin/fsdp" "${PLAN[@]}" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(j["recommendation"]["budget"], "yes" if j["recommendation"]["fits"] else "no")')
if [[ "$FITS" != yes ]]; then
  echo "scale: the planner says FULL_SHARD does not fit $BUDGET of tensors in a $BUDGET_RSS process at N=$N" >&2
  exit 1
fi

refuse() {  # label, ranks, extra flags...
  local label=$1 n=$2
  shift 2
  echo
  echo "== refused at start: $label"
  set +e
  out=$("$BUILD/bin/fsdp" run -n "$n" -- "$BUILD/bin/gpt" "${COMMON[@]}" "${AC[@]}" --max-memory "$LIMIT" "$@" 2>&1)
  rc=$?
  set -e
  echo "$out" | grep -m1 'cannot fit' | sed 's/^\[rank 0\] //' || true
  if [[ $rc -eq 0 ]]; then
    echo "scale: expected '$label' to be refused, but it ran" >&2
    exit 1
  fi
}
refuse "N=1 (FULL_SHARD)" 1
refuse "NO_SHARD at N=$N" "$N" --strategy none
refuse "eager construction at N=$N" "$N" --construct eager

echo
echo "== training: N=$N, FULL_SHARD, sharded construction, --max-memory $LIMIT (bytes) (log: $RUN/train.log)"
t0=$(date +%s)
"$BUILD/bin/fsdp" run -n "$N" -- "$BUILD/bin/gpt" "${COMMON[@]}" "${AC[@]}" --strategy full --construct sharded \
  --max-memory "$LIMIT" --rank-memory --plan > "$RUN/train.log" 2>&1 || {
  tail -30 "$RUN/train.log"
  echo "scale: the run failed (log: $RUN/train.log)" >&2
  exit 1
}
t1=$(date +%s)
grep -E '^\[rank 0\] (gpt:|step )' "$RUN/train.log" | sed 's/^\[rank 0\] //'
echo
echo "per rank, MiB: the tensors against the plan (limit $LIMIT bytes), then VmHWM in its parts against the process budget $BUDGET_RSS"
printf '%-5s %9s %9s %9s | %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n' rank "plan" "constr." "training" "at start" "tensors" "comm" "cache" \
  "malloc" "rest" "shared" "VmHWM" "its share" "PSS" "budget"
LINES=$(grep -o 'rank [0-9]* memory:.*' "$RUN/train.log" | sort -t' ' -k2 -n)
if [[ $(grep -c . <<< "$LINES") -ne $N ]]; then
  echo "scale: expected $N 'rank N memory:' lines in $RUN/train.log" >&2
  exit 1
fi
RSS_BYTES=$("$BUILD/bin/fsdp" "${PLAN[@]}" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["process_budget"]["rss"])')
awk -v rss="$RSS_BYTES" -v n="$N" '
  function m(x) { return x / 1048576 }
  { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[2] != "") f[kv[1]] = kv[2] }
    # Host-shared units: VmHWM counts the memory every rank maps whole; the
    # rank holds its share of it (the host holds it once).
    share = f["vmhwm"] - f["shared"] + f["shared"] / n
    over = share > rss
    if (over) bad++
    printf "%-5s %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9s\n", $2, m(f["plan_peak"]), m(f["construction"]),
           m(f["training_peak"]), m(f["at_start"]), m(f["tensors"]), m(f["comm"]), m(f["cache"]),
           m(f["malloc_used"] + f["malloc_free"]), m(f["code_since"] + f["unexplained"] + f["elsewhere"]),
           m(f["shared"]), m(f["vmhwm"]), m(share), m(f["pss"]), over ? "OVER" : "ok" }
  END { exit bad > 0 }' <<< "$LINES" || {
  echo "scale: a rank's VmHWM passed the process budget $BUDGET_RSS the planner answered for" >&2
  exit 1
}
echo "(malloc: in use beside the allocator + freed but kept; rest: library code paged in since start, stacks, unexplained;"
echo " shared: host-shared units every rank maps, counted whole in VmHWM; its share: VmHWM less shared + shared / $N,"
echo " what the budget bounds; PSS: the proportional set size at the end, shared pages divided among the ranks)"
echo
echo "training run: $((t1 - t0)) s; all of make scale: $(( $(date +%s) - start )) s"

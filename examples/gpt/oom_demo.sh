#!/usr/bin/env bash
# 让放不下的模型放得下: the same GPT-mini, the same per-rank memory budget, two
# strategies. NO_SHARD (every rank a full replica of P + G + O) runs out of
# memory and says which ledger term overflowed; FULL_SHARD ((P+G+O)/N per
# rank) trains.
#
#   examples/gpt/oom_demo.sh BUILD_DIR [BUDGET, default 96MiB]
#
# GPT-mini L=8 d=256 (6.4 M parameters), T=64, batch 4 per rank, 2 ranks.
# Data: data/fortunes/train.bin when `make demo` prepared it, else the
# repository's own docs as text.
set -uo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BUILD=$(cd "$1" && pwd)
BUDGET=${2:-96MiB}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for bin in fsdp gpt; do
  if [[ ! -x "$BUILD/bin/$bin" ]]; then
    echo "oom_demo: $BUILD/bin/$bin not found; build it first: cmake --build $BUILD --target fsdp gpt" >&2
    exit 1
  fi
done
if [[ -s "$ROOT/data/fortunes/train.bin" ]]; then
  DATA=(--data "$ROOT/data/fortunes/train.bin")
else
  DATA=(--text "$ROOT/README.md" "$ROOT/docs/DESIGN.md" "$ROOT/docs/GUIDE.md")
fi
MODEL=(--layers 8 --dim 256 --heads 4 --seq 64 --batch 4)

echo "== the plan: predicted peak per rank for each strategy (budget $BUDGET)"
for s in none full; do
  "$BUILD/bin/fsdp" plan --world 2 --strategy "$s" "${MODEL[@]}" | grep -E '^plan:|rest = |predicted peak'
done

echo
echo "== NO_SHARD with --max-memory $BUDGET (expected: refused before anything is built)"
"$BUILD/bin/fsdp" run -n 2 -- "$BUILD/bin/gpt" "${DATA[@]}" "${MODEL[@]}" --strategy none \
  --max-memory "$BUDGET" --steps 20 --eval-every 0 2>&1 | grep -v '^\[rank 1\]' | grep -m1 'cannot fit' || true

echo
echo "== the same with --no-budget-check (expected: out of memory, with the ledger)"
"$BUILD/bin/fsdp" run -n 2 -- "$BUILD/bin/gpt" "${DATA[@]}" "${MODEL[@]}" --strategy none \
  --max-memory "$BUDGET" --no-budget-check --steps 20 --eval-every 0 2>&1 | grep -v '^\[rank 1\]' | grep -v '^  |'
none=${PIPESTATUS[0]}

echo
echo "== FULL_SHARD with --max-memory $BUDGET (expected: trains)"
"$BUILD/bin/fsdp" run -n 2 -- "$BUILD/bin/gpt" "${DATA[@]}" "${MODEL[@]}" --strategy full \
  --max-memory "$BUDGET" --steps 20 --eval-every 0 --log-every 5 2>&1 |
  grep -E '^\[rank 0\] (step .*loss|trained|  peak|fsdp:)'
full=${PIPESTATUS[0]}

echo
echo "NO_SHARD exit code $none, FULL_SHARD exit code $full"
[[ $none -ne 0 && $full -eq 0 ]]

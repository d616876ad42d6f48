#!/usr/bin/env bash
# The replica groups' simulator over many seeds, split over the cores:
#   bash tests/sim/run.sh BUILD SEEDS FROM JOBS
# Each part prints its line; the total comes last. Exits non-zero when a seed
# failed (its part prints how to replay it).
set -uo pipefail
build=$1 seeds=$2 from=$3 jobs=$4
bin=$build/bin/fsdp_replica_sim
[ -x "$bin" ] || { echo "tests/sim/run.sh: no $bin (make build first)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
per=$(( (seeds + jobs - 1) / jobs ))
start=$(date +%s.%N)
pids=()
for ((j = 0; j < jobs; j++)); do
  f=$(( from + j * per ))
  n=$(( seeds - j * per )); (( n > per )) && n=$per
  (( n > 0 )) || break
  "$bin" --seeds "$n" --from "$f" > "$out/$j" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$out"/*
secs=$(echo "$(date +%s.%N) - $start" | bc)
awk -v s="$seeds" -v f="$from" -v t="$secs" '/^fsdp_replica_sim: seeds/ {
    v += $4; c += $6; d += $9; h += $11; r += $13 }
  END { printf "make sim: seeds %d..%d: %d violation(s); %d steps committed, %d dropped, %d heals, %d coordinator restarts; %.1f s on the wall\n", f, f + s - 1, v, c, d, h, r, t }' "$out"/*
exit $rc

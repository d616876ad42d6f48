#!/bin/sh
# fsdp-cpp: run the benchmarks. Each known build/bin/bench_* binary gets a
# line below (with the way it must be started); results are printed and
# appended as JSON lines to $BENCH_JSON.
#
#   bench/run.sh                 # from the repository root, after a build
#   BIN=build-rel/bin bench/run.sh
#
# Adding a benchmark: write a run_<name> function and list it in BENCHES.
set -eu
BIN=${BIN:-build/bin}
BENCH_JSON=${BENCH_JSON:-build/bench.jsonl}
mkdir -p "$(dirname "$BENCH_JSON")"

# Collectives at 2 and 4 ranks, started by the launcher like a real job.
run_bench_comm() {
  for n in 2 4; do
    "$BIN/fsdp" run -n "$n" -- "$BIN/bench_comm" --json "$BENCH_JSON"
  done
}

BENCHES="bench_comm"

status=0
for b in $BENCHES; do
  if [ ! -x "$BIN/$b" ]; then
    echo "bench/run.sh: $BIN/$b is missing; build first (make build)" >&2
    status=1
    continue
  fi
  echo "== $b"
  "run_$b" || status=1
done
echo "bench/run.sh: results appended to $BENCH_JSON"
exit $status

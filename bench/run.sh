#!/bin/sh
# fsdp-cpp: run the benchmarks. Each known build/bin/bench_* binary gets a
# line below (with the way it must be started); results are printed and
# appended as JSON lines to $BENCH_JSON.
#
#   bench/run.sh                 # from the repository root, after a build
#   bench/run.sh build-rel       # the build folder (as `make bench` passes it)
#   BIN=build-rel/bin bench/run.sh
#
# Besides the C++ benchmarks it runs the peers of bench_train (PyTorch DDP and
# DDP + ZeRO in Python, bench/ddp_reference.py) in the same invocation, then
# prints the side-by-side table and writes bench/results.json with the ratios
# of issue 6 (see bench/README.md). BENCHES="bench_comm" bench/run.sh runs a
# subset; BENCH_STEPS sets the measured steps of the training benchmarks.
#
# Adding a benchmark: write a run_<name> function and list it in BENCHES.
set -eu
BUILD_DIR=${1:-build}
BIN=${BIN:-$BUILD_DIR/bin}
BENCH_JSON=${BENCH_JSON:-$BUILD_DIR/bench.jsonl}
BENCH_STEPS=${BENCH_STEPS:-4}     # measured steps per configuration and round
BENCH_ROUNDS=${BENCH_ROUNDS:-3}   # rounds: every configuration in turn, medians over all
RESULTS=${RESULTS:-bench/results.json}
# The peers run the torch this build links: the interpreter CMake was
# configured with (FSDP_PYTHON in the build's cache; `make deps` installs it).
if [ -z "${PYTHON:-}" ]; then
  PYTHON=$(sed -n 's/^FSDP_PYTHON:FILEPATH=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
  [ -n "$PYTHON" ] || PYTHON=python3
fi
mkdir -p "$(dirname "$BENCH_JSON")"
# This run's JSON lines, one file per benchmark, for the summary below.
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-bench.XXXXXX")
trap 'rm -rf "$RUN_DIR"' EXIT

# Collectives at 2 and 4 ranks, started by the launcher like a real job.
run_bench_comm() {
  for n in 2 4; do
    "$BIN/fsdp" run -n "$n" -- "$BIN/bench_comm" --json "$RUN_DIR/bench_comm.jsonl"
  done
}

# GPT-mini training steps: every strategy x prefetch x dtype, plus compute only.
run_bench_train() {
  for n in 2 4; do
    "$BIN/fsdp" run -n "$n" -- "$BIN/bench_train" --steps "$BENCH_STEPS" --rounds "$BENCH_ROUNDS" \
      --json "$RUN_DIR/bench_train.jsonl"
  done
}

# One process, no communication: the engine's NO_SHARD (and FULL_SHARD) step
# beside PyTorch's plain Python step on the same model and kernels, with page
# faults per step; the two alternate in rounds.
run_bench_single() {
  if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "bench/run.sh: $PYTHON has no torch; skipping the single-process comparison" >&2
    return 1
  fi
  for r in $(seq "$BENCH_ROUNDS"); do
    "$BIN/fsdp" run -n 1 -- "$BIN/bench_train" --strategies none,full --prefetch off --dtypes fp32 \
      --steps "$BENCH_STEPS" --json "$RUN_DIR/bench_single.jsonl"
    "$PYTHON" bench/ddp_reference.py --world 1 --modes plain --steps "$BENCH_STEPS" --json "$RUN_DIR/single_peer.jsonl"
  done
}

# Threads per rank: the same FULL_SHARD step (and compute only) at N=2 with 2
# compute threads per rank, beside bench_train's 1 (2 ranks x 2 threads on a
# 2-core machine oversubscribe it, so the launcher's --threads 2 also makes
# OpenMP's idle threads sleep; on a larger host this shows the gain).
run_bench_threads() {
  "$BIN/fsdp" run -n 2 --threads 2 -- "$BIN/bench_train" --threads 2 --strategies full --prefetch on --dtypes fp32 \
    --steps "$BENCH_STEPS" --json "$RUN_DIR/bench_threads.jsonl"
}

# Activation checkpointing: the same FULL_SHARD step (prefetch on) with and
# without --ac block, fp32 and bf16, at N=2 and batch 8 (GPT-mini's A of
# docs/GUIDE.md); the four configurations alternate in every round and each
# figure is the median over all rounds' steps: the step-time cost beside the
# peak it saves.
run_bench_ac() {
  "$BIN/fsdp" run -n 2 -- "$BIN/bench_train" --strategies full --prefetch on --dtypes fp32,bf16 --ac off,on \
    --no-compute --batch 8 --steps "$BENCH_STEPS" --rounds "$BENCH_ROUNDS" --json "$RUN_DIR/bench_ac.jsonl"
}

# The optimizer step: libtorch's AdamW (about ten tensor ops per shard view)
# against fsdp::FusedAdamW (one at::_fused_adamw_ per parameter group), in
# the same process, alternating in every round; 'opt ms' is the step alone,
# median over all rounds' steps.
run_bench_optim() {
  "$BIN/fsdp" run -n 2 -- "$BIN/bench_train" --strategies full --prefetch on --dtypes fp32 --optimizers adamw,fused \
    --steps "$BENCH_STEPS" --rounds "$BENCH_ROUNDS" --json "$RUN_DIR/bench_optim.jsonl"
}

# The peers on the same model, batch and threads: PyTorch DDP and DDP + ZeRO.
run_peers() {
  if ! "$PYTHON" -c 'import torch.distributed' 2>/dev/null; then
    echo "bench/run.sh: $PYTHON has no torch.distributed; skipping the PyTorch peers" >&2
    return 1
  fi
  for n in 2 4; do
    "$PYTHON" bench/ddp_reference.py --world "$n" --steps "$BENCH_STEPS" --json "$RUN_DIR/peers.jsonl"
  done
}

# fsdp-cpp against PyTorch's own FSDP2 (and DDP) on the same model, batch,
# data order and threads per rank, at N = 2 and 4, fp32 and bf16, in
# interleaved rounds: every round runs each configuration once (ours, then
# theirs) before the next round starts, and each figure is the median over
# all rounds' steps. FSDP2's gradients are first checked against one process
# (pytorch #162338; bench/ddp_reference.py --check-grads).
run_vs_fsdp2() {
  if ! "$PYTHON" -c 'import torch.distributed.fsdp' 2>/dev/null; then
    echo "bench/run.sh: $PYTHON has no torch.distributed.fsdp; skipping FSDP2" >&2
    return 1
  fi
  "$PYTHON" bench/ddp_reference.py --world 2 --check-grads | tee "$RUN_DIR/fsdp2_check.txt"
  for r in $(seq "$BENCH_ROUNDS"); do
    for n in 2 4; do
      for dt in fp32 bf16; do
        "$BIN/fsdp" run -n "$n" -- "$BIN/bench_train" --strategies full,grad-op,none --prefetch on --dtypes "$dt" \
          --rounds 1 --steps "$BENCH_STEPS" --json "$RUN_DIR/vs_ours.jsonl"
        "$PYTHON" bench/ddp_reference.py --world "$n" --modes fsdp2 --dtype "$dt" --steps "$BENCH_STEPS" \
          --json "$RUN_DIR/vs_peer.jsonl"
      done
      "$PYTHON" bench/ddp_reference.py --world "$n" --modes ddp --steps "$BENCH_STEPS" --json "$RUN_DIR/vs_peer.jsonl"
    done
  done
}

# Host-shared units (docs/COMM.md, "Host-shared units") against the copying
# path (FSDP_SHARE_HOST=off, cross-memory attach) and PyTorch DDP, at N = 2
# and 4: FULL_SHARD and compute only in every round, the two paths and DDP in
# turn, each figure the median over all rounds' steps. bf16 is timed only
# where the CPU has bf16 instructions (avx512_bf16 or amx_bf16); elsewhere
# libtorch emulates it about 20 x slower and the section says so instead.
run_bench_shared() {
  dts=fp32
  if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    dts=fp32,bf16
  else
    echo "bench/run.sh: this CPU has no bf16 instructions (avx512_bf16, amx_bf16): bf16 not timed (emulated ~20 x slower)"
  fi
  for r in $(seq "$BENCH_ROUNDS"); do
    for n in 2 4; do
      for mode in on off; do
        FSDP_SHARE_HOST=$mode "$BIN/fsdp" run -n "$n" -- "$BIN/bench_train" --strategies full --prefetch on --dtypes "$dts" \
          --rounds 1 --steps "$BENCH_STEPS" --json "$RUN_DIR/shared_$mode.jsonl"
      done
      "$PYTHON" bench/ddp_reference.py --world "$n" --modes ddp --steps "$BENCH_STEPS" --json "$RUN_DIR/shared_ddp.jsonl"
    done
  done
}

# The flight recorder's cost (fsdp/flight.h): ns per recorded collective,
# and GPT-mini FULL_SHARD steps at N=2 with the recorder on and off in
# alternating rounds (bench_flight prints the estimate: collectives per step
# x ns per collective / step time).
run_bench_flight() {
  "$BIN/bench_flight" --record --json "$RUN_DIR/bench_flight.jsonl"
  for r in $(seq "$BENCH_ROUNDS"); do
    for mode in on off; do
      FSDP_FLIGHT_RECORDER=$mode "$BIN/fsdp" run -n 2 -- "$BIN/bench_flight" --train --steps "$((BENCH_STEPS * 5))" \
        --json "$RUN_DIR/bench_flight.jsonl"
    done
  done
}

BENCHES=${BENCHES:-"bench_shared vs_fsdp2 bench_single bench_comm bench_train bench_threads bench_flight bench_ac bench_optim peers"}

# The machine must be quiet for a figure to mean anything. Before each
# section (when none of ours runs) the CPU time that every process of the
# machine used over one second is read from /proc/stat, in cores: BENCH_MAX_BUSY
# (0.25) or more means someone else computes beside us, and the section's
# figures are flagged. The load averages before and after go into the results
# for context only: on some virtual machines they never fall below 1 even
# when idle, and after a section they count that section's own ranks.
BENCH_MAX_BUSY=${BENCH_MAX_BUSY:-0.25}
LOADS="$RUN_DIR/load.jsonl"
busy_cores() {
  read -r _ u n s i w q sq st _ < /proc/stat
  t1=$((u + n + s + i + w + q + sq + st)); i1=$((i + w))
  sleep 1
  read -r _ u n s i w q sq st _ < /proc/stat
  t2=$((u + n + s + i + w + q + sq + st)); i2=$((i + w))
  awk -v dt=$((t2 - t1)) -v di=$((i2 - i1)) -v c="$(nproc)" 'BEGIN { printf "%.2f", (dt > 0 ? (dt - di) / dt * c : 0) }'
}
record_load() {  # section, when
  o=null
  [ "$2" = before ] && o=$(busy_cores)
  printf '{"section": "%s", "when": "%s", "load1": %s, "busy_cores": %s, "loadavg": "%s"}\n' "$1" "$2" \
    "$(cut -d' ' -f1 /proc/loadavg)" "$o" "$(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOADS"
  if [ "$o" != null ] && awk -v o="$o" -v m="$BENCH_MAX_BUSY" 'BEGIN { exit !(o >= m) }'; then
    echo "bench/run.sh: WARNING: $o cores were busy with other work before '$1' (load average" \
      "$(cut -d' ' -f1-3 /proc/loadavg)): these figures do not hold" >&2
  fi
}

status=0
for b in $BENCHES; do
  bin=$b
  case $b in bench_threads | bench_single | bench_ac | bench_optim) bin=bench_train ;; esac
  case $b in vs_fsdp2 | bench_shared) bin=bench_train ;; esac
  if [ "$b" != peers ] && [ ! -x "$BIN/$bin" ]; then
    echo "bench/run.sh: $BIN/$bin is missing; build first (make build)" >&2
    status=1
    continue
  fi
  echo "== $b (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  record_load "$b" before
  "run_$b" || status=1
  record_load "$b" after
done
for f in "$RUN_DIR"/*.jsonl; do
  [ -e "$f" ] && cat "$f" >> "$BENCH_JSON"
done
echo "bench/run.sh: results appended to $BENCH_JSON"

# Side by side, and the ratios of issue 6.
if ls "$RUN_DIR"/bench_train.jsonl "$RUN_DIR"/bench_single.jsonl >/dev/null 2>&1 || [ -e "$RUN_DIR"/bench_ac.jsonl ] ||
   [ -e "$RUN_DIR"/vs_ours.jsonl ] || [ -e "$RUN_DIR"/bench_optim.jsonl ] || [ -e "$RUN_DIR"/shared_on.jsonl ]; then
  echo "== summary"
  BENCH_MAX_BUSY=$BENCH_MAX_BUSY "$PYTHON" - "$RUN_DIR" "$RESULTS" <<'EOF' || status=1
import json, os, sys

run_dir, out = sys.argv[1], sys.argv[2]

def lines(name):
    p = os.path.join(run_dir, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []

train, peers, comm = lines("bench_train.jsonl"), lines("peers.jsonl"), lines("bench_comm.jsonl")
threads2 = lines("bench_threads.jsonl")
single, single_peer, loads = lines("bench_single.jsonl"), lines("single_peer.jsonl"), lines("load.jsonl")
ac_rows = lines("bench_ac.jsonl")
optim_rows = lines("bench_optim.jsonl")
vs_ours, vs_peer = lines("vs_ours.jsonl"), lines("vs_peer.jsonl")
sh_on, sh_off, sh_ddp = lines("shared_on.jsonl"), lines("shared_off.jsonl"), lines("shared_ddp.jsonl")

def median(v):
    v = sorted(v)
    n = len(v)
    return None if n == 0 else v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

def pooled(rows):
    # One figure from several rounds' rows: the median over every round's
    # steps, page faults and cache as the mean / largest.
    if not rows:
        return None
    steps = [t for r in rows for t in r["step_s"]]
    faults = [r["page_faults_per_step"] for r in rows if "page_faults_per_step" in r]
    return {"step_s_median": median(steps), "rounds": len(rows),
            "page_faults_per_step": sum(faults) / len(faults) if faults else None,
            "cached_bytes": max((r.get("cached_bytes", 0) for r in rows), default=0),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rows)}

one_no_shard = pooled([r for r in single if r["strategy"] == "NO_SHARD"])
one_full = pooled([r for r in single if r["strategy"] == "FULL_SHARD"])
one_torch = pooled(single_peer)
if single:
    print("one process (N=1, fp32, one thread): step ms (median over %d rounds), page faults per step" %
          (one_no_shard or one_full or {"rounds": 0})["rounds"])
    for name, r in (("fsdp-cpp NO_SHARD", one_no_shard), ("fsdp-cpp FULL_SHARD", one_full),
                    ("PyTorch Python (plain)", one_torch)):
        if r:
            print("  %-24s %8.1f ms  %8.1f faults/step  cache %6.1f MiB  RSS %6.1f MiB" %
                  (name, r["step_s_median"] * 1e3, r["page_faults_per_step"] or 0, r["cached_bytes"] / 2**20,
                   r["peak_rss_bytes"] / 2**20))

def row(n, strategy, prefetch=True, dtype="fp32"):
    for r in train:
        if r["world"] == n and r["strategy"] == strategy and r["dtype"] == dtype and \
                (r["strategy"] == "compute-only" or r["prefetch"] == prefetch):
            return r
    return None

def row2(n, strategy):
    return next((r for r in threads2 if r["world"] == n and r["strategy"] == strategy), None)

def peer(n, impl):
    return next((r for r in peers if r["world"] == n and r["impl"] == impl), None)

def ratio(a, b):
    return a / b if a is not None and b else None

def step(r):
    return r["step_s_median"] if r else None

worlds = sorted({r["world"] for r in train})
# Side by side: one line per world, step times in ms.
cols = [("compute fp32", lambda n: row(n, "compute-only")),
        ("FULL fp32", lambda n: row(n, "FULL_SHARD")),
        ("FULL bf16", lambda n: row(n, "FULL_SHARD", dtype="bf16")),
        ("GRAD_OP fp32", lambda n: row(n, "SHARD_GRAD_OP")),
        ("NO_SHARD fp32", lambda n: row(n, "NO_SHARD")),
        ("torch DDP", lambda n: peer(n, "pytorch-ddp")),
        ("torch ZeRO", lambda n: peer(n, "pytorch-zero"))]
print("step time, ms (median; fsdp-cpp rows with prefetch on)")
print("%4s " % "N" + " ".join("%14s" % c for c, _ in cols))
for n in worlds:
    cells = []
    for _, f in cols:
        r = f(n)
        cells.append("%14.1f" % (r["step_s_median"] * 1e3) if r else "%14s" % "-")
    print("%4d " % n + " ".join(cells))
for title, key, scale in (("peak RSS, MiB", "peak_rss_bytes", 2**20), ("page faults per step", "page_faults_per_step", 1),
                          ("allocator cache, MiB", "cached_bytes", 2**20)):
    print(title)
    for n in worlds:
        cells = []
        for _, f in cols:
            r = f(n)
            cells.append("%14.1f" % (r[key] / scale) if r and r.get(key) is not None else "%14s" % "-")
        print("%4d " % n + " ".join(cells))

res = {"description": "ratios from one bench/run.sh invocation (see bench/README.md)",
       "ratios": {}, "targets": {}, "load": loads}
R = res["ratios"]

def target(name, value, limit, cmp):
    ok = None if value is None else (value <= limit if cmp == "<=" else value >= limit)
    res["targets"][name] = {"value": value, "target": "%s %.2f" % (cmp, limit), "met": ok}

R["no_shard_N1_over_pytorch_plain"] = ratio(step(one_no_shard), step(one_torch))
R["full_shard_N1_over_pytorch_plain"] = ratio(step(one_full), step(one_torch))
if one_no_shard and one_torch and one_torch["page_faults_per_step"]:
    R["faults_no_shard_N1_over_pytorch_plain"] = one_no_shard["page_faults_per_step"] / one_torch["page_faults_per_step"]
for n in worlds:
    for pf in (False, True):
        for dt in ("fp32", "bf16"):
            key = "full_shard_over_no_shard_N%d_%s_prefetch_%s" % (n, dt, "on" if pf else "off")
            R[key] = ratio(step(row(n, "FULL_SHARD", pf, dt)), step(row(n, "NO_SHARD", pf, dt)))
    R["full_shard_over_compute_N%d" % n] = ratio(step(row(n, "FULL_SHARD")), step(row(n, "compute-only")))
    R["full_shard_over_compute_N%d_bf16" % n] = ratio(step(row(n, "FULL_SHARD", dtype="bf16")),
                                                      step(row(n, "compute-only", dtype="bf16")))
    R["no_shard_over_compute_N%d" % n] = ratio(step(row(n, "NO_SHARD")), step(row(n, "compute-only")))
    R["full_shard_over_pytorch_ddp_N%d" % n] = ratio(step(row(n, "FULL_SHARD")), step(peer(n, "pytorch-ddp")))
    R["full_shard_over_pytorch_zero_N%d" % n] = ratio(step(row(n, "FULL_SHARD")), step(peer(n, "pytorch-zero")))
    R["no_shard_over_pytorch_ddp_N%d" % n] = ratio(step(row(n, "NO_SHARD")), step(peer(n, "pytorch-ddp")))
    R["compute_over_pytorch_ddp_N%d" % n] = ratio(step(row(n, "compute-only")), step(peer(n, "pytorch-ddp")))
    if row2(n, "FULL_SHARD"):
        R["full_shard_2threads_over_1thread_N%d" % n] = ratio(step(row2(n, "FULL_SHARD")), step(row(n, "FULL_SHARD")))
        R["compute_2threads_over_1thread_N%d" % n] = ratio(step(row2(n, "compute-only")), step(row(n, "compute-only")))
    for dt in ("fp32", "bf16"):
        r = row(n, "FULL_SHARD", True, dt)
        if r:
            R["peak_over_bound_N%d_%s" % (n, dt)] = r["ledger"]["peak_over_bound"]
            R["peak_over_predicted_N%d_%s" % (n, dt)] = r["ledger"]["peak_over_predicted"]
# fsdp-cpp against FSDP2, interleaved rounds, medians over all rounds' steps.
def vs_pool(rows):
    p = pooled(rows)
    if p:
        p["peak_bytes"] = max((r.get("peak_bytes", 0) for r in rows), default=0)
        p["bytes_sent_per_step"] = rows[0].get("bytes_sent_per_step")
        p["predicted_peak"] = (rows[0].get("ledger") or {}).get("predicted_peak")
    return p
if vs_ours:
    params = vs_ours[0]["params"]
    print("fsdp-cpp against PyTorch %s FSDP2 (fully_shard per block + root, gloo), batch %d x %d, %d thread(s) per "
          "rank, %d parameters; step ms = median over %d interleaved rounds" % (
              (vs_peer[0].get("torch") if vs_peer else "?"), vs_ours[0]["batch"], vs_ours[0]["seq"],
              vs_ours[0]["threads"], params,
              len([r for r in vs_ours if r["world"] == vs_ours[0]["world"] and r["dtype"] == vs_ours[0]["dtype"]
                   and r["strategy"] == "FULL_SHARD"])))
    print("  %2s %5s | %9s %9s %9s %9s %9s %9s | %7s %7s | %9s %9s %9s %9s | %9s %9s" % (
        "N", "dtype", "compute", "FULL", "GRAD_OP", "NO_SHARD", "FSDP2", "DDP", "F/FSDP2", "F/comp", "peak ours",
        "plan", "RSS ours", "RSS FSDP2", "MiB/step", "FSDP2"))
    for n in sorted({r["world"] for r in vs_ours}):
        for dt in ("fp32", "bf16"):
            ours = {st: vs_pool([r for r in vs_ours if r["world"] == n and r["dtype"] == dt and r["strategy"] == st])
                    for st in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "compute-only")}
            f2 = vs_pool([r for r in vs_peer if r["world"] == n and r["impl"] == "pytorch-fsdp2" and r["dtype"] == dt])
            ddp = vs_pool([r for r in vs_peer if r["world"] == n and r["impl"] == "pytorch-ddp"])
            full = ours["FULL_SHARD"]
            if not full:
                continue
            q = ratio(step(full), step(f2))
            R["full_shard_over_fsdp2_N%d_%s" % (n, dt)] = q
            qc = ratio(step(full), step(ours["compute-only"]))
            R["vs_full_shard_over_compute_N%d_%s" % (n, dt)] = qc
            if f2:
                R["peak_rss_full_shard_over_fsdp2_N%d_%s" % (n, dt)] = full["peak_rss_bytes"] / f2["peak_rss_bytes"]
            # FSDP2 FULL_SHARD moves, per rank and step, (N-1)/N of the parameters in the
            # compute dtype twice (forward and backward all-gather) and of the gradients in
            # the reduce dtype (the same) once (reduce-scatter): computed, not measured.
            pb = 2 if dt == "bf16" else 4
            f2_bytes = (n - 1) / n * params * 3 * pb
            ms = lambda r: "%9.1f" % (r["step_s_median"] * 1e3) if r else "%9s" % "-"
            mib = lambda b: "%9.1f" % (b / 2**20) if b else "%9s" % "-"
            print("  %2d %5s | %s %s %s %s %s %s | %7s %7s | %s %s %s %s | %s %s" % (
                n, dt, ms(ours["compute-only"]), ms(full), ms(ours["SHARD_GRAD_OP"]), ms(ours["NO_SHARD"]), ms(f2),
                ms(ddp), "%.3f" % q if q else "-", "%.3f" % qc if qc else "-", mib(full["peak_bytes"]),
                mib(full["predicted_peak"]),
                mib(full["peak_rss_bytes"]), mib(f2["peak_rss_bytes"] if f2 else None),
                mib(full["bytes_sent_per_step"]), mib(f2_bytes)))
    print("  (F/FSDP2: FULL_SHARD's step over FSDP2's; F/comp: over compute only (the same model, no FSDP); peak ours: the counting allocator's; plan: the planner's; RSS: "
          "VmHWM; MiB/step: bytes a rank sends, ours counted, FSDP2's from its algorithm)")
    chk = os.path.join(run_dir, "fsdp2_check.txt")
    if os.path.exists(chk):
        print(" " + open(chk).read().strip())
    for n in sorted({r["world"] for r in vs_ours}):
        for dt in ("fp32", "bf16"):
            target("full_shard_over_fsdp2_N%d_%s" % (n, dt), R.get("full_shard_over_fsdp2_N%d_%s" % (n, dt)), 0.80, "<=")
            target("peak_rss_full_shard_over_fsdp2_N%d_%s" % (n, dt),
                   R.get("peak_rss_full_shard_over_fsdp2_N%d_%s" % (n, dt)), 1.00, "<=")
        target("vs_full_shard_over_compute_N%d_fp32" % n, R.get("vs_full_shard_over_compute_N%d_fp32" % n), 1.10, "<=")
        target("vs_full_shard_over_compute_N%d_bf16" % n, R.get("vs_full_shard_over_compute_N%d_bf16" % n), 1.25, "<=")

# Host-shared units against the copying path and PyTorch DDP (run_bench_shared):
# the same rounds, medians over all rounds' steps.
if sh_on:
    print("host-shared units (FSDP_SHARE_HOST=on) against the copying path (off) and PyTorch DDP, GPT-mini, batch %d "
          "x %d, %d thread(s) per rank; step ms = median over %d rounds" % (
              sh_on[0]["batch"], sh_on[0]["seq"], sh_on[0]["threads"],
              len([r for r in sh_on if r["world"] == sh_on[0]["world"] and r["dtype"] == sh_on[0]["dtype"]
                   and r["strategy"] == "FULL_SHARD"])))
    print("  %2s %5s | %9s %9s %9s %9s | %8s %8s %8s | %10s %10s %10s" % (
        "N", "dtype", "compute", "shared", "copying", "DDP", "sh/comp", "sh/DDP", "cp/comp", "host peak",
        "(copying)", "host PSS"))
    def host_pool(rows):
        p = pooled(rows)
        if p:
            p["host_peak_rss_bytes"] = max(r.get("host_peak_rss_bytes", 0) for r in rows)
            p["host_pss_bytes"] = max(r.get("host_pss_bytes", 0) for r in rows)
        return p
    for n in sorted({r["world"] for r in sh_on}):
        for dt in ("fp32", "bf16"):
            on = host_pool([r for r in sh_on if r["world"] == n and r["dtype"] == dt and r["strategy"] == "FULL_SHARD"])
            off = host_pool([r for r in sh_off if r["world"] == n and r["dtype"] == dt and r["strategy"] == "FULL_SHARD"])
            comp = pooled([r for r in sh_on + sh_off if r["world"] == n and r["dtype"] == dt
                           and r["strategy"] == "compute-only"])
            ddp = pooled([r for r in sh_ddp if r["world"] == n and r["impl"] == "pytorch-ddp"]) if dt == "fp32" else None
            if not on:
                continue
            a, b, c = ratio(step(on), step(comp)), ratio(step(on), step(ddp)), ratio(step(off), step(comp))
            R["shared_over_compute_N%d_%s" % (n, dt)] = a
            R["copying_over_compute_N%d_%s" % (n, dt)] = c
            if b:
                R["shared_over_ddp_N%d" % n] = b
            if off:
                R["shared_host_peak_over_copying_N%d_%s" % (n, dt)] = on["host_peak_rss_bytes"] / off["host_peak_rss_bytes"]
            ms = lambda r: "%9.1f" % (r["step_s_median"] * 1e3) if r else "%9s" % "-"
            mib = lambda b: "%10.1f" % (b / 2**20) if b else "%10s" % "-"
            f3 = lambda q: "%8.3f" % q if q else "%8s" % "-"
            print("  %2d %5s | %s %s %s %s | %s %s %s | %s %s %s" % (
                n, dt, ms(comp), ms(on), ms(off), ms(ddp), f3(a), f3(b), f3(c), mib(on["host_peak_rss_bytes"]),
                mib(off["host_peak_rss_bytes"] if off else None), mib(on["host_pss_bytes"])))
    print("  (compute: the same model unwrapped; host peak: the ranks' VmHWM less their shared memory, plus the shared "
          "memory once, MiB; host PSS: the ranks' proportional set sizes summed after the steps)")
    for n in sorted({r["world"] for r in sh_on}):
        target("shared_over_compute_N%d_fp32" % n, R.get("shared_over_compute_N%d_fp32" % n), 1.05, "<=")
        target("shared_over_compute_N%d_bf16" % n, R.get("shared_over_compute_N%d_bf16" % n), 1.15, "<=")
        target("shared_over_ddp_N%d" % n, R.get("shared_over_ddp_N%d" % n), 0.95, "<=")
        for dt in ("fp32", "bf16"):
            target("shared_host_peak_over_copying_N%d_%s" % (n, dt),
                   R.get("shared_host_peak_over_copying_N%d_%s" % (n, dt)), 1.00, "<=")

# Activation checkpointing: step time and peak with --ac block over without,
# side by side (same run, alternating rounds, medians).
def ac_row(n, dtype, ac):
    return next((r for r in ac_rows if r["world"] == n and r["dtype"] == dtype and r.get("ac") == ac), None)
if ac_rows:
    print("activation checkpointing (FULL_SHARD, prefetch on, batch %d): step ms (median over %d rounds), peak MiB "
          "(counting allocator), the ledger's A" % (ac_rows[0]["batch"], ac_rows[0]["rounds"]))
    print("  %4s %5s %10s %10s %8s %10s %10s %8s %10s %10s" % ("N", "dtype", "step off", "step on", "ratio",
                                                             "peak off", "peak on", "ratio", "A off", "A on"))
for n in sorted({r["world"] for r in ac_rows}):
    for dt in ("fp32", "bf16"):
        off, on = ac_row(n, dt, False), ac_row(n, dt, True)
        if not (off and on):
            continue
        st, pk = on["step_s_median"] / off["step_s_median"], on["peak_bytes"] / off["peak_bytes"]
        R["ac_step_over_no_ac_N%d_%s" % (n, dt)] = st
        R["ac_peak_over_no_ac_N%d_%s" % (n, dt)] = pk
        R["ac_peak_saved_bytes_N%d_%s" % (n, dt)] = off["peak_bytes"] - on["peak_bytes"]
        print("  %4d %5s %10.1f %10.1f %8.3f %10.1f %10.1f %8.3f %10.1f %10.1f" % (
            n, dt, off["step_s_median"] * 1e3, on["step_s_median"] * 1e3, st, off["peak_bytes"] / 2**20,
            on["peak_bytes"] / 2**20, pk, off["ledger"]["A"] / 2**20, on["ledger"]["A"] / 2**20))
# The optimizer step: AdamW's per-tensor ops against one fused kernel per
# group (same run, alternating, medians).
def optim_row(wrapped, opt):
    return next((r for r in optim_rows if r["wrapped"] == wrapped and r.get("optimizer") == opt), None)
if optim_rows:
    print("optimizer step (N=%d, fp32, FULL_SHARD prefetch on and compute only): opt ms and step ms, median over %d "
          "rounds" % (optim_rows[0]["world"], optim_rows[0]["rounds"]))
    print("  %-14s %10s %10s %8s %10s %10s %8s" % ("", "opt adamw", "opt fused", "ratio", "step adamw",
                                                   "step fused", "ratio"))
for wrapped, label in ((True, "FULL_SHARD"), (False, "compute only")):
    a, f = optim_row(wrapped, "adamw"), optim_row(wrapped, "fused_adamw")
    if not (a and f):
        continue
    key = "full_shard" if wrapped else "compute"
    R["fused_adamw_opt_step_over_adamw_%s_N%d" % (key, a["world"])] = f["opt_step_s_median"] / a["opt_step_s_median"]
    print("  %-14s %10.2f %10.2f %8.3f %10.1f %10.1f %8.3f" % (
        label, a["opt_step_s_median"] * 1e3, f["opt_step_s_median"] * 1e3,
        f["opt_step_s_median"] / a["opt_step_s_median"], a["step_s_median"] * 1e3, f["step_s_median"] * 1e3,
        f["step_s_median"] / a["step_s_median"]))
for c in comm:
    n = c["world"]
    for x in c["rows"]:
        if x["bytes"] == 64 << 20:
            # against one loopback stream measured with every core free (the old reference)
            R["all_gather_64MiB_over_tcp_1stream_N%d" % n] = x["all_gather_vs_tcp"]
            R["reduce_scatter_64MiB_over_tcp_1stream_N%d" % n] = x["reduce_scatter_vs_tcp"]
    for p in c.get("paired", []):
        if p["bytes"] == 64 << 20 and p["piece_kib"] is None:
            # against the TCP ring: N ranks sending and receiving at once over plain
            # sockets, the same bytes between buffers of the same size, in the same
            # rounds (median of per-round ratios)
            R["all_gather_64MiB_over_tcp_N%d" % n] = p["all_gather_vs_tcp_ring"]
            R["reduce_scatter_64MiB_over_tcp_N%d" % n] = p["reduce_scatter_vs_tcp_ring"]

target("no_shard_N1_over_pytorch_plain", R.get("no_shard_N1_over_pytorch_plain"), 1.00, "<=")
target("faults_no_shard_N1_over_pytorch_plain", R.get("faults_no_shard_N1_over_pytorch_plain"), 2.00, "<=")
target("full_shard_over_pytorch_ddp_N2", R.get("full_shard_over_pytorch_ddp_N2"), 0.90, "<=")
target("full_shard_over_compute_N2_fp32", R.get("full_shard_over_compute_N2"), 1.10, "<=")
target("full_shard_over_compute_N2_bf16", R.get("full_shard_over_compute_N2_bf16"), 1.25, "<=")
target("full_shard_over_no_shard_N2", R.get("full_shard_over_no_shard_N2_fp32_prefetch_on"), 1.05, "<=")
for n in worlds:
    for dt in ("fp32", "bf16"):
        target("peak_over_bound_N%d_%s" % (n, dt), R.get("peak_over_bound_N%d_%s" % (n, dt)), 1.05, "<=")
for c in comm:
    for t in c.get("transports", []):
        if t["transport"] == "cma":
            R["cma_all_gather_64MiB_over_memcpy_N%d" % c["world"]] = t["all_gather_vs_memcpy"]
            R["cma_reduce_scatter_64MiB_over_memcpy_N%d" % c["world"]] = t["reduce_scatter_vs_memcpy"]
for c in comm:
    n = c["world"]
    target("cma_all_gather_64MiB_over_memcpy_N%d" % n, R.get("cma_all_gather_64MiB_over_memcpy_N%d" % n), 0.50, ">=")
    target("cma_reduce_scatter_64MiB_over_memcpy_N%d" % n, R.get("cma_reduce_scatter_64MiB_over_memcpy_N%d" % n),
           0.50, ">=")
    target("all_gather_64MiB_over_tcp_N%d" % n, R.get("all_gather_64MiB_over_tcp_N%d" % n), 0.80, ">=")
    target("reduce_scatter_64MiB_over_tcp_N%d" % n, R.get("reduce_scatter_64MiB_over_tcp_N%d" % n), 0.80, ">=")
busy = [l for l in loads if l.get("busy_cores") is not None and
        l["busy_cores"] >= float(os.environ.get("BENCH_MAX_BUSY", "0.25"))]
res["busy"] = bool(busy)
res["runs"] = {"bench_train": train, "peers": peers, "bench_comm": comm, "bench_threads": threads2,
               "bench_single": single, "single_peer": single_peer, "bench_ac": ac_rows, "bench_optim": optim_rows,
               "vs_ours": vs_ours, "vs_fsdp2": vs_peer,
               "shared_on": sh_on, "shared_off": sh_off, "shared_ddp": sh_ddp}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("before each section, cores busy with other work (/proc/stat over 1 s) / the 1-min load average: " +
      ", ".join("%s %.2f/%.2f" % (l["section"], l["busy_cores"], l["load1"]) for l in loads if l["when"] == "before"))
if busy:
    print("WARNING: the machine was busy during %s: these ratios do not hold" %
          ", ".join(sorted({l["section"] for l in busy})))
print("targets")
for k, t in res["targets"].items():
    v = "-" if t["value"] is None else "%.3f" % t["value"]
    met = {True: "met", False: "NOT met", None: "no data"}[t["met"]]
    print("  %-36s %8s  target %-7s %s" % (k, v, t["target"], met))
print("bench/run.sh: ratios written to %s" % out)
EOF
fi
exit $status

#!/usr/bin/env bash
# How long a checkpoint blocks training, synchronous against background
# (gpt --save-async), on make scale's model: GPT d=768 L=12 T=256 (85.7 M
# parameters; a checkpoint of parameters + AdamW state is ~1 GB, each rank
# writing 1/N), N ranks on this host.
#
#   bench/ckpt_async.sh [BUILD_DIR]      (default build)
#
# The two configurations run in turn, ROUNDS times (default 2); each trains
# STEPS steps (default 5) saving after steps 2 and 4. Printed, as medians over
# the rounds: the time a save blocked the loop (sync: the whole save; async:
# the call, plus the wait for the snapshot's copy at the end of the next
# backward), and the step time of the step right after each save (a
# background write is under way then; a long write overlaps the next steps
# too, which count as "other") against the other steps, and the sync run's. Environment: N (default 8),
# ROUNDS, STEPS, OUT (scratch folder, default runs/ckpt-async; removed),
# MODEL_FLAGS (gpt's model flags, to try the script on a smaller model).
# Check the load first (uptime): nothing else should run.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${N:-8}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-5}
OUT=${OUT:-$ROOT/runs/ckpt-async}
rm -rf "$OUT" && mkdir -p "$OUT"
read -r -a MODEL <<< "${MODEL_FLAGS:---dim 768 --layers 12 --heads 12 --seq 256 --batch 1 --ac block}"
COMMON=(--text "$ROOT"/docs/*.md "$ROOT"/README.md "${MODEL[@]}" --steps "$STEPS" --ckpt-every 2
        --eval-every 0 --log-every 1 --threads 1 --lr 3e-4 --warmup 0 --no-progress)
echo "load before: $(uptime)"
for round in $(seq 1 "$ROUNDS"); do
  for mode in sync async; do
    flags=()
    [[ $mode == async ]] && flags=(--save-async)
    rm -rf "$OUT/ckpt"
    "$BUILD/bin/fsdp" run -n "$N" -- "$BUILD/bin/gpt" "${COMMON[@]}" --ckpt-dir "$OUT/ckpt" "${flags[@]}" \
      > "$OUT/$mode-$round.log" 2>&1
    echo "round $round $mode: done"
  done
done
python3 - "$OUT" "$ROUNDS" "$STEPS" <<'PY'
import re, statistics, sys
out, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
step_re = re.compile(r"step\s+(\d+) \| loss .*\|\s+([\d.]+) ms/step")
sync_re = re.compile(r"checkpoint \S+/step-(\d+) \(([\d.]+) s\)")
async_re = re.compile(r"checkpoint \S+/step-(\d+) in the background \(training blocked ([\d.]+) s")
# The snapshot copied on the save's thread: training also waited for it at the end of the next backward.
waited_re = re.compile(r"checkpoint \S+/step-(\d+) committed \(.*training waited ([\d.]+) s for the snapshot")
blocked = {"sync": [], "async": []}
during, other, sync_steps = [], [], []
for r in range(1, rounds + 1):
    for mode in ("sync", "async"):
        text = open(f"{out}/{mode}-{r}.log").read()
        saves = {int(s): float(t) for s, t in (sync_re if mode == "sync" else async_re).findall(text)}
        if mode == "async":
            waited = {int(s): float(t) for s, t in waited_re.findall(text)}
            if not all(s in waited for s in saves if s < steps):
                sys.exit(f"ckpt_async: {out}/{mode}-{r}.log lacks a 'committed ... training waited' line")
            saves = {s: t + waited.get(s, 0.0) for s, t in saves.items()}
        blocked[mode] += [t for s, t in saves.items() if s < steps]  # the saves inside the loop
        for s, ms in step_re.findall(text):
            s, ms = int(s), float(ms)
            if s == 0:
                continue  # the first step warms up
            if mode == "sync":
                sync_steps.append(ms)
            elif s in saves:
                during.append(ms)  # step s runs right after the save of step s
            else:
                other.append(ms)
med = statistics.median
if not (blocked["sync"] and blocked["async"] and during and other and sync_steps):
    sys.exit(f"ckpt_async: a log lacks the lines parsed; see {out}")
bs, ba = med(blocked["sync"]), med(blocked["async"])
print(f"blocked by a save (median of {len(blocked['sync'])} / {len(blocked['async'])}): "
      f"sync {bs:.3f} s, async {ba:.3f} s = {ba / bs:.3f} x sync")
print(f"step time (median): async run, during a background write {med(during):.0f} ms, other steps "
      f"{med(other):.0f} ms (x{med(during) / med(other):.3f}); sync run {med(sync_steps):.0f} ms")
PY
echo "load after: $(uptime)"

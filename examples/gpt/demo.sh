#!/usr/bin/env bash
# The main demo: GPT-mini trained with FULL_SHARD on 2 ranks, on the English
# fortune files of Debian's `fortunes` package (byte-level, docs/GPT_MINI.md).
#
#   examples/gpt/demo.sh BUILD_DIR [extra gpt flags, e.g. --steps 100]
#
# Prepares data/fortunes/{train,val}.bin once, trains for a few minutes
# (step lines with each rank's busy time, a progress line with the ETA every
# 30 s, validation loss, the ledger, a sample), saves the full weights
# and prints where everything is. Environment: NPROC (ranks, default 2),
# FORTUNES_DIR (default: the Debian package's folder), RUN_DIR (outputs).
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BUILD=$(cd "$1" && pwd)
shift
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FORTUNES_DIR=${FORTUNES_DIR:-/usr/share/games/fortunes}
NPROC=${NPROC:-2}
DATA=$ROOT/data/fortunes
RUN=${RUN_DIR:-$ROOT/runs/gpt-demo}

for bin in fsdp gpt; do
  if [[ ! -x "$BUILD/bin/$bin" ]]; then
    echo "demo: $BUILD/bin/$bin not found; build it first: cmake --build $BUILD --target fsdp gpt" >&2
    exit 1
  fi
done

# --- the corpus: plain fortune files (no .dat / .u8 index files, no links), name order
if [[ ! -d "$FORTUNES_DIR" ]]; then
  echo "demo: $FORTUNES_DIR not found; install Debian's fortunes package (apt-get install fortunes)" >&2
  exit 1
fi
mapfile -t TEXTS < <(find "$FORTUNES_DIR" -maxdepth 1 -type f ! -name '*.*' | LC_ALL=C sort)
if [[ ${#TEXTS[@]} -eq 0 ]]; then
  echo "demo: no fortune text files in $FORTUNES_DIR" >&2
  exit 1
fi
if [[ ! -s "$DATA/train.bin" || ! -s "$DATA/val.bin" ]]; then
  echo "== preparing ${#TEXTS[@]} fortune files from $FORTUNES_DIR"
  "$BUILD/bin/fsdp" prepare --text "${TEXTS[@]}" --out "$DATA"
fi

# --- training: FULL_SHARD, one unit per block, 2 ranks of one thread each.
# Defaults tuned for ~4 minutes on 2 cores: validation loss ~5.6 -> below 2.5.
mkdir -p "$RUN"
echo "== training: $NPROC ranks, log in $RUN/train.log"
start=$(date +%s)
"$BUILD/bin/fsdp" run -n "$NPROC" -- "$BUILD/bin/gpt" \
  --data "$DATA/train.bin" --val "$DATA/val.bin" \
  --strategy full --wrap block --dtype fp32 \
  --seq 128 --dim 128 --layers 4 --heads 4 \
  --batch 16 --accum 1 --steps 500 \
  --lr 4e-3 --warmup 30 --min-lr 4e-4 --weight-decay 0.1 --clip 1.0 \
  --log-every 10 --eval-every 50 --eval-batches 8 --progress-every 30 \
  --sample 300 --top-k 5 --sample-seed 1 --prompt $'\n' \
  --save "$RUN/gpt.safetensors" \
  --ckpt-dir "$RUN/ckpt" --trace "$RUN/trace" \
  "$@" 2>&1 | tee "$RUN/train.log"
status=${PIPESTATUS[0]}
end=$(date +%s)
if [[ $status -ne 0 ]]; then
  echo "demo: training failed (exit $status); see $RUN/train.log" >&2
  exit "$status"
fi

# --- report: shards across ranks, the AG / RS timeline, memory and traffic.
"$BUILD/bin/fsdp" report "$RUN/trace" -o "$RUN/report.html"

echo
echo "== done in $((end - start)) s. Outputs:"
echo "   data:     $DATA/train.bin, $DATA/val.bin"
echo "   log:      $RUN/train.log"
echo "   weights:  $RUN/gpt.safetensors"
echo "   ckpt:     $RUN/ckpt (sharded; resume with --ckpt-dir $RUN/ckpt --resume)"
echo "   report:   $RUN/report.html (trace for Perfetto: $RUN/trace/trace.json)"
# bf16: several times faster where the CPU computes it natively, slower where
# libtorch must emulate it (docs/GUIDE.md, "When to use --dtype bf16").
if grep -q -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null; then
  echo "   bf16:     this CPU has bf16 instructions: 'make demo DEMO_ARGS=\"--dtype bf16\"' trains several times faster"
else
  echo "   bf16:     this CPU has no bf16 instructions; --dtype bf16 would be emulated (slower): fp32 is right here"
fi

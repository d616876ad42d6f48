#!/usr/bin/env bash
# The goals of Hugging Face checkpoints (docs/CHECKPOINT_FORMAT.md, "Hugging
# Face directories"), measured on a quiet machine:
#   1. load_hf of a ~1.1 B-parameter bf16 Llama (TinyLlama's shape, random,
#      made here by transformers) at N ranks, against the time to read its
#      bytes once (cat), with a cold and a warm page cache, reading what the
#      cache lacks with O_DIRECT (the default) and through the cache
#      (HfLoadOptions::direct_io = false); each rank's peak
#      RSS against a quarter of the model (fp32 masters) + 10%;
#   2. save_hf at N ranks against gathering every tensor to rank 0 and
#      writing one file there.
# Beside each load, in the same round: N processes filling a quarter of the
# fp32 model each in fresh memory (the page faults of the masters, with
# nothing read), and each rank's resident memory at start (libtorch, before
# any tensor): the two parts of a load that no reading can shorten.
#
#   bash bench/hf_load.sh [BUILD] [N]      (defaults: build 4)
# Environment: WORK (scratch folder, default a new one under /tmp, removed at
# the end unless KEEP=1), ROUNDS (default 3: rounds of loads, the default and
# --buffered-load in turn; medians), MODES (default "direct buffered": the
# loads of each round, in turn; MODE@SIZE reads in SIZE pieces, e.g.
# "direct direct@16MiB" pairs the default read size with another),
# MODES may name dcp: PyTorch FSDP2 loading the same files with DCP's
# HuggingFaceStorageReader under torchrun (bench/hf_load_dcp.py), side by
# side with load_hf in each round (e.g. MODES="direct dcp"),
# CACHES (default "cold warm"), EXPORT=0
# (loads only), PYTHON (the torch environment with transformers),
# SMALL=1 (a 2-layer model of the same widths: a check of this script, not
# a measurement).
# Cold runs drop the page cache (root only; otherwise they say so and are
# skipped). Takes about 10 minutes and ~12 GiB of disk.
set -euo pipefail
BUILD=${1:-build}
N=${2:-4}
ROUNDS=${ROUNDS:-3}
CACHES=${CACHES:-cold warm}
MODES=${MODES:-direct buffered}
PYTHON=${PYTHON:-$(sed -n 's/^FSDP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")}
WORK=${WORK:-$(mktemp -d /tmp/fsdp-hf-bench.XXXXXX)}
cleanup() { rm -f /dev/shm/fsdp-hf-bench-fresh.$$.*; [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK"
rm -f "$WORK"/cold-*.txt "$WORK"/warm-*.txt  # a kept folder's earlier rounds
CKPT=$WORK/tinyllama-1.1b
LAYERS=22
if [ "${SMALL:-0}" = 1 ]; then CKPT=$WORK/tinyllama-2-layers; LAYERS=2; fi

echo "== making $CKPT (transformers, random, bf16, 500 MB files)"
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
  "$PYTHON" - "$CKPT" "$LAYERS" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=int(sys.argv[2]),
                  num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
m = LlamaForCausalLM(cfg)
print("parameters: %.3f B" % (sum(p.numel() for p in m.parameters()) / 1e9))
m.save_pretrained(sys.argv[1], max_shard_size="500MB")
PY
fi
# A few tokens for the run's data (ids < 256: bytes).
head -c 200000 /dev/urandom > "$WORK/text.txt"
"$BUILD/bin/fsdp" prepare --text "$WORK/text.txt" --out "$WORK/data" >/dev/null
BYTES=$(du -cb "$CKPT"/*.safetensors | tail -1 | cut -f1)
echo "checkpoint: $BYTES bytes in $(ls "$CKPT"/*.safetensors | wc -l) files"

drop_caches() {
  sync
  if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then return 0; fi
  echo "(cannot drop the page cache here: not root; cold runs skipped)"
  return 1
}
read_once() {  # seconds to read every byte once
  local t0 t1
  t0=$(date +%s.%N); cat "$CKPT"/*.safetensors > /dev/null; t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
slowest() {  # the largest value of KEY= over the ranks' lines of FILE
  awk -F"$1=" -v k="$1=" 'index($0, k) { split($2, a, " "); if (a[1] + 0 > m + 0) m = a[1] } END { print m }' "$2"
}
read_direct() {  # seconds to read every byte once around the page cache (O_DIRECT), as load_hf reads cold bytes
  local t0 t1 f
  t0=$(date +%s.%N)
  for f in "$CKPT"/*.safetensors; do dd if="$f" of=/dev/null bs=16M iflag=direct status=none; done
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
fresh_memory() {  # $1: anon | shm. Seconds for N processes at once to fill a quarter of the fp32 model each in
  # memory never touched before (dd from /dev/zero; shm: files in /dev/shm, as host-shared memory is): the page
  # faults every load_hf pays for its fp32 masters, with nothing read.
  local t0 t1 i q=$((BYTES * 2 / N)) shm=/dev/shm/fsdp-hf-bench-fresh.$$
  t0=$(date +%s.%N)
  for i in $(seq "$N"); do
    if [ "$1" = anon ]; then dd if=/dev/zero of=/dev/null bs=$q count=1 iflag=fullblock status=none &
    else dd if=/dev/zero of=$shm.$i bs=16M count=$((q / 16777216)) status=none & fi
  done
  wait
  t1=$(date +%s.%N)
  rm -f $shm.*
  echo "$t1 - $t0" | bc -l
}
load_once() {  # $1: direct | buffered, either with @SIZE, or dcp. The slowest rank's build and load_hf seconds, and
  # the largest peak RSS
  if [ "$1" = dcp ]; then  # PyTorch's peer: FSDP2 + DCP's HuggingFaceStorageReader (bench/hf_load_dcp.py)
    TMPDIR="$WORK" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$N" "$(dirname "$0")/hf_load_dcp.py" "$CKPT" \
        > "$WORK/load-dcp.log" 2>&1 || { cat "$WORK/load-dcp.log"; exit 1; }
    grep -q "loaded_finite=0" "$WORK/load-dcp.log" && { echo "DCP loaded non-finite values" >&2; exit 1; }
    echo "$(slowest build_seconds "$WORK/load-dcp.log") $(slowest load_seconds "$WORK/load-dcp.log")" \
      "$(slowest peak_rss "$WORK/load-dcp.log") $(slowest start_rss "$WORK/load-dcp.log")"
    return
  fi
  local flag=()
  [ "${1%@*}" = buffered ] && flag=(--buffered-load)
  [ "${1#*@}" != "$1" ] && flag+=(--load-buffer "${1#*@}")
  "$BUILD/bin/fsdp" run -n "$N" -- "$BUILD/bin/llama" --hf "$CKPT" --data "$WORK/data/train.bin" --steps 0 \
      --seq 64 "${flag[@]}" > "$WORK/load.log" 2>&1 || { cat "$WORK/load.log"; exit 1; }
  echo "$(slowest build_seconds "$WORK/load.log") $(slowest load_seconds "$WORK/load.log") $(slowest peak_rss "$WORK/load.log")" \
    "$(slowest start_rss "$WORK/load.log")"
}
median() {  # of the numbers on stdin
  sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# Rounds alternate the MODES: by default load_hf's default (what the page
# cache lacks read with O_DIRECT) and --buffered-load
# (HfLoadOptions::direct_io = false), each load beside its own read-once;
# the lines give medians.
for cache in $CACHES; do
  if [ $cache = cold ] && ! drop_caches; then continue; fi
  for round in $(seq "$ROUNDS"); do
    for mode in $MODES; do
      d=0
      if [ $cache = cold ]; then drop_caches; d=$(read_direct); drop_caches; else cat "$CKPT"/*.safetensors > /dev/null; fi
      r=$(read_once)
      fa=$(fresh_memory anon); fs=$(fresh_memory shm)
      if [ $cache = cold ]; then drop_caches; fi
      read -r b l rss start < <(load_once $mode)
      echo "$r $b $l $rss $d $fa $fs $start" >> "$WORK/$cache-$mode.txt"
    done
  done
  MODEL_FP32=$(grep -o 'model_bytes=[0-9]*' "$WORK/load.log" | head -1 | cut -d= -f2)
  if [ -f "$WORK/$cache-dcp.txt" ]; then  # load_hf beside PyTorch's peer, round by round
    for mode in $MODES; do
      [ "$mode" = dcp ] && continue
      q=$(paste -d' ' "$WORK/$cache-$mode.txt" "$WORK/$cache-dcp.txt" | awk '{ print $3 / $11 }' | median)
      printf "%s cache: load_hf (%s) / FSDP2 + DCP HuggingFaceStorageReader at N=%d: median of the rounds' ratios %.2f x (goal <= 0.5)\n" \
        $cache $mode "$N" "$q"
    done
  fi
  budget=$(echo "$MODEL_FP32 / 4 * 1.1" | bc -l)
  for mode in $MODES; do
    f=$WORK/$cache-$mode.txt
    r=$(cut -d' ' -f1 "$f" | median); l=$(cut -d' ' -f3 "$f" | median); d=$(cut -d' ' -f5 "$f" | median)
    bl=$(awk '{ print $2 + $3 }' "$f" | median); rss=$(cut -d' ' -f4 "$f" | median)
    q=$(awk '{ print $3 / $1 }' "$f" | median)
    loader=load_hf; [ "$mode" = dcp ] && loader="FSDP2 + DCP"
    printf "%s cache, %s (median of %d): read once %.2f s; at N=%d $loader %.2f s (%.2f x; goal <= 1.5; median of the rounds' ratios %.2f x), with building the model %.2f s (%.2f x); peak RSS %.0f MiB, budget (a quarter of the fp32 model + 10%%) %.0f MiB (%s)\n" \
      $cache $mode "$ROUNDS" "$r" "$N" "$l" "$(echo "$l / $r" | bc -l)" "$q" "$bl" "$(echo "$bl / $r" | bc -l)" \
      "$(echo "$rss / 1048576" | bc -l)" "$(echo "$budget / 1048576" | bc -l)" \
      "$( [ "$(echo "$rss < $budget" | bc -l)" = 1 ] && echo ok || echo OVER)"
    [ $cache = cold ] && printf "  (read once around the page cache, dd iflag=direct: %.2f s)\n" "$d"
    fa=$(cut -d' ' -f6 "$f" | median); fs=$(cut -d' ' -f7 "$f" | median); start=$(cut -d' ' -f8 "$f" | median)
    printf "  (the masters' fresh memory alone, %d processes filling a quarter of the fp32 model each: %.2f s, %.2f s in shared memory; resident at start, before any tensor: %.0f MiB)\n" \
      "$N" "$fa" "$fs" "$(echo "$start / 1048576" | bc -l)"
  done
done

[ "${EXPORT:-1}" = 1 ] || exit 0
echo "== export at N=$N: save_hf against gathering to rank 0 (bf16 both)"
rm -rf "$WORK/export" "$WORK/gathered.safetensors"
"$BUILD/bin/fsdp" run -n "$N" -- "$BUILD/bin/llama" --hf "$CKPT" --data "$WORK/data/train.bin" --steps 0 --seq 64 \
    --export "$WORK/export" --max-shard-size 500MiB --export-gathered "$WORK/gathered.safetensors" > "$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; exit 1; }
e=$(slowest export_seconds "$WORK/export.log")
g=$(slowest gathered_seconds "$WORK/export.log")
printf "save_hf %.2f s, gathered to rank 0 %.2f s: %.2f x faster (goal >= 2)\n" "$e" "$g" "$(echo "$g / $e" | bc -l)"

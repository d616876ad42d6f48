#!/usr/bin/env bash
# fsdp-cpp measurement: FULL_SHARD against HYBRID_SHARD over a slow link
# between two "hosts" — two network namespaces joined by a veth pair whose
# both ends are shaped with tc (token bucket) — 2 ranks in each, GPT-mini,
# the configurations interleaved round by round. For each link rate it
# prints the measured step-time ratio FULL / HYBRID and the planner's
# predicted ratio beside it:
#   predicted = (T0_full + dcomm_full) / (T0_hybrid + dcomm_hybrid)
# where T0 is the step time measured on the unshaped veth (compute and the
# fast link) and dcomm the planner's extra communication time at the rate
# (`fsdp plan --hosts 2 --inter-bw RATE`, minus the same at the unshaped rate).
#
#   tests/netns/shaped_link.sh BIN_DIR [RATE...]      (default: 200mbit 1gbit)
#   SHAPED_DTYPES="fp32 bf16" SHAPED_ROUNDS=2 SHAPED_STEPS=8
#   SHAPED_CONFIGS="full hybrid"   each STRATEGY[:COMPRESS[:SHARE]]: FSDP_COMPRESS
#                                  (off, int8, int4, fp8) and FSDP_SHARE_HOST
#                                  (on, the default, or off) of that run, e.g.
#                                  "full hybrid hybrid:int8 hybrid:int4 full:int4:off"
# With more configurations than "full hybrid", a table follows per dtype:
# each configuration's step on the unshaped link and at each rate, its
# ratio to its own unshaped step, its bytes across hosts per step (rank 0's
# counters: what crossed, and what would have crossed uncompressed), and
# the bytes the veth carried per step (tc's counters on both ends, divided
# by the steps: the counters' 4 ranks plus TCP/IP headers and the
# rendezvous; the check that the counters count what crosses), and the
# planner's step at the rate: the configuration's unshaped step plus the
# planner's extra communication time (`fsdp plan ... --compress C
# --share-host S`, comm_seconds or comm_seconds_compressed).
# Exit: 0 done, 77 skipped (no namespaces or no tc here; the reason is
# printed). Needs root, iproute2 (ip, tc). A measurement, not a test: run it
# on a quiet machine.
set -u
BIN=${1:?usage: shaped_link.sh BIN_DIR [RATE...]}
shift
RATES=("$@")
[ ${#RATES[@]} -eq 0 ] && RATES=(200mbit 1gbit)
DTYPES=${SHAPED_DTYPES:-"fp32 bf16"}
ROUNDS=${SHAPED_ROUNDS:-2}
STEPS=${SHAPED_STEPS:-8}
CONFIGS=(${SHAPED_CONFIGS:-full hybrid})
MODEL=(--layers 4 --dim 256 --heads 4 --seq 64 --batch 4)
TEXT=$(cd "$(dirname "$0")/../.." && pwd)/README.md

tag=$$
A=fsdp-sa-$tag B=fsdp-sb-$tag
VA=fta$tag VB=ftb$tag
NET=10.214.$((tag % 250))
ADDR_A=$NET.1 ADDR_B=$NET.2
OUT=$(mktemp -d)
skip() { echo "shaped_link: SKIP: $*"; rm -rf "$OUT"; exit 77; }
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; ip link del "$VA" 2>/dev/null; rm -rf "$OUT"; }
command -v ip >/dev/null || skip "the 'ip' command (Debian package iproute2) is not installed"
command -v tc >/dev/null || skip "the 'tc' command (Debian package iproute2) is not installed"
command -v python3 >/dev/null || skip "python3 is needed to read the planner's JSON"
[ "$(id -u)" = 0 ] || skip "network namespaces need root (ran as uid $(id -u))"
err=$(ip netns add "$A" 2>&1) || skip "cannot create a network namespace: $err"
trap cleanup EXIT
ip netns add "$B" || skip "cannot create a second network namespace"
err=$(ip link add "$VA" type veth peer name "$VB" 2>&1) || skip "cannot create a veth pair: $err"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B"
ip -n "$A" addr add "$ADDR_A/24" dev "$VA" && ip -n "$B" addr add "$ADDR_B/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up
err=$(ip netns exec "$A" tc qdisc add dev "$VA" root tbf rate 1gbit burst 256kb latency 100ms 2>&1) ||
  skip "tc cannot shape the veth link: $err (no sch_tbf module?)"
ip netns exec "$A" tc qdisc del dev "$VA" root

TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
shape() {  # rate | none
  for pair in "$A $VA" "$B $VB"; do
    set -- $pair
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null
    [ "$RATE" = none ] || ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 200ms
  done
}
port=$((21000 + tag % 20000))
veth_bytes() {  # bytes both ends of the veth sent so far
  echo $(( $(ip netns exec "$A" cat /sys/class/net/"$VA"/statistics/tx_bytes) +
           $(ip netns exec "$B" cat /sys/class/net/"$VB"/statistics/tx_bytes) ))
}
run_gpt() {  # config dtype -> "seconds_per_step inter_bytes_per_step logical_per_step veth_bytes_per_step"
  port=$((port + 1))
  local cfg=$1 d=$2 s compress share
  IFS=: read -r s compress share <<<"$cfg"
  compress=${compress:-off} share=${share:-on}
  local name=${cfg//:/-} before after
  before=$(veth_bytes)
  for k in 0 1; do
    local ns=$A; [ $k = 1 ] && ns=$B
    ip netns exec "$ns" env FSDP_JOB_TOKEN="$TOKEN" FSDP_COMPRESS="$compress" FSDP_SHARE_HOST="$share" \
      timeout 600 "$BIN/fsdp" run --nnodes 2 --node-rank $k \
      --master-addr "$ADDR_A" --master-port $port -n 2 -- "$BIN/gpt" --text "$TEXT" "${MODEL[@]}" \
      --steps "$STEPS" --warmup 0 --eval-every 0 --log-every 1 --no-progress --straggler-factor 0 \
      --strategy "$s" --dtype "$d" >"$OUT/$name-$k.log" 2>&1 &
  done
  wait
  after=$(veth_bytes)
  grep -h 'traffic by tier' "$OUT/$name-0.log" | sed "s/^/    $cfg $d: /" >&2
  local t
  t=$(grep -h '\[rank 0\] step ' "$OUT/$name-0.log" | grep -o '[0-9.]* ms/step' |
    awk 'NR > 1 {t += $1; n++} END {if (n) printf "%.5f\n", t / n / 1000}')
  grep -h 'traffic by tier' "$OUT/$name-0.log" | python3 -c '
import re, sys
line = sys.stdin.read()
kv = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line))
if "steps" not in kv or "inter_bytes" not in kv: sys.exit("shaped_link: no traffic line in the log")
steps = kv["steps"]
print(sys.argv[1], kv["inter_bytes"] / steps, kv.get("inter_logical_bytes", kv["inter_bytes"]) / steps,
      int(sys.argv[2]) / steps)' "${t:-nan}" $((after - before))
}
plan_comm() {  # dtype inter-rate -> "full_seconds hybrid_seconds"
  "$BIN/fsdp" plan --world 4 --hosts 2 "${MODEL[@]}" --dtype "$1" --intra-bw 2GB/s --inter-bw "$2" --json |
    python3 -c 'import json,sys; r={x["strategy"]: x["comm_seconds"] for x in json.load(sys.stdin)["tiers"]["rows"]}; print(r["FULL_SHARD"], r["HYBRID_SHARD"])'
}
plan_config() {  # config dtype inter-rate -> the planner's comm seconds per step of that configuration
  local s compress share
  IFS=: read -r s compress share <<<"$1"
  compress=${compress:-off} share=${share:-on}
  "$BIN/fsdp" plan --world 4 --hosts 2 "${MODEL[@]}" --dtype "$2" --intra-bw 2GB/s --inter-bw "$3" \
    --compress "$compress" --share-host "$share" --json |
    python3 -c '
import json, sys
want = {"full": "FULL_SHARD", "hybrid": "HYBRID_SHARD", "grad_op": "SHARD_GRAD_OP", "none": "NO_SHARD"}[sys.argv[1]]
row = [x for x in json.load(sys.stdin)["tiers"]["rows"] if x["strategy"] == want][0]
print(row["comm_seconds_compressed"] if sys.argv[2] != "off" else row["comm_seconds"])' "$s" "$compress"
}
mean() {  # column $1 (1-based) of stdin's lines
  awk -v c="${1:-1}" '{s += $c; n++} END {if (n) printf "%.4f", s / n; else print "nan"}'
}
rate_name() { echo "$1" | sed 's/kbit/Kbit/; s/mbit/Mbit/; s/gbit/Gbit/'; }
has() { local x; for x in "${CONFIGS[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }

echo "shaped_link: 2 namespaces x 2 ranks over veth, GPT-mini ${MODEL[*]}, $STEPS steps, $ROUNDS interleaved rounds"
echo "  configurations: ${CONFIGS[*]}"
for d in $DTYPES; do
  for RATE in none "${RATES[@]}"; do
    shape
    for c in "${CONFIGS[@]}"; do : >"$OUT/r-$RATE-${c//:/-}"; done
    for i in $(seq "$ROUNDS"); do
      for c in "${CONFIGS[@]}"; do run_gpt "$c" "$d" >>"$OUT/r-$RATE-${c//:/-}"; done
    done
  done
  if has full && has hybrid; then
    t0f=$(mean 1 <"$OUT/r-none-full"); t0h=$(mean 1 <"$OUT/r-none-hybrid")
    read -r base_f base_h < <(plan_comm "$d" 2GB/s)
    echo "  $d unshaped: FULL_SHARD $t0f s/step, HYBRID_SHARD $t0h s/step"
    for RATE in "${RATES[@]}"; do
      tf=$(mean 1 <"$OUT/r-$RATE-full"); th=$(mean 1 <"$OUT/r-$RATE-hybrid")
      read -r cf ch < <(plan_comm "$d" "$(rate_name "$RATE")")
      python3 - "$d" "$RATE" "$tf" "$th" "$t0f" "$t0h" "$cf" "$ch" "$base_f" "$base_h" <<'PY'
import sys
d, rate = sys.argv[1], sys.argv[2]
tf, th, t0f, t0h, cf, ch, bf, bh = map(float, sys.argv[3:])
measured = tf / th if th > 0 else float("nan")
predicted = (t0f + cf - bf) / (t0h + ch - bh)
off = abs(measured / predicted - 1) * 100
print(f"  {d} {rate}: FULL_SHARD {tf:.4f} s/step, HYBRID_SHARD {th:.4f} s/step, ratio {measured:.2f} "
      f"measured vs {predicted:.2f} predicted ({off:.0f}% apart{'' if off <= 20 else ': over the 20% goal'})")
PY
    done
  fi
  [ "${CONFIGS[*]}" = "full hybrid" ] && continue
  echo "  $d: | config | link | s/step | x own unshaped | predicted s/step (apart) | inter-host MiB/step (uncompressed) | veth MiB/step |"
  for c in "${CONFIGS[@]}"; do
    f=${c//:/-}
    t0=$(mean 1 <"$OUT/r-none-$f")
    base=$(plan_config "$c" "$d" 2GB/s)
    for RATE in none "${RATES[@]}"; do
      comm=$base
      [ "$RATE" = none ] || comm=$(plan_config "$c" "$d" "$(rate_name "$RATE")")
      python3 - "$c" "$RATE" "$t0" "$(mean 1 <"$OUT/r-$RATE-$f")" "$(mean 2 <"$OUT/r-$RATE-$f")" \
        "$(mean 3 <"$OUT/r-$RATE-$f")" "$(mean 4 <"$OUT/r-$RATE-$f")" "$comm" "$base" <<'PY'
import sys
c, rate = sys.argv[1], sys.argv[2]
t0, t, inter, logical, veth, comm, base = map(float, sys.argv[3:])
M = 1 << 20
# The planner's step: the unshaped step plus its extra communication time at the rate.
pred = t0 + comm - base
apart = "-" if rate == "none" else f"{pred:.4f} ({abs(t / pred - 1) * 100:.0f}%)"
print(f"  | {c} | {'unshaped' if rate == 'none' else rate} | {t:.4f} | {t / t0:.2f} | {apart} | "
      f"{inter / M:.2f} ({logical / M:.2f}) | {veth / M:.2f} |")
PY
    done
  done
done

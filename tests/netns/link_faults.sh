# fsdp-cpp tests: network faults between the two "hosts" of two_hosts.sh
# (sourced by it with TWO_HOSTS_FAULT=cut|slow|elastic, after the namespaces $A, $B,
# the veth ends $VA, $VB, the addresses and $PORT, $TOKEN, $OUT are set up).
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# The first time (ms, from $2) a line matching $3 appears in file $1, waiting
# at most $4 s; empty when it never does.
first_seen() {
  local f=$1 t0=$2 re=$3 limit=$4 end=$(( $(now_ms) + $4 * 1000 ))
  while [ "$(now_ms)" -lt "$end" ]; do
    if grep -q -- "$re" "$f" 2>/dev/null; then echo $(( $(now_ms) - t0 )); return 0; fi
    sleep 0.02
  done
}
has_netem() { ip netns exec "$A" tc qdisc add dev "$VA" root netem delay 1ms 2>/dev/null &&
              ip netns exec "$A" tc qdisc del dev "$VA" root 2>/dev/null; }
fault_node() {  # node-rank namespace log program args...; env from FAULT_ENV
  local k=$1 ns=$2 log=$3
  shift 3
  ip netns exec "$ns" env FSDP_JOB_TOKEN="$TOKEN" $FAULT_ENV timeout "$TIMEOUT" "$BIN/fsdp" run --nnodes 2 \
    --node-rank "$k" --master-addr "$ADDR_A" --master-port "$PORT" -n 2 -- "$@" >"$log" 2>&1
}

case $FAULT in
cut)
  FAULT_ENV="FSDP_TIMEOUT=3 FSDP_FLIGHT_DIR=$OUT/flight"
  fault_node 0 "$A" "$OUT/node0.log" "$BIN/fsdp_test_worker" wd_train 1000000 16384 &
  p0=$!
  FAULT_ENV="FSDP_TIMEOUT=3 FSDP_FLIGHT_DIR=$OUT/flight GLOO_SOCKET_IFNAME=$VB" fault_node 1 "$B" "$OUT/node1.log" \
    "$BIN/fsdp_test_worker" wd_train 1000000 16384 &
  p1=$!
  t0=$(now_ms)
  [ -n "$(first_seen "$OUT/node0.log" "$t0" '\] step 20$' 120)" ] || {
    cat "$OUT"/node*.log; echo "two_hosts: FAIL: the job did not start"; kill $p0 $p1; exit 1; }
  sleep 2  # a few heartbeats: every rank has read where the others run
  tcut=$(now_ms)
  if has_netem; then
    how="netem loss 100%"
    ip netns exec "$A" tc qdisc add dev "$VA" root netem loss 100%
    ip netns exec "$B" tc qdisc add dev "$VB" root netem loss 100%
  else
    how="ip link set $VA down (this kernel has no netem)"
    ip -n "$A" link set "$VA" down
  fi
  echo "two_hosts: cut the link (2 s after step 20): $how"
  s0=$(first_seen "$OUT/node0.log" "$tcut" 'Cause: ranks\? 2 and 3 .*silent\|Cause: rank [23] is silent' 30)
  s1=$(first_seen "$OUT/node1.log" "$tcut" 'Cause: ranks 0 and 1 on .* silent: cut off' 30)
  wait $p0; rc0=$?
  wait $p1; rc1=$?
  sed 's/^/node0 | /' "$OUT/node0.log" | grep -v '] step ' | tail -40
  sed 's/^/node1 | /' "$OUT/node1.log" | grep -v '] step ' | tail -40
  echo "two_hosts: after the cut: node 0 named the other host's ranks silent after ${s0:-never} ms, node 1 after ${s1:-never} ms (FSDP_TIMEOUT=3 s); exits $rc0, $rc1"
  fail=0
  for k in 0 1; do
    n=$(grep -c '\] wd error: ' "$OUT/node$k.log")
    [ "$n" = 2 ] || { echo "two_hosts: FAIL: node $k: $n of 2 ranks reported the failed collective"; fail=1; }
  done
  [ "$(grep '\] wd error: ' "$OUT/node0.log" | grep -c 'rank 2: SILENT')" = 2 ] ||
    { echo "two_hosts: FAIL: node 0's ranks do not both name rank 2 silent"; fail=1; }
  [ "$(grep '\] wd error: ' "$OUT/node0.log" | grep -c 'rank 3: SILENT')" = 2 ] ||
    { echo "two_hosts: FAIL: node 0's ranks do not both name rank 3 silent"; fail=1; }
  [ "$(grep '\] wd error: ' "$OUT/node1.log" | grep -c 'Cause: ranks 0 and 1 on .* silent: cut off')" = 2 ] ||
    { echo "two_hosts: FAIL: node 1's ranks do not both name ranks 0 and 1 silent"; fail=1; }
  for s in "$s0" "$s1"; do
    [ -n "$s" ] && [ "$s" -le 5000 ] || { echo "two_hosts: FAIL: not named within timeout + 2 s"; fail=1; }
  done
  [ $fail = 0 ] && echo "two_hosts: PASS: a cut link names the other host's ranks silent on both sides"
  exit $fail
  ;;
slow)
  yes "the quick brown fox jumps over the lazy dog. " | head -c 200000 > "$OUT/text.txt"
  gpt_args=(--text "$OUT/text.txt" --seq 64 --dim 64 --layers 2 --heads 2 --batch 4 --steps 28 --log-every 1
            --eval-every 0 --threads 1 --no-progress --straggler-factor 2 --straggler-window 3)
  FAULT_ENV="FSDP_TIMEOUT=60"
  fault_node 0 "$A" "$OUT/node0.log" "$BIN/gpt" "${gpt_args[@]}" &
  p0=$!
  FAULT_ENV="FSDP_TIMEOUT=60 GLOO_SOCKET_IFNAME=$VB" fault_node 1 "$B" "$OUT/node1.log" "$BIN/gpt" "${gpt_args[@]}" &
  p1=$!
  t0=$(now_ms)
  [ -n "$(first_seen "$OUT/node0.log" "$t0" '\] step    12 ' 180)" ] || {
    cat "$OUT"/node*.log; echo "two_hosts: FAIL: the job did not reach step 12"; kill $p0 $p1; exit 1; }
  if has_netem; then
    how="netem loss 20% delay 50ms"
    ip netns exec "$A" tc qdisc add dev "$VA" root netem loss 20% delay 50ms
  else
    how="tc tbf rate 40mbit (this kernel has no netem)"
    ip netns exec "$A" tc qdisc add dev "$VA" root tbf rate 40mbit burst 64kbit latency 1s
    ip netns exec "$B" tc qdisc add dev "$VB" root tbf rate 40mbit burst 64kbit latency 1s
  fi
  echo "two_hosts: from step 12 the link is slow: $how"
  wait $p0; rc0=$?
  wait $p1; rc1=$?
  grep -h '\[rank 0\] step \|straggler\|error' "$OUT/node0.log" | sed 's/^/node0 | /'
  # tok/s of rank 0's step lines: steps 4-11 (before) and 16-27 (after).
  toks() { grep '\[rank 0\] step ' "$OUT/node0.log" | awk -v lo="$1" -v hi="$2" -F'|' \
    '{ split($1, a, " "); s = a[4] + 0; if (s >= lo && s <= hi) { split($6, b, " "); print b[1] } }' | sort -n |
    awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'; }
  before=$(toks 4 11)
  after=$(toks 16 27)
  echo "two_hosts: slow link: exits $rc0, $rc1; median tok/s before $before, after $after ($how)"
  fail=0
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "two_hosts: FAIL: the slow link failed the job"; fail=1; }
  awk -v b="$before" -v a="$after" 'BEGIN { exit !(b > 0 && a > 0 && a < 0.8 * b) }' ||
    { echo "two_hosts: FAIL: the tok/s lines do not show the slow link"; fail=1; }
  [ $fail = 0 ] && echo "two_hosts: PASS: a slow link slows the job ($before -> $after tok/s) and does not fail it"
  exit $fail
  ;;
elastic)
  # fsdp run --nnodes 1:2, one gpt rank per host, checkpoints in a folder
  # both see; the link is cut after the checkpoint of step 8: node 0 (it
  # hosts the store) goes on alone at world size 1 and finishes; node 1,
  # cut off from the store, ends saying node 0 is gone.
  yes "the quick brown fox jumps over the lazy dog. " | head -c 100000 > "$OUT/text.txt"
  gpt_args=(--text "$OUT/text.txt" --seq 32 --dim 48 --layers 2 --heads 2 --batch 2 --global-batch 12 --steps 40
            --warmup 4 --lr 3e-3 --eval-every 0 --log-every 1 --threads 1 --no-progress --straggler-factor 0
            --ckpt-dir "$OUT/ckpt" --ckpt-every 4 --resume --save "$OUT/final.safetensors")
  enode() {  # node-rank namespace log extra-env...
    local k=$1 ns=$2 log=$3
    shift 3
    ip netns exec "$ns" env FSDP_JOB_TOKEN="$TOKEN" FSDP_TIMEOUT=10 "$@" timeout "$TIMEOUT" "$BIN/fsdp" run \
      --nnodes 1:2 --node-rank "$k" --master-addr "$ADDR_A" --master-port "$PORT" -n 1 --max-restarts 2 \
      --rdzv-settle 1 --grace 1 -- "$BIN/gpt" "${gpt_args[@]}" >"$log" 2>&1
  }
  enode 0 "$A" "$OUT/node0.log" &
  p0=$!
  enode 1 "$B" "$OUT/node1.log" GLOO_SOCKET_IFNAME="$VB" &
  p1=$!
  t0=$(now_ms)
  [ -n "$(first_seen "$OUT/node0.log" "$t0" 'step-000008' 120)" ] || {
    cat "$OUT"/node*.log; echo "two_hosts: FAIL: no checkpoint of step 8"; kill $p0 $p1; exit 1; }
  tcut=$(now_ms)
  if has_netem; then
    how="netem loss 100%"
    ip netns exec "$A" tc qdisc add dev "$VA" root netem loss 100%
    ip netns exec "$B" tc qdisc add dev "$VB" root netem loss 100%
  else
    how="ip link set $VA down (this kernel has no netem)"
    ip -n "$A" link set "$VA" down
  fi
  echo "two_hosts: cut the link after the checkpoint of step 8: $how"
  s0=$(first_seen "$OUT/node0.log" "$tcut" 'elastic restart [0-9]*: world size 2 -> 1' 60)
  wait $p0; rc0=$?
  wait $p1; rc1=$?
  grep -h 'fsdp run\|resumed\|error' "$OUT/node0.log" | sed 's/^/node0 | /'
  grep -h 'fsdp run\|resumed\|error' "$OUT/node1.log" | sed 's/^/node1 | /'
  echo "two_hosts: elastic: node 0 restarted at world size 1 ${s0:-never} ms after the cut; exits $rc0, $rc1"
  fail=0
  [ $rc0 = 0 ] || { echo "two_hosts: FAIL: node 0 did not finish alone"; fail=1; }
  [ $rc1 = 1 ] || { echo "two_hosts: FAIL: node 1 exited $rc1, expected 1"; fail=1; }
  grep -q '\[rank 0\] resumed step [0-9]* at world size 1 (was 2); accumulation 6' "$OUT/node0.log" ||
    { echo "two_hosts: FAIL: node 0's rank did not resume at world size 1 with accumulation 6"; fail=1; }
  grep -q 'fsdp run: node 0 is gone: the launcher that hosts the rendezvous store' "$OUT/node1.log" ||
    { echo "two_hosts: FAIL: node 1 did not say node 0 is gone"; fail=1; }
  [ -s "$OUT/final.safetensors" ] || { echo "two_hosts: FAIL: no final weights"; fail=1; }
  [ $fail = 0 ] && echo "two_hosts: PASS: a cut link shrinks the job to node 0, which finishes at world size 1"
  exit $fail
  ;;
*)
  echo "two_hosts: FAIL: unknown TWO_HOSTS_FAULT='$FAULT' (expected cut, slow or elastic)"
  exit 1
  ;;
esac

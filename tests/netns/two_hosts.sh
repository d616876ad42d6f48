#!/usr/bin/env bash
# fsdp-cpp tests: two "hosts" on one machine — two network namespaces joined by
# a veth pair, two ranks in each, one `fsdp run` per namespace — must train
# exactly like one host with 4 ranks.
#
#   tests/netns/two_hosts.sh BIN_DIR [SCENARIO ARGS...]
#     (default workload: fsdp_test_worker core_parity full plain)
#   TWO_HOSTS_FAULT=cut tests/netns/two_hosts.sh BIN_DIR
#     a training loop (fsdp_test_worker wd_train) with FSDP_TIMEOUT=3; once
#     it runs, the link is cut (netem loss 100% where the kernel has netem,
#     else `ip link set ... down`): every rank on each side must name the
#     other host's ranks as silent within timeout + 2 s.
#   TWO_HOSTS_FAULT=slow tests/netns/two_hosts.sh BIN_DIR
#     GPT-mini (build/bin/gpt) logging every step; after 12 steps the link
#     gets lossy (netem loss 20% delay 50ms; without netem a token bucket of
#     40 Mbit/s, tc tbf): the job must end well and its tok/s lines show the
#     slowdown.
# Exit: 0 pass, 77 skipped (namespaces cannot be created here; the reason is
# printed), anything else a failure. Needs root (ip netns, iproute2).
#
# Node 0 lets the Gloo device pick the address that routes to the master;
# node 1 names its interface with GLOO_SOCKET_IFNAME, so both ways are run.
set -u
BIN=${1:?usage: two_hosts.sh BIN_DIR [SCENARIO ARGS...]}
shift
WORK=("$@")
[ ${#WORK[@]} -eq 0 ] && WORK=(core_parity full plain)
TIMEOUT=${TWO_HOSTS_TIMEOUT:-240}

tag=$$
A=fsdp-a-$tag B=fsdp-b-$tag
VA=fsa$tag VB=fsb$tag
NET=10.213.$((tag % 250))
ADDR_A=$NET.1 ADDR_B=$NET.2
PORT=$((20000 + tag % 20000))
OUT=$(mktemp -d)

skip() { echo "two_hosts: SKIP: $*"; rm -rf "$OUT"; exit 77; }
cleanup() {
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  ip link del "$VA" 2>/dev/null
  rm -rf "$OUT"
}

command -v ip >/dev/null || skip "the 'ip' command (Debian package iproute2) is not installed"
[ "$(id -u)" = 0 ] || skip "network namespaces need root (ran as uid $(id -u))"
err=$(ip netns add "$A" 2>&1) || skip "cannot create a network namespace: $err (a container without CAP_SYS_ADMIN?)"
trap cleanup EXIT
ip netns add "$B" || skip "cannot create a second network namespace"
err=$(ip link add "$VA" type veth peer name "$VB" 2>&1) || skip "cannot create a veth pair: $err"
set -e
ip link set "$VA" netns "$A"
ip link set "$VB" netns "$B"
ip -n "$A" addr add "$ADDR_A/24" dev "$VA"
ip -n "$B" addr add "$ADDR_B/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up
set +e
# (No need to wait for the link: the ranks retry the store until FSDP_RENDEZVOUS_TIMEOUT.)

TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "two_hosts: namespaces $A ($ADDR_A, node 0, master) and $B ($ADDR_B, node 1) over veth; port $PORT"
FAULT=${TWO_HOSTS_FAULT:-}
if [ -n "$FAULT" ]; then
  . "$(dirname "$0")/link_faults.sh"
  exit $?
fi
node() {  # node-rank namespace extra-env...
  local k=$1 ns=$2
  shift 2
  ip netns exec "$ns" env FSDP_JOB_TOKEN="$TOKEN" "$@" timeout "$TIMEOUT" "$BIN/fsdp" run --nnodes 2 \
    --node-rank "$k" --master-addr "$ADDR_A" --master-port "$PORT" -n 2 -- "$BIN/fsdp_test_worker" "${WORK[@]}" \
    >"$OUT/node$k.log" 2>&1
}
t0=$(date +%s%N)
node 0 "$A" &
p0=$!
node 1 "$B" GLOO_SOCKET_IFNAME="$VB" &
p1=$!
wait $p0
rc0=$?
wait $p1
rc1=$?
t1=$(date +%s%N)
sed 's/^/node0 | /' "$OUT/node0.log"
sed 's/^/node1 | /' "$OUT/node1.log"
echo "two_hosts: node 0 exit $rc0, node 1 exit $rc1, $(( (t1 - t0) / 1000000 )) ms"
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "two_hosts: FAIL: a node failed"; exit 1; }

# The same job on one host with 4 ranks: the same outcome on every rank. The
# parity errors themselves (max_rel, max_abs against the unsharded
# reference) may differ in the last bits: across hosts the collectives
# compose the tiers and sum host by host first (docs/COMM.md), so they are
# left out of the comparison; each line still says OK or not.
timeout "$TIMEOUT" "$BIN/fsdp" run -n 4 -- "$BIN/fsdp_test_worker" "${WORK[@]}" >"$OUT/one.log" 2>&1
rc=$?
sed 's/^/one-host | /' "$OUT/one.log"
[ $rc = 0 ] || { echo "two_hosts: FAIL: the one-host run failed ($rc)"; exit 1; }
result() { grep -h -o 'PARITY.*\|RESULT.*' "$@" | sed -E 's/ max_rel=[^ ]+ max_abs=[^ ]+//' | sort | uniq -c; }
two=$(result "$OUT/node0.log" "$OUT/node1.log")
one=$(result "$OUT/one.log")
echo "two hosts:"; echo "$two"; echo "one host:"; echo "$one"
[ -n "$two" ] || { echo "two_hosts: FAIL: the workload printed no PARITY/RESULT line"; exit 1; }
[ "$two" = "$one" ] || { echo "two_hosts: FAIL: two hosts and one host differ"; exit 1; }
echo "two_hosts: PASS: 2 namespaces x 2 ranks == 1 host x 4 ranks"

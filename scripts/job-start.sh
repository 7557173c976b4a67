#!/usr/bin/env bash
# Job start across network-namespace hosts under default settings: for each
# "HOSTSxRANKS" shape, makes that many hosts (a bridge, a namespace and a
# veth each, on 10.98.0.0/16), runs `btl run ... -- btl stress --messages
# MESSAGES --max-size 8` (wire-up, a barrier, a message to and a one-sided
# round with every peer) RUNS times, and writes the median wall time and
# the outcome to bench/results/60-job-start.tsv (then BENCHMARKS.md). As
# root; removes its hosts on exit, also on failure, and puts back the
# kernel's neighbour-table limits it raises (the one ARP table of all
# namespaces needs about hosts^2 entries).
#
#   bash scripts/job-start.sh                       # 8x2 16x2 32x2 32x4
#   SHAPES="32x4 64x4" RUNS=1 bash scripts/job-start.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
SHAPES=${SHAPES:-"8x2 16x2 32x2 32x4"}
RUNS=${RUNS:-3}
MESSAGES=${MESSAGES:-1}
MAX_SIZE=${MAX_SIZE:-8}
OUT=${OUT:-bench/results/60-job-start.tsv}
br=btlbr98
made=0
neigh=/proc/sys/net/ipv4/neigh/default
saved=$(cat $neigh/gc_thresh1 $neigh/gc_thresh2 $neigh/gc_thresh3)
work=$(mktemp -d)

down() {
  for i in $(seq 1 "$made"); do
    ip link del "bjv$i" 2>/dev/null || true
    ip netns del "bj$i" 2>/dev/null || true
  done
  ip link del "$br" 2>/dev/null || true
  made=0
}
cleanup() {
  down
  set -- $saved
  echo "$1" >$neigh/gc_thresh1; echo "$2" >$neigh/gc_thresh2; echo "$3" >$neigh/gc_thresh3
  rm -rf "$work"
}
trap cleanup EXIT

up() {
  local n=$1 need=$(( 4 * ($1 + 1) * ($1 + 1) ))
  [ "$need" -lt 1024 ] && need=1024
  echo "$need" >$neigh/gc_thresh1; echo $((2 * need)) >$neigh/gc_thresh2
  echo $((4 * need)) >$neigh/gc_thresh3
  ip link add "$br" type bridge
  ip addr add 10.98.255.254/16 dev "$br"
  ip link set "$br" up
  printf '127.0.0.1 localhost\n10.98.255.254 head\n' >"$work/hosts"
  for i in $(seq 1 "$n"); do
    ip netns add "bj$i"; made=$i
    ip link add "bjv$i" type veth peer name eth0 netns "bj$i"
    ip link set "bjv$i" master "$br" up
    local a="10.98.$((i / 250)).$((i % 250 + 1))"
    ip -n "bj$i" addr add "$a/16" dev eth0
    ip -n "bj$i" link set eth0 up
    ip -n "bj$i" link set lo up
    echo "$a bj$i" >>"$work/hosts"
  done
}

# BTL=PATH measures that build of btl instead (say, the one before a change).
if [ -n "${BTL:-}" ]; then
  btl=$BTL
else
  cargo build --release --locked -q -p btl-cli --bin btl
  btl=$root/target/release/btl
fi
rows=()
for shape in $SHAPES; do
  hosts=${shape%x*} per=${shape#*x}
  up "$hosts"
  list=$(for i in $(seq 1 "$hosts"); do printf 'bj%s:%s,' "$i" "$per"; done)
  times=() ok=0 spreads=() joins=() barriers=()
  # How long after the launch each rank's program starts (a program that
  # prints the clock): the spread, and the last host's first rank.
  for r in $(seq 1 "$RUNS"); do
    t0=$(date +%s.%N)
    BTL_NETNS_HOSTS=$work/hosts "$btl" run --timeout 120 -n $((hosts * per)) --host "${list%,}" \
      --agent "$root/scripts/netns-agent.sh" --wireup-addr 10.98.255.254 -- \
      date +%s.%N >"$work/starts" 2>&1 || true
    spreads+=("$(sed -n 's/^\[\([0-9]*\)\] \([0-9.]*\)$/\1 \2/p' "$work/starts" |
      awk -v t0="$t0" -v last=$(((hosts - 1) * per)) '
        { d = $2 - t0; if (NR == 1 || d > max) max = d; if (NR == 1 || d < min) min = d; if ($1 == last) l = d }
        END { printf "%.2f %.2f %.2f", min, max, l }')")
  done
  for r in $(seq 1 "$RUNS"); do
    t0=$(date +%s.%N)
    # BTL_LOG=info: each rank says when it joined (wire-up and transports
    # up) and when its first barrier ended (its message phase began).
    if BTL_LOG=info BTL_TCP_IF_INCLUDE=10.98.0.0/16 BTL_NETNS_HOSTS=$work/hosts \
        "$btl" run --timeout 600 -n $((hosts * per)) --host "${list%,}" \
        --agent "$root/scripts/netns-agent.sh" --wireup-addr 10.98.255.254 -- \
        "$btl" stress --messages "$MESSAGES" --max-size "$MAX_SIZE" >"$work/out" 2>&1 &&
        [ "$(grep -c 'all intact' "$work/out")" = $((hosts * per)) ]; then
      ok=$((ok + 1))
    else
      # Every rank's complaint, not just the last lines: the first failure
      # is often not the last one printed.
      grep -v 'all intact' "$work/out" | head -n 40 >&2
    fi
    times+=("$(echo "$(date +%s.%N) - $t0" | bc)")
    joins+=("$(sed -n 's/.*joined the job after \([0-9.]*\) s.*/\1/p' "$work/out" | sort -n | tail -n 1)")
    barriers+=("$(sed -n 's/.*message phase after \([0-9.]*\) s.*/\1/p' "$work/out" | sort -n | tail -n 1)")
  done
  median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  join=$(median "${joins[@]}") barrier=$(median "${barriers[@]}")
  med=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  # The run with the median latest start.
  read -r smin smax slast <<<"$(printf '%s\n' "${spreads[@]}" | sort -n -k2 | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}')"
  printf '[job-start] %s: %d of %d intact, median %.2f s; programs started %s-%s s after launch (last host %s s); last rank joined %.2f s, left the first barrier %.2f s after its start\n' \
    "$shape" "$ok" "$RUNS" "$med" "$smin" "$smax" "$slast" "$join" "$barrier"
  rows+=("$(printf '%s × %s\t%s\t%.2f\t%s\t%s\t%s\t%.2f\t%.2f\t%d of %d' "$hosts" "$per" $((hosts * per)) "$med" "$smin" "$smax" "$slast" "$join" "$barrier" "$ok" "$RUNS")")
  down
done

{
  echo "# title: Job start across network-namespace hosts (btl run, default settings)"
  echo "# command: SHAPES=\"$SHAPES\" RUNS=$RUNS MESSAGES=$MESSAGES MAX_SIZE=$MAX_SIZE bash scripts/job-start.sh"
  echo "# machine: $(nproc) vCPU $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# note: wall time of the whole job: launch, wire-up, barrier, $MESSAGES checked message(s) of up to $MAX_SIZE B to every peer and a get/put with each; median of $RUNS runs; all ranks share the machine's cores. Starts: when each rank's program began (a program printing the clock, same launch), after the launch; the run with the median latest start; last host: the first rank of the last host in the list. Joined: when the slowest rank had the wire-up done and its transports up; barrier: when the slowest rank left the first barrier (both after that rank's own start, medians)"
  printf 'hosts × ranks\tranks\tjob s\tfirst start s\tlast start s\tlast host s\tjoined s\tbarrier s\tintact\n'
  printf '%s\n' "${rows[@]}"
} >"$OUT"
python3 scripts/benchmarks.py

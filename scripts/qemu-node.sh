#!/usr/bin/env bash
# A bare-metal btl node booted in QEMU joins a job with Linux ranks.
#
#   bash scripts/qemu-node.sh          # demo: a 3-rank `btl stress` job, ranks 0 and 1
#                                      # on Linux, rank 2 the QEMU node; prints every
#                                      # rank's summary and the node's console
#   bash scripts/qemu-node.sh test     # the tests (scripts/test.sh runs them): that job,
#                                      # the QEMU node killed mid-run, a Linux rank
#                                      # killed mid-run
#   BTL_QEMU_KEEP=1 bash scripts/qemu-node.sh test   # keeps every console and rank log
#   bash scripts/qemu-node.sh bench    # the figures: image size, boot time, 8 B latency
#                                      # and 64 KiB bandwidth Linux <-> QEMU node, and
#                                      # Linux <-> the hosted smoltcp node on a TAP
#
# Needs root (a network namespace and a TAP device, made here and removed on
# every exit path), the riscv64gc-unknown-none-elf target, qemu-system-riscv64
# and OpenSBI (installed here if missing, with rustup and apt-get). Without
# them it skips, saying why; with CI set it fails instead.
#
# The node: platform-baremetal/qemu (riscv64gc-unknown-none-elf), booted by
# OpenSBI on QEMU's `virt` machine with a virtio-net device on a TAP in the
# namespace; its configuration is the kernel command line (-append). The
# Linux ranks: `btl stress` / `btl bench`, bound to the TAP's host side,
# each on a fixed port (BTL_TCP_PORT_MIN_V4, range 1) that the node is
# given; they learn the node's address from the session directory's wire-up
# records (BTL_WIREUP=dir), which this script writes on the node's behalf.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=${1:-demo}
case $mode in demo | test | bench) ;; *)
  echo "usage: bash scripts/qemu-node.sh [demo|test|bench]" >&2
  exit 2
  ;;
esac

log() { printf '[qemu-node] %s\n' "$*"; }
skip() {
  if [ -n "${CI:-}" ]; then
    echo "[qemu-node] FAILED: $* (CI is set: a missing prerequisite is a failure)" >&2
    exit 1
  fi
  log "SKIPPED: $*"
  exit 0
}

[ "$(id -u)" = 0 ] || skip "needs root for a network namespace and a TAP device"
# What the node needs, installed here too so that this one command works
# on a fresh machine (scripts/setup.sh installs the same for the tests).
if ! rustup target list --installed 2>/dev/null | grep -qx riscv64gc-unknown-none-elf; then
  log "adding the rustup target riscv64gc-unknown-none-elf"
  rustup target add riscv64gc-unknown-none-elf
fi
if ! command -v qemu-system-riscv64 >/dev/null && command -v apt-get >/dev/null; then
  log "installing qemu-system-misc and opensbi (Debian)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-misc opensbi
fi
command -v qemu-system-riscv64 >/dev/null || skip "qemu-system-riscv64 not found (Debian: qemu-system-misc)"
command -v ip >/dev/null || skip "ip (iproute2) not found"
[ -c /dev/net/tun ] || skip "/dev/net/tun missing: no TAP devices here"

NS=btlq$$
TAP=btlqtap0
HOST_IP=10.79.0.1
NODE_IP=10.79.0.2
NODE_PORT=7000
MAX_FRAME=131072
IMAGE=$root/target/riscv64gc-unknown-none-elf/release/btl-qemu-node
BTL=$root/target/release/btl
work=$(mktemp -d /tmp/btl-qemu.XXXXXX)
pids=()

cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  ip netns del "$NS" 2>/dev/null || true
  if [ -n "${BTL_QEMU_KEEP:-}" ]; then
    echo "[qemu-node] logs kept in $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- build ---------------------------------------------------------------
log "building btl (host) and the node image (riscv64gc-unknown-none-elf)"
cargo build --release --locked -q -p btl-cli
if [ "$mode" = bench ]; then
  cargo build --release --locked -q -p btl-baremetal --example tap_node
fi
(cd platform-baremetal/qemu && cargo build --release --locked -q)
size "$IMAGE" | sed 's/^/[qemu-node] /'

# ---- the namespace and its TAP ----------------------------------------------
ip netns add "$NS" || skip "cannot create a network namespace (ip netns add)"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev "$TAP" mode tap || skip "cannot create a TAP device"
ip -n "$NS" addr add "$HOST_IP/24" dev "$TAP"
ip -n "$NS" link set "$TAP" up

# wait_line FILE PATTERN SECONDS PID: until FILE has a line matching PATTERN;
# fails if PID ends first or the time runs out.
wait_line() {
  local file=$1 pat=$2 secs=$3 pid=$4 i
  for ((i = 0; i < secs * 20; i++)); do
    grep -q -- "$pat" "$file" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { grep -q -- "$pat" "$file" 2>/dev/null && return 0; return 1; }
    sleep 0.05
  done
  return 1
}

# wait_pid PID SECONDS: waits for PID (a child) to end, at most SECONDS;
# its status, or 124 after killing it on timeout.
wait_pid() {
  local pid=$1 secs=$2 i
  for ((i = 0; i < secs * 20; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" && return 0 || return $?
    fi
    sleep 0.05
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return 124
}

show() {
  local f
  for f in "$@"; do
    echo "----- ${f#"$work"/}"
    cat "$f" 2>/dev/null || true
  done
}

# boot NAME SIZE RUN_ARGS...: starts the node (rank SIZE-1 of SIZE) for job
# NAME, its console in $work/NAME/uart.log; waits (30 s) for it to be ready.
boot() {
  local name=$1 size=$2
  shift 2
  local dir=$work/$name me=$((size - 1)) peers="" r
  mkdir -p "$dir/session/wireup"
  for ((r = 0; r < me; r++)); do
    peers+=" peer=$r@$HOST_IP:$((7100 + r))"
  done
  # The node's wire-up records, as a rank of the job API publishes them:
  # its node name, the first fence, its TCP address, the second fence.
  printf 'qemu' >"$dir/session/wireup/node.$me"
  : >"$dir/session/wireup/fence-1.$me"
  printf '%s:%s' "$NODE_IP" "$NODE_PORT" >"$dir/session/wireup/tcp-addr.$me"
  : >"$dir/session/wireup/fence-2.$me"
  ip netns exec "$NS" qemu-system-riscv64 -machine virt -m 128M -smp 1 \
    -nographic -bios default -kernel "$IMAGE" \
    -global virtio-mmio.force-legacy=false \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
    -device virtio-net-device,netdev=n0,mac=52:54:00:62:74:6c \
    -append "job=$name rank=$me size=$size ip=$NODE_IP/24 port=$NODE_PORT$peers max_frame=$MAX_FRAME $*" \
    </dev/null >"$dir/uart.log" 2>&1 &
  qemu=$!
  pids+=("$qemu")
  if ! wait_line "$dir/uart.log" "ready at" 30 "$qemu"; then
    show "$dir/uart.log"
    echo "[qemu-node] $name: the node did not come up" >&2
    return 1
  fi
}

# linux_rank NAME SIZE RANK TIMEOUT CMD...: starts Linux rank RANK of job
# NAME in the namespace; its output in $work/NAME/rankRANK.log.
linux_rank() {
  local name=$1 size=$2 r=$3 timeout=$4
  shift 4
  local dir=$work/$name
  ip netns exec "$NS" env BTL_JOB="$name" BTL_RANK="$r" BTL_SIZE="$size" \
    BTL_LOCAL_RANK="$r" BTL_LOCAL_SIZE=$((size - 1)) BTL_NODE=linux \
    BTL_SESSION_DIR="$dir/session" BTL_WIREUP=dir BTL_WIREUP_TIMEOUT=30 \
    BTL_BIND="$HOST_IP" BTL_TCP_PORT_MIN_V4=$((7100 + r)) BTL_TCP_PORT_RANGE_V4=1 \
    BTL_TCP_MAX_FRAME="$MAX_FRAME" BTL_TIMEOUT="$timeout" BTL_LOG=warn \
    "${LINUX_ENV[@]}" "$@" >"$dir/rank$r.log" 2>&1 &
  ranks[$r]=$!
  pids+=("${ranks[$r]}")
}

# Extra environment of the Linux ranks (a test sets it).
LINUX_ENV=()
MESSAGES=${BTL_QEMU_MESSAGES:-200}
MAX_SIZE=262144 # the node's largest message (MAX_MESSAGE): chunked frames
STRESS=(stress --messages "$MESSAGES" --max-size "$MAX_SIZE")
NODE_STRESS="run=stress messages=$MESSAGES max_size=$MAX_SIZE timeout=60"
failures=0
passed=0

fail_test() {
  echo "[qemu-node] FAILED: $*" >&2
  failures=$((failures + 1))
}

# ---- the 3-rank job -------------------------------------------------------
job_test() {
  local name=job$$ t0=$SECONDS st r
  ranks=()
  boot "$name" 3 "$NODE_STRESS" || { fail_test "job: boot"; return; }
  for r in 0 1; do linux_rank "$name" 3 "$r" 60 "$BTL" "${STRESS[@]}"; done
  local ok=1 dir=$work/$name
  for r in 0 1; do
    st=0; wait_pid "${ranks[r]}" 150 || st=$?
    [ "$st" = 0 ] || { ok=0; echo "[qemu-node] job: Linux rank $r ended with status $st" >&2; }
    grep -q "all intact" "$dir/rank$r.log" || ok=0
  done
  # The node ends by itself once the job is over (at once if a rank failed).
  st=0; wait_pid "$qemu" $((ok == 1 ? 60 : 1)) || st=$?
  [ "$st" = 0 ] || { ok=0; echo "[qemu-node] job: QEMU ended with status $st" >&2; }
  grep -q "^btl-qemu-node: rank 2: .* from 2 peers .*: all intact" "$dir/uart.log" || ok=0
  # A clean close on every side: nobody saw a peer fail.
  grep -qi "failed" "$dir/uart.log" "$dir/rank0.log" "$dir/rank1.log" && ok=0
  if [ $ok = 1 ]; then
    grep -h "all intact" "$dir/rank0.log" "$dir/rank1.log" "$dir/uart.log" | sed 's/^/[qemu-node]   /'
    log "job: 2 Linux ranks + the QEMU node: all intact ($((SECONDS - t0)) s)"
    passed=$((passed + 1))
  else
    show "$dir/rank0.log" "$dir/rank1.log" "$dir/uart.log"
    fail_test "job: 2 Linux ranks + the QEMU node"
  fi
}

# ---- the QEMU node killed mid-run -------------------------------------------
# 1000 messages each way, the node killed once it has had 10 from each
# Linux rank: the ranks must notice the dead link (no FIN, no RST: the TAP
# goes silent) by TCP_USER_TIMEOUT / keep-alive — set short here — and end
# with an error naming rank 2, well within BTL_TIMEOUT.
node_killed_test() {
  local name=nk$$ st r timeout=30 m=1000
  ranks=()
  boot "$name" 3 "run=stress messages=$m max_size=$MAX_SIZE timeout=60" ||
    { fail_test "node killed: boot"; return; }
  LINUX_ENV=(BTL_TCP_USER_TIMEOUT=3000 BTL_TCP_KEEPALIVE_TIME=2 BTL_TCP_KEEPALIVE_INTVL=1
    BTL_TCP_KEEPALIVE_PROBES=3)
  for r in 0 1; do
    linux_rank "$name" 3 "$r" "$timeout" "$BTL" stress --messages "$m" --max-size "$MAX_SIZE"
  done
  LINUX_ENV=()
  local ok=1 dir=$work/$name
  if ! wait_line "$dir/uart.log" "10 messages from rank 0" 60 "$qemu" ||
    ! wait_line "$dir/uart.log" "10 messages from rank 1" 60 "$qemu"; then
    show "$dir/uart.log"; fail_test "node killed: the job did not start"; return
  fi
  if ! kill -9 "$qemu" 2>/dev/null; then
    show "$dir/uart.log"; fail_test "node killed: QEMU ended before it could be killed"; return
  fi
  wait "$qemu" 2>/dev/null || true
  local killed=$SECONDS
  for r in 0 1; do
    st=0; wait_pid "${ranks[r]}" $((timeout + 30)) || st=$?
    if [ "$st" = 0 ] || [ "$st" = 124 ]; then
      ok=0; echo "[qemu-node] node killed: Linux rank $r ended with status $st (want an error)" >&2
    fi
    grep -q "rank 2 failed" "$dir/rank$r.log" || ok=0
  done
  if [ $ok = 1 ]; then
    grep -h "btl stress" "$dir/rank0.log" "$dir/rank1.log" | sed 's/^/[qemu-node]   /'
    log "node killed: both Linux ranks named rank 2 failed $((SECONDS - killed)) s after the kill (TCP_USER_TIMEOUT 3 s, BTL_TIMEOUT=$timeout)"
    passed=$((passed + 1))
  else
    show "$dir/rank0.log" "$dir/rank1.log" "$dir/uart.log"
    fail_test "node killed mid-run"
  fi
}

# ---- a Linux rank killed mid-run ----------------------------------------------
# 1000 messages each way: both Linux ranks are deep in their sending when
# rank 0 is killed, once the node has had 10 messages from each. The Linux
# ranks run `btl stress --keep-going`, as the node always does: rank 1
# reports rank 0's failure and finishes its exchange with the node, so the
# node must go on with rank 1 after rank 0 failed (without it, rank 1
# would leave at once and whether the node exchanged anything more with it
# would be a race between the two ranks noticing the death).
rank_killed_test() {
  local name=rk$$ st r m=1000
  ranks=()
  boot "$name" 3 "run=stress messages=$m max_size=$MAX_SIZE timeout=60" ||
    { fail_test "rank killed: boot"; return; }
  for r in 0 1; do
    linux_rank "$name" 3 "$r" 60 "$BTL" stress --keep-going --messages "$m" --max-size "$MAX_SIZE"
  done
  local ok=1 dir=$work/$name
  if ! wait_line "$dir/uart.log" "10 messages from rank 0" 60 "$qemu" ||
    ! wait_line "$dir/uart.log" "10 messages from rank 1" 60 "$qemu"; then
    show "$dir/uart.log"; fail_test "rank killed: the job did not start"; return
  fi
  if ! kill -9 "${ranks[0]}" 2>/dev/null; then
    show "$dir/rank0.log" "$dir/uart.log"; fail_test "rank killed: rank 0 ended before it could be killed"; return
  fi
  wait "${ranks[0]}" 2>/dev/null || true
  st=0; wait_pid "${ranks[1]}" 90 || st=$?
  [ "$st" != 124 ] || { ok=0; echo "[qemu-node] rank killed: Linux rank 1 hung" >&2; }
  # Rank 1 named rank 0, received all of the node's messages, and failed
  # the run because of rank 0 (exit 1), nothing else.
  [ "$st" = 1 ] || { ok=0; echo "[qemu-node] rank killed: Linux rank 1 ended with status $st (want 1)" >&2; }
  grep -q "rank 1: going on without rank 0" "$dir/rank1.log" ||
    { ok=0; echo "[qemu-node] rank killed: Linux rank 1 did not report rank 0's failure" >&2; }
  if grep -q "rank 1: error: from rank 2\|rank 1: error: received\|going on without rank 2" "$dir/rank1.log"; then
    ok=0; echo "[qemu-node] rank killed: Linux rank 1 lost the node or found errors in its messages" >&2
  fi
  st=0; wait_pid "$qemu" 90 || st=$?
  [ "$st" != 124 ] || { ok=0; echo "[qemu-node] rank killed: the node hung" >&2; }
  # The node reported the failure, then went on exchanging checked
  # messages with rank 1 (more of them at the end than when rank 0 failed,
  # none wrong) until rank 1 — which skips the one-sided phase once a rank
  # has failed — left too; then it ended by itself with status 1.
  local before after
  before=$(sed -n 's/^btl-qemu-node: when peer 0 failed: \([0-9]*\) messages from rank 1 so far, \([0-9]*\) to it$/\1 \2/p' "$dir/uart.log")
  after=$(sed -n 's/^btl-qemu-node: rank 2: from rank 1: \([0-9]*\) of [0-9]* messages, to it: \([0-9]*\) of .*/\1 \2/p' "$dir/uart.log")
  read -r b_got b_sent <<<"${before:-x x}"
  read -r a_got a_sent <<<"${after:-x x}"
  if ! [[ $b_got$b_sent$a_got$a_sent =~ ^[0-9]+$ ]] || ((a_got + a_sent <= b_got + b_sent)); then
    ok=0; echo "[qemu-node] rank killed: with rank 1: '${before:-?}' when rank 0 failed, '${after:-?}' at the end" >&2
  fi
  grep -q "error:" "$dir/uart.log" && ok=0
  grep -q "^btl-qemu-node: exit status 1" "$dir/uart.log" || ok=0
  if [ $ok = 1 ]; then
    grep -h "peer 0 failed\|from rank 1\|stopped" "$dir/uart.log" | sed 's/^/[qemu-node]   /'
    log "rank killed: the node reported rank 0 failed and went on with rank 1 (received $b_got, sent $b_sent when rank 0 failed; $a_got and $a_sent at the end)"
    passed=$((passed + 1))
  else
    show "$dir/rank0.log" "$dir/rank1.log" "$dir/uart.log"
    fail_test "Linux rank killed mid-run"
  fi
}

case $mode in
demo)
  job_test
  show "$work/job$$/rank0.log" "$work/job$$/rank1.log" "$work/job$$/uart.log"
  ;;
test)
  t0=$SECONDS
  job_test
  node_killed_test
  rank_killed_test
  log "QEMU tests took $((SECONDS - t0)) s"
  printf 'qemu-node: %d passed, %d failed\n' "$passed" "$failures"
  ;;
bench)
  sizes=${BTL_QEMU_SIZES:-8,65536}
  # The QEMU node as rank 1 of a 2-rank `btl bench`; rank 0 (Linux) prints.
  ranks=()
  boot bench$$ 2 "run=bench sizes=$sizes quick=1 timeout=120" || exit 1
  linux_rank bench$$ 2 0 120 "$BTL" bench --transport tcp --sizes "$sizes" --quick
  st=0; wait_pid "${ranks[0]}" 300 || st=$?
  st2=0; wait_pid "$qemu" 10 || st2=$?
  if [ "$st" != 0 ] || [ "$st2" != 0 ]; then
    show "$work/bench$$/rank0.log" "$work/bench$$/uart.log"; exit 1
  fi
  boot_ms=$(sed -n 's/.* ready at .*), \([0-9]*\) ms after reset.*/\1/p' "$work/bench$$/uart.log")
  log "Linux rank <-> QEMU node (riscv64 TCG, virtio-net on a TAP), the node ready $boot_ms ms after reset:"
  grep -v "^btl\[" "$work/bench$$/rank0.log" | sed 's/^/[qemu-node]   /'
  # The same with btl-baremetal's hosted node (smoltcp on a TAP, a Linux
  # process), on a second TAP of the namespace.
  ip -n "$NS" tuntap add dev btlqtap1 mode tap
  ip -n "$NS" addr add 10.79.1.1/24 dev btlqtap1
  ip -n "$NS" link set btlqtap1 up
  dir=$work/hosted$$
  mkdir -p "$dir/session"
  common=(BTL_JOB=hosted$$ BTL_SIZE=2 BTL_LOCAL_RANK=0 BTL_LOCAL_SIZE=1
    BTL_SESSION_DIR="$dir/session" BTL_WIREUP=dir BTL_TCP_MAX_FRAME="$MAX_FRAME"
    BTL_TIMEOUT=120 BTL_LOG=warn)
  ip netns exec "$NS" env "${common[@]}" BTL_RANK=1 BTL_NODE=bm \
    "$root/target/release/examples/tap_node" --tap btlqtap1 --ip 10.79.1.2/24 \
    bench --sizes "$sizes" --quick >"$dir/rank1.log" 2>&1 &
  hosted=$!
  pids+=("$hosted")
  ip netns exec "$NS" env "${common[@]}" BTL_RANK=0 BTL_NODE=linux BTL_BIND=10.79.1.1 \
    "$BTL" bench --transport tcp --sizes "$sizes" --quick >"$dir/rank0.log" 2>&1 &
  linux=$!
  pids+=("$linux")
  st=0; wait_pid "$linux" 300 || st=$?
  st2=0; wait_pid "$hosted" 10 || st2=$?
  if [ "$st" != 0 ] || [ "$st2" != 0 ]; then
    show "$dir/rank0.log" "$dir/rank1.log"; exit 1
  fi
  log "Linux rank <-> the hosted smoltcp node (a Linux process on a TAP), same run:"
  grep -v "^btl\[" "$dir/rank0.log" | sed 's/^/[qemu-node]   /'
  ;;
esac
[ "$failures" = 0 ]

#!/usr/bin/env bash
# The Open MPI components' tests (the test command's `ompi` step): builds
# target/ompi/mca_btl_{rsm,rtcp}.so (scripts/ompi-components.sh), loads them
# into the system's Open MPI with --mca mca_base_component_path, and checks
#   - ompi_info lists both components and every btl parameter as an MCA
#     variable with its help text; values set through --mca / OMPI_MCA_*
#     reach btl (btl_base_verbose shows them);
#   - selection: `--mca pml ob1 --mca btl self,rsm` (and self,rtcp) runs
#     the checked MPI program (platform-linux/ompi/tests/mpi_check.c) at -n 2
#     and -n 4, btl_base_verbose 100 showing btl's component chosen and the
#     others unused;
#   - MPI_THREAD_MULTIPLE: a checked exchange of 4 threads a rank
#     (platform-linux/ompi/bench/mtexchange.c) over rsm and over rtcp;
#   - bad input: a malformed OMPI_MCA_btl_rsm_* value (and a rule conflict)
#     is reported naming the parameter, rsm declines, the job runs on vader;
#   - a rank SIGKILLed under mpirun ends the job within seconds, nothing of
#     the job left in /dev/shm (rsm and rtcp);
#   - mpi4py's own test suite (the test/ directory of the PyPI source
#     release of the installed mpi4py, downloaded by scripts/setup.sh into
#     ~/.cache/btl): the whole suite at -n 2 over self,vader / self,rsm and
#     self,tcp / self,rtcp, its point-to-point, collective and one-sided
#     modules at -n 5 over the same four; every test that passes over
#     vader/tcp must pass over rsm/rtcp;
#   - (Open MPI 5) a rank SIGKILLed under `mpirun --with-ft ulfm`: the
#     survivors revoke, shrink and allreduce (ulfm_check.c);
#   - three network-namespace hosts x 2 ranks with --mca btl self,rsm,rtcp:
#     mpi4py's point-to-point and collective tests pass, the verbose output
#     shows rsm inside a host and rtcp between hosts.
# Runs as root in CI (OMPI_ALLOW_RUN_AS_ROOT). A missing prerequisite skips
# with the reason, or fails when CI is set.
#
# The same checks run for Open MPI 5 inside the Debian 13 tree
# (`bash scripts/ompi5-env.sh test`, the test command's `ompi5` step): the
# Open MPI found is read from btl.h's BTL_VERSION, and what differs is
# named once below (API string, the reference shared-memory BTL vader/sm,
# the one-sided component osc pt2pt/rdma). OMPI_COMPONENTS_PREBUILT=DIR
# takes the components from DIR and the btl command from
# $CARGO_TARGET_DIR/release instead of building them (the tree has no Rust).
#
#   bash scripts/ompi-test.sh              # everything
#   OMPI_TESTS="basic mpi4py" bash scripts/ompi-test.sh   # some groups:
#       basic (info, selection, mpi_check, bad input), kill, mpi4py, hosts,
#       ulfm (Open MPI 5)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
groups=" ${OMPI_TESTS:-basic kill mpi4py hosts} "

skip_or_fail() {
  if [ -n "${CI:-}" ]; then
    echo "ompi-test: FAILED: $* (CI is set: a missing prerequisite is a failure)" >&2
    exit 1
  fi
  echo "ompi-test: SKIPPED: $*"
  exit 0
}
command -v mpirun >/dev/null || skip_or_fail "mpirun not found (scripts/setup.sh installs openmpi-bin)"
command -v mpicc >/dev/null || skip_or_fail "mpicc not found (scripts/setup.sh installs libopenmpi-dev)"
[ -f /usr/lib/x86_64-linux-gnu/openmpi/include/openmpi/opal/mca/btl/btl.h ] ||
  skip_or_fail "Open MPI's internal headers not found (libopenmpi-dev)"
m4ver=$(/usr/bin/python3 -c 'import mpi4py; print(mpi4py.__version__)' 2>/dev/null) ||
  skip_or_fail "mpi4py not importable by /usr/bin/python3 (scripts/setup.sh installs python3-mpi4py)"
sdist=${BTL_CACHE:-$HOME/.cache/btl}/mpi4py-$m4ver.tar.gz
[ -f "$sdist" ] || skip_or_fail "$sdist missing (scripts/setup.sh downloads mpi4py's source release)"

target=${CARGO_TARGET_DIR:-$root/target}
# What differs between the two Open MPI versions (BTL 3.1: 4.1, 3.3: 5.0).
iface=$(awk '$1 == "#define" && $2 == "BTL_VERSION" { print $3 }' \
  /usr/lib/x86_64-linux-gnu/openmpi/include/openmpi/opal/mca/btl/btl.h)
case "$iface" in
310) api="API v3.1.0" shm=vader osc=pt2pt work=$target/ompi-test oob_lo=(--mca oob_tcp_if_include lo) ;;
330)
  # PRRTE's out-of-band channel refuses loopback alone; a one-node job needs
  # no choice of interface.
  api="API v3.3.0" shm=sm osc=rdma work=$target/ompi5-test oob_lo=()
  # PMIx reads the same component path (OMPI_MCA_ variables) and reports
  # every file in it that is not a PMIx plugin; its own plugins are built in.
  export PMIX_MCA_mca_base_component_show_load_errors=none
  ;;
*) skip_or_fail "btl.h defines BTL_VERSION '$iface' (this script knows 310 and 330)" ;;
esac
if [ -n "${OMPI_COMPONENTS_PREBUILT:-}" ]; then
  components=$OMPI_COMPONENTS_PREBUILT
  [ -f "$components/mca_btl_rsm.so" ] && [ -f "$components/mca_btl_rtcp.so" ] ||
    skip_or_fail "OMPI_COMPONENTS_PREBUILT=$components has no mca_btl_rsm.so / mca_btl_rtcp.so"
  [ -x "$target/release/btl" ] || skip_or_fail "$target/release/btl missing (OMPI_COMPONENTS_PREBUILT)"
else
  components=$target/ompi
  bash scripts/ompi-components.sh >/dev/null
  cargo build --release --locked -p btl-cli --bin btl 2>/dev/null
fi
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=scripts/ompi-lib.sh
. scripts/ompi-lib.sh
ompi_use_components "$components"
mpicc -O2 -Wall -Werror -o "$work/mpi_check" platform-linux/ompi/tests/mpi_check.c -lpthread
mpicc -O2 -Wall -Werror -o "$work/mtexchange" platform-linux/ompi/bench/mtexchange.c -lpthread
tar -C "$work" -xzf "$sdist"
suite=$work/mpi4py-$m4ver
tests=platform-linux/ompi/tests

passed=0 failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
bad() {
  failed=$((failed + 1)); printf 'FAIL %s\n' "$1"
  if [ -n "${2:-}" ] && [ -f "$2" ]; then tail -40 "$2"; fi
  return 0
}
# mpirun with the options every run here has; TCP on loopback for Open
# MPI's own tcp BTL (ours keeps a one-node job on loopback by itself).
mpi() {
  timeout "${T:-300}" mpirun --oversubscribe --mca pml ob1 --mca btl_tcp_if_include lo \
    "${oob_lo[@]}" "$@"
}
shm_files() { ls /dev/shm 2>/dev/null | grep '^btl-' | sort || true; }

# ---------------------------------------------------------------- basic
if [[ $groups == *" basic "* ]]; then
  # ompi_info: both components, every btl parameter with its help
  ompi_info >"$work/info.txt" 2>&1
  for c in rsm rtcp; do
    if grep -q "MCA btl: $c (MCA v2.1.0, $api" "$work/info.txt"; then
      ok "ompi_info lists $c"
    else
      bad "ompi_info lists $c" "$work/info.txt"
    fi
  done
  for pair in rsm:sm rtcp:tcp; do
    c=${pair%:*} b=${pair#*:}
    ompi_info --param btl "$c" --level 9 --parsable >"$work/param-$c.txt"
    missing=$("$target/release/btl" info --json 2>/dev/null |
      /usr/bin/python3 -c '
import json, sys
comp, names = sys.argv[1], set()
for l in open(sys.argv[2]):
    parts = l.split(":")
    if len(parts) > 4 and parts[3] == "param" and parts[5] == "help":
        names.add(parts[4])
for l in sys.stdin:
    d = json.loads(l)
    if d.get("component") == comp[1] and "btl_%s_%s" % (comp[0], d["name"]) not in names:
        print(d["name"])
' "$c $b" "$work/param-$c.txt" | tr '\n' ' ') || missing="(btl info failed)"
    n=$(grep -c ":param:btl_${c}_[a-z0-9_]*:help:" "$work/param-$c.txt" || true)
    if [ -z "$missing" ] && [ "$n" -ge 20 ]; then
      ok "ompi_info --param btl $c --level 9: $n parameters with help, every btl $b parameter"
    else
      bad "ompi_info --param btl $c: missing [$missing] ($n with help)" "$work/param-$c.txt"
    fi
  done
  # a value through --mca and one through the environment reach btl
  log=$work/set.log
  if OMPI_MCA_btl_rsm_fifo_lazy_free=60 mpi -n 2 --mca btl self,rsm --mca btl_rsm_fifo_size 8192 \
      --mca btl_base_verbose 10 "$work/mpi_check" --quick >"$log" 2>&1 &&
    [ "$(grep -c 'btl_rsm_fifo_size = 8192 (from .*) goes to btl as sm.fifo_size' "$log")" = 2 ] &&
    [ "$(grep -c 'btl_rsm_fifo_lazy_free = 60 (from .*) goes to btl as sm.fifo_lazy_free' "$log")" = 2 ]; then
    ok "--mca btl_rsm_fifo_size / OMPI_MCA_btl_rsm_fifo_lazy_free reach btl"
  else
    bad "--mca btl_rsm_fifo_size / OMPI_MCA_btl_rsm_fifo_lazy_free reach btl" "$log"
  fi
  # selection and the checked program
  for c in rsm rtcp; do
    for n in 2 4; do
      log=$work/sel-$c-$n.log
      if mpi -n "$n" --mca btl self,$c --mca btl_base_verbose 100 "$work/mpi_check" --quick \
          >"$log" 2>&1 &&
        [ "$(grep -c 'mpi_check: rank [0-9]*: [0-9]* passed, 0 failed' "$log")" = "$n" ] &&
        [ "$(grep -c "select: init of component $c returned success" "$log")" = "$n" ] &&
        [ "$(grep -c "mca: bml: Using $c btl for send to" "$log")" = $((n * (n - 1))) ] &&
        ! grep -q 'mca: bml: Using \(vader\|tcp\|sm\|openib\|ofi\|uct\) btl' "$log"; then
        ok "selection + mpi_check over self,$c -n $n"
      else
        bad "selection + mpi_check over self,$c -n $n" "$log"
      fi
    done
  done
  # the full (not --quick) checked program once per component; no
  # component complaint either (a refused deregistration is one ob1
  # never retries: its registration would leak)
  for c in rsm rtcp; do
    log=$work/full-$c.log
    if mpi -n 3 --mca btl self,$c "$work/mpi_check" >"$log" 2>&1 &&
      [ "$(grep -c 'passed, 0 failed' "$log")" = 3 ] && ! grep -q "btl $c: " "$log"; then
      ok "mpi_check (full) over self,$c -n 3"
    else
      bad "mpi_check (full) over self,$c -n 3" "$log"
    fi
  done
  # MPI_THREAD_MULTIPLE: 4 threads a rank, each pair on its own
  # communicator, checked messages up to 256 KiB each way (mtexchange.c),
  # three seeds; ranks bound to one core each, so the threads contend
  for c in rsm rtcp; do
    log=$work/threads-$c.log
    : >"$log"
    runs=0
    for seed in 1 2 3; do
      mpi -n 2 --bind-to core --map-by core --mca btl self,$c "$work/mtexchange" 4 200 262144 \
        "$seed" >>"$log" 2>&1 && runs=$((runs + 1))
    done
    if [ "$runs" = 3 ] && [ "$(grep -c ' wrong 0$' "$log")" = 3 ] && ! grep -q "btl $c: " "$log"; then
      ok "threaded exchange (mtexchange, 4 threads a rank, 3 seeds) over self,$c"
    else
      bad "threaded exchange (mtexchange, 4 threads a rank, 3 seeds) over self,$c" "$log"
    fi
  done
  # one-sided (osc pt2pt in 4.1, osc rdma in 5.0; single-threaded: see mpi_check.c)
  for c in rsm rtcp; do
    log=$work/rma-$c.log
    if mpi -n 3 --mca btl self,$c --mca osc "$osc" "$work/mpi_check" --rma >"$log" 2>&1 &&
      [ "$(grep -c 'passed, 0 failed' "$log")" = 3 ]; then
      ok "mpi_check --rma (one-sided over osc $osc) over self,$c -n 3"
    else
      bad "mpi_check --rma over self,$c -n 3" "$log"
    fi
  done
  # bad input: reported by name, rsm declines, vader (sm) carries the job
  for bad_value in "fifo_size=abc:btl_rsm_fifo_size = \"abc\" is refused" \
      "free_list_max=2:parameters refused"; do
    var=${bad_value%%:*} want=${bad_value#*:}
    log=$work/badparam-${var%%=*}.log
    if (export "OMPI_MCA_btl_rsm_${var%%=*}=${var#*=}"
      mpi -n 2 --mca btl "self,rsm,$shm" --mca btl_base_verbose 100 "$work/mpi_check" --quick) \
        >"$log" 2>&1 &&
      grep -q "$want" "$log" && grep -q "btl_rsm_${var%%=*}\|${var%%=*}" "$log" &&
      [ "$(grep -c 'select: init of component rsm returned failure' "$log")" = 2 ] &&
      [ "$(grep -c "mca: bml: Using $shm btl for send to" "$log")" = 2 ] &&
      [ "$(grep -c 'passed, 0 failed' "$log")" = 2 ]; then
      ok "OMPI_MCA_btl_rsm_$var: named, rsm declines, the job runs over $shm"
    else
      bad "OMPI_MCA_btl_rsm_$var: named, rsm declines, the job runs over $shm" "$log"
    fi
  done
fi

# ---------------------------------------------------------------- kill
if [[ $groups == *" kill "* ]]; then
  for c in rsm rtcp; do
    log=$work/kill-$c.log
    before=$(shm_files)
    mpirun --oversubscribe --mca pml ob1 --mca btl self,$c "${oob_lo[@]}" \
      -n 3 "$work/mpi_check" --seconds 60 >"$log" 2>&1 &
    mp=$!
    victim=
    for _ in $(seq 100); do
      # the ranks are mpirun's children once they run MPI (their first
      # output is late, so wait a little once they exist)
      # (Open MPI 5's mpirun starts prterun, whose children they are)
      kids=$( (pgrep -P "$mp" -x mpi_check; for d in $(pgrep -P "$mp" -x prterun); do
        pgrep -P "$d" -x mpi_check; done) || true)
      if [ "$(wc -w <<<"$kids")" = 3 ]; then victim=$(awk '{print $2}' <<<"$(echo $kids)"); break; fi
      sleep 0.1
    done
    sleep 2
    t0=$(date +%s.%N)
    if [ -n "$victim" ] && ! kill -9 "$victim" 2>/dev/null; then victim="$victim (gone before the kill)"; fi
    ended=0
    for _ in $(seq 300); do
      if ! kill -0 "$mp" 2>/dev/null; then ended=1; break; fi
      sleep 0.1
    done
    t1=$(date +%s.%N)
    if [ "$ended" = 0 ]; then kill -9 "$mp" 2>/dev/null || true; fi
    wait "$mp" 2>/dev/null || true
    sleep 0.5
    left=$(comm -13 <(echo "$before") <(shm_files) | tr '\n' ' ')
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
    if [ -n "$victim" ] && [ "${victim#* }" = "$victim" ] && [ "$ended" = 1 ] && [ -z "${left// /}" ] &&
      awk -v s="$secs" 'BEGIN{exit !(s < 10)}'; then
      ok "a rank of 3 SIGKILLed over $c: the job ended ${secs}s later, nothing left in /dev/shm"
    else
      bad "a rank SIGKILLed over $c (victim ${victim:-none}, ended $ended after ${secs}s, left: $left)" "$log"
    fi
  done
fi

# ---------------------------------------------------------------- ulfm
# Open MPI 5 only: a rank SIGKILLed mid-exchange under `mpirun --with-ft
# ulfm` (platform-linux/ompi/tests/ulfm_check.c): every survivor sees the
# failure, revokes and shrinks the communicator and finishes an
# MPI_Allreduce over the survivors, in every one of ULFM_RUNS runs per
# component. Open MPI 5.0.7's MPI_Finalize after a failure sometimes waits
# in its own fence afterwards (over its tcp as over rtcp: the survivors'
# stacks are in ompi_mpi_finalize), so each run is bounded and judged by
# what the survivors report, not by mpirun's exit.
if [[ $groups == *" ulfm "* ]]; then
  if [ "$iface" != 330 ]; then
    echo "ompi-test: the ulfm group is Open MPI 5's (this is BTL $iface): not run"
  else
    mpicc -O2 -Wall -Werror -o "$work/ulfm_check" "$tests/ulfm_check.c"
    for c in rsm rtcp; do
      good=0 runs=${ULFM_RUNS:-5}
      for i in $(seq "$runs"); do
        log=$work/ulfm-$c-$i.log
        timeout 20 mpirun --with-ft ulfm --oversubscribe -n 4 --mca pml ob1 --mca btl self,$c \
          "$work/ulfm_check" >"$log" 2>&1 || true
        if [ "$(grep -c '^ulfm_check: rank [0-9]* survived, sum 6 of 3$' "$log")" = 3 ] &&
          ! grep -q '^ulfm_check: rank [0-9]*: ' "$log"; then
          good=$((good + 1))
        fi
      done
      if [ "$good" = "$runs" ]; then
        ok "ULFM: a rank of 4 SIGKILLed over $c, the 3 survivors shrink and allreduce in $good of $runs runs"
      else
        bad "ULFM over $c: the survivors finished in $good of $runs runs" "$log"
      fi
    done
  fi
fi

# ---------------------------------------------------------------- mpi4py
# one suite run: NAME NP BTLS [runtests options]; results in $work/m4/NAME
# (mpirun options, then -- and runtests.py options)
m4run() {
  local name=$1 np=$2 btls=$3; shift 3
  local d=$work/m4/$name opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ] && [ "$1" != -i ] && [ "$1" != -e ]; do
    opts+=("$1"); shift
  done
  [ "${1:-}" = -- ] && shift
  mkdir -p "$d"
  local t0=$SECONDS
  T=900 mpi -n "$np" --mca btl "$btls" "${opts[@]}" "$root/$tests/mpi4py-rank.sh" "$suite" "$d" \
    "$@" >"$d/mpirun.log" 2>&1 || true
  local s
  s=$(/usr/bin/python3 "$tests/mpi4py_results.py" summary "$d")
  printf '  %-24s %s (%ss)\n' "$name" "$(head -1 <<<"$s")" $((SECONDS - t0)) | tee -a "$work/m4/matrix.txt"
  tail -n +2 <<<"$s" | head -20
}
if [[ $groups == *" mpi4py "* ]]; then
  mkdir -p "$work/m4"
  : >"$work/m4/matrix.txt"
  # Spawning (test_spawn, test_dynproc) is excluded for every BTL: the
  # children are another Open MPI job, which none of these BTLs reach
  # (vader and tcp fail the same way: "unreachable" in dpm.c).
  all=(-e test_spawn -e test_dynproc)
  # The one-sided modules once more, single-threaded over osc pt2pt: under
  # mpi4py's default MPI_THREAD_MULTIPLE its one-sided tests disable
  # themselves over every BTL here (see the README).
  rma=(--thread-level single -i test_rma -i test_win)
  echo "mpi4py $m4ver test suite:"
  for b in $shm rsm; do m4run "$b-n2" 2 "self,$b" "${all[@]}"; done
  for b in tcp rtcp; do m4run "$b-n2" 2 "self,$b" "${all[@]}"; done
  for b in $shm rsm tcp rtcp; do m4run "$b-n5-p2p,cco" 5 "self,$b" -i test_p2p -i test_cco; done
  for b in $shm rsm tcp rtcp; do
    m4run "$b-n5-rma-$osc" 5 "self,$b" --mca osc "$osc" -- "${rma[@]}"
  done
  for pair in $shm:rsm tcp:rtcp; do
    ref=${pair%:*} ours=${pair#*:}
    for run in n2 n5-p2p,cco "n5-rma-$osc"; do
      if /usr/bin/python3 "$tests/mpi4py_results.py" compare "$work/m4/$ref-$run" \
          "$work/m4/$ours-$run" >"$work/m4/cmp-$ours-$run.txt" &&
        grep -q "passed=[1-9]" <<<"$(/usr/bin/python3 "$tests/mpi4py_results.py" summary "$work/m4/$ours-$run")"; then
        ok "mpi4py $run: every test passing over $ref passes over $ours"
      else
        bad "mpi4py $run: tests passing over $ref but not over $ours" "$work/m4/cmp-$ours-$run.txt"
      fi
    done
  done
fi

# ---------------------------------------------------------------- hosts
if [[ $groups == *" hosts "* ]]; then
  if ! ip netns add btlompiprobe$$ 2>/dev/null; then
    [ -n "${CI:-}" ] && { bad "network namespaces cannot be made here (needs root)"; }
    [ -z "${CI:-}" ] && echo "ompi-test: SKIPPED the 3-host run: cannot make network namespaces"
  else
    ip netns del btlompiprobe$$
    net=10.78.$(($$ % 200 + 20))
    hdir=$work/hosts
    mkdir -p "$hdir"
    trap netns_hosts_del EXIT
    netns_hosts "bo$$" "$net" "$hdir/hosts" "bo$$h1" "bo$$h2" "bo$$h3"
    hl="bo$$h1:2,bo$$h2:2,bo$$h3:2"
    # 6 ranks on this machine's 2 cores, in hosts Open MPI believes are
    # separate: without mpi_yield_when_idle the busy-polling ranks starve
    # the kernel's softirq work that moves packets across the veths (each
    # message then waits for a timer tick; Open MPI's own tcp BTL stalls
    # the same way), so yield when idle, as Open MPI does by itself when
    # it knows a node is oversubscribed.
    d=$work/m4/hosts
    mkdir -p "$d"
    log=$d/mpirun.log
    t0=$SECONDS
    # (OMPI_HOSTS_BTL / OMPI_HOSTS_TESTS change what runs, by hand)
    # shellcheck disable=SC2086
    BTL_NETNS_HOSTS=$hdir/hosts timeout "${T:-900}" mpirun --host "$hl" -n 6 \
      --mca plm_rsh_agent "$root/scripts/netns-agent.sh" \
      --mca oob_tcp_if_include "$net.0/24" -x OMPI_MCA_mca_base_component_path \
      -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
      --mca pml ob1 --mca btl "${OMPI_HOSTS_BTL:-self,rsm,rtcp}" \
      --mca btl_rtcp_if_include "$net.0/24" --mca btl_tcp_if_include "$net.0/24" \
      --mca btl_base_verbose 10 --mca mpi_yield_when_idle 1 \
      "$root/$tests/mpi4py-rank.sh" "$suite" "$d" ${OMPI_HOSTS_TESTS:--i test_p2p -i test_cco} \
      >"$log" 2>&1 || true
    s=$(/usr/bin/python3 "$tests/mpi4py_results.py" summary "$d")
    printf '  %-24s %s (%ss)\n' "3 hosts x 2, rsm+rtcp" "$(head -1 <<<"$s")" $((SECONDS - t0)) |
      tee -a "$work/m4/matrix.txt"
    # rsm to the host-mate, rtcp to the 4 others, from every rank
    # (each rank's verbose lines are in its own log, between test lines)
    uses=$(cat "$d"/rank.* | grep -o '\[[^]:]*:[0-9]*\] mca: bml: Using r[a-z]* btl for send to [^ ]* on node [^ ]*' || true)
    nrsm=$(grep -c 'Using rsm btl' <<<"$uses" || true)
    nrtcp=$(grep -c 'Using rtcp btl' <<<"$uses" || true)
    wrong=$(awk '{ src = $1; sub(/^\[/, "", src); sub(/:.*/, "", src); dst = $NF
        if (($0 ~ /rsm btl/) != (src == dst)) print }' <<<"$uses" | head -3)
    if grep -q '^passed=[1-9][0-9]* failed=0 ' <<<"$s" && [ "$nrsm" = 6 ] && [ "$nrtcp" = 24 ] &&
      [ -z "$wrong" ]; then
      ok "3 hosts x 2 ranks over self,rsm,rtcp: mpi4py p2p+cco pass; rsm inside a host (6), rtcp between hosts (24)"
    else
      bad "3 hosts x 2 ranks over self,rsm,rtcp (rsm $nrsm, rtcp $nrtcp, wrong: $wrong; $s)" "$log"
    fi
    # A host with one rank (rsm declines there) must not keep the other
    # hosts' rsm from connecting: its address is published all the same.
    # Ranks 0 and 1 on host 1 ping-pong (platform-linux/ompi/bench/mixpp.c),
    # rank 2 on host 2.
    log2=$d/onerank.log
    mpicc -O2 -Wall -Werror -o "$work/mixpp" platform-linux/ompi/bench/mixpp.c
    BTL_NETNS_HOSTS=$hdir/hosts timeout 300 mpirun --host "bo$$h1:2,bo$$h2:1" -n 3 \
      --mca plm_rsh_agent "$root/scripts/netns-agent.sh" \
      --mca oob_tcp_if_include "$net.0/24" -x OMPI_MCA_mca_base_component_path \
      -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
      --mca pml ob1 --mca btl self,rsm,rtcp --mca btl_rtcp_if_include "$net.0/24" \
      --mca btl_base_verbose 10 "$work/mixpp" >"$log2" 2>&1 || true
    nrsm=$(grep -c 'mca: bml: Using rsm btl' "$log2" || true)
    nrtcp=$(grep -c 'mca: bml: Using rtcp btl' "$log2" || true)
    if grep -q '^mix size=8' "$log2" && [ "$nrsm" = 2 ] && [ "$nrtcp" = 4 ]; then
      ok "hosts of 2 ranks and of 1: rsm inside the first (2), rtcp between them (4)"
    else
      bad "hosts of 2 ranks and of 1 (rsm $nrsm, rtcp $nrtcp)" "$log2"
    fi
    netns_hosts_del
    trap - EXIT
  fi
fi

[ -f "$work/m4/matrix.txt" ] && { echo "mpi4py matrix:"; cat "$work/m4/matrix.txt"; }
printf 'ompi: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# The Open MPI benchmark of a job across hosts (not a test): shared-memory
# latency between two ranks of one host while TCP links them to a third
# rank on another host (platform-linux/ompi/bench/mixpp.c: 8 B ping-pong
# batches between ranks 0 and 1, after each exchanged one message with rank
# 2, which then sleeps). Two network-namespace hosts on a bridge (as in
# scripts/ompi-test.sh), `mpirun --host A:2,B:1 --mca pml ob1`, interleaved
# REPS rounds of
#   rsm+rtcp    --mca btl self,rsm,rtcp   (btl's components)
#   vader+tcp   --mca btl self,vader,tcp  (Open MPI's)
#   rsm         --mca btl self,rsm        on one host, no TCP (the reference)
# and, with BASELINE=DIR (another build's mca_btl_rsm.so and
# mca_btl_rtcp.so), rsm+rtcp@base. Prints each run's line, then the medians
# of the fastest batch and of the mean batch (half round trip, µs).
#
#   REPS=5 BASELINE=/tmp/before bash scripts/ompi-mixbench.sh
#
# Why: a rank that progresses TCP beside shared memory pays for every idle
# socket it polls, so shared-memory latency inside a job across hosts is
# what the transports' polling costs each other (docs/tcp.md, "Quiet
# backoff"; docs/open-mpi.md, "Wire-up"). The current table is in
# BENCHMARKS.md (bench/results/25-open-mpi-across-hosts.tsv).
#
# Needs root (ip netns) and the components (scripts/ompi-components.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
reps=${REPS:-3}
bash scripts/ompi-components.sh >/dev/null
out=$root/target/ompi-mixbench
mkdir -p "$out"
mpicc -O2 -o "$out/mixpp" platform-linux/ompi/bench/mixpp.c
mpicc -O2 -o "$out/ppmin" platform-linux/ompi/bench/ppmin.c
# shellcheck source=scripts/ompi-lib.sh
. scripts/ompi-lib.sh
ompi_use_components "$root/target/ompi"

net=10.79.$(($$ % 200 + 20))
hA=mx$$a hB=mx$$b
trap netns_hosts_del EXIT
hosts=$out/hosts
netns_hosts "mx$$" "$net" "$hosts" "$hA" "$hB"

common=(--mca plm_rsh_agent "$root/scripts/netns-agent.sh" --mca oob_tcp_if_include "$net.0/24"
  -x OMPI_MCA_mca_base_component_path -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
  --bind-to core --mca pml ob1 --mca btl_rtcp_if_include "$net.0/24"
  --mca btl_tcp_if_include "$net.0/24")
configs=(
  "rsm+rtcp|--mca btl self,rsm,rtcp"
  "vader+tcp|--mca btl self,vader,tcp"
)
names="rsm+rtcp vader+tcp"
ompi_baseline ompi-mixbench
if [ -n "$base" ]; then
  configs+=("rsm+rtcp@base|--mca mca_base_component_path $sysdir:$base --mca btl self,rsm,rtcp")
  names="$names rsm+rtcp@base"
fi
names="$names rsm"
res=$out/results.tsv
: >"$res"
echo "ompi-mixbench: $reps rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq "$reps"); do
  for c in "${configs[@]}"; do
    name=${c%%|*} opts=${c#*|}
    # shellcheck disable=SC2086
    l=$(BTL_NETNS_HOSTS=$hosts timeout 300 mpirun --host "$hA:2,$hB:1" -n 3 "${common[@]}" \
      $opts "$out/mixpp" 2>&1 | grep '^mix ' || true)
    echo "round $rep $name: ${l:-no output (failed)}"
    [ -n "$l" ] || continue
    printf '%s\t%s\t%s\n' "$name" "$(sed 's/.*min_us=\([0-9.]*\).*/\1/' <<<"$l")" \
      "$(sed 's/.*mean_us=\([0-9.]*\).*/\1/' <<<"$l")" >>"$res"
  done
  # the reference: the same ping-pong on one host, shared memory only
  l=$(timeout 300 mpirun -n 2 --bind-to core --map-by core --mca pml ob1 \
    --mca oob_tcp_if_include lo --mca btl self,rsm "$out/ppmin" 8 2>&1 | grep '^size=' || true)
  echo "round $rep rsm (one host): ${l:-no output (failed)}"
  if [ -n "$l" ]; then
    printf '%s\t%s\t%s\n' rsm "$(sed 's/.*min_us=\([0-9.]*\).*/\1/' <<<"$l")" \
      "$(sed 's/.*mean_us=\([0-9.]*\).*/\1/' <<<"$l")" >>"$res"
  fi
done
echo
echo "medians over rounds (8 B half round trip between two ranks of a host, us):"
echo "| configuration | fastest batch | mean batch | runs |"
echo "|---|---|---|---|"
for n in $names; do
  awk -F'\t' -v n="$n" '
    function med(a, k,   i, j, t) {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    $1 == n { k++; mn[k] = $2; me[k] = $3 }
    END { if (k) printf "| %s | %.3f | %.3f | %d |\n", n, med(mn, k), med(me, k), k
          else printf "| %s | - | - | 0 |\n", n }' "$res"
done

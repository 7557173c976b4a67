#!/usr/bin/env bash
# What instructions on rsm's small-message path cost in latency (a
# benchmark, not a test): builds copies of the rsm component with N rounds
# of register-only work added on the send path (m_sendi, before btl_sendi)
# and, separately, on the receive path (on_event, before ob1's callback)
# (btl_ompi.c's BTL_OMPI_PAD_SEND / BTL_OMPI_PAD_RECV; 6 instructions a
# round), then runs ppmin (platform-linux/ompi/bench/ppmin.c: the half
# round trip of the fastest of 300 batches of 200 ping-pongs) at 8 B over
# self,vader, the unpadded rsm and every padded copy, interleaved, REPS
# rounds. The slope says how many instructions a change must remove from
# either path to move rsm's 8 B latency by a given amount, so that a
# change is judged before it is made (docs/performance-decisions.md,
# "What the 8 B gap was made of"). The pads are register-only work, the
# lightest load a sibling hardware thread can carry: an upper bound on
# what removing instructions gains, not an estimate of it.
#
#   bash scripts/ompi-sensitivity.sh                # PADS="40 80" REPS=5
#   PADS="20 40 80" REPS=3 bash scripts/ompi-sensitivity.sh
#
# Prints one line per run, then the medians of each configuration's fastest
# batches and their difference from the unpadded rsm.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
reps=${REPS:-5}
pads=${PADS:-40 80}
for p in $pads; do
  [[ "$p" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "ompi-sensitivity: PADS: '$p' is not a count of rounds (1-99999)" >&2; exit 1; }
done
out=$root/target/ompi-sensitivity
mkdir -p "$out"
bash scripts/ompi-components.sh >/dev/null
configs=("vader|--mca btl self,vader" "rsm|--mca btl self,rsm")
for p in $pads; do
  for side in send recv; do
    flag=BTL_OMPI_PAD_$(tr '[:lower:]' '[:upper:]' <<<"$side")
    OMPI_COMPONENTS_OUT=$out/$side-$p OMPI_COMPONENTS_CFLAGS="-D$flag=$p" \
      bash scripts/ompi-components.sh >/dev/null
    configs+=("rsm+$side$p|--mca mca_base_component_path @SYS@:$out/$side-$p --mca btl self,rsm")
  done
done
mpicc -O2 -o "$out/ppmin" platform-linux/ompi/bench/ppmin.c
# shellcheck source=scripts/ompi-lib.sh
. scripts/ompi-lib.sh
ompi_use_components "$root/target/ompi"
raw=$out/runs.txt
: >"$raw"
for r in $(seq "$reps"); do
  for c in "${configs[@]}"; do
    name=${c%%|*}
    opts=${c#*|}
    opts=${opts//@SYS@/$sysdir}
    # shellcheck disable=SC2086
    line=$(timeout 300 mpirun -n 2 --bind-to core --map-by core --mca pml ob1 \
      --mca oob_tcp_if_include lo $opts "$out/ppmin" 8 2>&1 | grep '^size=' || true)
    [ -n "$line" ] || { echo "ompi-sensitivity: $name gave no result in round $r" >&2; exit 1; }
    echo "round $r $name $line" | tee -a "$raw"
  done
done
echo
echo "medians of the fastest batch (us), and the difference from rsm (ns):"
awk '{ sub("min_us=", "", $5); v[$3] = v[$3] " " $5; if (!($3 in seen)) { seen[$3] = 1; order[++n] = $3 } }
  function median(s,   a, k, i, j, t) {
    k = split(s, a, " ")
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END {
    base = median(v["rsm"])
    for (i = 1; i <= n; i++) {
      m = median(v[order[i]])
      printf "  %-14s %.3f  %+6.1f\n", order[i], m, (m - base) * 1000
    }
  }' "$raw"

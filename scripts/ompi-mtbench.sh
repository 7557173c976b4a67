#!/usr/bin/env bash
# The threaded Open MPI benchmark (not a test): platform-linux/ompi/bench/
# mtexchange.c under MPI_THREAD_MULTIPLE, 2 ranks of THREADS threads
# (default 4), each thread pair on its own duplicated communicator
# exchanging MESSAGES (default 1000) checked messages of up to MAX (default
# 256 KiB) each way, `--mca pml ob1`, the BTL being the only difference:
#   self,rsm   against self,vader (Open MPI 5: self,sm)
#   self,rtcp  against self,tcp   (loopback)
# interleaved, REPS rounds (default 5). Per round the time of each BTL over
# vader's (tcp's for rtcp), then the median of those ratios; the median
# times too. Ranks are bound to one core each (--bind-to core): a rank's
# threads share it, as they would on a node with more ranks than cores.
# BASELINE=DIR adds rsm@base and rtcp@base from another build's components
# (as scripts/ompi-bench.sh does). Writes bench/results/23-open-mpi-threads.tsv
# (Open MPI 4.1) or 24-open-mpi-5-threads.tsv (Open MPI 5) when RECORD=1.
#
#   bash scripts/ompi-mtbench.sh
#   REPS=5 MESSAGES=2000 RECORD=1 bash scripts/ompi-mtbench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
reps=${REPS:-5} threads=${THREADS:-4} messages=${MESSAGES:-1000} max=${MAX:-262144}
target=${CARGO_TARGET_DIR:-$root/target}
# shellcheck source=scripts/ompi-lib.sh
. scripts/ompi-lib.sh
ompi_open_mpi ompi-mtbench
rec=23-open-mpi-threads.tsv
[ "$iface" = 310 ] || rec=24-open-mpi-5-threads.tsv
ompi_components_dir "$target"
out=$target/ompi-mtbench
mkdir -p "$out"
res=$out/results.tsv
: >"$res"
mpicc -O2 -Wall -Werror -o "$out/mtexchange" platform-linux/ompi/bench/mtexchange.c -lpthread
ompi_use_components "$components"
configs=(
  "$shm|--mca btl self,$shm"
  "rsm|--mca btl self,rsm"
  "tcp|--mca btl self,tcp --mca btl_tcp_if_include lo"
  "rtcp|--mca btl self,rtcp"
)
ompi_baseline ompi-mtbench
# the same two from the baseline's components
[ -z "$base" ] || for b in rsm rtcp; do
  configs+=("$b@base|--mca mca_base_component_path $sysdir:$base --mca btl self,$b")
done
echo "ompi-mtbench: $reps rounds, $threads threads, $messages messages up to $max B; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq "$reps"); do
  for c in "${configs[@]}"; do
    name=${c%%|*} opts=${c#*|}
    # shellcheck disable=SC2086
    line=$(timeout 300 mpirun -n 2 --bind-to core --map-by core --mca pml ob1 $oob_lo $opts \
      "$out/mtexchange" "$threads" "$messages" "$max" "$rep" 2>&1) || {
      echo "ompi-mtbench: $name failed in round $rep:" >&2
      echo "$line" >&2
      exit 1
    }
    secs=$(sed -n 's/^mtexchange .* seconds \([0-9.]*\) wrong 0$/\1/p' <<<"$line")
    [ -n "$secs" ] || { echo "ompi-mtbench: $name: unexpected output: $line" >&2; exit 1; }
    printf '%s\t%s\t%s\n' "$rep" "$name" "$secs" >>"$res"
    echo "round $rep $name $secs s"
  done
done
names=$(printf '%s\n' "${configs[@]}" | cut -d'|' -f1 | tr '\n' ' ')
python3 - "$res" "$shm" "$reps" "$threads" "$messages" "$max" "$ver" \
  "${RECORD:+$root/bench/results/$rec}" $names <<'EOF'
import statistics, sys
res, shm, reps, threads, messages, mx, ver, rec, *names = sys.argv[1:]
t = {}
for l in open(res):
    r, n, s = l.split("\t")
    t.setdefault(n, {})[r] = float(s)
def peer(n):
    return shm if n.startswith("rsm") or n == shm else "tcp"
rows = []
for n in names:
    p = peer(n)
    ratios = [t[n][r] / t[p][r] for r in t[n] if r in t[p]]
    rows.append((n, statistics.median(t[n].values()), p, statistics.median(ratios),
                 min(ratios), max(ratios)))
print(f"{'btl':10} {'median s':>9}  {'vs':5} {'ratio':>6}  (per round)")
for n, m, p, q, lo, hi in rows:
    print(f"{n:10} {m:9.3f}  {p:5} {q:6.2f}  ({lo:.2f}-{hi:.2f})")
if rec:
    with open(rec, "w") as f:
        f.write(f"# title: Inside Open MPI {ver}, threaded: {threads} threads a rank, "
                "MPI_THREAD_MULTIPLE\n")
        f.write(f"# command: REPS={reps} MESSAGES={messages} RECORD=1 bash scripts/"
                + ("ompi5-env.sh mtbench" if ver == "5" else "ompi-mtbench.sh") + "\n")
        f.write("# machine: 2 vCPU Intel Xeon guest (KVM), Debian "
                + ("13, Open MPI 5.0.7" if ver == "5" else "12, Open MPI 4.1.4") + "\n")
        f.write(f"# note: mtexchange.c, 2 ranks bound to a core each, {messages} checked messages "
                f"of 0-{int(mx) // 1024} KiB each way per thread pair; median wall time of "
                f"{reps} interleaved rounds, and the median of the per-round ratios to the peer\n")
        f.write("btl\tseconds\tpeer\ttime / peer's (range)\n")
        for n, m, p, q, lo, hi in rows:
            f.write(f"{n}\t{m:.2f}\t{p}\t" + ("" if n == p else f"{q:.2f} ({lo:.2f}-{hi:.2f})") + "\n")
    print(f"ompi-mtbench: wrote {rec}")
EOF

#!/usr/bin/env bash
# Peak shared memory of a job: btl's shared-memory transport against Open
# MPI's vader under the same workload.
#
#   cargo build --release -p btl-cli
#   bash scripts/shm-memory.sh
#
# For each N, runs the workload once per repetition and samples `Shmem` in
# /proc/meminfo (tmpfs and shared anonymous pages, /dev/shm included) every
# few milliseconds while it runs; the figure is the peak minus the value
# just before the start. The workload: every rank sends MESSAGES messages of
# mixed sizes up to MAX_SIZE to every other rank and checks them —
#   btl:   btl stress -n N --messages 20 --max-size 65536
#   vader: mpirun --oversubscribe --mca pml ob1 --mca btl self,vader -np N
#          mpi_stress 20 65536 (scripts/mpi_stress.c: the same sizes, drawn
#          by the same generator, and the same content; no one-sided phase)
# Shmem is machine-wide: shared memory that other jobs allocate or free
# during a run is counted too. Run it on an otherwise quiet machine, and
# compare the repetitions (REPS) — other jobs can only add to a peak, so the
# smallest of them is the closest to the job's own.
#
# Env: NS="16 32 64 128" (btl)  VADER_NS="16 64"  REPS=1  MESSAGES=20
#      MAX_SIZE=65536  BTL_BIN=target/release/btl  BUILD=/tmp/btl-shm-memory
#      TIMEOUT=900 (seconds per run)  OUT=$BUILD/shm-memory.md (the table)
# Open MPI: apt-get install openmpi-bin libopenmpi-dev (without mpicc the
# vader rows are skipped, saying so).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NS=${NS:-"16 32 64 128"}
VADER_NS=${VADER_NS:-"16 64"}
REPS=${REPS:-1}
MESSAGES=${MESSAGES:-20}
MAX_SIZE=${MAX_SIZE:-65536}
BTL_BIN=${BTL_BIN:-$ROOT/target/release/btl}
BUILD=${BUILD:-/tmp/btl-shm-memory}
TIMEOUT=${TIMEOUT:-900}
OUT=${OUT:-$BUILD/shm-memory.md}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mkdir -p "$BUILD"
log() { echo "[$(date +%T)] $*" >&2; }

if [ ! -x "$BTL_BIN" ]; then
    echo "shm-memory: no $BTL_BIN (cargo build --release -p btl-cli, or set BTL_BIN)" >&2
    exit 1
fi

# Shmem of /proc/meminfo in KiB, read without starting a process.
shmem_kb() {
    local k v _
    while read -r k v _; do
        if [ "$k" = "Shmem:" ]; then echo "$v"; return; fi
    done </proc/meminfo
    echo 0
}

ROWS=$BUILD/rows.tsv   # system N rep peak_kib after_kib seconds status
: >"$ROWS"

# measure SYSTEM N REP LOG CMD...: runs CMD, sampling Shmem until it ends.
measure() {
    local sys=$1 n=$2 rep=$3 lf=$4; shift 4
    local before peak v pid rc t0 t1 after
    before=$(shmem_kb)
    peak=$before
    t0=$(date +%s.%N)
    timeout "$TIMEOUT" "$@" >"$lf" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        v=$(shmem_kb)
        [ "$v" -gt "$peak" ] && peak=$v
        sleep 0.005
    done
    wait "$pid"; rc=$?
    t1=$(date +%s.%N)
    after=$(shmem_kb)
    local status=ok
    [ "$rc" = 0 ] || status="FAILED (exit $rc; $(tail -n 2 "$lf" | tr '\n\t' '  ' | cut -c1-160))"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$n" "$rep" "$((peak - before))" \
        "$((after - before))" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" \
        "$status" >>"$ROWS"
    log "$sys N=$n rep $rep: peak +$(( (peak - before) / 1024 )) MiB, $status"
}

VADER=1
if ! command -v mpicc.openmpi >/dev/null || ! command -v mpirun.openmpi >/dev/null; then
    log "no Open MPI (mpicc.openmpi, mpirun.openmpi): vader rows skipped (apt-get install openmpi-bin libopenmpi-dev)"
    VADER=0
elif ! mpicc.openmpi -O2 -Wall -o "$BUILD/mpi_stress" "$ROOT/scripts/mpi_stress.c"; then
    echo "shm-memory: building scripts/mpi_stress.c failed" >&2
    exit 1
fi

for rep in $(seq 1 "$REPS"); do
    for n in $NS; do
        measure btl "$n" "$rep" "$BUILD/btl.$n.$rep.log" \
            "$BTL_BIN" stress -n "$n" --messages "$MESSAGES" --max-size "$MAX_SIZE"
    done
    if [ "$VADER" = 1 ]; then
        for n in $VADER_NS; do
            measure vader "$n" "$rep" "$BUILD/vader.$n.$rep.log" \
                mpirun.openmpi --oversubscribe -np "$n" --mca pml ob1 --mca btl self,vader \
                "$BUILD/mpi_stress" "$MESSAGES" "$MAX_SIZE"
        done
    fi
done

python3 - "$ROWS" "$MESSAGES" "$MAX_SIZE" >"$OUT" <<'PYEOF'
import sys, collections
rows, messages, max_size = sys.argv[1], sys.argv[2], sys.argv[3]
runs = collections.defaultdict(list)
for l in open(rows):
    s, n, rep, peak, after, secs, status = l.rstrip("\n").split("\t")
    runs[(s, int(n))].append((int(peak) / 1024, int(after) / 1024, float(secs), status))
label = {"btl": f"btl stress --messages {messages} --max-size {max_size}",
         "vader": f"Open MPI vader, mpi_stress {messages} {max_size}"}
print(f"Peak Shmem (/proc/meminfo) above the value before the run, MiB; every rank sends {messages} messages "
      f"of up to {max_size} B to every other rank. With several repetitions: smallest (range).\n")
print("| workload | N | peak shared memory (MiB) | per rank (MiB) | left after (MiB) | time (s) | status |")
print("|---|---|---|---|---|---|---|")
for (s, n), v in sorted(runs.items(), key=lambda kv: (kv[0][0] != "btl", kv[0][1])):
    peaks = sorted(x[0] for x in v)
    cell = f"{peaks[0]:.1f}" + (f" ({peaks[0]:.1f}–{peaks[-1]:.1f})" if len(peaks) > 1 else "")
    bad = [x[3] for x in v if x[3] != "ok"]
    print(f"| {label[s]} | {n} | {cell} | {peaks[0] / n:.2f} | {max(x[1] for x in v):.1f} | "
          f"{max(x[2] for x in v):.1f} | {bad[0] if bad else 'ok'} |")
PYEOF
cat "$OUT"
grep -q FAILED "$ROWS" && exit 1
exit 0

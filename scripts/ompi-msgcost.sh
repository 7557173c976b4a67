#!/usr/bin/env bash
# Instructions per small message inside Open MPI 4.1 (`--mca pml ob1`, 2
# ranks on different cores), counted by valgrind's callgrind, which does not
# drift with the machine's load as the wall clock does (and this guest has
# no hardware counters). The program (platform-linux/ompi/bench/msgcost.c)
# sends batches of BATCH messages of SIZE bytes from rank 0 to rank 1; rank
# 1 sleeps until a batch is there, then receives it. Counted: on rank 0
# only inside MPI_Send (the send path: MPI, ob1, the BTL's send), on rank 1
# only inside MPI_Recv (the receive path: progress, the BTL handing the
# fragment up, ob1's matching and copy; no wait loop, the messages are
# there). Each configuration runs twice, ROUNDS and 2 x ROUNDS rounds, and
# the difference is divided by the extra messages, so one-time costs (the
# first send's connection set-up, lazy initialisation) cancel out.
# Configurations: self,vader against self,rsm, self,tcp against self,rtcp
# (loopback). For the shared-memory pair also the BTL's own part: on the
# sender the BTL's sendi (mca_btl_vader_sendi, rsm's m_sendi, each with all
# it calls), on the receiver opal_progress less ob1's fragment callback
# (what the BTLs' progress spends to hand a fragment up). Writes bench/results/21-open-mpi-instructions.tsv, then
# BENCHMARKS.md.
#
#   bash scripts/ompi-msgcost.sh                 # ROUNDS=100 BATCH=16 SIZE=8
#   SIZE=64 bash scripts/ompi-msgcost.sh
#   THREADS=multiple bash scripts/ompi-msgcost.sh   # MPI_THREAD_MULTIPLE
#       (one thread working; the thread-safe paths' cost), written to
#       bench/results/21-open-mpi-instructions-mt.tsv
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rounds=${ROUNDS:-100}
batch=${BATCH:-16}
size=${SIZE:-8}
sleep_ms=${SLEEP_MS:-20}
threads=${THREADS:-single}
case "$threads" in
single) out=${OUT:-bench/results/21-open-mpi-instructions.tsv} level= ;;
multiple) out=${OUT:-bench/results/21-open-mpi-instructions-mt.tsv} level=", MPI_THREAD_MULTIPLE" ;;
*) echo "ompi-msgcost: THREADS=$threads (single or multiple)" >&2; exit 1 ;;
esac
command -v valgrind >/dev/null || { echo "ompi-msgcost: valgrind missing (bash scripts/setup.sh installs it)" >&2; exit 1; }
bash scripts/ompi-components.sh >/dev/null
work=$root/target/ompi-msgcost
mkdir -p "$work"
mpicc -O2 -Wall -Wextra -o "$work/msgcost" platform-linux/ompi/bench/msgcost.c
# shellcheck source=scripts/ompi-lib.sh
. scripts/ompi-lib.sh
ompi_use_components "$root/target/ompi"
# The per-rank wrapper: callgrind counting only inside MPI_Send on rank 0
# and MPI_Recv on rank 1 (PMPI_* are the symbols' real names).
cat >"$work/wrap.sh" <<'WRAP'
#!/bin/sh
out=$1
shift
case "$OMPI_COMM_WORLD_RANK" in
  0) t='*MPI_Send' ;;
  *) t='*MPI_Recv' ;;
esac
exec valgrind --tool=callgrind --toggle-collect="$t" \
  --callgrind-out-file="$out.$OMPI_COMM_WORLD_RANK" "$@" 2>"$out.$OMPI_COMM_WORLD_RANK.log"
WRAP
chmod +x "$work/wrap.sh"

# total FILE: the instructions callgrind collected.
total() {
  callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
# incl FILE FUNCTION: FUNCTION's instructions with all it calls (0 if absent).
incl() {
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
    awk -v f="$2" '$NF ~ /^\[/ { $NF = "" } { n = $0; sub(/^.*:/, "", n); gsub(/ +$/, "", n) }
      n == f { gsub(",", "", $1); v = $1 } END { print v + 0 }'
}

configs=(
  "vader|--mca btl self,vader"
  "rsm|--mca btl self,rsm"
  "tcp|--mca btl self,tcp --mca btl_tcp_if_include lo"
  "rtcp|--mca btl self,rtcp"
)
declare -A send recv bsend brecv
sendi_vader=mca_btl_vader_sendi sendi_rsm=m_sendi
for c in "${configs[@]}"; do
  name=${c%%|*} opts=${c#*|}
  for r in "$rounds" $((2 * rounds)); do
    f=$work/cg.$name.$r
    rm -f "$f".*
    # shellcheck disable=SC2086
    if ! timeout 300 mpirun -n 2 --bind-to core --map-by core --mca pml ob1 \
        --mca oob_tcp_if_include lo $opts "$work/wrap.sh" "$f" \
        "$work/msgcost" "$r" "$batch" "$size" "$sleep_ms" "$threads" >"$f.out" 2>&1 ||
        ! grep -q ' 0 wrong' "$f.out"; then
      echo "ompi-msgcost: $name with $r rounds failed:" >&2
      cat "$f.out" >&2
      exit 1
    fi
    send[$name.$r]=$(total "$f.0") recv[$name.$r]=$(total "$f.1")
    fn=sendi_$name
    if [ -n "${!fn:-}" ]; then
      bsend[$name.$r]=$(incl "$f.0" "${!fn}")
      brecv[$name.$r]=$(( $(incl "$f.1" opal_progress) - $(incl "$f.1" mca_pml_ob1_recv_frag_callback_match) ))
    fi
  done
  extra=$((rounds * batch))
  s=$(( (send[$name.$((2 * rounds))] - send[$name.$rounds]) / extra ))
  v=$(( (recv[$name.$((2 * rounds))] - recv[$name.$rounds]) / extra ))
  send[$name]=$s recv[$name]=$v
  printf '[msgcost] %s: %d send + %d receive = %d instructions per %d B message\n' \
    "$name" "$s" "$v" $((s + v)) "$size"
  if [ -n "${bsend[$name.$rounds]:-}" ]; then
    bsend[$name]=$(( (bsend[$name.$((2 * rounds))] - bsend[$name.$rounds]) / extra ))
    brecv[$name]=$(( (brecv[$name.$((2 * rounds))] - brecv[$name.$rounds]) / extra ))
    printf '[msgcost] %s, the BTL alone: %d send + %d receive\n' "$name" "${bsend[$name]}" "${brecv[$name]}"
  fi
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
{
  echo "# title: Instructions per $size B message inside Open MPI 4.1$level (callgrind)"
  echo "# command: ROUNDS=$rounds BATCH=$batch SIZE=$size${level:+ THREADS=multiple} bash scripts/ompi-msgcost.sh"
  echo "# machine: $(nproc) vCPU $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(. /etc/os-release && echo "$PRETTY_NAME"), $(ompi_info --version 2>/dev/null | sed -n '1s/^Open MPI v/Open MPI /p')"
  echo "# note: --mca pml ob1, 2 ranks. Send: instructions inside MPI_Send on the sender (MPI, ob1, the BTL); receive: inside MPI_Recv on the receiver, the message already there (progress, the BTL, ob1's matching and copy). Per message, from the difference of a $rounds- and a $((2 * rounds))-round run of $batch-message batches, so one-time costs cancel; every message checked. Ratio: ours over Open MPI's BTL. BTL alone (shared memory): the BTL's sendi with all it calls; opal_progress less ob1's fragment callback"
  printf 'BTL\tsend\treceive\ttotal\tratio\tBTL alone: send\treceive\ttotal\tratio\n'
  for p in "vader rsm" "tcp rtcp"; do
    set -- $p
    for b in "$1" "$2"; do
      t=$((send[$b] + recv[$b])) r= bt=- br=- bs=- rr=
      [ "$b" = "$2" ] && r=$(ratio "$t" $((send[$1] + recv[$1])))
      if [ -n "${bsend[$b]:-}" ]; then
        bs=${bsend[$b]} br=${brecv[$b]} bt=$((bs + br))
        [ "$b" = "$2" ] && rr=$(ratio "$bt" $((bsend[$1] + brecv[$1])))
      fi
      printf '%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n' "$b" "${send[$b]}" "${recv[$b]}" "$t" "$r" "$bs" "$br" "$bt" "$rr"
    done
  done
} >"$out"
python3 scripts/benchmarks.py

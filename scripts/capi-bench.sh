#!/usr/bin/env bash
# The C ping-pong against the Rust bench at 8 B over sm: the C ABI should
# cost no more than 5 % over the Rust API it wraps (docs/c-api.md). Both
# send one 8-byte message per direction, btl bench's pattern and warm-up
# (pingpong.c --bench; see its header), so the two compare. The current
# figures are in BENCHMARKS.md (bench/results/30-*.tsv, 31-*.tsv).
#
#   bash scripts/capi-bench.sh [ROUNDS]              # latency, interleaved
#   bash scripts/capi-bench.sh --callgrind [ROUNDS]  # instructions per round trip
#
# Latency: ROUNDS (default 7) alternations of `pingpong --sizes 8 --iters
# $ITERS --bench` (BTL_TRANSPORT=sm) and `btl bench --transport sm --sizes 8 --iterations
# $ITERS` (ITERS default 200000), each rank pinned to its own core; prints
# every figure, the medians and their ratio, and the median of the
# rounds' ratios. Take it on a quiet machine.
#
# --callgrind: rank 0 under valgrind's callgrind (pinned to core 0), rank 1
# native (core 1); instructions of rank 0 per round trip from the
# difference of a 12000- and a 2000-iteration run (start-up cancels). The
# Rust side runs `btl bench --window 1`, whose bandwidth loop is the same
# ping-pong (8 B, then a 1-byte acknowledgement), so it counts two
# loops. Stable on a loaded machine except for idle passes (a poll that
# finds nothing, ~260 instructions) when the native peer is descheduled:
# the smallest of ROUNDS (default 3) is printed.
#
#   bash scripts/capi-bench.sh --idle               # instructions per idle pass
#
# --idle: one idle btl_progress pass (a poll that finds nothing, a fast box
# handed out each way; platform-linux/capi/bench/idle.c) of rank 0 under
# callgrind while rank 1 waits in a barrier: a 10^6-pass run less a 0-pass
# one, with an event callback and with NULL. Exact on a loaded machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=latency
if [ "${1:-}" = --callgrind ]; then mode=callgrind; shift; fi
if [ "${1:-}" = --idle ]; then mode=idle; shift; fi
rounds=${1:-$([ $mode = latency ] && echo 7 || echo 3)}
iters=${ITERS:-200000}
prefix=$PWD/target/capi
bash scripts/capi.sh "$prefix" >/dev/null
cargo build --release --locked -p btl-cli --bin btl
btl=$PWD/target/release/btl
out=$prefix/bench
mkdir -p "$out"
# shellcheck disable=SC2046
cc -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -o "$out/pingpong" \
  platform-linux/capi/examples/c/pingpong.c \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs btl)

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

if [ $mode = latency ]; then
  c=() r=()
  for i in $(seq "$rounds"); do
    a=$(BTL_TRANSPORT=sm "$btl" run --timeout 300 -n 2 -- sh -c \
      "exec taskset -c \$BTL_RANK $out/pingpong --sizes 8 --iters $iters --bench" |
      sed -n 's/.*size=8 latency_us=\([0-9.]*\).*/\1/p')
    b=$("$btl" bench --transport sm --sizes 8 --iterations "$iters" --format osu |
      sed -n 's/.*size=8 latency_us=\([0-9.]*\).*/\1/p')
    printf 'round %d: C %s us, Rust %s us\n' "$i" "$a" "$b"
    c+=("$a") r+=("$b")
  done
  mc=$(printf '%s\n' "${c[@]}" | median) mr=$(printf '%s\n' "${r[@]}" | median)
  # Each round's two runs are back to back, so they mostly share a
  # placement of the vCPUs; the median of the rounds' ratios is the
  # figure a noisy machine disturbs least.
  mp=$(for i in "${!c[@]}"; do awk -v c="${c[$i]}" -v r="${r[$i]}" 'BEGIN {print c / r}'; done | median)
  awk -v c="$mc" -v r="$mr" -v p="$mp" 'BEGIN {
    printf "median: C %.3f us, Rust %.3f us, C/Rust %.3f; median of the rounds'"'"' C/Rust %.3f\n", c, r, c / r, p}'
  exit 0
fi

command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
if [ $mode = idle ]; then
  # shellcheck disable=SC2046
  cc -std=c11 -O2 -o "$out/idle" platform-linux/capi/bench/idle.c \
    $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs btl)
  total() { # PASSES CALLBACK: rank 0's instructions
    local f
    f=$(mktemp "$out/cg.XXXXXX")
    BTL_TRANSPORT=sm BTL_TIMEOUT=600 "$btl" run --timeout 900 -n 2 -- sh -c '
      if [ "$BTL_RANK" = 0 ]; then
        exec taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$0" "$1" "$2" "$3" >/dev/null 2>&1
      else exec taskset -c 1 "$1" "$2" "$3" >/dev/null; fi' "$f" "$out/idle" "$@"
    callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
    rm -f "$f"
  }
  for cb in 1 0; do
    a=$(total 0 "$cb") b=$(total 1000000 "$cb")
    printf 'idle pass (%s): %d instructions\n' \
      "$([ "$cb" = 1 ] && echo "with a callback" || echo "NULL callback")" $(( (b - a) / 1000000 ))
  done
  exit 0
fi
# "TOTAL IDLE" of rank 0 (under callgrind) of a 2-rank job running ARGS:
# its instructions, and its progress passes that found no message.
ir() {
  local f
  f=$(mktemp "$out/cg.XXXXXX")
  BTL_TRANSPORT=sm BTL_TIMEOUT=600 "$btl" run --timeout 900 -n 2 -- sh -c '
    if [ "$BTL_RANK" = 0 ]; then
      exec taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$0" "$@" >/dev/null 2>&1
    else exec taskset -c 1 "$@" >/dev/null; fi' "$f" "$@"
  callgrind_annotate --inclusive=yes --tree=calling "$f" 2>/dev/null | awk '
    /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
    /^ *[0-9,]+ \([^)]*\) +> .*(World::pass|Dispatch>::recv) \([0-9,]+x\)/ {
      n = $0; sub(/.*\(/, "", n); sub(/x\).*/, "", n); gsub(",", "", n)
      if ($0 ~ /World::pass/) passes += n; else recvs += n
    }
    END { print total, passes - recvs }'
  rm -f "$f"
}
# Instructions and idle passes per round trip: N=12000 less N=2000 over
# ROUNDTRIPS (start-up cancels).
per() { # ROUNDTRIPS ARGS_12000... -- ARGS_2000...
  local rts=$1; shift
  local a=() b=()
  while [ "$1" != -- ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  local x y
  read -r -a x <<<"$(ir "${a[@]}")"
  read -r -a y <<<"$(ir "${b[@]}")"
  awk -v t="$(( x[0] - y[0] ))" -v i="$(( x[1] - y[1] ))" -v n="$rts" \
    'BEGIN {printf "%d %.3f\n", t / n, i / n}'
}
cs=() rs=()
for i in $(seq "$rounds"); do
  # C: 1.1 N round trips (a tenth more untimed); Rust: twice that.
  c=$(per 11000 "$out/pingpong" --sizes 8 --iters 12000 --bench -- \
    "$out/pingpong" --sizes 8 --iters 2000 --bench)
  r=$(per 22000 "$btl" bench --transport sm --sizes 8 --iterations 12000 --window 1 -- \
    "$btl" bench --transport sm --sizes 8 --iterations 2000 --window 1)
  printf 'round %d: C %s, Rust %s (instructions, idle passes per round trip; rank 0)\n' \
    "$i" "$c" "$r"
  cs+=("$c") rs+=("$r")
done
# Per side: instructions per round trip with no idle pass, the intercept of
# a line fitted through the rounds (instructions against idle passes; its
# slope is an idle pass's cost), or the round with the fewest idle passes
# when they hardly differ.
fit() {
  awk '{ n++; x[n] = $2; y[n] = $1; sx += $2; sy += $1 }
    END {
      mx = sx / n; my = sy / n
      for (k = 1; k <= n; k++) { sxx += (x[k] - mx) ^ 2; sxy += (x[k] - mx) * (y[k] - my) }
      if (n >= 2 && sxx > 0.01) { b = sxy / sxx; printf "%d %d\n", my - b * mx, b }
      else { best = 1; for (k = 2; k <= n; k++) if (x[k] < x[best]) best = k
             printf "%d -\n", y[best] - 0 }
    }'
}
read -r c ci <<<"$(printf '%s\n' "${cs[@]}" | fit)"
read -r r ri <<<"$(printf '%s\n' "${rs[@]}" | fit)"
awk -v c="$c" -v ci="$ci" -v r="$r" -v ri="$ri" 'BEGIN {
  printf "no idle pass: C %d, Rust %d instructions per round trip, C/Rust %.3f (an idle pass: C %s, Rust %s)\n",
    c, r, c / r, ci, ri }'

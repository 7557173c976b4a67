#!/usr/bin/env bash
# The C ABI's tests (the test command's `capi` step): installs the C ABI
# with scripts/capi.sh under target/capi, compiles the C examples of
# platform-linux/capi/examples/c with `cc $(pkg-config --cflags --libs
# btl)`, and runs them under `btl run -n 2` and `-n 4` over sm and tcp
# (BTL_TRANSPORT), the external wire-up with two handles per process, the
# misuse test — then all of them again built with -fsanitize=address
# (the ASan runtime in the program, libbtl.so loaded by it: no
# LD_PRELOAD needed). Every multi-process run is bounded by --timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$PWD/target/capi
bash scripts/capi.sh "$prefix" >/dev/null
cargo build --release --locked -p btl-cli --bin btl
btl=$PWD/target/release/btl
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
src=platform-linux/capi/examples/c
out=$prefix/bin
mkdir -p "$out"
flags=(-std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror)
progs=(pingpong onesided wireup misuse)
for p in "${progs[@]}"; do
  # shellcheck disable=SC2046
  cc "${flags[@]}" -O2 -o "$out/$p" "$src/$p.c" $(pkg-config --cflags --libs btl)
  # shellcheck disable=SC2046
  cc "${flags[@]}" -O1 -g -fsanitize=address -fno-omit-frame-pointer -o "$out/$p-asan" \
    "$src/$p.c" $(pkg-config --cflags --libs btl)
done
# The static library links too (a program with no libbtl.so at run time).
# shellcheck disable=SC2046
cc "${flags[@]}" -O2 -o "$out/pingpong-static" "$src/pingpong.c" -I"$prefix/include" \
  "$prefix/lib/libbtl.a" -lpthread -ldl -lm
if ldd "$out/pingpong-static" | grep -q libbtl; then
  echo "pingpong-static links libbtl.so" >&2; exit 1
fi

passed=0 failed=0
run() { # NAME EXPECTED_OK_LINES ENV... -- btl run ARGS...
  local name=$1 want=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local log
  log=$(mktemp)
  if env "${envs[@]}" ASAN_OPTIONS=detect_leaks=1 BTL_TIMEOUT=60 "$btl" run --timeout 120 "$@" >"$log" 2>&1 &&
    [ "$(grep -c 'OK \|misuse: .* passed, 0 failed' "$log")" -ge "$want" ]; then
    passed=$((passed + 1)); printf 'ok   %s\n' "$name"
  else
    failed=$((failed + 1)); printf 'FAIL %s\n' "$name"; tail -30 "$log"
  fi
  rm -f "$log"
}
for suffix in "" -asan; do
  for t in sm tcp; do
    for n in 2 4; do
      sizes=0,8,4096,65536,1048576
      run "pingpong$suffix $t -n $n" "$n" BTL_TRANSPORT=$t -- -n "$n" -- "$out/pingpong$suffix" --sizes "$sizes"
      run "onesided$suffix $t -n $n" "$n" BTL_TRANSPORT=$t -- -n "$n" -- "$out/onesided$suffix"
    done
  done
  run "wireup$suffix -n 4" 4 BTL_TRANSPORT=auto -- -n 4 -- "$out/wireup$suffix"
  run "wireup$suffix -n 4 --split" 4 BTL_TRANSPORT=auto -- -n 4 -- "$out/wireup$suffix" --split
  run "misuse$suffix sm -n 2" 2 BTL_TRANSPORT=sm -- -n 2 -- "$out/misuse$suffix"
  run "misuse$suffix tcp -n 2" 2 BTL_TRANSPORT=tcp -- -n 2 -- "$out/misuse$suffix"
done
run "pingpong-static sm -n 2" 2 BTL_TRANSPORT=sm -- -n 2 -- "$out/pingpong-static"
printf 'capi: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ]

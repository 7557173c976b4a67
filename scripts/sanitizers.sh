#!/usr/bin/env bash
# The core's unit tests and the FIFO and fast-box benchmarks (their threads,
# in a short mode) under ThreadSanitizer, and the core's unit tests under
# AddressSanitizer. Nightly `-Zsanitizer` with `-Zbuild-std`, so the
# standard library is instrumented too (a clean TSan run needs that: an
# uninstrumented std hides its synchronisation from TSan). Each sanitizer
# builds in its own target directory (target/tsan, target/asan), leaving the
# normal build alone. Any report fails the run (TSan and ASan exit
# non-zero on a finding).
#
#   bash scripts/sanitizers.sh            # both
#   SANITIZERS=thread bash scripts/sanitizers.sh
#
# Miri (the other half of issue 7's sanitizer work) is the `miri` step of
# scripts/test.sh: the core's unit tests and the FIFO and fast-box
# benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc +nightly -vV | sed -n 's/^host: //p')
for san in ${SANITIZERS:-thread address}; do
  dir=target/${san:0:1}san
  flags="-Zsanitizer=$san"
  printf '[sanitizers] %s: core unit tests\n' "$san"
  RUSTFLAGS="$flags" RUSTDOCFLAGS="$flags" CARGO_TARGET_DIR=$dir \
    TSAN_OPTIONS="halt_on_error=1" ASAN_OPTIONS="detect_leaks=1" \
    cargo +nightly test -Zbuild-std --target "$host" -p btl-core --lib --locked -q
  if [ "$san" = thread ]; then
    for bench in fifo fbox; do
      printf '[sanitizers] %s: %s benchmark (--short)\n' "$san" "$bench"
      RUSTFLAGS="$flags" CARGO_TARGET_DIR=$dir TSAN_OPTIONS="halt_on_error=1" \
        cargo +nightly test -Zbuild-std --target "$host" -p btl-core --bench "$bench" --locked -q -- --short
    done
  fi
done
printf '[sanitizers] clean\n'

#!/usr/bin/env bash
# The README's test command: sets up a fresh machine (scripts/setup.sh),
# then runs every check: formatting, clippy, the workspace tests, the C ABI
# and the Open MPI components (Open MPI 4.1 and 5.0), the loom
# models, miri on the core, the no_std builds, the bare-metal node in
# QEMU, every fuzz target for a bounded time, and the sanitizers. Exits non-zero on the
# first failure.
#
#   bash scripts/test.sh            # everything
#   BTL_SKIP=miri,loom bash scripts/test.sh   # skip steps while iterating
set -euo pipefail
cd "$(dirname "$0")/.."

passed=0
steps_run=()
skip=",${BTL_SKIP:-},"

step() {
  local name=$1; shift
  if [[ $skip == *",$name,"* ]]; then
    printf '\n==> %s: skipped (BTL_SKIP)\n' "$name"
    return
  fi
  printf '\n==> %s: %s\n' "$name" "$*"
  local t0=$SECONDS
  if ! "$@"; then
    printf '\n==> %s FAILED after %ss\n' "$name" $((SECONDS - t0))
    printf 'steps: %d passed, 1 failed\n' "$passed"
    exit 1
  fi
  passed=$((passed + 1))
  steps_run+=("$name $((SECONDS - t0))s")
}

step setup bash scripts/setup.sh
step fmt cargo fmt --all -- --check
# BENCHMARKS.md is generated from bench/results/*.tsv (scripts/benchmarks.py).
step benchmarks-md python3 scripts/benchmarks.py --check
step clippy cargo clippy --workspace --all-targets --locked -- -D warnings
step test cargo test --workspace --locked

# The C ABI: installs btl.h/libbtl/btl.pc under target/capi, compiles the
# C examples with pkg-config and runs them under `btl run -n 2/-n 4` over
# sm and tcp, the external wire-up, the misuse test, all again under
# AddressSanitizer (scripts/capi-test.sh).
step capi bash scripts/capi-test.sh

# The Open MPI components (target/ompi/mca_btl_{rsm,rtcp}.so) in the
# system's Open MPI: ompi_info, selection, a checked MPI program, bad
# parameters, a rank killed, mpi4py's own test suite over rsm/rtcp against
# vader/tcp, three namespace hosts over rsm+rtcp (scripts/ompi-test.sh).
step ompi bash scripts/ompi-test.sh

# The same checks in Open MPI 5: Debian 13's Open MPI 5.0.7, PMIx and mpi4py
# 4 in a debootstrap tree under target/ompi5-root (made once, then reused;
# every mount undone on exit), components built for BTL 3.3 into
# target/ompi5 (scripts/ompi5-env.sh test).
step ompi5 bash scripts/ompi5-env.sh test

# loom: first the check that every #[test] in loom-tests/tests calls
# loom::model in code (not in a comment or a string: such a test runs
# nothing and passes); then every model, built with --cfg loom in its own
# target dir so the normal build is not invalidated. Preemption bound 3, as
# the models are small rings (2–4 slots) with 1–2 writers.
loom() {
  cargo test -p btl-loom-tests --lib --locked -- check::
  RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
    cargo test -p btl-loom-tests --release --locked
}
step loom loom

# miri on the core's unit tests and the FIFO and fast-box benchmarks (their
# threads, in a short mode), with strict provenance.
miri() {
  MIRIFLAGS="-Zmiri-strict-provenance" cargo +nightly miri test -p btl-core --locked
  MIRIFLAGS="-Zmiri-strict-provenance" cargo +nightly miri test -p btl-core --locked --bench fifo -- --short
  MIRIFLAGS="-Zmiri-strict-provenance" cargo +nightly miri test -p btl-core --locked --bench fbox -- --short
}
step miri miri

# no_std: Cortex-M4F (32-bit atomics, 64-bit ones through portable-atomic's
# fallback) and Cortex-M0 (no compare-and-swap: critical-section feature),
# the core and the smoltcp adapter on both, with each logging choice; then
# a minimal Cortex-M4F firmware image of the adapter (the footprint
# example), printed with `size`.
nostd() {
  cargo build -p btl-core -p btl-baremetal --locked --target thumbv7em-none-eabihf
  cargo build -p btl-baremetal --locked --target thumbv7em-none-eabihf --no-default-features --features defmt
  cargo build -p btl-core --locked --target thumbv6m-none-eabi --features critical-section
  cargo build -p btl-baremetal --locked --target thumbv6m-none-eabi --features btl-core/critical-section
  cargo build -p btl-baremetal --locked --release --target thumbv7em-none-eabihf \
    --no-default-features --example footprint
  size target/thumbv7em-none-eabihf/release/examples/footprint
}
step no_std nostd

# The QEMU node (platform-baremetal/qemu, its own workspace, riscv64 bare
# metal): formatting, clippy for its target, then scripts/qemu-node.sh's
# tests — in a namespace with a TAP, a 3-rank job (2 Linux ranks + the
# node booted in QEMU), the node killed mid-run, a Linux rank killed
# mid-run. About 20 s once built.
qemu() {
  (cd platform-baremetal/qemu &&
    cargo fmt -- --check &&
    cargo clippy --release --locked -- -D warnings)
  bash scripts/qemu-node.sh test
}
step qemu qemu

# Every fuzz target (fuzz/, its own workspace) for FUZZ_SECS seconds (15
# here, to keep CI within its budget; 30 when scripts/fuzz.sh is run alone)
# from its committed seed corpus; a crash fails the step.
step fuzz env FUZZ_SECS="${FUZZ_SECS:-15}" bash scripts/fuzz.sh

# The core's unit tests and the FIFO and fast-box benchmarks' threads under
# ThreadSanitizer, the unit tests under AddressSanitizer.
step sanitizers bash scripts/sanitizers.sh

# The benchmarks must keep building (they are run by hand, not here).
step bench-build cargo bench -p btl-core --bench fifo --bench fbox --locked --no-run

printf '\n==> summary\n'
printf '  %s\n' "${steps_run[@]}"
printf 'steps: %d passed, 0 failed\n' "$passed"

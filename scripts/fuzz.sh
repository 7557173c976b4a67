#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time, starting from
# its committed seed corpus (fuzz/corpus/<target>; new inputs go to a
# temporary directory, so the run leaves the tree as it was). A crash, a
# panic, an input running over 10 s or a leak fails the run, naming the
# target and the reproducer that libFuzzer saved in fuzz/artifacts/<target>/.
#
#   bash scripts/fuzz.sh                    # every target, 30 s each
#   FUZZ_SECS=5 bash scripts/fuzz.sh        # shorter
#   FUZZ_TARGETS="fifo_model endpoint" bash scripts/fuzz.sh
#
# Needs nightly and cargo-fuzz (scripts/setup.sh installs both). Prints one
# line per target with its executions.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${FUZZ_SECS:-30}
# The lock file is committed: refuse to run if the build would change it.
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
cargo +nightly fetch --locked --target "$host" -q
targets=${FUZZ_TARGETS:-$(cargo +nightly fuzz list)}
cargo +nightly fuzz build

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=()
for t in $targets; do
  mkdir -p "$work/$t" "corpus/$t"
  log="$work/$t.log"
  printf '[fuzz] %s: %ss\n' "$t" "$secs"
  if ! cargo +nightly fuzz run "$t" "$work/$t" "corpus/$t" -- \
      -max_total_time="$secs" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log"
    printf '[fuzz] %s FAILED; reproduce with: cd fuzz && cargo +nightly fuzz run %s <artifact above>\n' "$t" "$t"
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  summary+=("$(printf '%-16s %10s executions in %ss, %s' "$t" "${execs:-?}" "$secs" "${cov:-cov: ?}")")
done
printf '[fuzz] %s\n' "${summary[@]}"

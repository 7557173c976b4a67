#!/usr/bin/env bash
# Installs what the tests need on a fresh machine with only rustup-managed
# Rust: the no_std targets, the nightly toolchain with miri and rust-src
# (miri, and -Zbuild-std for the sanitizers), and cargo-fuzz. Idempotent;
# safe to run on every test run.
set -euo pipefail

log() { printf '[setup] %s\n' "$*"; }
# can_apt: whether packages can be installed here (root with apt-get).
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
# apt_install [apt-get install options] PKG...
apt_install() {
  log "installing $*"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

command -v rustup >/dev/null || { echo "rustup not found: install Rust with rustup first" >&2; exit 1; }

# no_std targets: one with 32-bit atomics only (Cortex-M4F), one without
# compare-and-swap at all (Cortex-M0), and the QEMU node's (riscv64 bare
# metal, platform-baremetal/qemu).
NOSTD_TARGETS=(thumbv7em-none-eabihf thumbv6m-none-eabi riscv64gc-unknown-none-elf)
installed=$(rustup target list --installed)
for t in "${NOSTD_TARGETS[@]}"; do
  if ! grep -qx "$t" <<<"$installed"; then
    log "adding target $t"
    rustup target add "$t"
  fi
done

# nightly + miri (+ rust-src, which miri needs to build its sysroot).
if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
nightly_components=$(rustup +nightly component list --installed)
for c in miri rust-src; do
  if ! grep -q "^$c" <<<"$nightly_components"; then
    log "adding nightly component $c"
    rustup +nightly component add "$c"
  fi
done
# cargo-fuzz for the fuzz step (built from crates.io; a few minutes once).
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
# Debian packages of the tests that make their own hosts: iproute2 (network
# namespaces, veth, bridges), util-linux (unshare), openmpi-bin (mpirun and
# the PMIx library, for the run under mpirun), libpmix-dev (the PMIx header
# the PMIx layout test compiles against). Where one is missing or
# namespaces are not permitted, the tests skip, saying why — or, with CI
# set (as .ci/run sets it), fail. g++: libFuzzer (the fuzz step) is C++,
# and the layout test needs a C compiler.
need=()
command -v c++ >/dev/null || need+=(g++)
# The C ABI's tests (scripts/capi-test.sh) compile C with cc and pkg-config
# (gcc brings libasan for the AddressSanitizer runs).
command -v cc >/dev/null || need+=(gcc)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
command -v mpirun >/dev/null || need+=(openmpi-bin)
compgen -G '/usr/lib/*/pmix2/include/pmix_common.h' >/dev/null || need+=(libpmix-dev)
# nftables: the partition test cuts a namespace host off its network.
command -v nft >/dev/null || need+=(nftables)
# The Open MPI components (scripts/ompi-components.sh, scripts/ompi-test.sh):
# Open MPI's internal headers and mpicc (libopenmpi-dev), mpi4py for its
# test suite (python3-mpi4py), pip to fetch that suite's source release.
[ -f /usr/lib/x86_64-linux-gnu/openmpi/include/openmpi/opal/mca/btl/btl.h ] || need+=(libopenmpi-dev)
/usr/bin/python3 -c 'import mpi4py' 2>/dev/null || need+=(python3-mpi4py)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# Open MPI 5 (scripts/ompi5-env.sh): a Debian 13 tree made by debootstrap.
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  if can_apt; then
    apt_install "${need[@]}"
  else
    log "${need[*]} missing and cannot be installed here: the tests needing them will skip (fail with CI set)"
  fi
fi

# mpi4py's own test suite: the test/ directory of the PyPI source release
# of the installed version, cached (never committed) in ~/.cache/btl.
m4ver=$(/usr/bin/python3 -c 'import mpi4py; print(mpi4py.__version__)' 2>/dev/null || true)
cache=${BTL_CACHE:-$HOME/.cache/btl}
if [ -n "$m4ver" ] && [ ! -f "$cache/mpi4py-$m4ver.tar.gz" ]; then
  log "downloading mpi4py $m4ver's source release (its test suite)"
  mkdir -p "$cache"
  /usr/bin/python3 -m pip download --quiet --no-binary :all: --no-deps --no-build-isolation \
    -d "$cache" "mpi4py==$m4ver" ||
    log "could not download mpi4py $m4ver's source release: the mpi4py tests will skip"
fi

# QEMU (qemu-system-riscv64, in qemu-system-misc) and OpenSBI (its -bios
# default) boot the bare-metal node of scripts/qemu-node.sh. Without
# recommends: no GUI, no other firmware.
if ! command -v qemu-system-riscv64 >/dev/null || [ ! -e /usr/share/qemu/opensbi-riscv64-generic-fw_dynamic.bin ]; then
  if can_apt; then
    apt_install --no-install-recommends qemu-system-misc opensbi
  else
    log "qemu-system-riscv64 missing and cannot be installed here: the QEMU node tests will skip (fail with CI set)"
  fi
fi

# binutils' `size` prints the bare-metal firmware's sections (no_std step).
if ! command -v size >/dev/null; then
  if can_apt; then
    apt_install binutils
  else
    echo "binutils (size) missing and cannot be installed here" >&2; exit 1
  fi
fi

# `setup.sh --bench`: also the tools of the benchmarks (not of the tests):
# the anchors' peers (../shared/anchors: ucx_perftest from ucx-utils,
# fi_pingpong from libfabric-bin) and the profilers (perf from linux-perf,
# valgrind's callgrind).
if [ "${1:-}" = --bench ]; then
  bneed=()
  command -v ucx_perftest >/dev/null || bneed+=(ucx-utils)
  command -v fi_pingpong >/dev/null || bneed+=(libfabric-bin)
  command -v perf >/dev/null || bneed+=(linux-perf)
  command -v valgrind >/dev/null || bneed+=(valgrind)
  if [ ${#bneed[@]} -gt 0 ]; then
    if can_apt; then
      apt_install "${bneed[@]}"
    else
      echo "${bneed[*]} missing and cannot be installed here (run as root with apt-get)" >&2; exit 1
    fi
  fi
fi

# Build miri's sysroot once, quietly (the first miri run would do it anyway).
cargo +nightly miri setup >/dev/null 2>&1 || cargo +nightly miri setup
log "ready"

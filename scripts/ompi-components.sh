#!/usr/bin/env bash
# Builds btl's Open MPI BTL components against the system's Open MPI
# (Debian's libopenmpi-dev, 4.1): one C file (platform-linux/ompi/btl_ompi.c)
# compiled twice, each linked with btl's static C ABI (libbtl.a), leaving
# exactly
#   target/ompi/mca_btl_rsm.so    btl's shared memory (peers of this node)
#   target/ompi/mca_btl_rtcp.so   btl's TCP (every peer)
# Install: copy both into ~/.openmpi/components (on Open MPI's default
# mca_base_component_path), or run with
#   --mca mca_base_component_path /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3:$PWD/target/ompi
#
#   bash scripts/ompi-components.sh
#
# OMPI_COMPONENTS_OUT=DIR builds into DIR instead of target/ompi, and
# OMPI_COMPONENTS_CFLAGS adds C compiler flags (scripts/ompi-sensitivity.sh
# builds measurement copies with them). OMPI_INCLUDE and OMPI_LIB point at
# another Open MPI's headers and libraries; the BTL interface is read from
# its btl.h (BTL_VERSION 310: Open MPI 4.1, libopen-pal; 330: Open MPI 5.0,
# libopen-pal and libpmix). OMPI_COMPONENTS_NO_CARGO=1 links the
# libbtl.a already in $CARGO_TARGET_DIR/release instead of building it
# (scripts/ompi5-env.sh components: cargo runs on the host, this script in
# the Open MPI 5 tree, which has no Rust toolchain). OMPI_EXTRA_INCLUDE
# names further header folders (space-separated): scripts/ompi5-env.sh passes
# the few internal headers Debian 13's libopenmpi-dev leaves out.
set -euo pipefail
cd "$(dirname "$0")/.."
ompi_inc=${OMPI_INCLUDE:-/usr/lib/x86_64-linux-gnu/openmpi/include}
ompi_lib=${OMPI_LIB:-/usr/lib/x86_64-linux-gnu/openmpi/lib}
if [ ! -f "$ompi_inc/openmpi/opal/mca/btl/btl.h" ]; then
  echo "ompi-components: Open MPI's internal headers are missing ($ompi_inc/openmpi/opal/mca/btl/btl.h): install libopenmpi-dev" >&2
  exit 1
fi
btl_h=$ompi_inc/openmpi/opal/mca/btl/btl.h
extra_inc=()
for d in ${OMPI_EXTRA_INCLUDE:-}; do extra_inc+=(-I"$d"); done
iface=$(awk '$1 == "#define" && $2 == "BTL_VERSION" { print $3 }' "$btl_h")
case "$iface" in
310) ompi_libs=(-lopen-pal) ;;
330)
  ompi_libs=(-lopen-pal -lpmix)
  # Open MPI 5's headers include <pmix.h>; Debian keeps it beside libpmix.
  pmix_inc=${PMIX_INCLUDE:-/usr/lib/x86_64-linux-gnu/pmix2/include}
  extra_inc+=(-I"$pmix_inc")
  ;;
*)
  echo "ompi-components: $btl_h defines BTL_VERSION '${iface}'; btl_ompi.c builds for 310 (Open MPI 4.1) and 330 (Open MPI 5.0)" >&2
  exit 1
  ;;
esac
target=${CARGO_TARGET_DIR:-target}
if [ "${OMPI_COMPONENTS_NO_CARGO:-0}" = 1 ]; then
  if [ ! -f "$target/release/libbtl.a" ]; then
    echo "ompi-components: OMPI_COMPONENTS_NO_CARGO=1 but $target/release/libbtl.a is missing: build it with cargo build --release -p btl-capi" >&2
    exit 1
  fi
else
  cargo build --release --locked -p btl-capi
fi
out=${OMPI_COMPONENTS_OUT:-$target/ompi}
mkdir -p "$out"
rm -f "$out"/*.so
src=platform-linux/ompi
# Open MPI's headers use 16-byte compare-and-swap (its free lists' lifo):
# on x86_64 the instruction (cmpxchg16b), elsewhere libatomic.
arch=(-latomic)
[ "$(uname -m)" = x86_64 ] && arch=(-mcx16)
read -ra cflags <<<"${OMPI_COMPONENTS_CFLAGS:-}"
for c in rsm rtcp; do
  def=BTL_OMPI_$(tr '[:lower:]' '[:upper:]' <<<"$c")
  cc -std=gnu11 -O2 -g -fPIC -shared -Wall -Wextra -Werror -Wno-unused-parameter \
    -Wno-missing-field-initializers "${arch[@]}" -D"$def" "${cflags[@]}" \
    -I"$ompi_inc" -I"$ompi_inc/openmpi" "${extra_inc[@]}" -Iplatform-linux/capi/include \
    -o "$out/mca_btl_$c.so" "$src/btl_ompi.c" \
    "$target/release/libbtl.a" \
    -Wl,--version-script="$src/exports.map" -Wl,--gc-sections -Wl,-z,defs \
    -L"$ompi_lib" "${ompi_libs[@]}" -lpthread -ldl -lm -lgcc_s -lc
  strip --strip-debug "$out/mca_btl_$c.so"
done
echo "ompi-components: BTL interface $iface ($btl_h)" >&2
ls -l "$out"/mca_btl_rsm.so "$out"/mca_btl_rtcp.so

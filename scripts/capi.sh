#!/usr/bin/env bash
# Builds btl's C ABI (release) and installs it under PREFIX (default
# /usr/local):
#   PREFIX/include/btl.h
#   PREFIX/lib/libbtl.so.0.1.0, libbtl.so.0, libbtl.so, libbtl.a
#   PREFIX/lib/pkgconfig/btl.pc
# Then: cc prog.c $(pkg-config --cflags --libs btl)   (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
# unless PREFIX is a standard one).
#
#   bash scripts/capi.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
version=0.1.0

cargo build --release --locked -p btl-capi
target=${CARGO_TARGET_DIR:-target}

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 platform-linux/capi/include/btl.h "$prefix/include/btl.h"
install -m 755 "$target/release/libbtl.so" "$prefix/lib/libbtl.so.$version"
ln -sf "libbtl.so.$version" "$prefix/lib/libbtl.so.0"
ln -sf "libbtl.so.0" "$prefix/lib/libbtl.so"
install -m 644 "$target/release/libbtl.a" "$prefix/lib/libbtl.a"
cat > "$prefix/lib/pkgconfig/btl.pc" <<PC
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: btl
Description: btl, a byte-transfer layer for HPC (shared memory and TCP)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lbtl
Libs.private: -lpthread -ldl -lm -lgcc_s -lc
PC
echo "installed btl $version in $prefix (header, libbtl.so, libbtl.a, lib/pkgconfig/btl.pc)"

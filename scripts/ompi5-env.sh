#!/usr/bin/env bash
# Open MPI 5 beside the system's Open MPI 4.1: a Debian 13 ("trixie") minbase
# tree under target/ompi5-root with Debian's Open MPI 5.0, PMIx 5 and mpi4py,
# and a way to run commands inside it (as root, which debootstrap and chroot
# need).
#
#   bash scripts/ompi5-env.sh tree            # make the tree (once; reused after)
#   bash scripts/ompi5-env.sh run -- CMD...   # run CMD inside, in /btl
#   bash scripts/ompi5-env.sh components      # mca_btl_rsm.so, mca_btl_rtcp.so
#                                             # for Open MPI 5 into target/ompi5
#   bash scripts/ompi5-env.sh test [GROUPS]   # scripts/ompi-test.sh inside, over
#                                             # those components (the ompi5 step)
#   bash scripts/ompi5-env.sh bench           # scripts/ompi-bench.sh inside (REPS,
#                                             # SIZES, MIN, LAT_RUNS pass through)
#   bash scripts/ompi5-env.sh mtbench         # scripts/ompi-mtbench.sh inside (REPS,
#                                             # THREADS, MESSAGES, MAX, RECORD)
#   bash scripts/ompi5-env.sh unmount         # undo mounts a killed run left
#
# The tree is made once, in two steps with a stamp each: debootstrap's base
# (stamp .btl-debootstrap-done, written after debootstrap succeeded) and the
# apt packages (stamp .btl-ompi5-ready, naming the installed packages). A
# re-run reuses whatever is stamped: a tree without the debootstrap stamp,
# half made, is removed and made again; a tree whose apt step failed or whose
# package list changed keeps its base and only reruns apt (apt-get install is
# idempotent). Inside,
# for every `run`: /proc, /sys (hwloc reads it), /dev/shm (Open MPI's sm and
# btl's rsm segments), a fresh tmpfs on /tmp (PMIx's and Open MPI's session
# directories), and this checkout bound at /btl, so the scripts, sources and
# the host-built target/release/libbtl.a are reachable there.
#
# Every mount is made in a private mount namespace of this run (unshare), so
# none of them can outlive it, not even after SIGKILL; the EXIT trap unmounts
# them as well, and mounts under the tree left in this machine's own
# namespace (by an older or interrupted run) are removed before each run.
#
# Components for Open MPI 5 (decision): libbtl.a is built on the host with
# the host's Rust toolchain (cargo build --release -p btl-capi, as for
# Open MPI 4.1), and only btl_ompi.c is compiled inside the tree, against
# Open MPI 5's headers, and linked there with that libbtl.a, libopen-pal.so.80
# and libpmix. Why: the tree's glibc (2.41) is newer than the host's, so an
# archive built against the host's glibc links and runs inside; the Rust
# code is the same for both Open MPI versions, so one libbtl.a serves both
# and the Rust build is not done twice (2 cores); and the tree stays
# Debian's packages only, with no Rust toolchain to install and keep in it.
# The other way (everything inside) would need rustup in the tree and a
# second full release build. Output: $CARGO_TARGET_DIR/ompi5 (the target
# directory must be inside this checkout, the only host folder the tree sees).
#
# OMPI5_ROOT=DIR puts the tree elsewhere; OMPI5_MIRROR=URL picks the Debian
# archive. Inside, OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# are set (runs are as root), the environment is otherwise fresh: pass
# variables with `run -- env NAME=VALUE CMD...`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
mkdir -p "$target"
target=$(cd "$target" && pwd)
root=${OMPI5_ROOT:-$target/ompi5-root}
mirror=${OMPI5_MIRROR:-http://deb.debian.org/debian}
# libc6-dev and gcc to compile the components and the MPI test programs inside
# (linking the host-built libbtl.a); make for mpi4py's test helpers.
# iproute2 for the network-namespace hosts of ompi-test.sh, procps (pgrep)
# for its killed-rank test.
packages="libopenmpi-dev openmpi-bin python3-mpi4py gcc make libc6-dev iproute2 procps"
# The stamp names the packages and the header step (bumped when it changes).
stamp_content="$packages +headers1"
stamp=$root/.btl-ompi5-ready
base_stamp=$root/.btl-debootstrap-done

die() {
  echo "ompi5-env: $*" >&2
  exit 1
}

# Mount points at or under the tree in the current mount namespace, deepest
# first (the order they can be unmounted in).
mounts_under_tree() {
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo |
    sort -r
}

unmount_tree() {
  local m
  for m in $(mounts_under_tree); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "ompi5-env: cannot unmount $m" >&2
  done
}

# Runs inside the tree with a fresh environment.
in_tree() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@"
}

# In the private mount namespace: mounts what the tree's programs need.
mount_tree() {
  # The tree's root a mount point of its own: `ip netns add` inside makes
  # the root a slave mount (ompi-test.sh's namespace hosts).
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --bind /sys "$root/sys"
  mkdir -p "$root/dev/shm" "$root/btl"
  mount --bind /dev/shm "$root/dev/shm"
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
  mount --bind "$repo" "$root/btl"
}

# Debian 13's libopenmpi-dev ships opal_config.h naming the threads
# framework's pthreads headers (opal/mca/threads/pthreads/*.h) but not the
# headers themselves, so nothing that includes opal/mca/btl/btl.h compiles.
# They are taken from the source package of the very Open MPI version
# installed (Debian's archive, deb-src), into /opt/btl-ompi5-headers inside the tree.
headers_inside=/opt/btl-ompi5-headers
fetch_missing_headers() {
  local ver up src=$root/var/cache/btl-ompi-src
  ver=$(in_tree dpkg-query -W -f '${source:Version}' libopenmpi-dev)
  up=${ver#*:}
  up=${up%-*}
  echo "deb-src $mirror trixie main" >"$root/etc/apt/sources.list.d/btl-src.list"
  in_tree apt-get update -q
  rm -rf "$src" && mkdir -p "$src"
  in_tree sh -c "cd /var/cache/btl-ompi-src && apt-get source --download-only -q openmpi=$ver" ||
    die "cannot fetch Open MPI's source package $ver (deb-src)"
  rm -rf "${root:?}$headers_inside" && mkdir -p "$root$headers_inside"
  tar xJf "$src/openmpi_$up.orig.tar.xz" -C "$root$headers_inside" --strip-components=1 \
    --wildcards "openmpi-$up/opal/mca/threads/pthreads/*.h" ||
    die "Open MPI's source package $ver has no opal/mca/threads/pthreads headers"
  rm -rf "$src" "$root/etc/apt/sources.list.d/btl-src.list"
  in_tree apt-get update -q
}

# Makes the tree unless the stamp says it is there with these packages.
make_tree() {
  [ "$(id -u)" = 0 ] || die "needs root (debootstrap, mount, chroot)"
  [ "$(cat "$stamp" 2>/dev/null)" = "$stamp_content" ] && return 0
  unmount_tree
  if [ ! -e "$base_stamp" ]; then
    command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
    if [ -e "$root" ]; then
      [ -z "$(mounts_under_tree)" ] || die "$root still has mounts; not removing it"
      echo "ompi5-env: removing the unfinished tree $root" >&2
      rm -rf --one-file-system "$root"
    fi
    echo "ompi5-env: debootstrap trixie into $root ($mirror)" >&2
    debootstrap --variant=minbase trixie "$root" "$mirror" >"$target/ompi5-debootstrap.log" 2>&1 ||
      die "debootstrap failed: see $target/ompi5-debootstrap.log"
    [ -x "$root/usr/bin/apt-get" ] || die "debootstrap left no $root/usr/bin/apt-get: see $target/ompi5-debootstrap.log"
    date -u +%FT%TZ >"$base_stamp"
  fi
  # Every time apt runs, so a changed resolver or hosts file on the host is seen.
  cp /etc/resolv.conf /etc/hosts "$root/etc/"
  rm -f "$stamp"
  echo "ompi5-env: installing into $root: $packages" >&2
  # shellcheck disable=SC2086 # the package list is words
  unshare --mount --propagation private bash "$0" _apt $packages ||
    die "apt-get in the tree failed (the debootstrap base is kept; a re-run retries only apt)"
  echo "$stamp_content" >"$stamp"
}

case "${1:-}" in
tree)
  (
    flock 9
    make_tree
  ) 9>"$target/ompi5-root.lock"
  ;;
run)
  shift
  [ "${1:-}" != -- ] || shift
  [ $# -gt 0 ] || die "run: no command"
  (
    flock 9
    make_tree
  ) 9>"$target/ompi5-root.lock"
  unmount_tree
  exec unshare --mount --propagation private bash "$0" _run "$@"
  ;;
components)
  case "$target/" in
  "$repo"/*) ;;
  *) die "components: the target directory $target is outside the checkout $repo, which is all the tree sees (at /btl)" ;;
  esac
  inside_target=/btl/${target#"$repo"/}
  CARGO_TARGET_DIR=$target cargo build --release --locked -p btl-capi ||
    die "components: building libbtl.a on the host failed"
  bash "$0" run -- env CARGO_TARGET_DIR="$inside_target" OMPI_COMPONENTS_NO_CARGO=1 \
    OMPI_INCLUDE=/usr/lib/x86_64-linux-gnu/openmpi/include \
    OMPI_LIB=/usr/lib/x86_64-linux-gnu/openmpi/lib \
    OMPI_COMPONENTS_OUT="$inside_target/ompi5" OMPI_EXTRA_INCLUDE="$headers_inside" \
    OMPI_COMPONENTS_CFLAGS="${OMPI_COMPONENTS_CFLAGS:-}" \
    bash scripts/ompi-components.sh ||
    die "components: building the Open MPI 5 components in the tree failed"
  ;;
test)
  shift
  # As the other test steps: a missing prerequisite skips with the reason,
  # or fails when CI is set.
  why=
  [ "$(id -u)" = 0 ] || why="not root (debootstrap, mount and chroot need it)"
  [ -n "$why" ] || [ -e "$base_stamp" ] || command -v debootstrap >/dev/null ||
    why="debootstrap missing (scripts/setup.sh installs it)"
  if [ -n "$why" ]; then
    [ -z "${CI:-}" ] || die "test: FAILED: $why (CI is set: a missing prerequisite is a failure)"
    echo "ompi5-env: SKIPPED the Open MPI 5 tests: $why"
    exit 0
  fi
  bash "$0" components
  CARGO_TARGET_DIR=$target cargo build --release --locked -p btl-cli --bin btl ||
    die "test: building the btl command on the host failed"
  # mpi4py's test suite: the PyPI source release of the tree's mpi4py
  # (Debian's archive here has no mpi4py source package), fetched on the
  # host, kept in the tree's own cache.
  m4ver=$(in_tree /usr/bin/python3 -c 'import mpi4py; print(mpi4py.__version__)') ||
    die "test: mpi4py is not importable in the tree"
  cache=$root/root/.cache/btl
  if [ ! -f "$cache/mpi4py-$m4ver.tar.gz" ]; then
    mkdir -p "$cache"
    /usr/bin/python3 -m pip download --quiet --no-binary :all: --no-deps --no-build-isolation \
      -d "$cache" "mpi4py==$m4ver" || die "test: cannot download mpi4py $m4ver's source release"
  fi
  inside_target=/btl/${target#"$repo"/}
  bash "$0" run -- env CARGO_TARGET_DIR="$inside_target" OMPI_COMPONENTS_PREBUILT="$inside_target/ompi5" \
    CI="${CI:-}" OMPI_TESTS="${*:-${OMPI_TESTS:-basic kill ulfm mpi4py hosts}}" bash scripts/ompi-test.sh
  ;;
bench)
  shift
  bash "$0" components
  # The anchors' ping-pong lives beside the checkout, which is all the tree
  # sees: a copy goes into the target directory.
  pp=${MPI_PINGPONG:-$repo/../shared/anchors/mpi_pingpong.c}
  [ -f "$pp" ] || die "bench: $pp not found (set MPI_PINGPONG)"
  mkdir -p "$target/ompi5-bench"
  cp "$pp" "$target/ompi5-bench/mpi_pingpong.c"
  inside_target=/btl/${target#"$repo"/}
  bash "$0" run -- env CARGO_TARGET_DIR="$inside_target" OMPI_COMPONENTS_PREBUILT="$inside_target/ompi5" \
    MPI_PINGPONG="$inside_target/ompi5-bench/mpi_pingpong.c" REPS="${REPS:-3}" \
    SIZES="${SIZES:-8 4096 65536 1048576 4194304}" MIN="${MIN:-}" LAT_RUNS="${LAT_RUNS:-30}" \
    bash scripts/ompi-bench.sh
  ;;
mtbench)
  shift
  bash "$0" components
  inside_target=/btl/${target#"$repo"/}
  bash "$0" run -- env CARGO_TARGET_DIR="$inside_target" OMPI_COMPONENTS_PREBUILT="$inside_target/ompi5" \
    REPS="${REPS:-5}" THREADS="${THREADS:-4}" MESSAGES="${MESSAGES:-1000}" MAX="${MAX:-262144}" \
    RECORD="${RECORD:-}" bash scripts/ompi-mtbench.sh
  ;;
unmount)
  unmount_tree
  ;;
_apt)
  # Inside the private namespace: apt needs /proc for some maintainer scripts.
  shift
  trap unmount_tree EXIT
  trap 'exit 129' HUP INT TERM
  mount_tree
  in_tree apt-get update -q
  in_tree apt-get install -y -q --no-install-recommends "$@"
  in_tree apt-get clean
  fetch_missing_headers
  ;;
_run)
  shift
  trap unmount_tree EXIT
  trap 'exit 129' HUP INT TERM
  mount_tree
  in_tree sh -c 'cd /btl && exec "$@"' sh "$@"
  ;;
*)
  sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2
  exit 2
  ;;
esac

# Shared by the Open MPI scripts (ompi-test.sh, ompi-bench.sh,
# ompi-mixbench.sh); sourced, not run.

# ompi_use_components DIR: sets `sysdir` (Open MPI's own component
# directory, from ompi_info) and puts DIR (this build's rsm and rtcp, e.g.
# ROOT/target/ompi) after it on the component path of every mpirun that
# follows.
ompi_use_components() {
  sysdir=$(ompi_info --param mca base --level 9 --parsable |
    sed -n 's/^mca:mca:base:param:mca_base_component_path:value:"\{0,1\}\([^:"]*\).*/\1/p')
  sysdir=${sysdir:-/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3}
  export OMPI_MCA_mca_base_component_path=$sysdir:$1
}

# ompi_open_mpi SCRIPT: which Open MPI the headers are (btl.h's
# BTL_VERSION) and its names: sets `iface` (310 or 330), `ver` (4.1 or 5),
# `shm` (its shared-memory BTL, vader or sm) and `oob_lo` (mpirun options
# keeping its own channel on loopback: PRRTE, in 5, refuses loopback alone
# and needs none on one node); in 5 also keeps PMIx from reporting the
# non-PMIx files on the component path. Exits naming SCRIPT for another.
ompi_open_mpi() {
  iface=$(awk '$1 == "#define" && $2 == "BTL_VERSION" { print $3 }' \
    /usr/lib/x86_64-linux-gnu/openmpi/include/openmpi/opal/mca/btl/btl.h)
  case "$iface" in
  310) ver=4.1 shm=vader oob_lo="--mca oob_tcp_if_include lo" ;;
  330)
    ver=5 shm=sm oob_lo=""
    export PMIX_MCA_mca_base_component_show_load_errors=none
    ;;
  *) echo "$1: btl.h defines BTL_VERSION '$iface' (this script knows 310 and 330)" >&2; exit 1 ;;
  esac
}

# ompi_components_dir TARGET: sets `components`, the directory of rsm and
# rtcp: OMPI_COMPONENTS_PREBUILT, or TARGET/ompi after building them.
ompi_components_dir() {
  if [ -n "${OMPI_COMPONENTS_PREBUILT:-}" ]; then
    components=$OMPI_COMPONENTS_PREBUILT
  else
    components=$1/ompi
    bash scripts/ompi-components.sh >/dev/null
  fi
}

# ompi_baseline SCRIPT: with BASELINE=DIR set, checks that DIR holds both
# components (exits naming SCRIPT if not) and sets `base` to its absolute
# path; without BASELINE, sets `base` empty.
ompi_baseline() {
  base=
  [ -n "${BASELINE:-}" ] || return 0
  local f
  for f in mca_btl_rsm.so mca_btl_rtcp.so; do
    [ -f "$BASELINE/$f" ] || { echo "$1: $BASELINE/$f not found (BASELINE)" >&2; exit 1; }
  done
  base=$(cd "$BASELINE" && pwd)
}

# netns_hosts BRIDGE NET HOSTS_FILE NAME...: one network namespace per NAME
# (a "host"), each with eth0 at NET.i/24 (i = 1, 2, ...) on a veth into the
# bridge BRIDGE (NET.254, this machine's side), and lo up; writes
# HOSTS_FILE (localhost, head, every NAME) for scripts/netns-agent.sh
# (BTL_NETNS_HOSTS). Veths are named BRIDGE-v1, ... (at most 15 bytes:
# keep BRIDGE short). netns_hosts_del undoes it (the caller traps it).
netns_hosts() {
  local br=$1 net=$2 file=$3 i=0 h
  shift 3
  NETNS_BRIDGE=$br NETNS_NAMES="$*"
  ip link add "$br" type bridge
  ip addr add "$net.254/24" dev "$br"
  ip link set "$br" up
  printf '127.0.0.1 localhost\n%s.254 head\n' "$net" >"$file"
  for h in "$@"; do
    i=$((i + 1))
    ip netns add "$h"
    ip link add "${br}v$i" type veth peer name eth0 netns "$h"
    ip link set "${br}v$i" master "$br" up
    ip -n "$h" addr add "$net.$i/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    printf '%s.%s %s\n' "$net" "$i" "$h" >>"$file"
  done
}

# Removes what netns_hosts made (deleting a namespace removes its veth).
netns_hosts_del() {
  local h
  for h in ${NETNS_NAMES:-}; do ip netns del "$h" 2>/dev/null || true; done
  [ -z "${NETNS_BRIDGE:-}" ] || ip link del "$NETNS_BRIDGE" 2>/dev/null || true
}

#!/bin/sh
# Stand-in for ssh that "logs in" to a network namespace, for the multi-host
# tests (btl run --agent, mpirun --mca plm_rsh_agent):
#   netns-agent.sh [ssh options] HOST COMMAND...
# HOST is a network namespace (`ip netns add HOST`). COMMAND runs through a
# shell (as sshd does; Open MPI sends one quoted string) inside that
# namespace, in a new UTS namespace whose host name is HOST (so each "host"
# has its own node name) and a new mount namespace where the file named by
# BTL_NETNS_HOSTS, if set, is bind-mounted over /etc/hosts.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-l|-p|-i|-F|-J) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "usage: $0 [ssh options] HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
exec ip netns exec "$host" unshare --uts --mount sh -c '
  hostname "$1" || exit 255
  if [ -n "$3" ] && [ -f "$3" ]; then mount --bind "$3" /etc/hosts || exit 255; fi
  exec /bin/sh -c "$2"' netns-agent "$host" "$*" "${BTL_NETNS_HOSTS:-}"

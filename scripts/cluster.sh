#!/usr/bin/env bash
# An emulated cluster on this machine: N "hosts", each a Linux network namespace with its own host name, joined by
# a bridge through links of limited rate, optionally with a CPU quota (a really slower host, not a sleep).
#
#   scripts/cluster.sh up [N] [--rate RATE] [--latency L] [--cpu HOST=FRACTION ...] [--link HOST=RATE ...]
#   scripts/cluster.sh mpirun -H h1:2,h2:2 -np 4 python script.py ...   # Open MPI across the hosts
#   scripts/cluster.sh horovodrun -np 4 -H h1:2,h2:2 python script.py ...
#   scripts/cluster.sh exec h1 CMD ...                                  # one command on one host
#   scripts/cluster.sh status
#   scripts/cluster.sh down                                             # removes everything `up` made
#
# What `up` makes (and `down` removes; both are idempotent, and `up` first removes a previous cluster):
#   - bridge hsbr0 with 10.77.0.1/24 in the root namespace (mpirun's side; nothing else is routed);
#   - per host hK (K = 1..N): namespace hs-hK, veth pair hsv-hK (bridge side) / eth0 (host side) with 10.77.0.(10+K),
#     loopback up, a tbf qdisc of RATE on both ends of the link (tc tbf; this kernel has no netem, so LATENCY is
#     tbf's queueing bound, not a propagation delay);
#   - /etc/hosts lines "10.77.0.(10+K) hK  # hetsync-cluster" (Open MPI routes by host name);
#   - with --cpu hK=F: cgroup v1 cpu group /sys/fs/cgroup/cpu/hetsync-hK with cfs_quota = F x period (the host
#     gets F of one core in total, whatever number of processes it runs) and a large cpu.shares, so that the quota
#     is what limits it: with the default weight the whole group would weigh as much as one process of the other
#     hosts and get far less than F on a loaded machine (measured: a 2-host job slowed 2-10x at random);
#   - $HETSYNC_CLUSTER_DIR (default /tmp/hetsync-cluster): the hosts file, the Open MPI rsh agent and the settings.
# Processes run on a host through the agent: `ip netns exec hs-hK unshare --uts` (its own host name), joined to
# the host's cgroup.  Traffic stays on these namespaces and the bridge.  Needs root (CI runs as root).
set -euo pipefail

DIR="${HETSYNC_CLUSTER_DIR:-/tmp/hetsync-cluster}"
BRIDGE=hsbr0
SUBNET=10.77.0
TAG="# hetsync-cluster"
CGROUP=/sys/fs/cgroup/cpu

say() { echo "[cluster] $*" >&2; }
die() { echo "[cluster] error: $*" >&2; exit 2; }

hosts() { [ -f "$DIR/hosts" ] && cat "$DIR/hosts" || true; }

down() {
  for h in $(hosts); do
    # processes still on the host (a failed run) go first, so the namespace and cgroup can be removed
    if [ -d "$CGROUP/hetsync-$h" ]; then
      for pid in $(cat "$CGROUP/hetsync-$h/cgroup.procs" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    fi
    ip netns pids "hs-$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^hs-h' || true); do ip netns del "$ns" 2>/dev/null || true; done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^hsv-h' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  if grep -q "$TAG" /etc/hosts 2>/dev/null; then
    grep -v "$TAG" /etc/hosts > /etc/hosts.hetsync.tmp && cat /etc/hosts.hetsync.tmp > /etc/hosts
    rm -f /etc/hosts.hetsync.tmp
  fi
  for cg in "$CGROUP"/hetsync-h*; do [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true; done
  rm -rf "$DIR"
  say "down: no namespace, link, bridge, hosts line or cgroup of the cluster is left"
}

shape() {  # shape DEV-IN-NS-OR-ROOT RATE LATENCY [netns]
  local dev=$1 rate=$2 lat=$3 ns=${4:-}
  local run=(); [ -n "$ns" ] && run=(ip netns exec "$ns")
  "${run[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 64kb latency "$lat"
}

up() {
  local n=2 rate=1gbit lat=50ms cpus=() links=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate=$2; shift 2 ;;
      --latency) lat=$2; shift 2 ;;
      --cpu) cpus+=("$2"); shift 2 ;;
      --link) links+=("$2"); shift 2 ;;
      [0-9]*) n=$1; shift ;;
      *) die "unknown argument to up: $1" ;;
    esac
  done
  [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200, got $n"
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc, cgroups)"
  down >/dev/null 2>&1 || true
  mkdir -p "$DIR"
  trap 'say "up failed: removing what it made"; down; exit 2' ERR
  ip link add "$BRIDGE" type bridge
  ip addr add "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for k in $(seq 1 "$n"); do
    local h="h$k" ns="hs-h$k" addr="$SUBNET.$((10 + k))" r=$rate
    for l in "${links[@]}"; do [ "${l%%=*}" = "$h" ] && r=${l#*=}; done
    ip netns add "$ns"
    ip link add "hsv-$h" type veth peer name eth0 netns "$ns"
    ip link set "hsv-$h" master "$BRIDGE" up
    ip netns exec "$ns" ip addr add "$addr/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    shape eth0 "$r" "$lat" "$ns"
    shape "hsv-$h" "$r" "$lat"
    echo "$addr $h  $TAG" >> /etc/hosts
    echo "$h" >> "$DIR/hosts"
    echo "$h $addr $r" >> "$DIR/links"
  done
  for c in "${cpus[@]}"; do
    local h=${c%%=*} f=${c#*=}
    grep -qx "$h" "$DIR/hosts" || die "--cpu $c: no host $h"
    mkdir -p "$CGROUP/hetsync-$h"
    local period; period=$(cat "$CGROUP/hetsync-$h/cpu.cfs_period_us")
    python3 -c "import sys; f=float(sys.argv[1]); assert 0 < f <= 64, f" "$f" || die "--cpu $c: F must be > 0"
    echo $(python3 -c "import sys; print(int(float(sys.argv[1]) * int(sys.argv[2])))" "$f" "$period") \
      > "$CGROUP/hetsync-$h/cpu.cfs_quota_us"
    echo $((1024 * 64)) > "$CGROUP/hetsync-$h/cpu.shares"
    echo "$h $f" >> "$DIR/cpu"
  done
  write_agent
  trap - ERR
  say "up: $n hosts ($(paste -sd, "$DIR/hosts")) on $BRIDGE $SUBNET.0/24, links $rate (tbf latency $lat)$( [ ${#cpus[@]} -gt 0 ] && echo ", cpu ${cpus[*]}")"
}

write_agent() {  # Open MPI's plm_rsh_agent: "agent [options] HOST CMD" -> CMD on HOST
  cat > "$DIR/agent" <<EOF
#!/usr/bin/env bash
# Open MPI rsh agent of the emulated cluster (scripts/cluster.sh): runs CMD on host HOST.
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done   # rsh options Open MPI may pass
host=\$1; shift
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh" exec "\$host" "\$@"
EOF
  chmod +x "$DIR/agent"
}

exec_on() {  # exec_on HOST CMD...: CMD in the host's namespace, with its host name and CPU quota
  local h=$1; shift
  grep -qx "$h" "$DIR/hosts" 2>/dev/null || die "no host $h (scripts/cluster.sh up first)"
  # the cgroup first: `ip netns exec` mounts the namespace's own /sys, where the cgroup tree is not
  [ -d "$CGROUP/hetsync-$h" ] && echo $$ > "$CGROUP/hetsync-$h/cgroup.procs"
  exec ip netns exec "hs-$h" unshare --uts /bin/sh -c 'hostname "$0"; exec /bin/sh -c "$*"' "$h" "$@"
}

mpi_args() {  # the Open MPI options every cross-host launch needs
  echo --mca plm_rsh_agent "$DIR/agent" --mca oob_tcp_if_include "$SUBNET.0/24" \
       --mca btl_tcp_if_include "$SUBNET.0/24" --mca btl self,vader,tcp --bind-to none --oversubscribe
}

status() {
  [ -f "$DIR/hosts" ] || { say "no cluster"; return 0; }
  cat "$DIR/links"
  [ -f "$DIR/cpu" ] && sed 's/^/cpu /' "$DIR/cpu"
  return 0
}

cmd=${1:-}; shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  exec) exec_on "$@" ;;
  mpirun) [ -f "$DIR/agent" ] || die "no cluster (scripts/cluster.sh up first)"
          exec mpirun $(mpi_args) "$@" ;;
  horovodrun) [ -f "$DIR/agent" ] || die "no cluster (scripts/cluster.sh up first)"
          exec horovodrun --mpi-args="$(mpi_args)" --network-interface "$BRIDGE" "$@" ;;
  mpi-args) mpi_args ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac

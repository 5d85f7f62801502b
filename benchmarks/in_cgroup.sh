#!/bin/sh
# Runs one rank of a benchmark job inside its own CPU-quota cgroup (benchmarks/quota.py made it), then execs the
# command: the rank's every thread -- TensorFlow's, Horovod's, hetsync's -- shares the quota, as on a slow node.
# The rank comes from the launcher (Open MPI: OMPI_COMM_WORLD_RANK); the cgroup root from HETSYNC_BENCH_CGROUP.
set -e
rank="${OMPI_COMM_WORLD_RANK:?in_cgroup.sh runs under mpirun or horovodrun --mpi}"
group="${HETSYNC_BENCH_CGROUP:?set by benchmarks/run.py}/r$rank"
[ -d "$group" ] || { echo "in_cgroup.sh: no cgroup $group (benchmarks/quota.py makes one per rank)" >&2; exit 2; }
echo $$ > "$group/cgroup.procs"
exec "$@"

"""Benchmark (not a test), eager-SGD §6.1 (Fig 8/9): solo and majority allreduce vs MPI_Allreduce under a linear
skew.  Run with ``mpirun -np 8 --oversubscribe python tests/mpi/bench_partial.py``.

Each repetition: a barrier, then rank r sleeps r x skew (the paper's linearly skewed processes), then calls the
collective; the latency is the time from the call to its return on that rank.  Printed (rank 0, one JSON line): the
mean latency over ranks and repetitions of solo, majority and plain MPI_Allreduce (mpi4py, on a communicator of
the same ranks), their ratios, and the mean number of active processes per round (ranks whose call waited for the
round; the paper's NAP: ~1 for solo, ~P/2 for majority) and of contributors (stale data included).
No Horovod: MPI comes from mpi4py (MPI_THREAD_MULTIPLE), the engine runs on it as it does under Horovod.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kb", type=float, default=16.0, help="message size in KB (float32)")
    parser.add_argument("--skew-ms", type=float, default=2.0, help="rank r sleeps r x this before each call")
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()

    from mpi4py import MPI

    from hetsync import ops, ops_partial

    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    ops.engine_start(timeout=60.0)
    n = max(1, int(args.kb * 1024 / 4))
    x = tf.constant(np.full(n, rank + 1.0, np.float32))
    sendbuf = np.full(n, rank + 1.0, np.float32)
    recvbuf = np.empty_like(sendbuf)

    def partial(mode):
        fn = tf.function(lambda t: ops_partial.partial_allreduce(t, mode=mode, name=f"bench-{mode}", seed=1))
        return lambda: fn(x)

    def mpi():
        comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)

    def quiet_barrier():
        # Not MPI_Barrier: with 8 processes on 2 cores, ranks spinning in it would steal the CPU of the ranks still
        # timing their call.
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.0002)

    results = {}
    for label, call in (("mpi_allreduce", mpi), ("solo", partial("solo")), ("majority", partial("majority"))):
        latencies, active, nap = [], [], []
        for rep in range(args.warmup + args.reps):
            quiet_barrier()
            time.sleep(rank * args.skew_ms / 1000.0)
            t0 = time.perf_counter()
            out = call()
            dt = time.perf_counter() - t0
            if rep >= args.warmup:
                latencies.append(dt)
                if out is not None:
                    active.append(int(out.active))
                    nap.append(int(out.nap))
        # the slowest rank's partial calls must not spill into the next collective's timing
        ops.set_availability(ops.AWAY)
        quiet_barrier()
        time.sleep(0.05)
        quiet_barrier()
        ops.set_availability(ops.IN_STEP)
        mean_latency = comm.allreduce(float(np.mean(latencies)), op=MPI.SUM) / size
        results[label] = {"mean_latency_ms": 1000 * mean_latency}
        if active:
            results[label]["mean_active"] = comm.allreduce(float(np.mean(active)), op=MPI.SUM) / size
            results[label]["mean_contributors"] = comm.allreduce(float(np.mean(nap)), op=MPI.SUM) / size
    base = results["mpi_allreduce"]["mean_latency_ms"]
    for label in ("solo", "majority"):
        results[label]["speedup_vs_mpi"] = base / results[label]["mean_latency_ms"]
    if rank == 0:
        print("RESULT " + json.dumps({"processes": size, "kb": args.kb, "skew_ms": args.skew_ms, "reps": args.reps,
                                      **results}), flush=True)
    ops.engine_shutdown()


if __name__ == "__main__":
    main()

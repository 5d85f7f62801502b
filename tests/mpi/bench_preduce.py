"""Benchmark (not a test): P-Reduce of a float32 buffer over all ranks vs plain MPI_Allreduce (mpi4py) of the same
size on a communicator of the same ranks. Run with ``mpirun -np 4 --oversubscribe python tests/mpi/bench_preduce.py``.

Both are timed twice: before hvd.init() and with Horovod's background thread running (as in training); on an
oversubscribed machine the two differ a lot. Each rep is timed
after a barrier and the slowest rank's time counts (a collective is as slow as its last
member); the medians over the reps are printed on rank 0, with their ratio. P-Reduce's time includes what a user
pays: the TF op, the copy into the fused buffer and back, the header exchange, the progress-thread polling and the
division by the group size.
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
import horovod.tensorflow as hvd  # noqa: E402


def timed(comm, fn, reps):
    from mpi4py import MPI

    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(comm.allreduce(dt, op=MPI.MAX))
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=10.0, help="buffer size in MB (float32)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    # mpi4py initialises MPI (MPI_THREAD_MULTIPLE) first, so both can also be timed before Horovod's background
    # thread exists (the engine needs only MPI_THREAD_MULTIPLE); hvd.init() then reuses that MPI.
    from mpi4py import MPI

    from hetsync import ops

    comm = MPI.COMM_WORLD.Dup()  # a communicator of the same ranks as the P-Reduce group
    n = int(args.mb * 1e6 / 4)
    buf = np.full(n, comm.rank, np.float32)
    x = tf.constant(np.full(n, comm.rank, np.float32))
    group = list(range(comm.size))

    def mpi_allreduce():
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def preduce():
        ops.p_reduce(x, group).numpy()

    def preduce_fp16():
        ops.p_reduce(x, group, compression="fp16").numpy()

    def measure():
        for _ in range(args.warmup):
            preduce()
            mpi_allreduce()
        t_mpi = timed(comm, mpi_allreduce, args.reps)
        t_pr = timed(comm, preduce, args.reps)
        t_mpi2 = timed(comm, mpi_allreduce, args.reps)  # again, to see the noise
        preduce_fp16()
        t_half = timed(comm, preduce_fp16, args.reps)
        return t_pr, t_mpi, t_mpi2, t_half

    ops.engine_start(timeout=120.0)
    alone = measure()
    hvd.init()
    with_hvd = measure()
    if comm.rank == 0:
        print(f"buffer {args.mb:g} MB float32 on {comm.size} ranks, median of {args.reps} reps (slowest rank)")
        for label, (t_pr, t_mpi, t_mpi2, t_half) in (("before hvd.init()", alone), ("Horovod running", with_hvd)):
            base = min(t_mpi, t_mpi2)
            print(f"  {label:18s}: MPI_Allreduce {t_mpi * 1e3:7.2f} ms (repeat {t_mpi2 * 1e3:7.2f} ms), "
                  f"P-Reduce {t_pr * 1e3:7.2f} ms, ratio P-Reduce / MPI_Allreduce {t_pr / base:.2f}; "
                  f"P-Reduce fp16 {t_half * 1e3:7.2f} ms ({t_half / base:.2f})")
        print("RESULT " + json.dumps({label: dict(mpi_ms=min(t_mpi, t_mpi2) * 1e3, preduce_ms=t_pr * 1e3,
                                                  fp16_ms=t_half * 1e3) for label, (t_pr, t_mpi, t_mpi2, t_half)
                                      in (("alone", alone), ("horovod", with_hvd))}), flush=True)
    comm.Free()
    ops.engine_shutdown()


if __name__ == "__main__":
    main()

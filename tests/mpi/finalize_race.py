"""Run under mpirun (2 ranks): Horovod finalizes MPI while the engine's progress thread is inside a section of MPI
calls (tests/test_exits.py).

HETSYNC_ENGINE_TEST_PAUSE_MS makes every progress-loop section pause between asking whether MPI is still usable and
its first MPI call, and the loop spends nearly all its time in that pause: ``hvd.shutdown()`` (Horovod's thread calls
``MPI_Finalize``) lands inside one.  Asking ``MPI_Finalized`` before the calls is not enough: the section's next call
would come after ``MPI_Finalize`` and Open MPI aborts the process (SIGABRT, "called after MPI_FINALIZE").  The
engine's finalize hook makes ``MPI_Finalize`` wait for the section instead; then the progress thread stops, and a
later hetsync operation fails with "MPI was finalized".  Ends with ``OK rank=R``."""
import os
import sys
import time
import traceback

os.environ["HETSYNC_ENGINE_TEST_PAUSE_MS"] = "500"  # read when the engine starts

import tensorflow as tf  # noqa: E402
from engine_util import barrier, hvd, start  # noqa: E402


def main():
    ops = start()
    rank = hvd.rank()
    got = ops.p_reduce(tf.constant([float(rank)]), [0, 1])  # the engine works under the pause
    assert abs(float(got.numpy()[0]) - 0.5) < 1e-6, got
    barrier()  # both ranks finalize together, each while its progress thread sits in a section
    began = time.monotonic()
    hvd.shutdown()  # MPI_Finalize on Horovod's background thread
    print(f"rank {rank}: hvd.shutdown() took {time.monotonic() - began:.2f} s", flush=True)
    try:
        ops.p_reduce(tf.constant([1.0]), [0, 1], timeout=5)
    except tf.errors.OpError as exc:
        assert "MPI was finalized" in str(exc), exc
    else:
        raise AssertionError("a P-Reduce after MPI_Finalize did not fail")
    return rank


if __name__ == "__main__":
    try:
        done = main()
    except BaseException:  # noqa: BLE001 -- report anything, then die loudly (hvd.rank() is gone after shutdown)
        traceback.print_exc()
        print(f"FAIL rank={os.environ.get('OMPI_COMM_WORLD_RANK')}", flush=True)
        sys.stderr.flush()
        os._exit(1)
    print(f"OK rank={done}", flush=True)

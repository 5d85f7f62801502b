"""`import hetsync` touches nothing, and either import order works (tests/test_exits.py).

Rank 0 imports hetsync before ``hvd.init()``, rank 1 after it, as a user adds the import next to its use.  Checked:
the import initializes no MPI and changes no environment variable; ``hetsync.init()`` logs no warning in either
order; the engine's MPI setting goes in at ``hetsync.init()`` through MPI_T and reads back, and a user's own
``OMPI_MCA_`` setting is left alone.  Each rank then runs a P-Reduce so that the
engine is busy up to the end, and the job exits 0 on both ranks (the exit handshake orders the engine's last MPI
call before Horovod's finalization).  Ends with ``OK rank=R``."""
import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import mpi4py  # noqa: E402

mpi4py.rc.initialize = False  # only asks; MPI is Horovod's to start
from mpi4py import MPI  # noqa: E402

RANK = int(os.environ["OMPI_COMM_WORLD_RANK"])
SETTING = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def import_hetsync():
    before = dict(os.environ)
    import hetsync  # noqa: F401 -- the check is what importing it does

    assert dict(os.environ) == before, "import hetsync changed the environment"
    return hetsync


def main():
    hetsync = import_hetsync() if RANK == 0 else None
    assert not MPI.Is_initialized(), "import hetsync initialized MPI"
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    if hetsync is None:
        hetsync = import_hetsync()
    caught = Records()
    logging.getLogger("hetsync").addHandler(caught)
    with warnings.catch_warnings(record=True) as python_warnings:
        warnings.simplefilter("always")
        hetsync.init()
    from hetsync import ops

    assert not caught.records and not python_warnings, (
        [r.getMessage() for r in caught.records], [str(w.message) for w in python_warnings])
    assert ops.mpi_settings() == ["coll_libnbc_iallreduce_algorithm=1 (hetsync)"], ops.mpi_settings()
    out = ops.p_reduce(tf.fill([1000], float(RANK + 1)), [0, 1])
    assert abs(float(out[0]) - 1.5) < 1e-6, out[:3]
    # A user's own setting is left alone: set (as mpirun -x or --mca would) on every rank -- a collective algorithm
    # must be the same on all ranks -- with the value MPI already has, then hetsync restarted.
    hetsync.shutdown()
    os.environ[SETTING] = "1"
    hetsync.init()
    assert ops.mpi_settings() == ["coll_libnbc_iallreduce_algorithm=1 (user)"], ops.mpi_settings()
    out = ops.p_reduce(tf.fill([1000], float(RANK + 1)), [0, 1])
    assert abs(float(out[0]) - 1.5) < 1e-6, out[:3]
    print(f"OK rank={RANK}", flush=True)


if __name__ == "__main__":
    main()

"""A script that calls hvd.init() before `import hetsync` (tests/test_exits.py): Horovod then owns MPI's
finalization, and hetsync.init() says so once, on rank 0, naming the fix.  Ends with ``OK rank=R``."""
import os
import sys

import horovod.tensorflow.keras as hvd

hvd.init()  # before `import hetsync`: the order docs/engine.md ("Who finalizes MPI") asks users to avoid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import hetsync  # noqa: E402
from hetsync import _mpi_early  # noqa: E402

assert _mpi_early.horovod_owns_mpi(), "MPI was started by Horovod here, hetsync must see that"
hetsync.init()
hetsync.shutdown()
print(f"OK rank={hvd.rank()}", flush=True)

"""MPI is started by hetsync, before Horovod, in a process an MPI launcher started (``mpirun``, ``horovodrun --mpi``).

Why: Horovod finalizes MPI itself when it was the one to initialize it, on its background thread, as soon as it
shuts down -- also when an exception on another rank shuts it down, while hetsync's engine thread may be inside an
MPI call (a segfault at exit, issue 18).  When MPI is already initialized at ``hvd.init()``, Horovod leaves the
finalization to whoever initialized it: hetsync then finalizes at exit, after its own shutdown (the engine thread
has stopped) and after Horovod's.  This needs ``import hetsync`` before ``hvd.init()``, as scripts do; otherwise
Horovod keeps its usual role (and the engine's progress thread stops when it sees MPI finalized).
``HETSYNC_EARLY_MPI=0`` turns it off.  MPI started here gets :data:`MPI_DEFAULTS` (a user's own setting wins).
"""
import atexit
import ctypes
import os

MPI_THREAD_MULTIPLE = 3  # Open MPI's mpi.h (hetsync runs on Open MPI, docs/engine.md)
# Open MPI settings hetsync starts MPI with unless the user set them (the environment, as mpirun -x or --mca do):
# the engine's non-blocking allreduces (OD-SGD's transfer, P-Reduce's groups) run on Open MPI's libnbc, whose own
# choice for an in-place MPI_Iallreduce on 4 ranks is not its ring; across 2 emulated hosts on 100 Mbit/s links
# the ring made OD-SGD +73% faster than allreduce where the default made it +18% (docs/cluster.md).
MPI_DEFAULTS = {"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "1"}  # 1 = ring
LIBRARY = "libmpi.so.40"  # the Open MPI that Horovod was built against (scripts/install.sh)
_STATE = {"lib": None}


def init_before_horovod():
    """MPI_Init_thread(MPI_THREAD_MULTIPLE) when launched by mpirun and MPI is not started yet; else nothing."""
    from hetsync import env

    if env.get("HETSYNC_EARLY_MPI") == "0" or "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return False
    try:
        lib = ctypes.CDLL(LIBRARY, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    started = ctypes.c_int(0)
    lib.MPI_Initialized(ctypes.byref(started))
    if started.value:
        return False
    apply_defaults(os.environ)
    provided = ctypes.c_int(0)
    if lib.MPI_Init_thread(None, None, MPI_THREAD_MULTIPLE, ctypes.byref(provided)) != 0:
        return False
    _STATE["lib"] = lib
    atexit.register(_finalize)  # before hvd.init() registers Horovod's shutdown: runs after it
    return True


def horovod_owns_mpi():
    """True when a launcher started this process, hetsync's early start was not turned off, and MPI was started by
    someone else (``hvd.init()`` ran before ``import hetsync``): Horovod then finalizes MPI on its own thread when
    any rank exits, possibly under the engine's thread (hetsync.init warns)."""
    from hetsync import env

    return (_STATE["lib"] is None and "OMPI_COMM_WORLD_SIZE" in os.environ
            and env.get("HETSYNC_EARLY_MPI") != "0")


def apply_defaults(environ):
    """:data:`MPI_DEFAULTS` into ``environ`` where the user has not set them (read by MPI_Init_thread)."""
    for name, value in MPI_DEFAULTS.items():
        environ.setdefault(name, value)
    return environ


def _finalize():
    """At exit, last: MPI_Finalize -- unless an exception is ending this process (its peers may never come to the
    finalization's synchronization; the launcher ends the job when this process exits non-zero)."""
    from hetsync import _runtime

    lib = _STATE["lib"]
    if lib is None or _runtime.failed():
        return
    done = ctypes.c_int(0)
    lib.MPI_Finalized(ctypes.byref(done))
    if not done.value:
        lib.MPI_Finalize()

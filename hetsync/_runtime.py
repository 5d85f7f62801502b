"""Process-wide hetsync state: start/stop of the C++ engine and the job layout, all taken from Horovod.

hetsync does not launch or rank processes itself: Horovod (on MPI) does.  ``init()`` checks that Horovod runs on an
MPI that allows several threads (the engine's progress thread talks MPI beside Horovod's background thread), then
starts the engine on its own duplicated communicator, and, on rank 0, the coordinator services a mode needs.
"""
import atexit

from hetsync import env
from hetsync.algorithms.options import Option, check_all

_STATE = {"initialized": False, "timeout": None, "services": None, "failed": False}

DEFAULT_TIMEOUT_S = env.VARS["HETSYNC_TIMEOUT"].default  # 120 s
# Each default is its environment variable's (hetsync/env.py), used when the argument is None.
INIT_OPTIONS = {
    "timeout": Option(DEFAULT_TIMEOUT_S, "number", minimum=0, above=True,
                      doc="seconds any blocking wait may last before it fails naming the ranks"),
    "comm_cache_size": Option(env.VARS["HETSYNC_COMM_CACHE_SIZE"].default, "int", minimum=1,
                              doc="communicator cache bound", paper="Ripples §6.1"),
    # ops.DEFAULT_AWAY_AFTER_S's value (tests/test_docs.py checks): ops imports nothing from hetsync, and init checks
    # its arguments before loading the engine (tests/test_bad_input.py runs init without Horovod)
    "away_after": Option(env.VARS["HETSYNC_AWAY_AFTER"].default, "number", minimum=0, above=True,
                         doc="seconds between train steps before peers go on without a rank"),
}


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def _check_horovod(hvd):
    """Raises a RuntimeError naming what is missing; every rank runs the same checks, so every rank raises."""
    from hetsync import compat

    refusal = compat.runtime_problem()  # Elastic Horovod (docs/compatibility.md)
    if refusal:
        raise RuntimeError(refusal)
    try:
        initialized = hvd.is_initialized()
    except (AttributeError, ValueError):
        initialized = False
    if not initialized:
        raise RuntimeError("hetsync.init() needs Horovod: call hvd.init() first")
    if not hvd.mpi_enabled():
        raise RuntimeError(
            "hetsync needs Horovod running on MPI (its engine shares the MPI job): launch with "
            "`horovodrun --mpi -np N ...` or `mpirun -np N ...`, not with the Gloo controller")
    if not hvd.mpi_threads_supported():
        raise RuntimeError(
            "hetsync needs MPI_THREAD_MULTIPLE (its progress thread runs beside Horovod's); this MPI or "
            "HOROVOD_MPI_THREADS_DISABLE=1 does not provide it")


def init(timeout=None, comm_cache_size=None, away_after=None):
    """Starts hetsync after ``hvd.init()``.

    Args:
      timeout: seconds any blocking hetsync wait may last before it fails with an error naming the ranks it waited
        for (default: env ``HETSYNC_TIMEOUT`` or 120).
      comm_cache_size: communicator cache bound (Ripples §6.1); default env ``HETSYNC_COMM_CACHE_SIZE`` or 64.
      away_after: seconds a rank may stay between two train steps (in callbacks) before its peers stop waiting for
        it and go on without it (default env ``HETSYNC_AWAY_AFTER`` or 0.2; docs/engine.md "Availability").
    """
    if _STATE["initialized"]:
        return
    if timeout is None:
        timeout = env.get("HETSYNC_TIMEOUT")
    if comm_cache_size is None:
        comm_cache_size = env.get("HETSYNC_COMM_CACHE_SIZE")
    if away_after is None:
        away_after = env.get("HETSYNC_AWAY_AFTER")
    check_all("hetsync.init", INIT_OPTIONS,
              {"timeout": timeout, "comm_cache_size": comm_cache_size, "away_after": away_after})
    hvd = _hvd()
    _check_horovod(hvd)
    from hetsync import _logging

    _logging.configure(hvd.rank())  # the "hetsync" logger's defaults, unless the application set it up
    _warn_if_horovod_owns_mpi(hvd.rank())
    from hetsync import ops
    ops.set_away_after(away_after)
    ops.engine_start(timeout=timeout, cache_size=comm_cache_size)
    info = ops.engine_info()
    if info["rank"] != hvd.rank() or info["size"] != hvd.size():
        raise RuntimeError(
            f"hetsync's MPI world (rank {info['rank']} of {info['size']}) differs from Horovod's "
            f"(rank {hvd.rank()} of {hvd.size()}): run one Horovod job per MPI job")
    _STATE.update(initialized=True, timeout=timeout)
    from hetsync.coordinator.services import JobServices

    _STATE["services"] = JobServices(hvd, timeout)
    from hetsync import training

    training.install()
    _watch_for_failure()
    _at_exit(shutdown)


def _warn_if_horovod_owns_mpi(rank):
    """``hvd.init()`` before ``import hetsync`` leaves MPI's finalization to Horovod's thread, which runs it as soon as
    any rank exits: a rank whose engine is still inside an MPI call then crashes at exit (signal 11, rarely; seen
    in the engine tests' harness).  Said once, on rank 0."""
    from hetsync import _mpi_early

    if rank == 0 and _mpi_early.horovod_owns_mpi():
        import logging

        logging.getLogger("hetsync").warning(
            "hvd.init() ran before `import hetsync`: Horovod started MPI and finalizes it on its own thread as soon as "
            "any rank exits, which can crash a rank's hetsync engine at exit; put `import hetsync` before hvd.init() "
            "(docs/engine.md, 'Who finalizes MPI'; HETSYNC_EARLY_MPI=0 silences this)")


def _watch_for_failure():
    """An uncaught exception marks the process failed (after its traceback is printed, by the previous hook), so
    the exit's :func:`shutdown` waits for no peer: they will not come, and the launcher ends the job when this
    process exits non-zero.  Without it the exit would sit in the Group Generator's wait and the engine's
    barriers, up to the timeout each."""
    import sys

    if getattr(sys.excepthook, "_hetsync", False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        _STATE["failed"] = True
        previous(kind, value, traceback)

    hook._hetsync = True
    sys.excepthook = hook


def _at_exit(fn):
    """Runs ``fn`` when the interpreter exits, before ``concurrent.futures`` shuts its thread pools down (threading's
    exit hooks run before atexit's, last registered first): rank 0's coordinator server answers from such a pool,
    and the other ranks' last calls (finishing with the Group Generator) need it.  Scripts rarely call
    ``hetsync.shutdown()`` themselves, so this path is the usual one."""
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is None:
        atexit.register(fn)
        return
    register(fn)
    atexit.register(fn)  # a no-op when the first one ran (shutdown is idempotent)


def shutdown():
    """Stops everything hetsync started in this process: the modes' threads (Group Generator away watchers), the
    coordinator clients' channels, rank 0's server, the engine's progress thread.  Collective when the job ends
    normally (the Group Generator hears every rank finish; the engine drains its communicator); after an uncaught
    exception nothing waits for a peer.  Runs at exit by itself; safe to call twice."""
    if not _STATE["initialized"]:
        return
    failed = _STATE["failed"]
    services = _STATE.get("services")
    _STATE.update(initialized=False, services=None)
    from hetsync import ops

    try:
        if services is not None:
            services.stop(failed=failed)
    finally:
        ops.engine_shutdown(drain=not failed)


def failed():
    """True once an uncaught exception is ending this process (shutdown then waits for no peer)."""
    return _STATE["failed"]


def is_initialized():
    return _STATE["initialized"]


def require_init(what):
    if not _STATE["initialized"]:
        raise RuntimeError(f"{what} needs hetsync.init() (after hvd.init())")


def timeout():
    return _STATE["timeout"] or DEFAULT_TIMEOUT_S


def services():
    require_init("the coordinator services")
    return _STATE["services"]


def hosts():
    """Every rank's host name, gathered once at ``init`` (the job's real placement: machines of any size)."""
    return list(services().hosts)


def rank():
    return _hvd().rank()


def size():
    return _hvd().size()


def local_rank():
    return _hvd().local_rank()


def local_size():
    return _hvd().local_size()

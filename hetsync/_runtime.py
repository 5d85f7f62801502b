"""Process-wide hetsync state: start/stop of the C++ engine and the job layout, all taken from Horovod.

hetsync does not launch or rank processes itself: Horovod (on MPI) does.  ``init()`` checks that Horovod runs on an
MPI that allows several threads (the engine's progress thread talks MPI beside Horovod's background thread), then
starts the engine on its own duplicated communicator, and, on rank 0, the coordinator services a mode needs.
"""
import atexit
import os

_STATE = {"initialized": False, "timeout": None, "services": None}

DEFAULT_TIMEOUT_S = 120.0


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def _check_horovod(hvd):
    """Raises a RuntimeError naming what is missing; every rank runs the same checks, so every rank raises."""
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
    hvd = _hvd()
    _check_horovod(hvd)
    if timeout is None:
        timeout = float(os.environ.get("HETSYNC_TIMEOUT", DEFAULT_TIMEOUT_S))
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if comm_cache_size is None:
        comm_cache_size = int(os.environ.get("HETSYNC_COMM_CACHE_SIZE", 64))
    from hetsync import ops

    if away_after is None:
        away_after = float(os.environ.get("HETSYNC_AWAY_AFTER", ops.DEFAULT_AWAY_AFTER_S))
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
    _at_exit(shutdown)


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
    """Stops the coordinator services and the engine. Safe to call twice."""
    if not _STATE["initialized"]:
        return
    services = _STATE.get("services")
    if services is not None:
        services.stop()
    from hetsync import ops

    ops.engine_shutdown()
    _STATE.update(initialized=False, services=None)


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


def rank():
    return _hvd().rank()


def size():
    return _hvd().size()


def local_rank():
    return _hvd().local_rank()


def local_size():
    return _hvd().local_size()

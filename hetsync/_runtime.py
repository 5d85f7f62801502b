"""Process-wide hetsync state: start/stop of the C++ engine and the job layout, all taken from Horovod.

hetsync does not launch or rank processes itself: Horovod (on MPI) does.  ``init()`` checks that Horovod runs on an
MPI that allows several threads (the engine's progress thread talks MPI beside Horovod's background thread), then
starts the engine on its own duplicated communicator, and, on rank 0, the coordinator services a mode needs.
"""
import atexit

from hetsync import _logging, compat, env, ops
from hetsync.algorithms.options import Option, check_all
from hetsync.coordinator.services import JobServices

_STATE = {"initialized": False, "timeout": None, "services": None}

DEFAULT_TIMEOUT_S = env.VARS["HETSYNC_TIMEOUT"].default  # 120 s
# How long a failing process waits for its peers' engines to answer that they stopped calling MPI, before its exit
# shuts Horovod down (and every rank's Horovod finalizes MPI): a peer answers within a progress-loop tick (<= 1 ms
# when idle; longer on an oversubscribed machine); the wait ends early once every peer answered.
ABORT_WAIT_S = 10.0
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

    _logging.configure(hvd.rank())  # the "hetsync" logger's defaults, unless the application set it up
    ops.set_away_after(away_after)
    ops.engine_start(timeout=timeout, cache_size=comm_cache_size)
    info = ops.engine_info()
    if info["rank"] != hvd.rank() or info["size"] != hvd.size():
        raise RuntimeError(
            f"hetsync's MPI world (rank {info['rank']} of {info['size']}) differs from Horovod's "
            f"(rank {hvd.rank()} of {hvd.size()}): run one Horovod job per MPI job")
    _STATE.update(initialized=True, timeout=timeout)

    _STATE["services"] = JobServices(hvd, timeout)
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
    """Stops everything hetsync started in this process: the modes' threads (Group Generator away watchers), the
    coordinator clients' channels, rank 0's server, the engine's progress thread.  Collective when the job ends
    normally (the Group Generator hears every rank finish; the engine drains its communicator); after an uncaught
    exception nothing waits for a peer.  Runs at exit by itself; safe to call twice."""
    if not _STATE["initialized"]:
        return
    failing = failed()
    services = _STATE.get("services")
    _STATE.update(initialized=False, services=None)

    try:
        if services is not None:
            services.stop(failed=failing)
    finally:
        if failing:
            ops.engine_abort(wait_s=ABORT_WAIT_S)
        else:
            ops.engine_shutdown(drain=True)
    if not failing:
        _exit_handshake()


def _exit_handshake():
    """One Horovod allreduce after the engine's drain, on every rank: no rank's Horovod shuts down before every
    rank's engine has made its last MPI call.

    Why: Horovod finalizes MPI (it started it, at ``hvd.init()``) on its background thread as soon as any rank's
    Horovod shuts down, and a rank's engine still inside an MPI call then crashes.  hetsync's exit hook runs before
    Horovod's (registered later, run first), so this allreduce is every rank's last Horovod call before its
    Horovod's shutdown; a rank that never comes (it failed: its launcher ends the job) ends the wait with Horovod's
    own shutdown error, which is ignored here."""
    import tensorflow as tf

    hvd = _hvd()
    try:
        hvd.allreduce(tf.constant(0, tf.int32), op=hvd.Sum, name="hetsync.exit_handshake")
    except Exception as exc:  # noqa: BLE001 -- Horovod already shut down elsewhere: nothing left to order
        import logging

        logging.getLogger("hetsync").debug("exit handshake skipped: %s", exc)


def failed():
    """True once an uncaught exception is ending this process (shutdown then waits for no peer: they will not come,
    and the launcher ends the job when this process exits non-zero).  Python sets ``sys.last_value`` before it
    prints an uncaught exception, which is before the exit hooks run: no ``sys.excepthook`` of ours is needed."""
    import sys

    return getattr(sys, "last_value", None) is not None


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

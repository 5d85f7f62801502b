"""Python side of hetsync's C++ engine: P-Reduce (Ripples §3.2/§6.1), the non-blocking allreduce, availability,
and the engine controls (eager-SGD's partial allreduce: ops_partial.py; Hop's queues: ops_hop.py).

Everything here is a thin wrapper around the ops in ``hetsync/_lib/hetsync_ops.so`` (built from ``tf_ops/``).
The engine itself is described in docs/engine.md. This module deliberately imports nothing from the rest of
``hetsync``: the world rank/size come from the engine's own ``HetsyncEngineInfo`` op.
"""
import atexit
import ctypes
import os

import numpy as np
import tensorflow as tf

_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib", "hetsync_ops.so")


def _load_library():
    if not os.path.exists(_LIB_PATH):
        raise ImportError(
            f"hetsync's native library is missing ({_LIB_PATH}). Build it from the repository root with "
            "`make -C tf_ops PYTHON=$(which python)` or reinstall with `pip install -e .`")
    try:
        return tf.load_op_library(_LIB_PATH)
    except (tf.errors.NotFoundError, OSError) as e:
        raise ImportError(
            f"could not load {_LIB_PATH} into TensorFlow {tf.__version__} ({e}); it was probably built against "
            "another TensorFlow or MPI: rebuild with `make -C tf_ops clean all PYTHON=$(which python)`") from e


_lib = _load_library()
# The same library (dlopen returns the loaded handle): the C entry points that report availability are two atomic
# stores, cheap enough to call around every train step.
_clib = ctypes.CDLL(_LIB_PATH)
_clib.hetsync_set_availability.argtypes = [ctypes.c_int]
_clib.hetsync_engine_abort.argtypes = [ctypes.c_double]
_clib.hetsync_get_availability.restype = ctypes.c_int
_clib.hetsync_set_away_after.argtypes = [ctypes.c_double]
_clib.hetsync_engine_away.restype = ctypes.c_int
_clib.hetsync_pin_away.argtypes = [ctypes.c_int]

# Order of the HetsyncEngineStats vector (tf_ops/engine/engine.cc, kStatNames).
STAT_NAMES = ("preduces", "bytes", "cache_hits", "cache_misses", "cache_size", "uncached_creations",
              "withdrawals_seen", "session", "withdrawn", "failed", "away_events", "self_excluded",
              "peers_excluded", "away", "wire_bytes", "partial_rounds", "partial_contributed",
              "partial_staleness_sum", "partial_included", "partial_missed", "partial_pending", "partial_schedules")

# Availability (tf_ops/engine/control.h): where this rank's Python thread is.
IN_STEP, BETWEEN, AWAY = 0, 1, 2
DEFAULT_AWAY_AFTER_S = 0.2

# Wire dtypes of the kernel; half precisions travel as float32 (the kernel has no half arithmetic and the
# average of half values is better computed in float32 anyway).
_WIRE = {tf.float32: tf.float32, tf.float64: tf.float64, tf.int32: tf.int32, tf.int64: tf.int64,
         tf.float16: tf.float32, tf.bfloat16: tf.float32}
_WIRE_ORDER = (tf.float32, tf.float64, tf.int32, tf.int64)  # one op per wire dtype, always in this order
_SUB_SCALE = tf.constant([len(_WIRE_ORDER), 1], tf.int64)  # explicit stream s -> engine streams 4s .. 4s+3

_info_cache = {}
_atexit_registered = [False]


def on_host():
    """The device scope of every data-carrying engine op: the host.  The ops have CPU kernels only (the engine
    reads and writes host memory, MPI does the transfer); placing them explicitly keeps a GPU user's model working
    even with soft device placement turned off.  TensorFlow copies a GPU tensor to the host before the op and the
    result back to the GPU where it is used: two PCIe copies of the synchronized tensors per exchange (docs/engine.md,
    "GPUs")."""
    return tf.device("/device:CPU:0")


def engine_info():
    """World rank, world size and MPI thread level (an int; MPI_THREAD_MULTIPLE is 3 in Open MPI and MPICH).

    Works before engine_start() as long as MPI is initialised (hvd.init()).
    """
    if not _info_cache:
        r, s, t = _lib.hetsync_engine_info()
        _info_cache.update(rank=int(r), size=int(s), thread_level=int(t))
    return dict(_info_cache)


def engine_start(timeout=120.0, cache_size=None):
    """Starts the engine; collective over all ranks, after ``hvd.init()``. While it runs, a second call changes
    nothing (to change settings: engine_shutdown() then engine_start() on every rank).

    Args:
      timeout: default per-operation deadline in seconds (a P-Reduce can override it).
      cache_size: communicator cache bound (Ripples §6.1); None: env ``HETSYNC_COMM_CACHE_SIZE`` or 64.
    """
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    cache = -1 if cache_size is None else int(cache_size)
    if cache_size is not None and cache < 0:
        raise ValueError(f"cache_size must be >= 0, got {cache_size}")
    _lib.hetsync_engine_start(timeout_seconds=float(timeout), cache_size=cache)
    if not _atexit_registered[0]:
        # Stop the progress thread before Horovod's atexit finalizes MPI (atexit runs last-registered first).
        # Local only: at exit a peer may already be gone, so no collective drain.
        atexit.register(lambda: _lib.hetsync_engine_shutdown(drain=False))
        _atexit_registered[0] = True


def mpi_settings():
    """The MPI settings the engine applied at its last start (tf_ops/engine/mpi_settings.h), one line each:
    ``name=value (hetsync)``, ``name=value (user)`` (the user's OMPI_MCA_name won) or ``name: not applied (why)``."""
    return [line.decode() for line in _lib.hetsync_mpi_settings().numpy().tolist()]


def set_availability(state):
    """Reports where this rank is: IN_STEP (peers wait for it), BETWEEN (left its step: away once it stays out
    longer than away_after), AWAY (OUT of every instance it has not started, at once).  Thread-safe, ~1 us."""
    if state not in (IN_STEP, BETWEEN, AWAY):
        raise ValueError(f"availability must be IN_STEP, BETWEEN or AWAY, got {state!r}")
    _clib.hetsync_set_availability(int(state))


def pin_away(away):
    """While pinned, this rank stays AWAY whatever else reports (an idle rank's injected delays are not compute)."""
    _clib.hetsync_pin_away(1 if away else 0)


def availability():
    return int(_clib.hetsync_get_availability())


def engine_away():
    """True while the engine counts this rank as away (it answers EXCLUDE to instances it has not started)."""
    return bool(_clib.hetsync_engine_away())


def set_away_after(seconds):
    """Seconds a rank may stay between two steps before peers stop waiting for it (default 0.2)."""
    if seconds is None or seconds < 0:
        raise ValueError(f"away_after must be >= 0 seconds, got {seconds!r}")
    _clib.hetsync_set_away_after(float(seconds))


def exclude(stream, seqs):
    """This rank is OUT of instances ``(stream, seq)`` for ``seq`` in ``seqs`` (a coordinator excluded it)."""
    seqs = [int(q) for q in seqs]
    if seqs:
        for k in range(len(_WIRE_ORDER)):  # every dtype sub-stream of p_reduce(instance=(stream, seq))
            _lib.hetsync_exclude(tf.constant(int(stream) * len(_WIRE_ORDER) + k, tf.int64),
                                 tf.constant(seqs, tf.int64))


def engine_shutdown(drain=True):
    """Stops the engine.  ``drain``: collective (drains stray control messages; each of its two barriers gives up
    after the engine timeout); False (this process is failing): no MPI call at all.  Idempotent."""
    _lib.hetsync_engine_shutdown(drain=bool(drain))


def engine_abort(wait_s=10.0):
    """This process is ending with an uncaught exception: stops the engine and tells every peer's engine to stop
    calling MPI, waiting up to ``wait_s`` for their answers (docs/engine.md, "Who finalizes MPI").  Idempotent."""
    _clib.hetsync_engine_abort(float(wait_s))


def withdraw():
    """Leaves the current P-Reduce session: peers waiting for this rank exclude it instead of waiting."""
    _lib.hetsync_withdraw()


def rejoin():
    """Starts a new P-Reduce session; call on every rank, after a global consensus step (e.g. hvd.allreduce)."""
    _lib.hetsync_rejoin()


def engine_stats():
    """Counters of the running (or last) engine, as a dict keyed by STAT_NAMES."""
    values = _lib.hetsync_engine_stats().numpy().tolist()
    return dict(zip(STAT_NAMES, values))


def validate_group(group, rank, size):
    """Returns the sorted list of ranks, or raises ValueError naming the problem (same words as the kernel)."""
    ranks = [int(r) for r in group]
    text = "[" + ", ".join(str(r) for r in ranks) + "]"
    if not ranks:
        raise ValueError("P-Reduce group is empty")
    dups = sorted({r for r in ranks if ranks.count(r) > 1})
    if dups:
        raise ValueError(f"P-Reduce group {text} has duplicate ranks {dups}")
    bad = sorted(r for r in ranks if r < 0 or r >= size)
    if bad:
        raise ValueError(f"P-Reduce group {text} has out-of-range ranks {bad} for world size {size}")
    if rank not in ranks:
        raise ValueError(f"P-Reduce group {text} lacks the calling rank {rank}")
    return sorted(ranks)


def _group_tensor(group):
    if isinstance(group, (tf.Tensor, tf.Variable)):
        # Graph tensors are checked by the kernel (InvalidArgumentError with the same wording).
        return tf.cast(group, tf.int32)
    arr = np.asarray(group)
    if arr.ndim != 1:
        raise ValueError(f"P-Reduce group must be a 1-D sequence of ranks, got {group!r}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"P-Reduce group must contain integer ranks, got {group!r}")
    info = engine_info()
    return tf.constant(validate_group(arr.tolist(), info["rank"], info["size"]), dtype=tf.int32)


def _instance_tensor(instance):
    if instance is None:
        return tf.constant([0, 0], tf.int64)
    if isinstance(instance, (tf.Tensor, tf.Variable)):
        return tf.cast(instance, tf.int64)
    stream, seq = instance
    if isinstance(stream, int) and not 0 < stream < 2 ** 62:
        raise ValueError(f"instance stream must be in [1, 2**62), got {stream}")
    return tf.stack([tf.cast(stream, tf.int64), tf.cast(seq, tf.int64)])


def _wire_half(compression):
    if compression is None:
        return False
    name = getattr(compression, "__name__", type(compression).__name__).lower()
    if "fp16" in name or compression == "fp16":
        return True
    if "none" in name or compression == "none":
        return False
    raise ValueError(f"compression must be None, 'fp16' or a Horovod Compression (none/fp16), got {compression!r}")


def p_reduce(tensors, group, timeout=None, name=None, instance=None, compression=None):
    """Averages ``tensors`` over the ranks in ``group`` (Ripples P-Reduce); every member must make the same call.

    Args:
      tensors: a tensor/variable or a list of them (any shapes; float16/bfloat16/float32/float64/int32/int64).
      group: world ranks including the caller: list/tuple/np array (checked here, ValueError) or an int tensor.
      timeout: seconds before the call fails with DeadlineExceededError naming the missing ranks; None: engine
        default. After a timeout the engine refuses further work until restarted (docs/engine.md).
      name: name scope.
      instance: ``(stream, seq)`` naming this P-Reduce the same on every member (an int64 [2] tensor inside a
        graph); seqs of one stream must increase on each rank.  None: the n-th call for this group.  A member that
        is away (between steps for too long, at an epoch end, finished) answers EXCLUDE and the others average
        without it (docs/engine.md).
      compression: None / 'fp16' / ``hvd.Compression.fp16``: float tensors travel and are summed as float16.

    Returns the averages in input order (a single tensor if a single tensor was given). Integers average with
    truncation toward zero. Tensors are fused per dtype into one buffer (Ripples §6.1); dtypes go in a fixed order
    chained by control dependencies, so every rank issues the same sequence of engine operations.
    """
    single = not isinstance(tensors, (list, tuple))
    items = [tf.convert_to_tensor(t) for t in ([tensors] if single else tensors)]
    if not items:
        raise ValueError("p_reduce needs at least one tensor")
    for t in items:
        if t.dtype not in _WIRE:
            raise TypeError(f"p_reduce does not support dtype {t.dtype.name}")
    group_t = _group_tensor(group)
    instance_t = _instance_tensor(instance)
    half = _wire_half(compression)
    timeout_s = -1.0 if timeout is None else float(timeout)
    if timeout is not None and timeout_s <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    results = [None] * len(items)
    with tf.name_scope(name or "p_reduce"):
        previous = []
        for k, wire in enumerate(_WIRE_ORDER):
            idx = [i for i, t in enumerate(items) if _WIRE[t.dtype] == wire]
            if not idx:
                continue
            # One engine op per wire dtype, each an instance of its own sub-stream (stream * 4 + dtype index).
            inst_k = instance_t if instance is None else instance_t * _SUB_SCALE + tf.constant([k, 0], tf.int64)
            with tf.control_dependencies(previous):
                inputs = [tf.cast(items[i], wire) if items[i].dtype != wire else items[i] for i in idx]
                with on_host():
                    outs = _lib.hetsync_p_reduce(tensors=inputs, group=group_t, instance=inst_k,
                                                 timeout_seconds=timeout_s, wire_half=half and wire == tf.float32)
            for i, out in zip(idx, outs):
                results[i] = tf.cast(out, items[i].dtype) if items[i].dtype != wire else out
            previous = list(outs)
    return results[0] if single else results


def allreduce_start(tensors, timeout=None, name=None):
    """Starts a SUM of ``tensors`` over every rank on the engine's progress thread; returns a handle at once.

    The non-blocking allreduce (docs/engine.md): the transfer runs while the caller goes on computing, and
    :func:`allreduce_wait` collects it -- in the same step or a later one (OD-SGD's gradient allreduce of step t
    overlaps step t+1's compute).  Every rank must start the same sequence of them with the same element counts; a
    rank that never starts one is named after ``timeout`` seconds (None: the engine default).  float32/float64
    tensors, all of one dtype; they travel fused in one buffer.  Returns an int64 scalar tensor (the handle).
    """
    items = [tf.convert_to_tensor(t) for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors])]
    if not items:
        raise ValueError("allreduce_start needs at least one tensor")
    dtypes = {t.dtype for t in items}
    if len(dtypes) != 1 or items[0].dtype not in (tf.float32, tf.float64):
        raise TypeError(f"allreduce_start takes float32 or float64 tensors of one dtype, got {sorted(d.name for d in dtypes)}")
    if timeout is not None and not float(timeout) > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    with tf.name_scope(name or "allreduce_start"), on_host():
        return _lib.hetsync_allreduce_start(tensors=items, timeout_seconds=-1.0 if timeout is None else float(timeout))


def allreduce_wait(handle, like, name=None):
    """Waits for the allreduce started as ``handle`` (each handle once); returns ``(sums, times)``: the sums shaped
    like the tensors/variables in ``like`` (a list), and ``times`` = [started, data phase began, done, this wait
    began], seconds of the monotonic clock (Python's ``time.monotonic``) as the engine saw them: ``done - wait``,
    when positive, is the part of the transfer the caller did not hide."""
    like = [tf.convert_to_tensor(t) for t in like]
    with tf.name_scope(name or "allreduce_wait"), on_host():
        sums, times = _lib.hetsync_allreduce_wait(handle=handle, like=like)
    return list(sums), times

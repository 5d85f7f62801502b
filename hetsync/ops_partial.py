"""Python side of eager-SGD's partial allreduce in the engine (eager-SGD §4, §5.1; tf_ops/engine/partial*.h,
docs/engine.md): a persistent collective per name whose rounds run on the progress thread whether or not this rank
called, with whichever ranks' data is there (solo: any rank starts a round; majority: a seeded designated rank;
all: every rank or its absence).  Used by hetsync/algorithms/eager.py.

All ops work eagerly and inside ``tf.function``.
"""
import collections

import tensorflow as tf

from hetsync.ops import _lib, _wire_half, on_host

PARTIAL_MODES = ("solo", "majority", "all")


class PartialResult(collections.namedtuple(
        "PartialResult", ["tensors", "included", "nap", "round", "initiator", "staleness", "contributors",
                          "active", "rounds"])):
    """What one partial_allreduce call returns (eager-SGD §5.1, the ADS response).

    tensors: the average of the contributions in the returned round (a tensor, or a list like the input).
    included: bool tensor, True when this call's tensors are in that average (else they wait in the send buffer
      and go with the next round this rank's progress thread takes part in).
    nap: number of ranks whose data is in the average (it divides by it).
    active: of those, the ranks whose call waited for this round (fresh gradients; eager-SGD §6.1's "active
      processes"); the others' stale data went in passively.
    round: the round's index; initiator: majority: the designated rank, solo: the first initiator this rank saw.
    staleness: when included, rounds the oldest gradients in this rank's contribution waited (0: fresh), else -1.
    contributors: int32 [world size]: 0 no data in the average, 1 stale data sent passively, 2 a waiting call's.
    rounds: how many rounds ``tensors`` holds (1, or with late="accumulate" every round since the previous call).
    """


def _splitmix64(x):
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def _fnv1a64(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & ((1 << 64) - 1)
    return h


def majority_initiator(seed, name, round_, size):
    """The rank majority mode designates to initiate ``round_`` of collective ``name`` (eager-SGD §4.2): every
    rank computes the same one from the shared seed.  Pure Python; the engine's C++ computes the same."""
    x = (seed & ((1 << 64) - 1)) ^ _fnv1a64(name.encode()) ^ ((round_ * 0x9E3779B97F4A7C15) & ((1 << 64) - 1))
    return _splitmix64(x) % size


def partial_allreduce(tensors, mode="solo", name="partial_allreduce", seed=0, timeout=None, compression=None,
                      late="latest"):
    """eager-SGD's partial allreduce: average ``tensors`` with whichever ranks' data is there (§4, §5.1).

    Every rank runs every round of the collective ``name`` on its progress thread, passively when its Python thread
    is elsewhere, with what its send buffer holds: the tensors of earlier calls no round took yet (stale), or
    nothing.  A call adds ``tensors`` to the send buffer, then
      - if a round ran since this rank's previous call: returns that round's result at once (``included`` False,
        the tensors wait for the next round);
      - else ``mode="solo"``: activates the next round itself; ``mode="majority"``: waits until the rank a seeded
        RNG designates for the round calls (or is away: then that rank's engine activates it); ``mode="all"``:
        waits until every rank has called or is away (rank 0's engine coordinates; away ranks contribute what
        their send buffer holds) -- the round includes the tensors (``included`` True).
    All ranks that return a round get the same average.  Works eagerly and inside ``tf.function``.  With
    ``late="accumulate"`` a call returns the sum of every round since its previous call (each divided by the world
    size) instead of only the latest.

    Args:
      tensors: a float32/float64 tensor or a list of them (one dtype per call; shapes fixed per name).
      mode: "solo", "majority" or "all".
      name: the persistent schedule; every rank must use the same tensors, mode and seed under one name.
      seed: majority: the shared seed of the initiator sequence (see majority_initiator).
      timeout: seconds before a round that cannot run fails (a rank's engine gone; majority: the designated rank
        never came); None: the engine default.
      compression: None / 'fp16' / ``hvd.Compression.fp16``: float32 data travels and is summed as float16 (the
        send buffer, where stale gradients accumulate, stays float32).
      late: "latest": a call returns one round, its sum divided by its contributors (ADS average; eager-SGD's
        Algorithm 5, ``late="algorithm5"`` in hetsync/algorithms/eager.py, scales it by NAP / P);
        "accumulate": a call returns every round since this rank's previous call, each round's sum divided by the
        world size -- every rank then applies every contribution exactly once, weight 1/P.

    Returns a PartialResult.
    """
    if late not in ("latest", "accumulate"):
        raise ValueError(f"late must be 'latest' or 'accumulate', got {late!r}")
    if mode not in PARTIAL_MODES:
        raise ValueError(f"partial_allreduce mode must be one of {PARTIAL_MODES}, got {mode!r}")
    if not isinstance(name, str) or not 0 < len(name) < 64:
        raise ValueError(f"partial_allreduce name must be a string of 1 to 63 characters, got {name!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    timeout_s = -1.0 if timeout is None else float(timeout)
    if timeout is not None and timeout_s <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    single = not isinstance(tensors, (list, tuple))
    items = [tf.convert_to_tensor(t) for t in ([tensors] if single else tensors)]
    if not items:
        raise ValueError("partial_allreduce needs at least one tensor")
    dtypes = {t.dtype for t in items}
    if len(dtypes) != 1 or items[0].dtype not in (tf.float32, tf.float64):
        raise TypeError(f"partial_allreduce needs float32 or float64 tensors of one dtype, got "
                        f"{sorted(d.name for d in dtypes)}")
    half = _wire_half(compression) and items[0].dtype == tf.float32
    with on_host():
        outs = _lib.hetsync_partial_allreduce(tensors=items, collective=name, mode=mode, seed=seed,
                                              timeout_seconds=timeout_s, wire_half=half, late=late)
    averaged, info, contributors = list(outs[0]), outs[1], outs[2]
    return PartialResult(averaged[0] if single else averaged, tf.cast(info[0], tf.bool), info[1], info[2], info[3],
                         info[4], contributors, info[5], info[6])


def partial_discard(name):
    """Drops what this rank's partial allreduce ``name`` holds but has not returned yet: the results of rounds since
    its last call (``late="accumulate"``) and its deposit that no round took (e.g. after a consensus average that
    already contains them).  Local; no-op for an unknown name."""
    _lib.hetsync_partial_discard(collective=name)


def partial_drain(name, like):
    """What this rank's partial allreduce ``name`` holds but has not returned -- the round results since its last
    call (late="accumulate": all of them; "latest": the newest, if not yet returned) plus its undelivered deposit --
    shaped like the tensors in ``like`` (the same list, in the same order and dtype, as its calls send); then
    forgotten.  Waits for a round this rank is taking part in passively (a peer's) to finish first.  A live switch
    leaving eager-SGD applies it locally (hetsync/algorithms/eager.py), so no gradient is lost or applied twice."""
    like = [tf.convert_to_tensor(t) for t in like]
    with on_host():
        return list(_lib.hetsync_partial_drain(like=like, collective=name))

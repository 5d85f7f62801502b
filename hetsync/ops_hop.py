"""Python side of Hop's queues in the engine (Hop §4.1, §4.2, §5, §6; tf_ops/engine/hop*.h, docs/engine.md).

A queue set ``name`` is this worker's update queue (rotating, ``max_ig + 1`` queues) plus a token count per
out-neighbour.  One iteration of the parallel graph (§3.2, Fig 7) is::

    hop_send(params, name)                  # Send x_k to the out-neighbours (returns at once)
    grads = compute(params)                 # the train step, while the progress thread sends
    params = hop_recv(params, name)         # Recv(k) + Reduce: average with the selected updates
    params -= lr * grads                    # Apply
    hop_advance(name)                       # enter k + 1: take a token from each out-neighbour, grant one to each
                                            # in-neighbour

All ops work eagerly and inside ``tf.function``; the tensors are float32 (fused into one message per update).
"""
import collections

import tensorflow as tf

from hetsync.ops import _lib, _wire_half, on_host

STAT_NAMES = ("iteration", "queue_size", "max_queue", "dropped", "skips", "skipped_iters", "sends", "sends_skipped",
              "used", "jump", "session", "absent", "lag")
NEIGHBOUR_FIELDS = ("peer", "in", "out", "tokens", "known_iteration", "queued", "absent")

HopReport = collections.namedtuple("HopReport", "stats neighbours history")


def _timeout(timeout):
    t = -1.0 if timeout is None else float(timeout)
    if timeout is not None and t <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    return t


def hop_configure(name, in_neighbours, out_neighbours, max_ig, backup=0, staleness=None, compression=None,
                  stale_reduce="newest"):
    """Creates this worker's queue set ``name`` (local; every worker configures its own side of the graph).
    Messages that arrived before are kept and applied.  ``stale_reduce`` (with staleness): "received" reduces only
    the updates received since the previous reduce (§4.4's N_in^(k)), "newest" every in-neighbour's newest
    satisfactory one.  InvalidArgumentError names a bad neighbour list, ``max_ig < 1`` or ``backup`` outside
    [0, |N_in|)."""
    _lib.hetsync_hop_configure(queue=name, in_neighbours=[int(r) for r in in_neighbours],
                               out_neighbours=[int(r) for r in out_neighbours], max_ig=int(max_ig),
                               backup=int(backup), staleness=-1 if staleness is None else int(staleness),
                               reuse_stale=stale_reduce == "newest",
                               wire_half=_wire_half(compression))


def _floats(tensors):
    return [tf.cast(tf.convert_to_tensor(t), tf.float32) for t in tensors]


def hop_send(tensors, name, compression=None):
    """Send: enqueue ``tensors`` (fused) into the update queue of every out-neighbour that is not past this
    worker's iteration (§6.2 (b): known from the tokens it sent).  Only the first call in an iteration sends.
    Returns the number of neighbours sent to (int64 scalar)."""
    with on_host():
        return _lib.hetsync_hop_send(tensors=_floats(tensors), queue=name, wire_half=_wire_half(compression))


def hop_recv(tensors, name, offset=0, timeout=None):
    """Recv(k) + Reduce for k = iteration + offset: blocks until the receive rule is satisfied (standard: every
    present in-neighbour's update tagged k; backup: |N_in| - backup of them, plus any other already here;
    staleness s: each in-neighbour's newest update no older than k - s), then returns (averaged tensors, info).
    info = [k, updates reduced, dropped so far, oldest iteration reduced, newest, microseconds waited]."""
    items = _floats(tensors)
    with on_host():
        outs = _lib.hetsync_hop_recv(tensors=items, offset=tf.cast(offset, tf.int64), queue=name,
                                     timeout_seconds=_timeout(timeout))
    return list(outs[0]), outs[1]


def hop_advance(name, steps=1, timeout=None):
    """Enters iteration + steps: takes ``steps`` tokens from every out-neighbour (blocking while one is max_ig
    iterations behind), grants ``steps`` to every in-neighbour.  Returns the new iteration."""
    return _lib.hetsync_hop_advance(steps=tf.cast(steps, tf.int64), queue=name, timeout_seconds=_timeout(timeout))


def hop_query(name, skip=0, trigger=0):
    """Gauges: HopReport(stats: dict by STAT_NAMES, neighbours: list of dicts by NEIGHBOUR_FIELDS, history:
    int64 [m, 2] array of (iteration, CLOCK_MONOTONIC ns) per entry into an iteration this session).  Eager only."""
    stats, neighbours, history = _lib.hetsync_hop_query(queue=name, skip=int(skip), trigger=int(trigger))
    return HopReport(dict(zip(STAT_NAMES, stats.numpy().tolist())),
                     [dict(zip(NEIGHBOUR_FIELDS, row)) for row in neighbours.numpy().tolist()],
                     history.numpy())


def hop_jump(name, skip, trigger):
    """The jump §5 would make now (iterations to skip; 0 none), as an int64 tensor (for tf.function)."""
    return _lib.hetsync_hop_query(queue=name, skip=int(skip), trigger=int(trigger))[0][9]

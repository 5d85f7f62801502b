"""Ripples Group Generator (GG) state machines: plain Python, no gRPC, no threads, no wall clock.

Spec: Luo et al., "Heterogeneity-Aware Asynchronous Decentralized Training" (Ripples).

* §3.2: a synchronization is a *P-Reduce* (all-reduce restricted to a group ``G`` that contains the initiating
  worker).  Two groups sharing a worker must be serialized (atomicity); disjoint groups run concurrently.
* §3.3: the union of the groups over time must connect all workers (spectral gap); both generators draw groups at
  random from all live workers, so this holds with probability 1 over a long run.
* §4.1 (Fig 8): a centralized GG creates groups on behalf of the workers, keeps a *lock vector* (which worker is
  in a running P-Reduce), parks groups that conflict with locked workers in a *pending group queue*, and releases
  the locks once every member *acknowledged* the end of its P-Reduce.
* §5.1: every worker has a *Group Buffer* (GB, the ordered groups containing it); a request is served from the
  GB, and only a worker with an empty GB triggers a *Global Division* (GD) of all idle workers into disjoint
  random groups.
* §5.2 (Fig 12): *Inter-Intra synchronization*: one GD round where one *head worker* per node is grouped across
  nodes and the other workers only with local workers, then one round of whole-node groups.
* §5.3 (Fig 13): the slowdown filter: a GD started by initiator ``i`` only includes workers ``w`` with
  ``c_i - c_w < C_thres`` where ``c`` counts the group requests of each worker.

One concern per module (each imports only the ones above it in this list):

==================== ========================================================================================
``errors``           the exceptions (one per gRPC status the server maps them to)
``groups``           :class:`Group` (what a member receives), :class:`WaitInfo`, the internal record and states
``locks``            §4.1 lock vector, pending group queue, per-worker buffers, group life cycle, expiry
``invariants``       ``wait_info`` and ``check_invariants`` (read-only diagnostics of that state)
``protocol``         the worker protocol shared by both generators: request/poll/ack/finish/away/back/resume
``random_gg``        §4.1 random GG (``group_buffer``: §5.1's Group Buffer or the paper's rule), ``DRAFTED``
``slowdown_filter``  §5.3 request-counter filter with ``C_thres`` (+ ``exclude_laggards``)
``inter_intra``      §5.2 node layout, head rotation, the Inter and Intra rounds
``smart_gg``         §5 smart GG: §5.1 Group Buffer + Global Division, mixing in the two above
==================== ========================================================================================

The pull model
--------------
Workers run ``request -> P-Reduce -> ack -> compute -> request ...``.  A worker drafted into another worker's group
learns about it on its *next* request (§4.1's "GG notifies the workers"): every worker therefore has a FIFO of
groups that contain it and that it has not received yet, and a request is always answered with the *oldest* group
of that FIFO.  For the smart generator this FIFO *is* the Group Buffer of §5.1: a new group (a Global Division) is
made only when it is empty.  The random generator does the same by default (``group_buffer=True``, our variant:
random groups drafting workers regardless of their state, served from the buffer).  With ``group_buffer=False`` it
follows §4.1 exactly: every request makes a fresh random group for the requester; the requester first runs the
groups it was drafted into (handed out with phase ``"drafted"``, each followed by a continuation request) and then
its own.

Sync points (consensus rounds) do not reset the generator: every worker leaves it (``finish``) and ``resume``
brings them back, so the §5.3 request counters and the rest of the state carry over.

API (``now`` is the caller's clock, seconds, monotonic; ``None`` uses the injectable ``clock``)
--------------------------------------------------------------------------------------------------
``request(worker, now, iteration) -> Group | None`` (``None``: wait, then ``poll``), ``poll(worker, now) -> Group |
None``, ``ack(worker, group_id, now) -> bool``, ``finish(worker, now) -> list[Group]`` (obligations),
``away(worker, now) -> list[Group]`` (excluded groups), ``back(worker, now)``, ``resume(now) -> list[int]``,
``expire(now) -> list[int]``, ``next_deadline()``, ``wait_info(worker)``, ``metrics()``, ``check_invariants()``.
"""

from __future__ import annotations

from .errors import GGError, GroupFailed, InvalidArgument, InvariantViolation, ProtocolViolation, WorkerEvicted
from .groups import Group, WaitInfo
from .protocol import _BaseGroupGenerator
from .random_gg import DRAFTED, RandomGroupGenerator
from .smart_gg import SmartGroupGenerator

__all__ = [
    "Group",
    "WaitInfo",
    "GGError",
    "InvalidArgument",
    "ProtocolViolation",
    "WorkerEvicted",
    "GroupFailed",
    "InvariantViolation",
    "DRAFTED",
    "RandomGroupGenerator",
    "SmartGroupGenerator",
    "make_generator",
]


def make_generator(mode: str, size: int, **options) -> _BaseGroupGenerator:
    """``mode`` is ``"random"`` (§4.1) or ``"smart"`` (§5); ``options`` go to the constructor."""
    mode = (mode or "smart").lower()
    if mode == "random":
        allowed = {"group_size", "seed", "ack_timeout", "clock", "group_buffer"}
        return RandomGroupGenerator(size, **{k: v for k, v in options.items() if k in allowed})
    if mode == "smart":
        return SmartGroupGenerator(size, **options)
    raise ValueError(f"unknown group generator mode {mode!r} (expected 'random' or 'smart')")

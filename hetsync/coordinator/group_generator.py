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

Sync points (consensus rounds) do not reset the generator: every worker leaves it (:meth:`finish`) and
:meth:`resume` brings them back, so the §5.3 request counters and the rest of the state carry over.

Group life cycle: ``pending`` (in the pending group queue) -> ``active`` (members locked) -> handed to members one
by one -> ``completed`` (all members acked; locks released) or ``failed`` (ack timeout).  A group becomes active
when none of its members is locked *and* no older pending group shares a member with it (strict FIFO: a pending
group is never overtaken by a younger group on a shared worker).  Consequences, checked by
:meth:`check_invariants`: every worker executes its groups in creation order, the same relative order for every
member; every waiting group waits only for *older* groups (no cycle, no deadlock); and the oldest pending group
waits only for running groups (no starvation).  A group's member list never changes once it was handed to a
member (consistency).

API (``now`` is the caller's clock, seconds, monotonic; ``None`` uses the injectable ``clock``)
--------------------------------------------------------------------------------------------------
``request(worker, now, iteration) -> Group | None`` (``None``: wait, then ``poll``), ``poll(worker, now) -> Group |
None``, ``ack(worker, group_id, now) -> bool``, ``finish(worker, now) -> list[Group]`` (obligations),
``away(worker, now) -> list[Group]`` (excluded groups), ``back(worker, now)``, ``expire(now) -> list[int]``,
``next_deadline()``, ``wait_info(worker)``, ``metrics()``, ``check_invariants()``.

Away workers
------------
The rule of the data plane is that no rank waits on a rank that is not coming.  A worker that leaves its training
step for something that may block (a user's global collective in a callback, validation, the end of its ``fit``)
tells the GG it is *away*.  Every group it has not received yet is then *excused* for it: counted as acknowledged
by it, never locking it, never handed to it (its engine answers the other members' P-Reduce headers of these
groups with EXCLUDE, so they go on without it).  While away it is drafted into no new group.  Its next request
brings it back.  Without this, a group formed among away workers could lock a worker that another worker's pending
group needs, and that worker's request would block in the GG while the away workers wait for it elsewhere.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional, Sequence

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

PENDING, ACTIVE, COMPLETED, FAILED, DROPPED = "pending", "active", "completed", "failed", "dropped"
_RECENT_LIMIT = 8192  # finished groups remembered for idempotent acks and error messages


# ----------------------------------------------------------------------------------------------------- errors
class GGError(Exception):
    """Base class of the errors of the Group Generator."""


class InvalidArgument(GGError, ValueError):
    """Malformed request: worker out of range, unknown group id, ack by a non-member (gRPC INVALID_ARGUMENT)."""


class ProtocolViolation(GGError):
    """Well-formed but not allowed now, e.g. a request while holding an un-acked group (FAILED_PRECONDITION)."""


class WorkerEvicted(ProtocolViolation):
    """The worker did not ack a group within ``ack_timeout`` and was removed from the job (FAILED_PRECONDITION)."""

    def __init__(self, worker: int, group_id: int):
        super().__init__(f"worker {worker} was evicted: it did not acknowledge group {group_id} in time")
        self.worker = worker
        self.group_id = group_id


class GroupFailed(GGError):
    """A group the worker held failed: ``workers`` never acked it within ``ack_timeout`` (gRPC ABORTED).

    Raised once, by the next request of each member that held the group without acking it; the request after
    that proceeds normally (without the evicted workers).
    """

    def __init__(self, group_id: int, members: Sequence[int], workers: Sequence[int]):
        self.group_id = int(group_id)
        self.members = tuple(members)
        self.workers = tuple(sorted(workers))
        super().__init__(
            f"group {self.group_id} {list(self.members)} failed: worker(s) {list(self.workers)} did not "
            f"acknowledge it within the ack timeout and were evicted"
        )


class InvariantViolation(AssertionError):
    """Raised by :meth:`check_invariants`."""


# ------------------------------------------------------------------------------------------------ data types
@dataclass(frozen=True)
class Group:
    """A group as handed to a worker: identical for every member (§4: consistent group information)."""

    group_id: int
    members: tuple[int, ...]  # sorted world ranks
    phase: str = "random"

    @property
    def is_singleton(self) -> bool:
        """A one-member group: no synchronization this time; no ack needed."""
        return len(self.members) == 1

    def __len__(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class WaitInfo:
    """Why a worker waits: its group, the members still busy, and the workers whose action is awaited."""

    worker: int
    group_id: int
    members: tuple[int, ...]
    waiting_since: float
    busy: tuple[int, ...]  # members of the group locked by / queued behind other groups
    awaiting: tuple[int, ...]  # workers that must still receive/ack the running groups blocking it
    blocking_groups: tuple[int, ...]

    def describe(self) -> str:
        return (
            f"worker {self.worker} waits for group {self.group_id} {list(self.members)}: members {list(self.busy)} "
            f"are busy in group(s) {list(self.blocking_groups)}, awaiting worker(s) {list(self.awaiting)}"
        )


@dataclass(eq=False)
class _G:
    gid: int
    members: list[int]
    creator: Optional[int]
    phase: str
    created_at: float
    state: str = PENDING
    activated_at: Optional[float] = None
    first_handout: Optional[float] = None
    received: dict = field(default_factory=dict)  # worker -> (time, members tuple as handed)
    acked: set = field(default_factory=set)
    excused: set = field(default_factory=set)  # members that went away before receiving it: count as acked
    culprits: tuple = ()

    def participants(self) -> list[int]:
        """The members that take part: all but the excused ones (they are not locked and not waited for)."""
        return [m for m in self.members if m not in self.excused]

    def done(self) -> bool:
        """Every member acked it or is excused from it."""
        return len(self.acked) + len(self.excused) >= len(self.members)

    def public(self) -> Group:
        return Group(self.gid, tuple(self.members), self.phase)


# ------------------------------------------------------------------------------------------------- base class
class _BaseGroupGenerator:
    """Machinery shared by both generators: lock vector, pending queue, per-worker FIFO/GB, acks, finish, expiry."""

    mode = "base"

    def __init__(
        self,
        size: int,
        group_size: int = 3,
        seed: Optional[int] = None,
        ack_timeout: Optional[float] = 300.0,
        clock: Optional[Callable[[], float]] = None,
    ):
        if int(size) < 1:
            raise ValueError("size must be >= 1")
        if int(group_size) < 2:
            raise ValueError("group_size must be >= 2")
        if ack_timeout is not None and ack_timeout <= 0:
            raise ValueError("ack_timeout must be > 0 or None")
        self.size = int(size)
        self.group_size = int(group_size)
        self.ack_timeout = ack_timeout
        self.seed = seed
        self._rng = random.Random(seed)
        self._clock = clock or time.monotonic
        self._next_gid = 1
        self.version = 0  # bumped on every state change (lets a server skip needless wake-ups)
        self._groups: dict[int, _G] = {}  # live groups: pending or active
        self._pending: list[int] = []  # the pending group queue (§4.1), ascending gid
        self._queue: list[list[int]] = [[] for _ in range(self.size)]  # per-worker FIFO / Group Buffer (§5.1)
        self._lock: list[Optional[int]] = [None] * self.size  # lock vector (§4.1): gid of the locking group
        self._holding: list[Optional[int]] = [None] * self.size  # group received, not yet acked
        self._waiting: list[Optional[float]] = [None] * self.size  # outstanding request since
        self._departed: list[Optional[str]] = [None] * self.size  # None, "finished" or "evicted"
        self._away: list[bool] = [False] * self.size  # left its training step (see away()); live workers only
        self._evicted_by: dict[int, int] = {}
        self._notices: list[deque] = [deque() for _ in range(self.size)]
        self._recent: "OrderedDict[int, _G]" = OrderedDict()
        # metrics; _counter is the per-worker request counter c_w of §5.3
        self._counter = [0] * self.size
        self._syncs = [0] * self.size
        self._waits = [0] * self.size
        self._pending_time = [0.0] * self.size
        self._max_pending = [0.0] * self.size
        self._last_iter = [-1] * self.size
        self._groups_formed = 0
        self._groups_completed = 0
        self._groups_failed = 0
        self._singletons = 0
        self._conflicts = 0
        self._divisions = 0
        self._away_events = 0

    # ------------------------------------------------------------------ public API
    def request(
        self,
        worker: int,
        now: Optional[float] = None,
        iteration: Optional[int] = None,
        last_seen: Optional[int] = None,
    ) -> Optional[Group]:
        """Worker ``worker`` asks for a group (Fig 7 step 3 / Fig 8 ①②).

        Returns the oldest group of the worker's buffer if it is ready (active), creating new group(s) first if the
        buffer is empty; returns ``None`` if that group is still pending: the worker must wait and :meth:`poll`.
        Calling ``request`` again while a request is outstanding (e.g. a retry after a timeout) is the same as
        :meth:`poll` and does not count as a new request.

        ``last_seen`` (optional) is the id of the last group the caller actually received (0: none).  If the worker
        holds an un-acked group ``X`` and ``last_seen != X``, the reply carrying ``X`` was lost in transit and ``X``
        is handed out again instead of raising.

        Raises :class:`GroupFailed` (once) if a group the worker held failed, :class:`WorkerEvicted`,
        :class:`ProtocolViolation` if the worker finished or still holds an un-acked group.
        """
        now = self._now(now)
        w = self._check_worker(worker)
        self._expire(now)
        self._check_live(w)
        self._set_back(w)  # a request means the worker is in its training step again
        if self._notices[w]:
            raise self._notices[w].popleft()
        if self._holding[w] is not None:
            held = self._groups[self._holding[w]]
            if last_seen is not None and int(last_seen) != held.gid:
                return self._public_for(held, w)  # the reply carrying it was lost: hand it out again (same copy)
            raise ProtocolViolation(
                f"worker {w} requested a new group while still holding group {held.gid}: ack it first"
            )
        if iteration is not None and int(iteration) >= 0:
            self._last_iter[w] = int(iteration)
        if self._waiting[w] is not None:  # retry of the outstanding request
            return self._handout(w, now)
        if self._continues(w):  # ripples-random without a Group Buffer: the rest of this synchronization
            return self._wait_or_handout(w, now)
        self._counter[w] += 1
        if self._needs_group(w):
            self._generate(w, now)
            self._promote(now)
            if not self._queue[w]:  # pragma: no cover - defensive, _generate always covers the requester
                self._new_group([w], w, "solo", now)
                self._promote(now)
        return self._wait_or_handout(w, now)

    def _wait_or_handout(self, w: int, now: float) -> Optional[Group]:
        group = self._handout(w, now)
        if group is None:
            self._waiting[w] = now
            self._waits[w] += 1
            self._conflicts += 1
        return group

    def poll(self, worker: int, now: Optional[float] = None) -> Optional[Group]:
        """Return the group the worker waits for once it is ready (its hand-out), else ``None``."""
        now = self._now(now)
        w = self._check_worker(worker)
        self._expire(now)
        self._check_live(w)
        if self._waiting[w] is None:
            if self._away[w]:
                raise ProtocolViolation(f"worker {w} went away while waiting: its request was abandoned; request again")
            raise ProtocolViolation(f"worker {w} has no outstanding request to poll")
        return self._handout(w, now)

    def ack(self, worker: int, group_id: int, now: Optional[float] = None) -> bool:
        """Worker acknowledges the end of its P-Reduce of ``group_id`` (Fig 8 ⑧); idempotent.

        Returns ``True`` if this ack completed the group (its locks are released).
        """
        now = self._now(now)
        w = self._check_worker(worker)
        gid = self._check_gid(group_id)
        self._expire(now)
        g = self._groups.get(gid)
        if g is None:
            old = self._recent.get(gid)
            if old is not None:
                if w not in old.members and w not in old.received:
                    raise InvalidArgument(f"worker {w} is not a member of group {gid} {old.members}")
                if self._holding[w] == gid:  # pragma: no cover - cleared when the group ended
                    self._holding[w] = None
                return False
            if gid < self._next_gid:  # ended long ago and forgotten: accept (idempotent)
                return False
            raise InvalidArgument(f"unknown group id {gid}")
        if w not in g.members:
            raise InvalidArgument(f"worker {w} is not a member of group {gid} {g.members}")
        if w in g.excused:  # it went away before receiving it: its ack was counted then
            return False
        if w not in g.received:
            raise ProtocolViolation(f"worker {w} acked group {gid} before receiving it")
        if w in g.acked:
            return False
        g.acked.add(w)
        self.version += 1
        if self._holding[w] == gid:
            self._holding[w] = None
        if g.done():
            self._complete(g, now)
            return True
        return False

    def finish(self, worker: int, now: Optional[float] = None) -> list[Group]:
        """The worker stops training: it is never put into new groups.

        Implicitly acks the group it holds and abandons an outstanding request.  It is removed from every group
        of its buffer that nobody received yet (a group left with one member that waits for it becomes a
        singleton, i.e. no synchronization; other one-member groups are dropped).  A group of its buffer that was
        already handed to another member cannot change any more: it is handed to this worker too and returned;
        the worker must still run its P-Reduce and ack it.  Idempotent: a repeated call returns the obligation
        still un-acked, if any (so a lost reply loses nothing).
        """
        now = self._now(now)
        w = self._check_worker(worker)
        self._expire(now)
        if self._departed[w] is not None:
            h = self._holding[w]
            return [self._groups[h].public()] if h is not None and h in self._groups else []
        if self._holding[w] is not None:
            self.ack(w, self._holding[w], now)
        self._waiting[w] = None
        self._away[w] = False
        self._departed[w] = "finished"
        self.version += 1
        obligations: list[Group] = []
        for gid in list(self._queue[w]):
            g = self._groups[gid]
            if g.state == ACTIVE and g.first_handout is not None:
                self._queue[w].remove(gid)
                self._deliver(g, w, now)
                obligations.append(g.public())
            else:
                self._remove_member(g, w)
        self._promote(now)
        return obligations

    def away(self, worker: int, now: Optional[float] = None) -> list[Group]:
        """The worker left its training step for something that may block: nobody must wait for it.

        Every group containing it that it has not received yet (pending or active, in its buffer) is *excused* for
        it: counted as its ack, removed from its buffer, its lock on the worker released (a group whose last
        missing ack this was completes; a pending group will not lock it when it becomes active).  The member
        lists do not change: members that receive these groups later see the same list, and the away worker's
        engine answers their P-Reduce headers with EXCLUDE.  Returns these groups, oldest first, for the caller
        to register as excluded with its engine.  A group it already received (held, not yet acked) is left
        alone: it will ack it.  An outstanding request is abandoned (its group is excused like the others).

        Until its next :meth:`request` (or :meth:`back`), the worker is drafted into no new group.  Idempotent: a
        second call while away returns ``[]``; so does a call for a finished or evicted worker.
        """
        now = self._now(now)
        w = self._check_worker(worker)
        self._expire(now)
        if self._departed[w] is not None or self._away[w]:
            return []
        self._away[w] = True
        self._away_events += 1
        self._waiting[w] = None
        self.version += 1
        excused = [self._groups[gid] for gid in self._queue[w]]
        self._queue[w] = []
        for g in excused:
            g.excused.add(w)
            if self._lock[w] == g.gid:
                self._lock[w] = None
        for g in excused:
            if g.gid in self._groups and g.done():
                self._complete(g, now)
        self._promote(now)
        return [g.public() for g in excused]

    def back(self, worker: int, now: Optional[float] = None) -> None:
        """The worker is back in its training step and may be drafted again (a request implies it)."""
        now = self._now(now)
        w = self._check_worker(worker)
        self._expire(now)
        self._check_live(w)
        self._set_back(w)

    def resume(self, now: Optional[float] = None) -> list[int]:
        """A sync point ended (an epoch-end consensus round, a switch back to this mode): every worker that left
        the GG for it (finished, or evicted meanwhile) takes part again; returns them.

        Nothing else is reset: the request counters ``c_w`` of §5.3 (a slow worker stays recognized as slow from
        one epoch to the next), the head rotation of §5.2, the random stream, the group ids and the metrics.  The
        Group Buffers keep every group still in them; at a sync point these are only groups among workers that
        did not leave, since a leaving worker already left the groups nobody had received (:meth:`finish`: nobody
        may wait for a worker that is in a global collective) and ran those somebody had.
        """
        now = self._now(now)
        self._expire(now)
        back = [w for w in range(self.size) if self._departed[w] is not None]
        for w in back:
            self._departed[w] = None
            self._evicted_by.pop(w, None)
            self._notices[w].clear()
            self._holding[w] = None
        if back:
            self.version += 1
        return back

    def is_away(self, worker: int) -> bool:
        return self._away[self._check_worker(worker)]

    def expire(self, now: Optional[float] = None) -> list[int]:
        """Fail every group handed out more than ``ack_timeout`` ago and not fully acked; returns their ids.

        The members that never received the group (or, if all received it, those that never acked) are evicted:
        they are removed from all groups and never grouped again; the other members holding the group get a
        :class:`GroupFailed` on their next request.  Called implicitly by every other method.
        """
        return self._expire(self._now(now))

    def next_deadline(self) -> Optional[float]:
        """Earliest time at which :meth:`expire` would fail a group (``None`` if none can)."""
        if self.ack_timeout is None:
            return None
        times = [g.first_handout for g in self._groups.values() if g.state == ACTIVE and g.first_handout is not None]
        return min(times) + self.ack_timeout if times else None

    def is_waiting(self, worker: int) -> bool:
        return self._waiting[self._check_worker(worker)] is not None

    def wait_info(self, worker: int) -> Optional[WaitInfo]:
        """Diagnostics for a waiting worker: which members are busy and whose action is awaited."""
        w = self._check_worker(worker)
        if self._waiting[w] is None or not self._queue[w]:
            return None
        g = self._groups[self._queue[w][0]]
        busy, blocking, awaiting = set(), set(), set()
        seen: set[int] = set()
        stack = [g]
        while stack:
            cur = stack.pop()
            if cur.gid in seen:
                continue
            seen.add(cur.gid)
            if cur.state == ACTIVE:
                if cur is not g:
                    blocking.add(cur.gid)
                    awaiting.update(m for m in cur.participants() if m not in cur.acked)
                continue
            for m in cur.participants():
                lk = self._lock[m]
                if lk is not None and lk != cur.gid:
                    if cur is g:
                        busy.add(m)
                    stack.append(self._groups[lk])
                for other in self._queue[m]:
                    if other >= cur.gid:
                        break
                    if cur is g:
                        busy.add(m)
                    stack.append(self._groups[other])
        return WaitInfo(
            worker=w,
            group_id=g.gid,
            members=tuple(g.members),
            waiting_since=self._waiting[w],
            busy=tuple(sorted(busy)),
            awaiting=tuple(sorted(awaiting)),
            blocking_groups=tuple(sorted(blocking)),
        )

    def metrics(self) -> dict:
        """Counters (see docs/group_generator.md): groups formed/completed/failed, conflicts, per-worker stats."""
        return {
            "mode": self.mode,
            "size": self.size,
            "groups_formed": self._groups_formed,
            "groups_completed": self._groups_completed,
            "groups_failed": self._groups_failed,
            "singletons": self._singletons,
            "conflicts": self._conflicts,
            "global_divisions": self._divisions,
            "away_events": self._away_events,
            "pending_groups": len(self._pending),
            "active_groups": sum(1 for g in self._groups.values() if g.state == ACTIVE),
            "requests": list(self._counter),
            "syncs": list(self._syncs),
            "waits": list(self._waits),
            "pending_time_s": list(self._pending_time),
            "max_pending_s": list(self._max_pending),
            "last_iteration": list(self._last_iter),
            "state": [d or ("away" if a else "live") for d, a in zip(self._departed, self._away)],
        }

    def worker_state(self, worker: int) -> str:
        """``finished``, ``evicted``, ``holding``, ``waiting`` or ``idle`` (an away worker is ``holding`` or
        ``idle``: this is its position in the protocol; see :meth:`is_away`)."""
        w = self._check_worker(worker)
        if self._departed[w]:
            return self._departed[w]
        if self._holding[w] is not None:
            return "holding"
        return "waiting" if self._waiting[w] is not None else "idle"

    def held_group(self, worker: int) -> Optional[int]:
        return self._holding[self._check_worker(worker)]

    def buffer(self, worker: int) -> list[Group]:
        """The worker's Group Buffer: groups containing it that it has not received yet, oldest first."""
        return [self._groups[gid].public() for gid in self._queue[self._check_worker(worker)]]

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """Raise :class:`InvariantViolation` unless the state is sound.

        Atomicity (a worker is in at most one executing group, and locks match active groups), consistency (every
        hand-out of a group is identical: same id, same sorted members), requester membership, FIFO order of the
        buffers, and the structural no-deadlock / no-starvation conditions (pending groups wait only for older
        groups, the pending queue is fully promoted, a locked worker's running group is the head of its buffer).
        Away workers: nobody waits for them (they are locked by no group they have not received, their buffer is
        empty, they do not wait), and a group every member acked or is excused from is not live any more.
        """

        def bad(msg: str) -> None:
            raise InvariantViolation(msg)

        executing = [0] * self.size
        for gid, g in self._groups.items():
            if g.gid != gid or g.state not in (PENDING, ACTIVE):
                bad(f"group {gid} has state {g.state} in the live table")
            if not g.members or g.members != sorted(set(g.members)):
                bad(f"group {gid} members {g.members} not sorted/unique/non-empty")
            if any(not 0 <= m < self.size for m in g.members):
                bad(f"group {gid} has out-of-range members {g.members}")
            if g.creator is not None and self._departed[g.creator] is None and g.creator not in g.members:
                bad(f"group {gid} lost its live requester {g.creator}")
            if g.received and g.state != ACTIVE:
                bad(f"group {gid} was handed out while {g.state}")
            for m, (_, copy) in g.received.items():
                if copy != tuple(g.members):
                    bad(f"consistency: group {gid} handed to {m} as {copy}, now {g.members}")
                if m not in g.members:
                    bad(f"group {gid} handed to non-member {m}")
            if not g.acked <= set(g.received):
                bad(f"group {gid} acked by workers that did not receive it")
            if not g.excused <= set(g.members) or g.excused & set(g.received):
                bad(f"group {gid} excuses {sorted(g.excused)}: not members, or members that received it")
            if g.done():
                bad(f"group {gid} acked or excused by every member but still {g.state}")
            if g.state == ACTIVE:
                for m in g.participants():
                    if self._lock[m] != gid:
                        bad(f"atomicity: member {m} of active group {gid} locked by {self._lock[m]}")
                if g.received:
                    for m in g.participants():
                        executing[m] += 1
            else:
                if gid not in self._pending:
                    bad(f"pending group {gid} missing from the pending queue")
            for m in g.members:
                if m in g.excused:
                    if gid in self._queue[m] or self._lock[m] == gid:
                        bad(f"worker {m} excused from group {gid} but still queued/locked by it")
                    continue
                if m not in g.received and gid not in self._queue[m]:
                    bad(f"group {gid} missing from the buffer of member {m}")
                if self._departed[m] and m not in g.received:
                    bad(f"departed worker {m} still in un-received group {gid}")
        if any(c > 1 for c in executing):
            bad(f"atomicity: worker(s) in two executing groups: {executing}")
        for w in range(self.size):
            lk = self._lock[w]
            if lk is not None and (lk not in self._groups or self._groups[lk].state != ACTIVE):
                bad(f"worker {w} locked by non-active group {lk}")
            if lk is not None and w not in self._groups[lk].members:
                bad(f"worker {w} locked by group {lk} it is not in")
            q = self._queue[w]
            if q != sorted(set(q)):
                bad(f"buffer of {w} not in creation order: {q}")
            for gid in q:
                if gid not in self._groups or w not in self._groups[gid].members or w in self._groups[gid].received:
                    bad(f"buffer of {w} holds stale group {gid}")
            if lk is not None and w not in self._groups[lk].received and (not q or q[0] != lk):
                bad(f"worker {w} locked by group {lk} that is not the head of its buffer {q}")
            h = self._holding[w]
            if h is not None:
                g = self._groups.get(h)
                if g is None or g.state != ACTIVE or w not in g.received or w in g.acked:
                    bad(f"worker {w} holds group {h} inconsistently")
                if self._waiting[w] is not None:
                    bad(f"worker {w} both holds a group and waits")
            if self._waiting[w] is not None and not q:
                bad(f"worker {w} waits with an empty buffer")
            if self._departed[w] and (q or self._waiting[w] is not None):
                bad(f"departed worker {w} still queued/waiting")
            if self._away[w]:
                if self._departed[w]:
                    bad(f"departed worker {w} marked away")
                if q or self._waiting[w] is not None:
                    bad(f"away worker {w} still queued/waiting: {q}")
                if lk is not None and w not in self._groups[lk].received:
                    bad(f"away worker {w} locked by group {lk} it has not received")
        if self._pending != sorted(self._pending):
            bad("pending queue out of order")
        blocked: set[int] = set()
        for gid in self._pending:
            g = self._groups.get(gid)
            if g is None or g.state != PENDING:
                bad(f"pending queue holds non-pending group {gid}")
            taking_part = g.participants()
            if not any(self._lock[m] is not None or m in blocked for m in taking_part):
                bad(f"liveness: pending group {gid} could run but was not promoted")
            for m in taking_part:  # no deadlock: a pending group only waits for older groups
                lk = self._lock[m]
                if lk is not None and lk > gid:
                    bad(f"deadlock risk: pending group {gid} waits for younger group {lk}")
            blocked.update(taking_part)

    # ------------------------------------------------------------------ internals
    def _generate(self, requester: int, now: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _now(self, now: Optional[float]) -> float:
        return float(self._clock() if now is None else now)

    def _check_worker(self, worker) -> int:
        if isinstance(worker, bool) or not isinstance(worker, int):
            try:
                if int(worker) != worker:
                    raise ValueError
                worker = int(worker)
            except (TypeError, ValueError):
                raise InvalidArgument(f"worker must be an integer rank, got {worker!r}") from None
        if not 0 <= worker < self.size:
            raise InvalidArgument(f"worker {worker} out of range [0, {self.size})")
        return worker

    def _check_gid(self, group_id) -> int:
        try:
            gid = int(group_id)
        except (TypeError, ValueError):
            raise InvalidArgument(f"group id must be an integer, got {group_id!r}") from None
        if gid <= 0:
            raise InvalidArgument(f"unknown group id {group_id}")
        return gid

    def _check_live(self, w: int) -> None:
        if self._departed[w] == "evicted":
            raise WorkerEvicted(w, self._evicted_by.get(w, -1))
        if self._departed[w] == "finished":
            raise ProtocolViolation(f"worker {w} already finished")

    def _live_workers(self) -> list[int]:
        return [u for u in range(self.size) if self._departed[u] is None]

    def _draftable(self) -> list[int]:
        """Workers that may be put into a new group: live and not away (nobody must wait for an away worker)."""
        return [u for u in range(self.size) if self._departed[u] is None and not self._away[u]]

    def _set_back(self, w: int) -> None:
        if self._away[w]:
            self._away[w] = False
            self.version += 1

    def _is_idle(self, u: int) -> bool:
        """Idle in the sense of §5.1's GD: live, not away, empty Group Buffer, not in a running group."""
        return (
            self._departed[u] is None
            and not self._away[u]
            and not self._queue[u]
            and self._lock[u] is None
            and self._holding[u] is None
            and self._waiting[u] is None
        )

    def _new_group(self, members: Sequence[int], creator: Optional[int], phase: str, now: float) -> _G:
        members = sorted(set(int(m) for m in members))
        assert not any(self._away[m] for m in members), f"away worker drafted into {members}"
        if len(members) == 1:
            phase = "solo"
        g = _G(self._next_gid, members, creator, phase, now)
        self._next_gid += 1
        self._groups[g.gid] = g
        self._pending.append(g.gid)
        for m in members:  # appended in creation order: same relative order in every member's buffer (§5.1)
            self._queue[m].append(g.gid)
        self._groups_formed += 1
        self.version += 1
        return g

    def _promote(self, now: float) -> None:
        """Re-check the pending group queue (§4.1): activate, oldest first, each group whose members are all
        unlocked and not claimed by an older pending group; set their bits in the lock vector."""
        still: list[int] = []
        blocked: set[int] = set()
        for gid in self._pending:
            g = self._groups[gid]
            taking_part = g.participants()  # excused (away) members are neither waited for nor locked
            if any(self._lock[m] is not None or m in blocked for m in taking_part):
                still.append(gid)
                blocked.update(taking_part)
            else:
                g.state = ACTIVE
                g.activated_at = now
                self.version += 1
                for m in taking_part:
                    self._lock[m] = gid
        self._pending = still

    def _handout(self, w: int, now: float) -> Optional[Group]:
        if not self._queue[w]:
            return None
        g = self._groups[self._queue[w][0]]
        if g.state != ACTIVE:
            return None
        self._queue[w].pop(0)
        since = self._waiting[w]
        self._waiting[w] = None
        waited = max(0.0, now - since) if since is not None else 0.0
        self._pending_time[w] += waited
        self._max_pending[w] = max(self._max_pending[w], waited)
        self._deliver(g, w, now)
        return self._public_for(g, w)

    def _public_for(self, g: _G, w: int) -> Group:
        """The group as handed to member ``w`` (the random GG without a Group Buffer marks drafted groups)."""
        return g.public()

    def _continues(self, w: int) -> bool:
        """Whether a request continues the worker's current synchronization (no new request, no new group)."""
        return False

    def _needs_group(self, w: int) -> bool:
        """§5.1 Group Buffer: a new group only for a worker whose buffer is empty."""
        return not self._queue[w]

    def _deliver(self, g: _G, w: int, now: float) -> None:
        self.version += 1
        g.received[w] = (now, tuple(g.members))
        if g.first_handout is None:
            g.first_handout = now
        self._syncs[w] += 1
        if len(g.members) == 1:  # singleton: no P-Reduce, completes on hand-out, ack optional
            g.acked.add(w)
            self._singletons += 1
            self._complete(g, now)
        else:
            self._holding[w] = g.gid

    def _complete(self, g: _G, now: float) -> None:
        g.state = COMPLETED
        for m in g.members:
            if self._lock[m] == g.gid:
                self._lock[m] = None
        self._groups_completed += 1
        self._retire(g)
        self._promote(now)

    def _retire(self, g: _G) -> None:
        self.version += 1
        self._groups.pop(g.gid, None)
        if g.gid in self._pending:
            self._pending.remove(g.gid)
        self._recent[g.gid] = g
        while len(self._recent) > _RECENT_LIMIT:
            self._recent.popitem(last=False)

    def _remove_member(self, g: _G, w: int) -> None:
        """Remove ``w`` from a group nobody received yet; drop the group if it became useless.

        Useless means at most one member still taking part (excused members do not count).  If that member is
        waiting for this very group, it gets a singleton instead (the excused members are removed from it too:
        nobody received it, and a singleton needs no P-Reduce they would have to exclude themselves from).
        """
        assert not g.received
        self.version += 1
        g.members.remove(w)
        g.excused.discard(w)
        if g.gid in self._queue[w]:
            self._queue[w].remove(g.gid)
        if self._lock[w] == g.gid:
            self._lock[w] = None
        taking_part = g.participants()
        if len(taking_part) == 1:
            m = taking_part[0]
            if self._waiting[m] is not None and self._queue[m] and self._queue[m][0] == g.gid:
                g.members = [m]
                g.excused.clear()
                g.creator = m  # the requester may have been an excused member
                g.phase = "solo"  # the waiting requester gets a singleton: no synchronization this time
                return
        if len(taking_part) <= 1:
            for m in taking_part:
                self._queue[m].remove(g.gid)
                if self._lock[m] == g.gid:
                    self._lock[m] = None
            g.state = DROPPED
            self._retire(g)

    def _expire(self, now: float) -> list[int]:
        if self.ack_timeout is None:
            return []
        failed = []
        for g in list(self._groups.values()):
            if (
                g.gid in self._groups
                and g.state == ACTIVE
                and g.first_handout is not None
                and now - g.first_handout >= self.ack_timeout
            ):
                self._fail(g, now)
                failed.append(g.gid)
        return failed

    def _fail(self, g: _G, now: float) -> None:
        never = [m for m in g.participants() if m not in g.received]
        culprits = never or [m for m in g.participants() if m not in g.acked]
        g.state = FAILED
        g.culprits = tuple(culprits)
        self._groups_failed += 1
        for m in g.members:
            if self._lock[m] == g.gid:
                self._lock[m] = None
            if self._holding[m] == g.gid:
                self._holding[m] = None
                if m not in culprits:
                    self._notices[m].append(GroupFailed(g.gid, g.members, culprits))
            if m not in g.received and g.gid in self._queue[m]:
                self._queue[m].remove(g.gid)
        self._retire(g)
        for m in culprits:
            self._evict(m, g.gid)
        self._promote(now)

    def _evict(self, w: int, gid: int) -> None:
        if self._departed[w] is not None:
            return
        self._departed[w] = "evicted"
        self._evicted_by[w] = gid
        self._waiting[w] = None
        self._away[w] = False
        self._holding[w] = None
        for other in list(self._queue[w]):
            og = self._groups[other]
            if og.received:  # pragma: no cover - a handed group is the worker's locked head; cannot be here
                continue
            self._remove_member(og, w)


# ------------------------------------------------------------------------------------------ random generator
DRAFTED = "drafted"  # phase of a group handed to a member it was not generated for (random GG, no Group Buffer)


class RandomGroupGenerator(_BaseGroupGenerator):
    """§4.1 random GG: a uniformly random group of ``group_size`` live workers containing the requester (clipped
    to the live workers), whatever their state, except away workers (nobody must wait for them: fewer others give
    a smaller group, none a singleton); groups that conflict with locked workers wait in the FIFO pending group
    queue until the locks are released.

    ``group_buffer=False`` (the paper's §4.1 rule, not the default): *every* synchronization request gets a fresh
    random group,
    even from a worker that other workers already drafted into their groups.  P-Reduce is a collective, so a
    drafted worker must still run those groups (Fig 8 ⑤ "GG notifies the workers"): in this pull model its next
    request hands them out first, oldest first, marked with phase ``"drafted"``; the worker runs and acks each and
    asks again (a *continuation*: no new request, no new group) until it receives the group generated for its own
    request.  A worker thus runs about ``group_size`` P-Reduces per step, which is the cost §5.1 removes.

    ``group_buffer=True`` (default; §5.1's Group Buffer applied to random groups, our variant): a request is served
    from the worker's buffer when it is not empty, and only a worker with an empty buffer gets a new random group:
    one P-Reduce per step.  It measured 1.8x faster to the target loss (README "Ripples: paper rules and ours").
    """

    mode = "random"

    def __init__(self, size: int, group_size: int = 3, group_buffer: bool = True, **kw):
        super().__init__(size, group_size=group_size, **kw)
        self.group_buffer = bool(group_buffer)
        self._own: list[Optional[int]] = [None] * self.size  # gid generated for the worker's last request

    def _generate(self, requester: int, now: float) -> None:
        others = [u for u in self._draftable() if u != requester]
        k = min(self.group_size - 1, len(others))
        chosen = self._rng.sample(others, k) if k else []
        self._own[requester] = self._new_group([requester] + chosen, requester, "random", now).gid

    def _needs_group(self, w: int) -> bool:
        return not self.group_buffer or not self._queue[w]

    def _continues(self, w: int) -> bool:
        return not self.group_buffer and self._own[w] in self._queue[w]

    def _public_for(self, g: _G, w: int) -> Group:
        if self.group_buffer or g.gid == self._own[w] or len(g.members) == 1:
            return g.public()
        return Group(g.gid, tuple(g.members), DRAFTED)


# ------------------------------------------------------------------------------------------- smart generator
class SmartGroupGenerator(_BaseGroupGenerator):
    """§5 smart GG: Group Buffer + Global Division + Inter-Intra synchronization + slowdown filter.

    Parameters
    ----------
    node_of:
        ``node_of[rank]`` is the node (host) of each worker (any hashable); ``None``: all on one node.
    c_thres:
        §5.3 ``C_thres``: a GD started by ``i`` only takes idle workers ``w`` with ``c_i - c_w < c_thres``
        (``None`` disables the filter).
    exclude_laggards:
        Extension of §5.3 (default on; ``False`` is the paper's rule exactly): a worker lagging the *fastest* live
        worker by ``c_thres`` requests or more (``c_max - c_w >= c_thres``) is not drafted by anybody else, even
        by an initiator that lags too, and gets no Intra group.  Without it, fast workers that happened to be
        blocked by a slow worker early on lag as well, keep drafting the slow worker (their counters stay within
        ``c_thres`` of its own) and form a slow island with it; with Inter-Intra this costs the slow worker's
        node-mates ~15% of their throughput in the tests' simulation.  A lagging worker still synchronizes
        whenever it initiates a GD, with the idle fast workers.  Measured (simulation, 8 workers, one 5x slower,
        10 seeds): the fast workers' iteration time is 0.7% (one node) and 2.4% (two nodes) lower with it; the
        one-host Keras benchmark cannot tell them apart (README "Ripples: paper rules and ours"), so it stays on.
    inter_intra:
        §5.2: with more than one node, each GD inserts two rounds of groups into the buffers: an *Inter* round
        (one head worker per node, heads randomly grouped across nodes; the other workers randomly grouped
        with local workers only) and an *Intra* round (all divided workers of a node in one group).

    Choices where the paper is vague (see docs/group_generator.md): GD cuts the shuffled idle workers into groups
    of exactly ``group_size`` (a single left-over worker joins the last group, so no idle worker is left out);
    the head worker of a node rotates over the node's local ranks (the next idle local rank after the previous
    head), spreading the inter-node traffic like the static schedule of Fig 10; a worker whose counter lags the
    fastest (live, or with ``exclude_laggards=False`` divided) worker by ``c_thres`` or more gets no Intra group,
    since the Intra group runs one iteration later and would make the whole node wait for one slow iteration
    (§5.3's argument only covers the first round); one-member groups are not created except for the requester
    when nobody else is idle (a singleton: no synchronization this time).
    """

    mode = "smart"

    def __init__(
        self,
        size: int,
        group_size: int = 3,
        node_of: Optional[Sequence[Hashable]] = None,
        c_thres: Optional[int] = 5,
        seed: Optional[int] = None,
        inter_intra: bool = True,
        ack_timeout: Optional[float] = 300.0,
        clock: Optional[Callable[[], float]] = None,
        exclude_laggards: bool = True,
    ):
        super().__init__(size, group_size=group_size, seed=seed, ack_timeout=ack_timeout, clock=clock)
        if node_of is None:
            node_of = [0] * self.size
        node_of = list(node_of)
        if len(node_of) != self.size:
            raise ValueError(f"node_of has {len(node_of)} entries, expected {self.size}")
        if c_thres is not None and c_thres <= 0:
            raise ValueError("c_thres must be > 0 or None")
        ids: dict = {}
        self.node_of = [ids.setdefault(n, len(ids)) for n in node_of]
        self.num_nodes = len(ids)
        self.local_ranks: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for r, n in enumerate(self.node_of):
            self.local_ranks[n].append(r)
        self.c_thres = c_thres
        self.inter_intra = bool(inter_intra)
        self.exclude_laggards = bool(exclude_laggards)
        self._head_next = [0] * self.num_nodes  # rotation pointer into local_ranks[node]

    # -- §5.1 Global Division
    def _generate(self, requester: int, now: float) -> None:
        self._divisions += 1
        c_max = self._fastest()
        idle = [requester] + [
            u for u in range(self.size) if u != requester and self._is_idle(u) and self._passes(requester, u, c_max)
        ]
        if self.inter_intra and self.num_nodes > 1:
            rounds = self._inter_intra_division(idle, requester)
        else:
            rounds = [[(grp, "gd") for grp in self._partition(idle, requester)]]
        made_for_requester = False
        for rnd in rounds:
            for members, phase in rnd:
                if len(members) < 2:
                    continue
                self._new_group(members, requester if requester in members else None, phase, now)
                made_for_requester |= requester in members
        if not made_for_requester:
            self._new_group([requester], requester, "solo", now)

    def _fastest(self) -> int:
        return max((self._counter[u] for u in self._live_workers()), default=0)

    def _passes(self, initiator: int, u: int, c_max: int) -> bool:
        """§5.3 slowdown filter ``c_i - c_w < C_thres`` (+ the ``exclude_laggards`` extension)."""
        if self.c_thres is None:
            return True
        c = self._counter
        if c[initiator] - c[u] >= self.c_thres:
            return False
        return not (self.exclude_laggards and c_max - c[u] >= self.c_thres)

    def _partition(self, workers: Sequence[int], first: Optional[int] = None) -> list[list[int]]:
        """Random partition into chunks of ``group_size`` (``first``, if given, lands in the first chunk).

        A single left-over worker takes one worker from the previous chunk, so the last two groups are smaller
        rather than one larger: with 4 idle workers and groups of 3 that gives 2 + 2, not one group of all four (a
        whole-job average at every division, which would tie every worker to the slowest one).  With groups of 2
        it joins the last pair instead.
        """
        pool = [u for u in workers if u != first]
        self._rng.shuffle(pool)
        if first is not None and first in workers:
            pool.insert(0, first)
        chunks = [pool[i : i + self.group_size] for i in range(0, len(pool), self.group_size)]
        if len(chunks) >= 2 and len(chunks[-1]) == 1:
            if len(chunks[-2]) > 2:
                chunks[-1].insert(0, chunks[-2].pop())
            else:
                chunks[-2].extend(chunks.pop())
        return chunks

    def _pick_head(self, node: int, idle_here: set[int]) -> int:
        """Rotate the head worker over the node's local ranks: the first idle one at/after the pointer."""
        ranks = self.local_ranks[node]
        start = self._head_next[node]
        for k in range(len(ranks)):
            idx = (start + k) % len(ranks)
            if ranks[idx] in idle_here:
                self._head_next[node] = (idx + 1) % len(ranks)
                return ranks[idx]
        raise AssertionError("no idle worker on node")  # pragma: no cover

    def _inter_intra_division(self, idle: list[int], requester: int) -> list[list[tuple[list[int], str]]]:
        """§5.2 (Fig 12): two GD rounds over the same idle workers: Inter (heads across nodes + local groups of
        the non-heads), then Intra (all divided workers of each node)."""
        by_node: dict[int, list[int]] = {}
        for u in idle:
            by_node.setdefault(self.node_of[u], []).append(u)
        first_round: list[tuple[list[int], str]] = []
        if len(by_node) >= 2:
            heads = {n: self._pick_head(n, set(ws)) for n, ws in sorted(by_node.items())}
            for grp in self._partition(sorted(heads.values()), requester if requester in heads.values() else None):
                first_round.append((grp, "inter"))
            for n, ws in sorted(by_node.items()):
                rest = [u for u in ws if u != heads[n]]
                for grp in self._partition(rest, requester if requester in rest else None):
                    first_round.append((grp, "local"))
        else:  # only one node has idle workers: no inter-node round is possible
            for ws in by_node.values():
                for grp in self._partition(ws, requester if requester in ws else None):
                    first_round.append((grp, "local"))
        second_round: list[tuple[list[int], str]] = []
        c_max = self._fastest() if self.exclude_laggards else max(self._counter[u] for u in idle)
        for n, ws in sorted(by_node.items()):
            members = [u for u in ws if self.c_thres is None or c_max - self._counter[u] < self.c_thres]
            if len(members) >= 2:
                second_round.append((sorted(members), "intra"))
        return [first_round, second_round]


def make_generator(mode: str, size: int, **options) -> _BaseGroupGenerator:
    """``mode`` is ``"random"`` (§4.1) or ``"smart"`` (§5); ``options`` go to the constructor."""
    mode = (mode or "smart").lower()
    if mode == "random":
        allowed = {"group_size", "seed", "ack_timeout", "clock", "group_buffer"}
        return RandomGroupGenerator(size, **{k: v for k, v in options.items() if k in allowed})
    if mode == "smart":
        return SmartGroupGenerator(size, **options)
    raise ValueError(f"unknown group generator mode {mode!r} (expected 'random' or 'smart')")

"""§4.1 (Fig 8) machinery: the lock vector, the pending group queue, the per-worker buffers and a group's life cycle.

Group life cycle: ``pending`` (in the pending group queue) -> ``active`` (members locked) -> handed to members one
by one -> ``completed`` (all members acked; locks released) or ``failed`` (ack timeout).  A group becomes active
when none of its members is locked *and* no older pending group shares a member with it (strict FIFO: a pending
group is never overtaken by a younger group on a shared worker).  Consequences, checked by
:meth:`~.invariants._Diagnostics.check_invariants`: every worker executes its groups in creation order, the same
relative order for every member; every waiting group waits only for *older* groups (no cycle, no deadlock); and the
oldest pending group waits only for running groups (no starvation).  A group's member list never changes once it
was handed to a member (consistency).

This module owns the generator's state (:class:`_GroupTable`) and the transitions of that life cycle; it knows
nothing about *which* groups are made (random_gg, smart_gg) nor about the worker-facing calls (protocol).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from typing import Callable, Optional, Sequence

from .errors import GroupFailed, InvalidArgument, ProtocolViolation, WorkerEvicted
from .groups import ACTIVE, COMPLETED, DROPPED, FAILED, Group, _G

_RECENT_LIMIT = 8192  # finished groups remembered for idempotent acks and error messages


class _GroupTable:
    """The state of a Group Generator and the group life cycle: lock vector, pending queue, per-worker FIFO/GB,
    hand-out, completion, expiry and eviction."""

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

    # ------------------------------------------------------------------ helpers
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

    # ------------------------------------------------------------------ group life cycle
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

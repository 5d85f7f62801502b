"""The worker-facing protocol shared by both generators (Fig 7 / Fig 8): request, poll, ack, finish, away, back,
resume, expire, and the queries and metrics about it.

The pull model
--------------
Workers run ``request -> P-Reduce -> ack -> compute -> request ...``.  A worker drafted into another worker's group
learns about it on its *next* request (§4.1's "GG notifies the workers"): every worker therefore has a FIFO of
groups that contain it and that it has not received yet, and a request is always answered with the *oldest* group
of that FIFO.  Which groups are made, and when, is the generator's business (hooks :meth:`_generate`,
:meth:`_needs_group`, :meth:`_continues`): a new group is made only when the FIFO is empty by default (§5.1's Group
Buffer), for every request with the random GG's paper rule (``group_buffer=False``).

Away workers
------------
The rule of the data plane is that no rank waits on a rank that is not coming.  A worker that leaves its training
step for something that may block (a user's global collective in a callback, validation, the end of its ``fit``)
tells the GG it is *away*.  Every group it has not received yet is then *excused* for it: counted as acknowledged
by it, never locking it, never handed to it (its engine answers the other members' P-Reduce headers of these
groups with EXCLUDE, so they go on without it).  While away it is drafted into no new group.  Its next request
brings it back.  Without this, a group formed among away workers could lock a worker that another worker's pending
group needs, and that worker's request would block in the GG while the away workers wait for it elsewhere.

Sync points
-----------
Sync points (consensus rounds) do not reset the generator: every worker leaves it (:meth:`finish`) and
:meth:`resume` brings them back, so the §5.3 request counters and the rest of the state carry over.
"""

from __future__ import annotations

from typing import Optional

from .errors import InvalidArgument, ProtocolViolation
from .groups import ACTIVE, Group
from .invariants import _Diagnostics
from .locks import _GroupTable

__all__ = []


class _BaseGroupGenerator(_Diagnostics, _GroupTable):
    """What both generators share: the worker protocol (request, poll, ack, finish, away, back, resume, expire),
    queries and metrics, over the lock vector / pending queue / buffers of :class:`~.locks._GroupTable`.

    A generator subclasses it and decides which groups are made: :meth:`_generate` (and optionally
    :meth:`_needs_group`, :meth:`_continues`, :meth:`_public_for`).
    """

    mode = "base"

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
        if self._counts_request(w):
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

    # ------------------------------------------------------------------ hooks of the generators
    def _generate(self, requester: int, now: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _continues(self, w: int) -> bool:
        """Whether a request continues the worker's current synchronization (no new request, no new group)."""
        return False

    def _counts_request(self, w: int) -> bool:
        """Whether this request starts a new synchronization, which §5.3's request counter c_w counts."""
        return True

    def _needs_group(self, w: int) -> bool:
        """§5.1 Group Buffer: a new group only for a worker whose buffer is empty."""
        return not self._queue[w]

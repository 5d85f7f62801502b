"""Diagnostics over the lock vector and the buffers: why a worker waits (:meth:`_Diagnostics.wait_info`) and the
soundness check run after every event by the property tests (:meth:`_Diagnostics.check_invariants`).

Read-only: these methods never change the state, so they sit apart from the machinery they inspect.
"""

from __future__ import annotations

from typing import Optional

from .errors import InvariantViolation
from .groups import ACTIVE, PENDING, WaitInfo

__all__ = []


class _Diagnostics:
    """Mixin of :class:`~.protocol._BaseGroupGenerator` over the state of :class:`~.locks._GroupTable`."""

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

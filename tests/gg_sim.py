"""Deterministic discrete-event simulation of workers driving a Group Generator (no threads, no sockets).

Each simulated worker runs the loop of Fig 7 with the GG of §4.1: compute for ``compute_time(w, it)``, request a
group, wait until the group is ready, run the P-Reduce, which (being a collective) ends ``comm_time(k)`` after the
*last* member of the ``k``-member group arrived, ack, and repeat ``iterations[w]`` times; then ``finish`` and run
the returned obligations.  Used by the tests (slowdown tolerance, starvation, connectivity) and handy for quick
what-if studies of the generators.

Away workers (``away=``): after an iteration a worker may leave its training step for a while, or for good (think
of validation, or a global collective in a callback).  It tells the GG (``gen.away``, unless ``report_away`` is
false) and its engine is OUT of every group it has not received: the collective of such a group ends when the
other members arrived (the engine's EXCLUDE answers), as in hetsync's engine.  It comes back with its next
request.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

from hetsync.coordinator.group_generator import Group, _BaseGroupGenerator

__all__ = ["SimResult", "SimDeadlock", "simulate"]


class SimDeadlock(RuntimeError):
    """No event left but some worker still waits for a group."""


@dataclass
class SimResult:
    end_time: list[float]  # per worker: time its last iteration (and obligations) ended
    iteration_ends: list[list[float]]  # per worker: time each iteration's synchronization ended
    groups: list[Group] = field(default_factory=list)  # every group handed out (first hand-out), in order
    wait_time: list[float] = field(default_factory=list)  # per worker: time spent waiting for the GG
    block_time: list[float] = field(default_factory=list)  # per worker: time blocked inside P-Reduce
    events: int = 0

    def mean_iteration_time(self, workers: Sequence[int]) -> float:
        spans = [self.iteration_ends[w][-1] / len(self.iteration_ends[w]) for w in workers if self.iteration_ends[w]]
        return sum(spans) / len(spans)


def simulate(
    gen: _BaseGroupGenerator,
    compute_time: Union[Sequence[float], Callable[[int, int], float]],
    iterations: Union[int, Sequence[int]],
    comm_time: Union[float, Callable[[int], float]] = 0.1,
    check: bool = False,
    max_events: int = 10_000_000,
    on_event: Optional[Callable[[float], None]] = None,
    away: Optional[Callable[[int, int], Optional[float]]] = None,
    report_away: bool = True,
) -> SimResult:
    """Run the simulation to completion; ``check=True`` calls ``gen.check_invariants()`` after every event.

    ``away(w, it)``, called when worker ``w`` ended iteration ``it`` (1-based) and has more to run, returns
    ``None`` (go on) or how long ``w`` is away before it computes again (``math.inf``: for good; such a worker
    never finishes).  ``report_away=False`` leaves the GG uninformed, to show what goes wrong then (breaks must
    then be for good: a silent worker's engine and the GG would disagree on the groups it comes back to).
    """
    n = gen.size
    if callable(compute_time):
        ctime = compute_time
    else:
        times = list(compute_time)
        ctime = lambda w, it: times[w]  # noqa: E731
    comm = comm_time if callable(comm_time) else (lambda k: float(comm_time))  # noqa: E731
    iters = [iterations] * n if isinstance(iterations, int) else list(iterations)

    seq = itertools.count()
    heap: list = []
    it_done = [0] * n
    draining = [False] * n
    obligations: list[list[Group]] = [[] for _ in range(n)]
    waiting: set[int] = set()
    wait_start = [0.0] * n
    arrive_at = [0.0] * n
    res = SimResult([0.0] * n, [[] for _ in range(n)], [], [0.0] * n, [0.0] * n)
    arrivals: dict[int, set] = {}
    pending_groups: dict[int, Group] = {}  # collectives some member arrived at, not yet over
    seen_groups: set[int] = set()
    excluded: dict[int, set] = {}  # gid -> workers whose engine is OUT of it (away before receiving it)
    silent = [False] * n  # away without telling the GG (report_away=False): OUT of everything not received

    def push(t, kind, w, payload=None):
        heapq.heappush(heap, (t, next(seq), kind, w, payload))

    def after_sync(w, t):
        if draining[w]:
            run_obligation(w, t)
            return
        it_done[w] += 1
        res.iteration_ends[w].append(t)
        if it_done[w] >= iters[w]:
            draining[w] = True
            obligations[w] = list(gen.finish(w, t))
            run_obligation(w, t)
            return
        gone = away(w, it_done[w]) if away is not None else None
        if gone is not None:
            if not report_away and gone != float("inf"):
                raise ValueError("report_away=False models workers that leave for good (away() must return inf)")
            go_away(w, t)
            if gone == float("inf"):
                return
            t += gone
        push(t + ctime(w, it_done[w]), "compute_done", w)

    def go_away(w, t):
        if report_away:
            for g in gen.away(w, t):
                excluded.setdefault(g.group_id, set()).add(w)
        else:
            silent[w] = True
        for gid in list(pending_groups):  # the others may have been waiting in the collective for w
            maybe_complete(pending_groups[gid], t)

    def run_obligation(w, t):
        if obligations[w]:
            arrive(w, obligations[w].pop(0), t)
        else:
            res.end_time[w] = t

    def arrive(w, g: Group, t):
        if g.group_id not in seen_groups:
            seen_groups.add(g.group_id)
            res.groups.append(g)
        if g.is_singleton:
            after_sync(w, t)
            return
        arrive_at[w] = t
        arrivals.setdefault(g.group_id, set()).add(w)
        pending_groups[g.group_id] = g
        maybe_complete(g, t)

    def maybe_complete(g: Group, t):
        """The collective ends once every member arrived or is OUT (excluded, or silently away)."""
        got = arrivals[g.group_id]
        out = excluded.get(g.group_id, set())
        if not all(m in got or m in out or silent[m] for m in g.members):
            return
        done = t + comm(len(got))
        for m in sorted(got):
            res.block_time[m] += t - arrive_at[m]  # waited inside the collective for the last member
            push(done, "ack", m, g.group_id)
        del arrivals[g.group_id]
        del pending_groups[g.group_id]

    for w in range(n):
        if iters[w] <= 0:
            draining[w] = True
            obligations[w] = list(gen.finish(w, 0.0))
            run_obligation(w, 0.0)
        else:
            push(ctime(w, 0), "compute_done", w)

    events = 0
    while heap:
        t, _, kind, w, payload = heapq.heappop(heap)
        events += 1
        if events > max_events:
            raise RuntimeError("simulation exceeded max_events")
        if kind == "compute_done":
            g = gen.request(w, t, iteration=it_done[w])
            if g is None:
                waiting.add(w)
                wait_start[w] = t
            else:
                arrive(w, g, t)
        elif kind == "ack":
            gen.ack(w, payload, t)
            after_sync(w, t)
        # Anything may have made a pending group ready: let every waiting worker poll (the server's notify_all).
        progressed = True
        while progressed:
            progressed = False
            for v in sorted(waiting):
                g = gen.poll(v, t)
                if g is not None:
                    waiting.discard(v)
                    res.wait_time[v] += t - wait_start[v]
                    arrive(v, g, t)
                    progressed = True
        if check:
            gen.check_invariants()
        if on_event is not None:
            on_event(t)
    if waiting or arrivals:
        raise SimDeadlock(f"no events left; waiting workers {sorted(waiting)}, incomplete groups {list(arrivals)}")
    res.events = events
    return res

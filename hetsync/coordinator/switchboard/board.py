"""The Switch Board: one decision, on every rank, about when the job changes its sync mode (README "Switching").

A plain state machine (no gRPC, no clock of its own); hetsync/coordinator/switchboard/service.py serves it on rank 0's
coordinator server, and tests/test_switchboard.py checks it alone with hypothesis.

Why a negotiation.  Every rank must switch after the same Keras step: the switch is a global consensus round, and
after it a synchronous mode's per-step collectives must pair up across ranks.  In a decentralized mode the ranks
are at different steps, so no rank can name a step on its own.  Each rank counts its train-function calls
(its *position*, cumulative over the process's hetsync fits; every rank runs the same number, idle steps
included) and reports it to the board after every step, before the next one starts.  So a rank's true position
is at most one past its last report, and ``at = max(last reported positions) + 1`` is a step no rank has passed:
every rank learns the decision at its next report and switches at the end of step ``at``.

Report cadence ``every`` = k (``sync="auto"``'s ``report_every``; 1 otherwise): a rank reports only at positions
that are multiples of k (and once right after a switch, at ``at``), so a rank is at most k steps past its last
report, and ``at`` = the first multiple of k after the largest reported position: every rank's next report is at
or before it.  One report per k steps costs rank 0's server (which shares a core with a worker) k times less.
A rank may send its report for position q a step ahead, at the end of step q - 1, and read the answer at the end of
step q (hetsync/training/callbacks.py): the positions are the same, and the rank is then between one step behind
its last report and k - 1 steps past it, so ``at`` is still a step no rank has passed, and a decision with
``at`` = q is heard at q, before the rank passes it.

Requests (the rule, README): the first request the board receives is decided at the next report; requests that
arrive while a decision is pending (made, not yet carried out by every rank) or before it is made are dropped as
*superseded* -- concurrent requests from several ranks give one switch.  A request for the mode already in force
with the same options is answered ``unchanged``.  ``sync="auto"`` (auto_policy.py) posts its requests through the
same path, as rank -1.
"""
import json

ACCEPTED, SUPERSEDED, UNCHANGED = "accepted", "superseded", "unchanged"


def canonical(options):
    """Options as a canonical JSON string (the board compares and ships them as text)."""
    return json.dumps(options or {}, sort_keys=True)


class Decision:
    """Switch number ``id`` to ``mode`` with ``options`` (JSON) at the end of step ``at``."""

    __slots__ = ("id", "mode", "options", "at", "by", "reason", "made_at")

    def __init__(self, id_, mode, options, at, by, reason, made_at):
        self.id, self.mode, self.options, self.at = id_, mode, options, at
        self.by, self.reason, self.made_at = by, reason, made_at

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}


class SwitchBoard:
    """Switch negotiation for ``size`` ranks; ``policy`` (auto_policy.AutoPolicy or None) proposes switches."""

    def __init__(self, size, policy=None):
        self.size = int(size)
        self.policy = policy
        self.positions = [-1] * self.size   # last reported position per rank
        self.applied = [0] * self.size      # last decision id each rank carried out
        self.current = None                 # (mode, options JSON) in force, from the ranks' reports
        self.pending = None                 # (by, mode, options, reason): the request to decide next
        self.decision = None                # the decision not yet carried out by every rank
        self.history = []                   # every decision, in order
        self.requests = {ACCEPTED: 0, SUPERSEDED: 0, UNCHANGED: 0}
        self.every = 1                      # the ranks' report cadence (the largest any rank reported)

    def _check_rank(self, rank):
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range for {self.size} workers")

    # -- requests ---------------------------------------------------------------------------------------------
    def request(self, rank, mode, options=None, reason="requested"):
        """A rank (or the policy, rank -1) asks for ``mode``; returns ACCEPTED, SUPERSEDED or UNCHANGED."""
        if rank != -1:
            self._check_rank(rank)
        options = options if isinstance(options, str) else canonical(options)
        if self.pending is not None or self.decision is not None:
            status = SUPERSEDED
        elif self.current == (mode, options):
            status = UNCHANGED
        else:
            self.pending = (rank, mode, options, reason)
            status = ACCEPTED
        self.requests[status] += 1
        return status

    # -- reports ----------------------------------------------------------------------------------------------
    def report(self, rank, position, applied, mode=None, options=None, samples=(), now=0.0, every=1, stopped=None):
        """Rank ``rank`` finished step ``position`` (having carried out decisions up to ``applied``), running
        ``mode``; ``samples`` are (time, compute seconds, run-delay rate or None) per iteration, for the
        policy; ``every``: its report cadence; ``stopped``: the ranks the Job Clock says stopped training (None:
        not known), for the policy.  Returns the decision this rank has yet to carry out, or None."""
        self._check_rank(rank)
        self.every = max(self.every, int(every or 1))
        if position < self.positions[rank]:
            raise ValueError(f"rank {rank} reported position {position} after {self.positions[rank]}: positions "
                             "only grow")
        self.positions[rank] = position
        self.applied[rank] = max(self.applied[rank], int(applied))
        if mode is not None and self.decision is None:  # a schedule may switch every rank without the board
            self.current = (mode, options if isinstance(options, str) else canonical(options))
        self._retire(now)
        if self.policy is not None:
            for t, compute_s, run_delay in samples:
                self.policy.add(rank, t, compute_s, run_delay)
            self._consult_policy(now, stopped)
        self._decide(now)
        d = self.decision
        if d is not None and self.applied[rank] < d.id:
            if position > d.at:  # the protocol makes this impossible; say so loudly rather than diverge
                raise RuntimeError(f"rank {rank} is at step {position}, past switch {d.id}'s step {d.at}")
            return d
        return None

    def _retire(self, now):
        """The decision every rank has carried out (``now``: the report that said so, the last rank's) is history."""
        d = self.decision
        if d is not None and min(self.applied) >= d.id:
            self.current = (d.mode, d.options)
            self.decision = None
            if self.policy is not None:
                self.policy.switched(d.mode, d.made_at, now)

    def _consult_policy(self, now, stopped):
        if self.pending is not None or self.decision is not None or self.current is None:
            return
        proposal = self.policy.evaluate(now, self.current[0], stopped)
        if proposal is not None:
            mode, options, evidence = proposal
            self.request(-1, mode, options, reason=f"auto: {evidence}")

    def _decide(self, now):
        if self.pending is None or self.decision is not None:
            return
        by, mode, options, reason = self.pending
        self.pending = None
        k = self.every
        at = (max(self.positions) // k + 1) * k
        self.decision = Decision(len(self.history) + 1, mode, options, at, by, reason, now)
        self.history.append(self.decision)

    def metrics(self):
        return {"switches": len(self.history), "positions": list(self.positions), "applied": list(self.applied),
                "current": list(self.current) if self.current else None, **{f"requests_{k}": v for k, v in
                                                                            self.requests.items()}}

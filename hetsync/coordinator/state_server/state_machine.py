"""ESync's State Server as a plain state machine (ESync §4.1, Algorithm 2; §4.2's non-blocking queries).

The server decides, before each local iteration of each worker, whether the worker should aggregate now (READY) or
take another local step (NOT-READY).  The idea (§4): the slowest worker aggregates after every step of its own; a
faster worker keeps taking local steps as long as one more step still ends before the slowest worker is ready, so
when the slowest arrives at the aggregation the others are (nearly) there too.

Records (Algorithm 2 line 2): ``(rank, local_iterations k, capability c, last_finish_time t_e, ready, round)``.
``query(r, k, c, since_finish, now)`` (QUERY-STATE) updates r's record, with ``t_e = now - since_finish`` (see
"Clocks" below), and answers

* NOT-READY when ``k == 0`` (every worker takes at least one step per round) or when the slowest worker has not
  started this round yet (it is still in the previous aggregation: "has not completed the PULL");
* READY when r is the slowest, or the slowest is already ready, or ``c_r + epsilon > rest_time`` with
  ``rest_time = c_slowest - (now - t_e_slowest)``: the time until the slowest finishes its current step;
* NOT-READY otherwise.

``reset(r, round, now, since_finish)`` (RESET-STATE-SERVER) after r's aggregation: ready cleared, k = 0, round
advanced, ``t_e = now - since_finish``.

Clocks: Algorithm 2 line 8 subtracts a worker's ``t_e`` from the server's ``current_time``, which only means
something when both are read on one clock.  No worker's clock reaches this class: a worker sends how long ago (on
its own clock) its last step ended, and the server places that on its own clock when the request arrives, ``t_e =
now - since_finish``.  Workers and server may then be on different hosts, with unrelated clocks; the error is the
request's one-way latency (t_e is placed that much late, so rest_time is that much too long: sub-millisecond on the
loopback this runs on, against steps of tens of milliseconds).

``arrive(r, round)`` / ``missing(round)``: the aggregation's roll call.  Before the Horovod allreduce of a round a
worker tells the server it is there and waits (state_service.py, ``StateWait``) until every live worker is there
too; workers that never come (dead, hung) are then named in an error instead of leaving everyone inside a Horovod
collective that never completes.  Away and finished workers are not waited for.

Choices where the paper is silent (docs: README, "ESync"):

* The slowest worker is the live worker with the largest capability.  A worker that finished training or is away
  (in a global collective, between epochs; reported by its client) is not a candidate, so nobody waits for it.
* ``t_e`` reaches the server as a duration (``since_finish``), not as the worker's absolute time (above,
  "Clocks").
* The capabilities start at 0.  The worker runs Algorithm 1's RUN-BATCH-DATA-TEST before round 0 and reports its
  ``c`` with a k = 0 query (hetsync/algorithms/esync.py, ``batch_data_test``), so round 0 is decided on measured
  capabilities; without it round 0 ends after one step everywhere.

Pure Python, no gRPC and no clock of its own (``now`` is passed in), so it is tested alone with hypothesis
(tests/test_state_server.py).
"""
import dataclasses

READY, NOT_READY = True, False


@dataclasses.dataclass
class Record:
    rank: int
    k: int = 0              # local iterations in the current round
    c: float = 0.0          # capability: seconds per local iteration (query RTT included in non-blocking mode)
    t_e: float = 0.0        # when the worker finished its last local iteration, on the server's clock
    ready: bool = False
    round: int = 0          # aggregations this worker has completed
    state: str = "live"     # "live", "away" or "finished"
    queries: int = 0
    local_steps: int = 0    # over the whole run
    rounds_ready_at: dict = dataclasses.field(default_factory=dict)  # round -> time it was told READY
    heard: float = 0.0      # server time of its last request


class StateServer:
    """Algorithm 2 for ``size`` workers; ``epsilon`` is the boundary constant (seconds)."""

    def __init__(self, size, epsilon=0.01):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0 seconds, got {epsilon}")
        self.size, self.epsilon = size, float(epsilon)
        self.records = [Record(r) for r in range(size)]
        self.abandoned = {}  # round -> why its aggregation was given up (a roll call timed out)

    def _check(self, rank):
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            raise ValueError(f"worker {rank!r} out of range for {self.size} workers")
        return self.records[rank]

    def slowest(self):
        """The live worker with the largest capability (lowest rank on ties); None when none is live."""
        live = [rec for rec in self.records if rec.state == "live"]
        return max(live, key=lambda rec: (rec.c, -rec.rank)) if live else None

    def query(self, rank, k, c, since_finish, now):
        """QUERY-STATE(r, k, c, t_e): READY (aggregate now) or NOT_READY (take another local step).  ``t_e`` is
        ``now - since_finish``: the worker's last step ended ``since_finish`` seconds before this request arrived."""
        rec = self._check(rank)
        if since_finish < 0:
            raise ValueError(f"worker {rank}: since_finish must be >= 0 seconds, got {since_finish}")
        if rec.state == "finished":
            raise ValueError(f"worker {rank} has finished; it cannot query the State Server again")
        rec.state, rec.heard = "live", float(now)
        if k < rec.k and k != 0:
            raise ValueError(f"worker {rank}: local iterations went back from {rec.k} to {k} without a reset")
        rec.local_steps += max(0, k - rec.k)
        rec.k, rec.c, rec.t_e = int(k), float(c), float(now) - float(since_finish)
        rec.queries += 1
        if rec.ready:
            return READY
        slow = self.slowest()
        if rec.k == 0 or slow.round < rec.round:
            return NOT_READY
        rest_time = slow.c - (now - slow.t_e)
        if slow is rec or slow.ready or rec.c + self.epsilon > rest_time:
            rec.ready = True
            rec.rounds_ready_at[rec.round] = now
            return READY
        return NOT_READY

    def reset(self, rank, round_, now, since_finish=0.0):
        """RESET-STATE-SERVER(r, t, t_e): r aggregated and starts round ``round_``; its aggregation ended
        ``since_finish`` seconds before ``now`` (t_e, on the server's clock).  Rounds only go forward; they may skip
        (a worker that was away took part in the aggregations without querying)."""
        rec = self._check(rank)
        if round_ <= rec.round:
            raise ValueError(f"worker {rank}: reset to round {round_}, but it is already in round {rec.round}")
        if since_finish < 0:
            raise ValueError(f"worker {rank}: since_finish must be >= 0 seconds, got {since_finish}")
        rec.round, rec.k, rec.ready, rec.t_e = round_, 0, False, float(now) - float(since_finish)
        rec.heard = max(rec.heard, float(now))

    def arrive(self, rank, round_, now):
        """r is at the aggregation of round ``round_`` (it was told READY, or ran out of local steps)."""
        rec = self._check(rank)
        if rec.state == "finished":
            raise ValueError(f"worker {rank} has finished; it cannot take part in an aggregation")
        if round_ < rec.round:
            raise ValueError(f"worker {rank}: arrived at round {round_}, but it is already in round {rec.round}")
        rec.state, rec.heard = "live", float(now)
        if round_ > rec.round:  # it was away while the others aggregated
            rec.round, rec.k = int(round_), 0
        rec.ready = True

    def abandon(self, round_, why):
        """A worker's roll call for ``round_`` timed out: the round's aggregation will never run (the workers
        that gave up have left it), so a latecomer must not wait for them in a collective either."""
        self.abandoned.setdefault(int(round_), why)

    def missing(self, round_):
        """Live workers not yet at (or past) the aggregation of round ``round_``."""
        return [rec.rank for rec in self.records
                if rec.state == "live" and not (rec.round > round_ or (rec.round == round_ and rec.ready))]

    def away(self, rank):
        """The worker left its steps (a global collective, an epoch end): nobody waits for it meanwhile."""
        rec = self._check(rank)
        if rec.state == "live":
            rec.state = "away"

    def finish(self, rank):
        """The worker stopped training for good."""
        self._check(rank).state = "finished"

    def metrics(self):
        """Per worker: state, round, local steps, queries, capability."""
        return {"rounds": [rec.round for rec in self.records], "local_steps": [rec.local_steps for rec in self.records],
                "queries": [rec.queries for rec in self.records], "state": [rec.state for rec in self.records],
                "capability": [rec.c for rec in self.records]}

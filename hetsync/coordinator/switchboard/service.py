"""The Switch Board over gRPC: the servicer rank 0's coordinator server hosts beside the Group Generator and the
State Server (same port, same job secret, loopback on one host).  Every rank's side is client.py.

The decisions are :class:`~hetsync.coordinator.switchboard.board.SwitchBoard`'s; this module moves them over the
wire, under one lock.  No clock is compared across hosts: a report carries each sample's age (a duration on the
worker's clock), which the service places on its own clock at receipt (the error is the report's one-way latency).
"""
import json
import threading
import time

import grpc

from .. import _proto
from ..auth import require_secret
from .auto_policy import AutoPolicy
from .board import SwitchBoard

pb2, pb2_grpc = _proto.load("switchboard")


class SwitchServicer(pb2_grpc.SwitchBoardServicer):
    """Serves ``owner.switchboard`` (owner: the GGServer; the board is created with the server), whose policy also
    hears which ranks ``owner.job_clock`` says stopped."""

    def __init__(self, owner, size, clock=time.monotonic):
        self._o, self._clock = owner, clock
        self._lock = threading.Lock()
        owner.switchboard = SwitchBoard(size)
        self._size = size
        self._musters = {}  # key -> {"errors": {worker: error}, "replied": set of workers}
        self._muster_cond = threading.Condition()

    def _call(self, request, context, fn):
        require_secret(request.secret, self._o.secret, context)
        with self._lock:
            try:
                return fn(self._o.switchboard)
            except (ValueError, RuntimeError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def SwitchRequest(self, request, context):
        def ask(board):
            status = board.request(request.worker, request.mode, request.options_json)
            d = board.decision
            return pb2.SwitchRequestReply(status=status, pending_id=d.id if d else 0,
                                          pending_mode=d.mode if d else (board.pending[1] if board.pending else ""))

        return self._call(request, context, ask)

    def SwitchReport(self, request, context):
        def report(board):
            received = self._clock()
            delays = list(request.sample_run_delay)
            if len(delays) != len(request.sample_compute_s):  # not measured (a rank without the field)
                delays = [-1.0] * len(request.sample_compute_s)
            ages = zip(request.sample_age_s, request.sample_compute_s, delays)
            samples = [(received - max(age, 0.0), c, d if d >= 0 else None) for age, c, d in ages]
            d = board.report(request.worker, request.position, request.applied, request.mode or None,
                             request.options_json or "{}", samples, received, request.every or 1, self._stopped())
            if d is None:
                return pb2.SwitchDecision(id=0)
            return pb2.SwitchDecision(id=d.id, mode=d.mode, options_json=d.options, at=d.at, by=d.by,
                                      reason=d.reason)

        return self._call(request, context, report)

    def _stopped(self):
        """The ranks the Job Clock, served beside the board by the same server, says stopped training: read without
        its lock (a list of booleans, each written whole; a stop seen one report late delays a decision, no more)."""
        return {r for r, s in enumerate(self._o.job_clock.stopped) if s}

    def SwitchConfigure(self, request, context):
        def configure(board):
            if not request.policy_json:
                board.policy = None
            else:
                cfg = json.loads(request.policy_json)
                board.policy = AutoPolicy(board.size, cfg.pop("candidates", None), **cfg)
            return pb2.SwitchAck()

        return self._call(request, context, configure)

    def SwitchMuster(self, request, context):
        """A roll call: waits (on its own condition, not the board's lock) until every rank came or ``wait_s``."""
        require_secret(request.secret, self._o.secret, context)
        if not 0 <= request.worker < self._size:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"worker {request.worker} out of range")
        with self._muster_cond:
            m = self._musters.setdefault(request.key, {"errors": {}, "replied": set()})
            m["errors"][request.worker] = request.error
            self._muster_cond.notify_all()
            deadline = time.monotonic() + max(request.wait_s, 0.0)
            # polls the server's stop flag: a stopping server (an exception on rank 0) ends every wait at once
            while len(m["errors"]) < self._size and not getattr(self._o, "_stopping", False):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._muster_cond.wait(min(left, 0.5))
            missing = [r for r in range(self._size) if r not in m["errors"]]
            errors = [m["errors"].get(r, "") for r in range(self._size)]
            m["replied"].add(request.worker)
            if not missing and len(m["replied"]) == self._size:
                del self._musters[request.key]
        return pb2.MusterReply(missing=missing, errors=errors)


def add_to_server(owner, server: grpc.Server) -> None:
    """Serves the Switch Board (created here, for ``owner.generator.size`` ranks) on ``server``."""
    pb2_grpc.add_SwitchBoardServicer_to_server(SwitchServicer(owner, owner.generator.size), server)

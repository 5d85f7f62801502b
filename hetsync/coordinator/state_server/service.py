"""ESync's State Server over gRPC (ESync §4.1, §4.2): the servicer rank 0's coordinator server hosts beside the
Group Generator (same port, same job secret, loopback-bound on one host).  The worker's side is client.py.

The decisions are :class:`~hetsync.coordinator.state_server.state_machine.StateServer`'s (a plain state machine);
this module only moves them over the wire, under one lock.  ``now`` is the server's ``time.monotonic()`` at a
request's receipt.  No absolute time crosses the wire (the paper's Algorithm 2 compares a worker's t_e with the
server's clock, a one-host assumption): the client sends how long ago its finish times were (``since_finish_s``,
measured just before sending), and the server places that on its own clock (state_machine.py, "Clocks").
"""
import threading
import time

import grpc

from .. import _proto
from ..auth import require_secret
from .state_machine import StateServer

pb2, pb2_grpc = _proto.load("state_server")


class StateServicer(pb2_grpc.StateServerServicer):
    """Serves the State Server installed on ``owner`` (a GGServer: ``secret``, ``state_server``)."""

    def __init__(self, owner, clock=time.monotonic):
        self._o, self._clock = owner, clock
        self._lock = threading.Condition()  # notified on every change, for StateWait

    def _call(self, request, context, fn):
        require_secret(request.secret, self._o.secret, context)
        with self._lock:
            server = self._o.state_server
            if server is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no ESync State Server is installed in this job")
            try:
                reply = fn(server)
                self._lock.notify_all()
                return reply
            except ValueError as exc:
                code = (grpc.StatusCode.FAILED_PRECONDITION if "has finished" in str(exc)
                        else grpc.StatusCode.INVALID_ARGUMENT)
                context.abort(code, str(exc))

    def QueryState(self, request, context):
        def query(server):
            ready = server.query(request.worker, request.local_iterations, request.capability_s,
                                 request.since_finish_s, self._clock())
            slow = server.slowest()
            return pb2.StateReply(ready=ready, slowest=-1 if slow is None else slow.rank)

        return self._call(request, context, query)

    def ResetState(self, request, context):
        return self._call(request, context,
                          lambda s: s.reset(request.worker, request.round, self._clock(), request.since_finish_s)
                          or pb2.StateAck())

    def StateAway(self, request, context):
        return self._call(request, context, lambda s: s.away(request.worker) or pb2.StateAck())

    def StateFinish(self, request, context):
        return self._call(request, context, lambda s: s.finish(request.worker) or pb2.StateAck())

    def StateWait(self, request, context):
        """The aggregation's roll call (state_server.arrive/missing), waiting under the lock's condition."""
        start = self._clock()
        self._call(request, context, lambda s: s.arrive(request.worker, request.round, start) or pb2.StateAck())
        deadline = start + (request.timeout_s if request.timeout_s > 0 else 120.0)
        with self._lock:
            while True:
                server = self._o.state_server
                if server is None:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the ESync State Server was removed")
                if request.round in server.abandoned:
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"ESync round {request.round} was abandoned by the other workers: "
                                  f"{server.abandoned[request.round]}")
                missing = server.missing(request.round)
                left = deadline - self._clock()
                if not missing:
                    return pb2.StateAck()
                if left <= 0 or not context.is_active():
                    break
                self._lock.wait(min(left, 0.5))
            silent = ", ".join(f"{r} (last heard {self._clock() - server.records[r].heard:.1f} s ago)"
                               for r in missing)
            why = (f"worker(s) {silent} did not reach the aggregation within {request.timeout_s:g} s (dead or "
                   f"hung?); the job cannot aggregate without them")
            server.abandon(request.round, why)
            self._lock.notify_all()
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"ESync round {request.round}: {why}")

    def StateMetrics(self, request, context):
        return self._call(request, context, lambda s: pb2.StateServerMetrics(**{
            "rounds": s.metrics()["rounds"], "local_steps": s.metrics()["local_steps"],
            "queries": s.metrics()["queries"], "state": s.metrics()["state"],
            "capability_s": s.metrics()["capability"]}))


def install(gg_server, size, epsilon):
    """Rank 0: installs a fresh State Server for ``size`` workers on the running coordinator server."""
    gg_server.state_server = StateServer(size, epsilon)


def add_to_server(owner, server: grpc.Server) -> None:
    """Serves the State Server installed on ``owner`` (the coordinator server: ``secret``, ``state_server``)."""
    pb2_grpc.add_StateServerServicer_to_server(StateServicer(owner), server)

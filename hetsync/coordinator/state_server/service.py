"""ESync's State Server over gRPC (ESync §4.1, §4.2): the servicer rank 0's coordinator server hosts beside the
Group Generator (same port, same job secret, loopback-bound on one host), and the client each worker uses.

The decisions are :class:`hetsync.coordinator.state_server.StateServer`'s (a plain state machine); this module only
moves them over the wire, under one lock.  ``now`` is the server's ``time.monotonic()`` at a request's receipt.
No absolute time crosses the wire (the paper's Algorithm 2 compares a worker's t_e with the server's clock, a
one-host assumption): the client API takes the worker's finish times on the worker's own clock, the client sends
how long ago they were (``since_finish_s``, measured just before sending), and the server places that on its own
clock (state_server.py, "Clocks").
"""
import threading
import time

import grpc

from . import _proto
from .auth import require_secret
from .state_server import StateServer

pb2, pb2_grpc = _proto.load()


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


class StateServerClient:
    """One worker's connection to the State Server; every call has ``timeout`` seconds.  ``clock`` is the worker's
    own clock, the one its ``last_finish_time`` / ``finish_time`` arguments are read on: they leave as durations
    (module docstring), so it need not be the server's."""

    def __init__(self, address, secret, worker, timeout=30.0, clock=time.monotonic):
        self.worker, self.secret, self.timeout, self._clock = int(worker), secret, float(timeout), clock
        self._channel = grpc.insecure_channel(address)
        self._stub = pb2_grpc.StateServerStub(self._channel)

    def _since(self, finished_at):
        return max(0.0, self._clock() - float(finished_at))

    def _query(self, local_iterations, capability_s, last_finish_time):
        return pb2.StateQuery(secret=self.secret, worker=self.worker, local_iterations=int(local_iterations),
                              capability_s=float(capability_s), since_finish_s=self._since(last_finish_time))

    def query(self, local_iterations, capability_s, last_finish_time):
        """QUERY-STATE: True (READY: aggregate now) or False (take another local step).  ``last_finish_time``:
        when the last local step ended, on this worker's ``clock``."""
        return self._stub.QueryState(self._query(local_iterations, capability_s, last_finish_time),
                                     timeout=self.timeout).ready

    def query_async(self, local_iterations, capability_s, last_finish_time):
        """§4.2's non-blocking query: a future whose ``result()`` is the StateReply."""
        return self._stub.QueryState.future(self._query(local_iterations, capability_s, last_finish_time),
                                            timeout=self.timeout)

    def reset(self, round_, finish_time):
        """RESET-STATE-SERVER: the worker starts round ``round_``; its aggregation ended at ``finish_time`` (this
        worker's ``clock``)."""
        self._stub.ResetState(pb2.StateReset(secret=self.secret, worker=self.worker, round=int(round_),
                                             since_finish_s=self._since(finish_time)), timeout=self.timeout)

    def wait(self, round_, timeout_s):
        """Arrives at round ``round_``'s aggregation and waits for every live worker (StateWait); grpc.RpcError
        DEADLINE_EXCEEDED names the workers that did not come."""
        self._stub.StateWait(pb2.StateWaitRequest(secret=self.secret, worker=self.worker, round=int(round_),
                                                  timeout_s=float(timeout_s)), timeout=float(timeout_s) + 30.0)

    def away(self):
        self._stub.StateAway(pb2.StateWorker(secret=self.secret, worker=self.worker), timeout=self.timeout)

    def finish(self):
        self._stub.StateFinish(pb2.StateWorker(secret=self.secret, worker=self.worker), timeout=self.timeout)

    def metrics(self):
        m = self._stub.StateMetrics(pb2.MetricsRequest(secret=self.secret), timeout=self.timeout)
        return {"rounds": list(m.rounds), "local_steps": list(m.local_steps), "queries": list(m.queries),
                "state": list(m.state), "capability": list(m.capability_s)}

    def close(self):
        self._channel.close()

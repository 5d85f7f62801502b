"""ESync's State Server, a worker's side (ESync §4.1, Algorithm 1's QUERY-STATE and RESET-STATE-SERVER).

The client API takes the worker's finish times on the worker's own clock and sends how long ago they were
(``since_finish_s``): no absolute time crosses the wire (service.py).
"""
import time

from .. import _proto
from .._client import ServiceClient

pb2, pb2_grpc = _proto.load("state_server")


class StateServerClient(ServiceClient):
    """One worker's connection to the State Server; every call has ``timeout`` seconds.  ``clock`` is the worker's
    own clock, the one its ``last_finish_time`` / ``finish_time`` arguments are read on: they leave as durations
    (module docstring), so it need not be the server's."""

    def __init__(self, address, secret, worker, timeout=30.0, clock=time.monotonic):
        super().__init__(address, secret, worker, timeout, pb2_grpc.StateServerStub)
        self._clock = clock

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


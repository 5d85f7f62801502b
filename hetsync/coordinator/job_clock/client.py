"""The Job Clock, a rank's side: claims of train steps, the stopped rank's wait for its slice, the stop step."""
import json

from .. import _proto
from .._client import ServiceClient
from .clock import REACHED

pb2, pb2_grpc = _proto.load("job_clock")


class JobClockClient(ServiceClient):
    """One rank's connection to the Job Clock; every call has ``timeout`` seconds."""

    def __init__(self, address, secret, worker, timeout=30.0):
        super().__init__(address, secret, worker, timeout, pb2_grpc.JobClockStub)

    def _msg(self, epoch=0, step=0, position=0, plan=None, wait_s=0.0):
        return pb2.JobStepMsg(secret=self.secret, worker=self.worker, epoch=int(epoch), step=int(step),
                              position=int(position), total=plan.total if plan else 0,
                              keras_steps=plan.keras_steps if plan else 0, wait_s=float(wait_s))

    def claim(self, epoch, step, position, plan, force=False, floor=0):
        """(status, count, stop_at or None): status is job_clock.GRANTED, FULL or STOPPED."""
        msg = self._msg(epoch, step, position, plan)
        msg.force, msg.floor = bool(force), int(floor)
        r = self._stub.JobClaim(msg, timeout=self.timeout)
        return r.status, r.count, (None if r.stop_at < 0 else r.stop_at)

    def reached(self, epoch, step, position, plan, wait_s):
        """(reached, stop_at or None) after at most ``wait_s`` seconds on the server."""
        r = self._stub.JobReached(self._msg(epoch, step, position, plan, wait_s), timeout=self.timeout + wait_s)
        return r.status == REACHED, (None if r.stop_at < 0 else r.stop_at)

    def stop(self, position):
        """This rank stopped during Keras step ``position``; returns the stop step if every rank has stopped."""
        r = self._stub.JobStop(self._msg(position=position), timeout=self.timeout)
        return None if r.stop_at < 0 else r.stop_at

    def resume(self):
        self._stub.JobResume(self._msg(), timeout=self.timeout)

    def metrics(self):
        return json.loads(self._stub.JobMetrics(pb2.MetricsRequest(secret=self.secret), timeout=self.timeout).json)


"""The Job Clock over gRPC: the servicer rank 0's coordinator server hosts beside the Group Generator, the State
Server and the Switch Board (same port, same job secret).  Every rank's side is client.py.

The decisions are :class:`~hetsync.coordinator.job_clock.clock.JobClock`'s; this module moves them over the wire
under one condition variable, so a stopped rank's ``JobReached`` sleeps on the server until a claim fills its slice
(no polling), and no clock is compared across ranks: the server measures its own waits.
"""
import json
import threading
import time

import grpc

from .. import _proto
from ..auth import require_secret
from .clock import GRANTED, GRANTS, REACHED, STOPPED, WAITING, EpochPlan, JobClock

pb2, pb2_grpc = _proto.load("job_clock")


class JobServicer(pb2_grpc.JobClockServicer):
    """Serves ``owner.job_clock`` (owner: the coordinator server)."""

    def __init__(self, owner, size):
        self._o = owner
        self._cv = threading.Condition()
        owner.job_clock = JobClock(size)

    def _call(self, request, context, fn):
        require_secret(request.secret, self._o.secret, context)
        with self._cv:
            try:
                return fn(self._o.job_clock)
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    @staticmethod
    def _reply(status, count, clock):
        return pb2.JobStepReply(status=status, count=count, stop_at=-1 if clock.stop_at is None else clock.stop_at)

    @staticmethod
    def _plan(request):
        return EpochPlan(request.total, request.keras_steps)

    def JobClaim(self, request, context):
        def claim(clock):
            status, count = clock.claim(request.worker, request.epoch, request.step, request.position,
                                        self._plan(request), force=request.force, floor=request.floor)
            if status in GRANTS:
                self._cv.notify_all()
            return self._reply(status, count, clock)

        return self._call(request, context, claim)

    def JobReached(self, request, context):
        def reached(clock):
            deadline = time.monotonic() + max(float(request.wait_s), 0.0)
            plan = self._plan(request)
            while not clock.reached(request.worker, request.epoch, request.step, request.position, plan):
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._reply(WAITING, clock.counts[request.epoch], clock)
                self._cv.wait(left)
            return self._reply(REACHED, clock.counts[request.epoch], clock)

        return self._call(request, context, reached)

    def JobStop(self, request, context):
        def stop(clock):
            clock.stop(request.worker, request.position)
            self._cv.notify_all()
            return self._reply(STOPPED, 0, clock)

        return self._call(request, context, stop)

    def JobResume(self, request, context):
        def resume(clock):
            clock.resume(request.worker)
            return self._reply(GRANTED, 0, clock)

        return self._call(request, context, resume)

    def JobMetrics(self, request, context):
        return self._call(request, context, lambda clock: pb2.JobMetricsReply(json=json.dumps(clock.metrics())))


def add_to_server(owner, server: grpc.Server) -> None:
    """Serves the Job Clock (created here, for ``owner.generator.size`` ranks) on ``server``."""
    pb2_grpc.add_JobClockServicer_to_server(JobServicer(owner, owner.generator.size), server)

"""The Job Clock over gRPC: the servicer rank 0's coordinator server hosts beside the Group Generator, the State
Server and the Switch Board (same port, same job secret), and the client every rank uses.

The decisions are :class:`hetsync.coordinator.job_clock.JobClock`'s; this module moves them over the wire under one
condition variable, so a stopped rank's ``JobReached`` sleeps on the server until a claim fills its slice (no
polling), and no clock is compared across ranks: the server measures its own waits.
"""
import json
import threading
import time

import grpc

from . import _proto
from .auth import require_secret
from .job_clock import FULL, GRANTED, STOPPED, EpochPlan, JobClock

pb2, pb2_grpc = _proto.load()
REACHED, WAITING = "reached", "waiting"


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
            if status == GRANTED:
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


class JobClockClient:
    """One rank's connection to the Job Clock; every call has ``timeout`` seconds."""

    def __init__(self, address, secret, worker, timeout=30.0):
        self.worker, self.secret, self.timeout = int(worker), secret, float(timeout)
        self._channel = grpc.insecure_channel(address)
        self._stub = pb2_grpc.JobClockStub(self._channel)

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

    def close(self):
        self._channel.close()


__all__ = ["JobServicer", "JobClockClient", "GRANTED", "FULL", "STOPPED", "REACHED", "WAITING"]

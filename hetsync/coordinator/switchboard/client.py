"""The Switch Board, a rank's side: switch requests, the per-step report (which carries the decision to carry
out), sync="auto"'s policy, and a switch's roll call.  Samples travel as ages on this rank's clock (service.py)."""
import json
import time

from .. import _proto
from .._client import ServiceClient

pb2, pb2_grpc = _proto.load("switchboard")


class SwitchClient(ServiceClient):
    """One rank's connection to the Switch Board; every call has ``timeout`` seconds."""

    def __init__(self, address, secret, worker, timeout=30.0):
        super().__init__(address, secret, worker, timeout, pb2_grpc.SwitchBoardStub)

    def request(self, mode, options_json):
        reply = self._stub.SwitchRequest(pb2.SwitchRequestMsg(secret=self.secret, worker=self.worker, mode=mode,
                                                              options_json=options_json), timeout=self.timeout)
        return reply.status, reply.pending_mode

    def report(self, position, applied, mode, options_json, samples=(), every=1):
        """The decision this rank has yet to carry out (a SwitchDecision; ``id == 0``: none).  ``samples``:
        (time.monotonic() on this rank, compute seconds, run-delay rate or None) per iteration; times travel as
        ages."""
        return self._stub.SwitchReport(self._report_msg(position, applied, mode, options_json, samples, every),
                                       timeout=self.timeout)

    def report_ahead(self, position, applied, mode, options_json, samples=(), every=1):
        """:meth:`report`, sent without waiting: a future whose ``result()`` is the SwitchDecision.  The rank sends
        it a step before ``position`` and reads it after that step: on a CPU-throttled node a blocking call's answer
        waits for the node's next CPU window (up to a scheduler period, 100 ms), which the step's compute uses
        instead."""
        return self._stub.SwitchReport.future(self._report_msg(position, applied, mode, options_json, samples, every),
                                              timeout=self.timeout)

    def _report_msg(self, position, applied, mode, options_json, samples, every):
        now = time.monotonic()
        return pb2.SwitchReportMsg(
            secret=self.secret, worker=self.worker, position=int(position), applied=int(applied), mode=mode,
            options_json=options_json, every=int(every), sample_age_s=[now - t for t, _, _ in samples],
            sample_compute_s=[c for _, c, _ in samples],
            sample_run_delay=[-1.0 if d is None else d for _, _, d in samples])

    def configure(self, policy):
        """Installs ``sync="auto"``'s policy (a dict: candidates and settings; None removes it)."""
        self._stub.SwitchConfigure(pb2.SwitchConfigureMsg(
            secret=self.secret, policy_json=json.dumps(policy) if policy is not None else ""), timeout=self.timeout)

    def muster(self, key, error, wait_s):
        """The switch's roll call (collective: every rank calls it with the same ``key``): (missing ranks, errors
        by rank).  Missing ranks are named after ``wait_s`` seconds, never waited for longer."""
        reply = self._stub.SwitchMuster(pb2.MusterMsg(secret=self.secret, worker=self.worker, key=key,
                                                      error=error or "", wait_s=float(wait_s)),
                                        timeout=float(wait_s) + self.timeout)
        return list(reply.missing), list(reply.errors)


"""The Job Clock: the job's count of train steps per epoch, shared by speed, and the step at which every rank leaves
fit once all have stopped.

===========  =================================================================================
``clock``    the decisions (claims, a stopped rank's slice, the stop step): plain Python, no gRPC
``service``  the gRPC servicer rank 0's coordinator server hosts (``protos/job_clock.proto``)
``client``   a rank's side
===========  =================================================================================

Importing this package loads no gRPC: ``service`` and ``client`` are imported by name.
"""
from .clock import AHEAD, FULL, GRANTED, GRANTS, REACHED, STOPPED, WAITING, EpochPlan, JobClock, passes_to

__all__ = ["AHEAD", "FULL", "GRANTED", "GRANTS", "REACHED", "STOPPED", "WAITING", "EpochPlan", "JobClock",
           "passes_to"]

"""The Switch Board: live sync-mode switches agreed at one step on every rank, and sync="auto"'s policy.

================  =================================================================================
``board``         the decisions (requests, the agreed switch step, reports): plain Python, no gRPC
``auto_policy``   sync="auto": classifies the measured heterogeneity and picks a candidate mode
``service``       the gRPC servicer rank 0's coordinator server hosts (``protos/switchboard.proto``)
``client``        a rank's side
================  =================================================================================

Importing this package loads no gRPC: ``service`` and ``client`` are imported by name.
"""
from .board import ACCEPTED, SUPERSEDED, UNCHANGED, Decision, SwitchBoard, canonical

__all__ = ["ACCEPTED", "SUPERSEDED", "UNCHANGED", "Decision", "SwitchBoard", "canonical"]

"""ESync's State Server (ESync §4.1, Algorithm 2; §4.2), one concern per module:

=================  =================================================================================
``state_machine``  the decisions (READY / NOT-READY per query, rounds, away and finished workers): plain
                   Python, no gRPC, no clock of its own
``service``        the gRPC servicer rank 0's coordinator server hosts (``protos/state_server.proto``)
``client``         a worker's side
=================  =================================================================================

Importing this package loads no gRPC: ``service`` and ``client`` are imported by name.
"""
from .state_machine import NOT_READY, READY, StateServer

__all__ = ["NOT_READY", "READY", "StateServer"]

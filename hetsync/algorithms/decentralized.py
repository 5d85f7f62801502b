"""Shared behaviour of decentralized methods: workers hold different parameters and average them in groups.

During a consensus round (a Horovod collective over all ranks) a worker cannot take part in hetsync's group
collectives, so it withdraws from them first: the engine tells every peer, and a peer waiting on it in a P-Reduce
continues without it (docs/engine.md).  After the round all workers rejoin a new session; a worker whose training
has ended withdraws again at once, so the others never wait on it.
"""
from hetsync import ops
from hetsync.algorithms.base import SyncAlgorithm


class DecentralizedAlgorithm(SyncAlgorithm):
    """Withdraws from P-Reduce for each consensus round and rejoins after it."""

    def on_consensus_begin(self):
        ops.withdraw()

    def on_idle(self):
        """Stopped while others train on: leave the mode's collectives exactly as for a consensus round."""
        self.on_consensus_begin()

    def on_consensus_end(self, finished):
        ops.rejoin()
        if finished:
            ops.withdraw()

"""``hetsync.callbacks.ConsensusCallback``: how often decentralized training averages its workers' models.

Optional.  Without it, hetsync already ends every epoch and every ``fit`` with one model on every rank: the sync
points of hetsync/training/ run for every model compiled with a ``hetsync.DistributedOptimizer``.  This callback
only changes their schedule; it does no collective of its own (two callbacks issuing global rounds would pair
with the wrong rounds on other ranks).
"""
from hetsync.training import last_rounds
from hetsync.training.hooks import ConsensusSchedule


class ConsensusCallback(ConsensusSchedule):
    """Schedule of the consensus rounds (Horovod averages of all workers' models).

    Args:
      every: ``"epoch"`` (default: at each epoch end, before the epoch's validation when there is one), an int N
        (also every N training batches), or None (no epoch-end average: only at the end of ``fit``).  With None,
        epoch ends are still a global sync point (hvd.join), so rank 0's checkpoints hold rank 0's own model.
      epochs: with ``every="epoch"`` or N, average at every ``epochs``-th epoch end only (default 1); the other
        epoch ends stay global sync points without an average (eager-SGD §5 syncs the models "every tens of
        epochs").  The end of ``fit`` then averages when its last epoch end did not.
      at_end: average when ``fit`` ends (default True).  False leaves each rank with its own model -- useful only
        to inspect the workers' divergence.  Ranks whose ``fit`` ends early keep taking part in the others' sync
        points either way, so nobody waits on them.
    """

    def __init__(self, every="epoch", at_end=True, epochs=1):
        super().__init__()
        if not (every in ("epoch", None) or (isinstance(every, int) and not isinstance(every, bool) and every > 0)):
            raise ValueError(f"every must be 'epoch', a positive int (batches) or None, got {every!r}")
        if not isinstance(at_end, bool):
            raise ValueError(f"at_end must be True or False, got {at_end!r}")
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"epochs must be a positive int (epoch ends between averages), got {epochs!r}")
        self.every, self.at_end, self.epochs = every, at_end, epochs

    @property
    def rounds(self):
        """Sync points the last ``fit`` ran (read from hetsync's internal callback)."""
        return last_rounds()

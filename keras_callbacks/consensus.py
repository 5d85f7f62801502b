"""Keras face of hetsync.consensus: average all workers' parameters before evaluation and at the end of training."""
import tensorflow as tf

from hetsync.consensus import consensus, finish


class Consensus(tf.keras.callbacks.Callback):
    """Averages every worker's model with Horovod so decentralized training evaluates and ends with one model.

    Args:
      every: ``"epoch"`` (default: once per epoch, before the epoch's validation when there is one, else at its
        end), an int N (every N training batches), or None (only at the end of training).
      at_end: at the end of ``fit`` join rounds until every worker has finished (default True).  Workers whose
        ``fit`` ends early (fewer steps, early stopping, a time budget) keep taking part in the others' rounds, so
        nobody waits on them and every rank ends with the same model.

    Put it after callbacks that may stop training (EarlyStopping) and before checkpointing callbacks in the list.
    """

    def __init__(self, every="epoch", at_end=True):
        super().__init__()
        if not (every in ("epoch", None) or (isinstance(every, int) and every > 0)):
            raise ValueError(f"every must be 'epoch', a positive int (batches) or None, got {every!r}")
        self.every, self.at_end = every, at_end
        self._in_fit = False
        self._done_this_epoch = False
        self.rounds = 0

    def _round(self):
        consensus(self.model)
        self.rounds += 1

    def on_train_begin(self, logs=None):
        self._in_fit = True

    def on_epoch_begin(self, epoch, logs=None):
        self._done_this_epoch = False

    def on_test_begin(self, logs=None):
        # Validation inside fit: evaluate the consensus model, not this worker's local one.
        if self._in_fit and self.every == "epoch" and not self._done_this_epoch:
            self._round()
            self._done_this_epoch = True

    def on_train_batch_end(self, batch, logs=None):
        if isinstance(self.every, int) and (batch + 1) % self.every == 0:
            self._round()

    def on_epoch_end(self, epoch, logs=None):
        if self.every == "epoch" and not self._done_this_epoch:
            self._round()
            self._done_this_epoch = True

    def on_train_end(self, logs=None):
        self._in_fit = False
        if self.at_end:
            self.rounds += finish(self.model)

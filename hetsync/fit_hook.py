"""hetsync inside ``Model.fit``, with no callback for the user to add: where each rank is, epoch ends, the end.

``hetsync.init()`` wraps ``tf.keras.Model.fit`` once.  For a model compiled with a ``hetsync.DistributedOptimizer``
the wrapper puts one internal callback, :class:`SyncPoints`, first in the callback list; any other model trains
exactly as before.  The callback gives every mode the drop-in guarantees (README, "Guarantees"):

* **Where the rank is** (docs/engine.md, "Availability").  The compiled train function is wrapped so the engine
  knows when this rank is inside a train step (IN_STEP: peers wait for it, it is coming) and when it left
  (BETWEEN: if it stays out longer than ``away_after``, e.g. blocked in a user's ``hvd.allreduce`` in a callback,
  peers stop waiting and go on without it).  Epoch ends and finished ranks are reported AWAY at once.
* **Epoch ends are a global sync point.**  Every rank reaches it after its own last batch of the epoch (ranks of
  decentralized modes are at different iterations, shards may be uneven): it leaves hetsync's partial collectives,
  calls ``hvd.join()`` -- Horovod's own answer to uneven data: collectives that other ranks still run (their
  gradient allreduce, a user's ``hvd.allreduce`` every N batches) complete without this rank -- and once every rank
  has joined, one consensus round averages the models (decentralized modes end every epoch with one model, so
  validation and rank 0's ``ModelCheckpoint`` see the consensus model) and says who has finished.  User callbacks
  that run Horovod collectives at the epoch end (``MetricAverageCallback``) run after this point, on every rank at
  once.  The sync point runs before the epoch's validation when there is one, else at ``on_epoch_end``.
* **Ranks that stop at different times.**  A rank whose ``fit`` ends (last epoch, ``EarlyStopping``, a time budget,
  a short shard) keeps taking part in the others' sync points -- join, consensus -- until every rank has finished,
  so nobody waits on it, it receives every consensus, and all ranks leave ``fit`` with the same model.  A finished
  rank's model has weight 0 in the consensus (it stopped training; the others' is newer).

``keras_callbacks.Consensus`` is optional: it adds rounds every N batches, or turns the epoch-end rounds off.
"""
import functools

_STATE = {"installed": False, "original_fit": None, "last_rounds": 0}


def last_rounds():
    """Sync points (epoch ends, end rounds, mid-epoch rounds) of the last hetsync ``fit`` on this rank."""
    return _STATE["last_rounds"]


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def install():
    """Wraps ``tf.keras.Model.fit`` (idempotent).  Models without a hetsync optimizer are not affected."""
    if _STATE["installed"]:
        return
    import tensorflow as tf

    original = tf.keras.Model.fit

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        algorithm = getattr(getattr(self, "optimizer", None), "_hetsync_algorithm", None)
        if algorithm is None:
            return original(self, *args, **kwargs)
        args, kwargs = _with_sync_points(original, self, args, kwargs, algorithm)
        return original(self, *args, **kwargs)

    fit._hetsync_original = original
    tf.keras.Model.fit = fit
    _STATE.update(installed=True, original_fit=original)


def _with_sync_points(original, model, args, kwargs, algorithm):
    """Returns fit's arguments with SyncPoints first in its callback list."""
    import inspect

    bound = inspect.signature(original).bind(model, *args, **kwargs)
    callbacks = bound.arguments.get("callbacks")
    user = list(callbacks) if callbacks else []
    user = [cb for cb in user if not isinstance(cb, SyncPoints)]
    bound.arguments["callbacks"] = [SyncPoints(algorithm, user)] + user
    bound.arguments.pop("self", None)
    return (), dict(bound.arguments)


def _consensus_options(user_callbacks):
    from keras_callbacks.consensus import Consensus

    found = [cb for cb in user_callbacks if isinstance(cb, Consensus)]
    return (found[0].every, found[0].at_end) if found else ("epoch", True)


def _wrap_train_function(model):
    """Makes the compiled train function report IN_STEP / BETWEEN to the engine around every call."""
    fn = model.train_function
    if fn is None or getattr(fn, "_hetsync_wrapped", False):
        return
    from hetsync import ops

    def train_function(iterator):
        ops.set_availability(ops.IN_STEP)
        try:
            return fn(iterator)
        finally:
            ops.set_availability(ops.BETWEEN)

    train_function._hetsync_wrapped = True
    train_function._hetsync_inner = fn
    model.train_function = train_function


def _make_callback_base():
    import tensorflow as tf

    return tf.keras.callbacks.Callback


class SyncPoints(_make_callback_base()):
    """The internal callback (see the module docstring).  Always first in ``fit``'s callback list."""

    def __init__(self, algorithm, user_callbacks=()):
        super().__init__()
        self.algorithm = algorithm
        self.every, self.at_end = _consensus_options(user_callbacks)
        self.rounds = 0
        self._in_fit = False
        self._synced_this_epoch = False
        self._steps_since_sync = 0
        self._epochs = None

    # -- Keras hooks ----------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        from hetsync import ops

        self._in_fit = True
        self._epochs = (self.params or {}).get("epochs")
        _wrap_train_function(self.model)
        ops.set_availability(ops.BETWEEN)

    def on_epoch_begin(self, epoch, logs=None):
        self._synced_this_epoch = False

    def on_train_batch_end(self, batch, logs=None):
        self._steps_since_sync += 1
        if isinstance(self.every, int) and self._steps_since_sync and (batch + 1) % self.every == 0:
            self._mid_epoch_round()

    def on_test_begin(self, logs=None):
        if self._in_fit and not self._synced_this_epoch:
            self._epoch_sync_point(last=False)

    def on_epoch_end(self, epoch, logs=None):
        if not self._synced_this_epoch:
            last = bool(self.model.stop_training) or (self._epochs is not None and epoch + 1 >= self._epochs)
            self._epoch_sync_point(last=last)

    def on_train_end(self, logs=None):
        from hetsync import ops

        self._in_fit = False
        ops.set_availability(ops.AWAY)
        # Keep joining the others' sync points until every rank has finished (no-op if the last one said so).
        while not self._all_finished:
            self._sync_point(finished=True)
        self._all_finished = False
        _STATE["last_rounds"] = self.rounds
        ops.set_availability(ops.IN_STEP)  # outside fit: plain ops.p_reduce calls are not gated

    # -- sync points ----------------------------------------------------------------------------------------
    _all_finished = False

    def _epoch_sync_point(self, last):
        self._synced_this_epoch = True
        self._sync_point(finished=last)

    def _sync_point(self, finished):
        """Global: every rank calls it the same number of times (finished ranks from on_train_end's loop)."""
        from hetsync import ops
        from hetsync.consensus import sync_point

        ops.set_availability(ops.AWAY)
        weight = 1.0 if self._steps_since_sync > 0 else 0.0
        average = self.at_end if finished else self.every is not None
        self._all_finished = sync_point(self.model, self.algorithm, finished=finished, weight=weight,
                                                  average=average, name=f"hetsync.sync.{self.rounds}")
        self.rounds += 1
        self._steps_since_sync = 0
        if not finished:
            ops.set_availability(ops.BETWEEN)

    def _mid_epoch_round(self):
        """``Consensus(every=N)``: a sync point every N batches too (every rank reaches batch N of the epoch;
        a finished rank's loop pairs with it like with an epoch end)."""
        self._sync_point(finished=False)


def uninstall():
    """Restores the original ``Model.fit`` (tests)."""
    if not _STATE["installed"]:
        return
    import tensorflow as tf

    tf.keras.Model.fit = _STATE["original_fit"]
    _STATE.update(installed=False, original_fit=None)


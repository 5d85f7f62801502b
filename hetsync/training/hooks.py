"""The callbacks the training layer treats specially, declared: each kind is a base class here, and the training
layer recognizes a user's callback by ``isinstance``, never by an attribute it happens to carry.

* :class:`TrainStepCallback` -- runs inside each train step, around each local iteration (an injected slowdown is
  compute: hetsync.testing's callbacks);
* :class:`ConsensusSchedule` -- decides when the sync points average the models (hetsync.callbacks.ConsensusCallback);
* :class:`SwitchSchedule` -- live sync-mode switches, bound to the fit's sync points
  (hetsync.callbacks.SyncModeCallback).

This module imports nothing from hetsync, so the public callbacks (hetsync.callbacks, hetsync.testing) subclass
these without importing the training layer's machinery, and the training layer never imports them.
"""
import tensorflow as tf


class TrainStepCallback(tf.keras.callbacks.Callback):
    """A callback whose work belongs inside the train step: under ``hetsync.keras.fit`` the training layer calls
    :meth:`on_local_iteration_begin` / :meth:`on_local_iteration_end` inside each train step -- once per Keras step,
    or once per local iteration in modes that take several per step (ESync's rounds, balanced's micro-batches,
    whose ``work`` is the micro-batch's part of a batch) -- and sets ``per_local_iteration``, so the time counts as
    the step's compute.  Without hetsync's fit (a plain Horovod model), a subclass runs them around each Keras batch
    itself."""

    per_local_iteration = False

    def on_local_iteration_begin(self, work=1.0):
        """Before one local iteration; ``work``: its share of a whole batch (1.0 but for micro-batches)."""

    def on_local_iteration_end(self):
        """After one local iteration."""


class ConsensusSchedule(tf.keras.callbacks.Callback):
    """When the fit's sync points average the models: ``every`` ("epoch", a number of batches, or None: only at the
    end), every ``epochs``-th epoch end, and ``at_end``.  Issues no collective of its own."""

    every, at_end, epochs = "epoch", True, 1


class SwitchSchedule(tf.keras.callbacks.Callback):
    """Live sync-mode switches in a fit: a per-epoch ``schedule`` ({epoch: (mode, options)}) and requests; bound at
    the fit's start to the rank's sync points (:meth:`bind`), through which every switch goes."""

    schedule = {}
    verbose = True

    def __init__(self):
        super().__init__()
        self.carried = set()  # the schedule's epochs whose start a fit of this process went through

    def bind(self, sync_points):
        """At on_train_begin: the sync points of the fit this callback belongs to."""
        raise NotImplementedError

    def missed_before(self, epoch):
        """The latest schedule entry before ``epoch`` whose start no fit of this process went through, as
        (epoch, target), or None: a script restarted at ``initial_epoch`` resumes in the mode its schedule had put
        in force by then."""
        missed = [e for e in self.schedule if e < epoch and e not in self.carried]
        return (max(missed), self.schedule[max(missed)]) if missed else None

"""The training layer: what every rank does around the mode's train step, in ``Model.fit`` and custom loops.

* lifecycle.py -- the rank's lifecycle, one state machine: every availability report to the engine, every pin
  and every stop told to the Job Clock follows one of its transitions.  The single home of the absent-rank rule.
* rank_state.py -- its Keras face: what a Keras step does, idle steps, sync points, the agreed stop.
* job_epochs.py -- job epochs: an epoch is the job's ``sum(steps_per_epoch)`` train steps, shared by speed, with
  every rank running the same Keras steps (coordinator/job_clock/clock.py holds the count).
* callbacks.py -- SyncPoints and StopVote, Keras' face of the state machine; keras_fit.py -- ``hetsync.keras.fit``,
  which plans each fit's epochs and adds them; front_door.py -- which front door a train step came through (plain
  ``model.fit`` of a hetsync model is refused; ``hvd.DistributedGradientTape`` in a loop of an own-pace mode too).
* options.py -- what the user's callbacks declare, and checks that every rank passed the same.
* initial_state.py -- Horovod's broadcast callback, honoured before a fit's first step; saved_mode.py -- the mode in
  force stamped into the user's HDF5 checkpoints, and the restarted fit's switch back to it.
* consensus.py -- the weighted Horovod average of the models at a sync point (and ``hetsync.consensus``).
* step_clock.py -- compute and waiting time per step (sync="auto", the report).
* loop.py -- custom training loops: ``hetsync.job_steps``.
* report.py -- the heterogeneity report callback.
"""
from hetsync.training.rank_state import last_rounds, position

__all__ = ["position", "last_rounds"]

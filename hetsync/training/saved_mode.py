"""The mode in force travels with a whole-model checkpoint, so a restart resumes in it (docs/resume.md).

A live switch (``SyncModeCallback.request``, a schedule) changes the mode a job trains in; a restart runs the
script again, whose ``DistributedOptimizer`` line names the mode the job *started* in.  Without this module the
resumed job would silently train on in that mode.  So:

* when a user's ``ModelCheckpoint`` writes the whole model to an HDF5 file at an epoch end, :class:`ModeStamp` (a
  callback after the user's) adds the mode in force and its options to the file, as a root attribute that Keras'
  own loading ignores;
* ``hetsync.load_model`` reads it back into the loaded optimizer's family (``Family.resumed``);
* at the next fit's start every rank takes part in one small agreement (:func:`agree`): the root of the user's
  ``BroadcastGlobalVariablesCallback`` hands its saved mode to every rank (Horovod's recipe loads on rank 0 only),
  or, without the callback, every rank must have loaded the same one; the fit's sync points then switch to it at
  its first epoch's start, on every rank, as a schedule entry would.

``sync="auto"`` ignores a saved mode: it measures again from its first steps, as at a fresh start.
"""
import itertools
import json
import os
import time
import zlib

import tensorflow as tf

ATTRIBUTE = "hetsync_sync_mode"   # the HDF5 root attribute: {"mode": ..., "options": {...}} as JSON
_HDF5 = (".h5", ".hdf5")
_CALLS = itertools.count()  # names the fit-start collective: every rank calls agree() at the same fits


def read(filepath):
    """(mode, options dict) saved in the HDF5 checkpoint ``filepath``, or None (another format, or no stamp)."""
    import h5py

    path = os.fspath(filepath)
    if not (os.path.isfile(path) and h5py.is_hdf5(path)):
        return None
    with h5py.File(path, "r") as f:
        raw = f.attrs.get(ATTRIBUTE)
    if raw is None:
        return None
    saved = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    return saved["mode"], dict(saved["options"])


def write(filepath, mode, options):
    """Stamps ``filepath`` (an HDF5 file Keras has just written) with the mode in force."""
    import h5py

    with h5py.File(filepath, "a") as f:
        f.attrs[ATTRIBUTE] = json.dumps({"mode": mode, "options": options}, sort_keys=True)


class ModeStamp(tf.keras.callbacks.Callback):
    """After the user's callbacks at each epoch end: stamps the HDF5 files their ``ModelCheckpoint`` callbacks wrote
    in this epoch end with the mode in force (whole-model, per-epoch checkpoints: what ``hetsync.load_model``
    loads)."""

    def __init__(self, head, user_callbacks):
        super().__init__()
        self.head = head
        self.writers = [cb for cb in user_callbacks if isinstance(cb, tf.keras.callbacks.ModelCheckpoint)
                        and not cb.save_weights_only and cb.save_freq == "epoch"
                        and os.fspath(cb.filepath).endswith(_HDF5)]
        self.since = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.since = time.time()

    def on_epoch_end(self, epoch, logs=None):
        family = self.head.state.family
        if family is None or not self.writers:
            return
        mode, options = family.current
        for cb in self.writers:
            try:
                path = os.fspath(cb.filepath).format(epoch=epoch + 1, **(logs or {}))
            except (KeyError, IndexError, ValueError):  # a name Keras could not format either
                continue
            # written in this epoch end (save_best_only may have skipped it; an older file is another run's)
            if os.path.isfile(path) and os.path.getmtime(path) >= self.since - 1.0:
                write(path, mode, json.loads(options))


def _wanted(family):
    """The saved mode this rank would resume in, as [mode, options], or None (``sync="auto"`` ignores one)."""
    if family is None or family.auto is not None or family.resumed is None:
        return None
    return list(family.resumed)


def code(family):
    """This rank's column in fit's agreement across ranks (keras_fit.py): 0, or a number for the saved mode it
    would resume in."""
    wanted = _wanted(family)
    return 0 if wanted is None else zlib.crc32(json.dumps(wanted, sort_keys=True).encode()) or 1


def check(codes, root):
    """Every rank's :func:`code` (fit's agreement, before anything): without a broadcast root, the ranks that
    loaded a checkpoint saved in some mode must all have loaded the same one; raised on every rank."""
    if root >= 0 or len(set(codes)) == 1:
        return
    raise ValueError(f"ranks {[r for r, c in enumerate(codes) if c != codes[0]]} loaded a checkpoint saved in "
                     "another sync mode than rank 0 did (or none): load the same checkpoint on every rank, or load "
                     "it on one rank and pass hvd.callbacks.BroadcastGlobalVariablesCallback with that rank as root "
                     "(Horovod's recipe)")


def agree(family, root, codes):
    """At a fit's start, on every rank (``codes``: every rank's :func:`code`, already checked): the saved mode the
    fit resumes in, or None.  With a broadcast root whose code is not 0, one Horovod broadcast hands its saved mode
    to every rank (the other ranks built their models afresh); otherwise every rank holds the same one."""
    import horovod.tensorflow as hvd

    mine = _wanted(family)
    if family is not None:
        family.resumed = None  # once: a later fit of this process goes on in whatever mode is then in force
    if root >= 0:
        if not codes[root]:
            return None
        mine = hvd.broadcast_object(mine, root_rank=root, name=f"hetsync.saved_mode.{next(_CALLS)}")
    return (mine[0], dict(mine[1])) if mine else None

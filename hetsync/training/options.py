"""What the training layer reads from the user's callbacks and checks across ranks.

Callbacks carry their own behaviour and declare what they are by subclassing a base of hooks.py, so this package
never imports ``hetsync.callbacks`` and ``hetsync.testing`` (no import circle).
"""
import itertools

from hetsync.training.hooks import ConsensusSchedule, SwitchSchedule

_AGREEMENTS = itertools.count()


def consensus_options(user_callbacks, algorithm):
    """(every, at_end, epochs): a user's Consensus callback decides; else the mode's own ``consensus_every`` and
    ``consensus_epochs`` (eager-SGD's model_sync_every: batches between mid-epoch averages; model_sync_epochs: epoch
    ends between averages), else every epoch end."""
    found = [cb for cb in user_callbacks if isinstance(cb, ConsensusSchedule)]
    if found:
        return found[0].every, found[0].at_end, found[0].epochs
    return algorithm.consensus_every or "epoch", True, algorithm.consensus_epochs


def switching_row(family, user_callbacks):
    """This rank's [wanted, report_every] for live switches: a SyncModeCallback (or sync="auto") on a hetsync
    optimizer.  Its part ("switching") of fit's one agreement across ranks (keras_fit._prepare)."""
    wanted = family is not None and (any(isinstance(cb, SwitchSchedule) for cb in user_callbacks)
                                     or family.auto is not None)
    return [1 if wanted else 0, family.report_every if family is not None else 1]


def check_switching(rows):
    """Live switches need every rank to report to the Switch Board, at the same cadence: all ranks or none, else
    a switch would wait forever for a rank that never hears of it.  Raised on every rank (``rows``: every rank's
    :func:`switching_row`, as gathered); returns whether switching is wanted."""
    differ = [r for r, row in enumerate(rows) if list(row) != list(rows[0])]
    if differ:
        raise ValueError(f"ranks {differ} differ from rank 0 in having a hetsync.callbacks.SyncModeCallback callback "
                         "(or sync='auto') or in sync='auto''s report_every: pass the same callbacks and options on "
                         "every rank, as for Horovod's callbacks")
    return bool(rows[0][0])


def gather(what, values):
    """Collective: every rank's ``values`` (a list of ints), as a list of rows by rank."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    everyone = hvd.allgather(tf.constant([[int(v) for v in values]], tf.int64),
                             name=f"hetsync.gather.{what}.{next(_AGREEMENTS)}")
    return everyone.numpy().tolist()


def gather_parts(what, parts):
    """Collective: one :func:`gather` of every rank's named ``parts`` (``{name: int or list of ints}``, the same
    names and widths on every rank), read back by name: for each part, a list by rank of its value (an int, or a
    list for a part given as one).  fit's one agreement reads its parts by name, so that no part's columns move
    when another joins it."""
    values, widths = [], []
    for value in parts.values():
        many = isinstance(value, (list, tuple))
        values += list(value) if many else [value]
        widths.append(len(value) if many else None)
    rows, out, at = gather(what, values), {}, 0
    for name, width in zip(parts, widths):
        out[name] = [row[at] if width is None else row[at:at + width] for row in rows]
        at += 1 if width is None else width
    return out


def agree_or_raise(what, error, fingerprint):
    """Collective (one small Horovod allgather of objects), for a call every rank makes with what should be the same
    arguments: ``error`` is this rank's own validation failure (a string, or None) and ``fingerprint`` its
    arguments, canonical.  Raises the same ValueError on every rank when any rank failed (naming each and its
    reason) or when the ranks' arguments differ (naming the ranks that differ from rank 0), so a rank-dependent
    mistake never leaves the other ranks waiting in a later collective.  Horovod not started: nothing to agree
    with; ``error`` is raised here."""
    import horovod.tensorflow as hvd

    try:
        started = hvd.is_initialized()
    except (AttributeError, ValueError):
        started = False
    if not started or hvd.size() == 1:
        if error:
            raise ValueError(error)
        return
    rows = hvd.allgather_object((error, fingerprint), name=f"hetsync.agree.{what}.{next(_AGREEMENTS)}")
    failed = [(r, e) for r, (e, _) in enumerate(rows) if e]
    if failed:
        same = len({e for _, e in failed}) == 1
        if same:
            raise ValueError(f"{what} failed on rank(s) {[r for r, _ in failed]}: {failed[0][1]}")
        raise ValueError(f"{what} failed on rank(s) {[r for r, _ in failed]}: " +
                         "; ".join(f"rank {r}: {e}" for r, e in failed))
    differ = [r for r, (_, f) in enumerate(rows) if f != rows[0][1]]
    if differ:
        raise ValueError(f"{what}: ranks {differ} were given other arguments than rank 0 (rank 0: {rows[0][1]}; "
                         f"rank {differ[0]}: {rows[differ[0]][1]}); pass the same sync mode and options on every "
                         "rank")


def fingerprint(value):
    """A canonical, comparable text of option values (dicts sorted; classes and objects by name, as Horovod's
    ``compression=hvd.Compression.fp16`` or a process set are not JSON)."""
    import json

    def plain(v):
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, type):
            return f"<class {v.__module__}.{v.__qualname__}>"
        return f"<{type(v).__qualname__}>"

    return json.dumps(plain(value), sort_keys=True)

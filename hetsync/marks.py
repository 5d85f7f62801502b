"""What hetsync built an optimizer for: its sync algorithm and, for a ``hetsync.DistributedOptimizer``, the mode
family (hetsync/switching.py) that switches between modes.

One record, written where hetsync builds the optimizer and read everywhere else (the training layer, the
callbacks, the checks, ``hetsync.report``), instead of attributes on the user's object that each reader probes:
a Keras optimizer that hetsync never built simply has no record.  Weak references: a record goes with its
optimizer.  Imports nothing from hetsync, so any module may use it.
"""
import weakref

_ALGORITHM = weakref.WeakKeyDictionary()
_FAMILY = weakref.WeakKeyDictionary()


def record(optimizer, *, algorithm=None, family=None):
    """Records ``algorithm`` (a SyncAlgorithm) and/or ``family`` (a switching.Family) for ``optimizer``."""
    if algorithm is not None:
        _ALGORITHM[optimizer] = algorithm
    if family is not None:
        _FAMILY[optimizer] = family


def algorithm_of(optimizer):
    """The SyncAlgorithm ``optimizer`` was built for, or None (not built by hetsync, or None itself)."""
    return _lookup(_ALGORITHM, optimizer)


def family_of(optimizer):
    """The mode family of a ``hetsync.DistributedOptimizer``, or None."""
    return _lookup(_FAMILY, optimizer)


def is_hetsync(optimizer):
    """True for any optimizer hetsync built (a mode's wrapped optimizer or a DistributedOptimizer)."""
    return algorithm_of(optimizer) is not None or family_of(optimizer) is not None


def _lookup(table, optimizer):
    if optimizer is None:
        return None
    try:
        return table.get(optimizer)
    except TypeError:  # not weakly referenceable (a number, a string): nothing hetsync built
        return None

"""What works with what: Horovod's keyword arguments, callbacks and features against every sync mode.

:data:`ROWS` (table.py) is the one declared table (docs/compatibility.md is generated from it: ``python -m hetsync.compat``, or
``python -m hetsync.docs`` with the other references; tests/test_compat.py fails when the page is stale or a cell
names a test that does not exist).  A cell is:

* ``✓``: supported, and the test that shows it is named;
* ``warned``: accepted, with a warning saying what does not apply;
* ``refused``: a clear error at ``DistributedOptimizer``, ``fit``, ``hetsync.init`` or ``job_steps`` time;
* ``untested``: expected to work (the note says why) but no test here shows it.

The checks behind the "refused" and "warned" cells live here too (:func:`fit_problem`, :func:`call_problem`,
:func:`runtime_problem`, :func:`tape_problem`, ...), called from the places that refuse.
"""
from hetsync.compat.checks import (  # noqa: F401
    _LOADED,
    _TAPE,
    call_problem,
    fit_modes,
    fit_problem,
    horovod_optimizer_warning,
    keras_problem,
    keras_version,
    loop_problem,
    runtime_problem,
    steps_per_execution,
    switch_problem,
    tape_problem,
)
from hetsync.compat.render import HEADER, KINDS, OUTPUT, main, render, stale, write  # noqa: F401
from hetsync.compat.table import (  # noqa: F401
    GROUPS,
    OK,
    OWN_PACE,
    REFUSED,
    ROWS,
    STATUSES,
    UNTESTED,
    WARNED,
    WRAPPED,
    Cell,
    Row,
    cell,
    modes,
)

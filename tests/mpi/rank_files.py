"""Marker files in a directory every rank shares (one host): how a test script makes the order it needs between
ranks (a rank waits until the others have done something) instead of hoping the machine's timing produces it."""
import os
import time


def mark(where, name):
    """Says ``name`` happened (an empty file, created at once)."""
    open(os.path.join(where, name), "w").close()


def wait_for(where, names, timeout=60.0, poll=0.01):
    """Waits until every file of ``names`` exists in ``where``; bounded (``timeout`` seconds), so a peer that died
    cannot hang the test: the check that needed the order then fails and says why.  Returns True when all came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(where, n)) for n in names):
            return True
        time.sleep(poll)
    return False

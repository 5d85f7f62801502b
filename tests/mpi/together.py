"""Run under mpirun: several of these test scripts one after another in one job (argument: a JSON list of
[label, script, arg, ...]).  Each script's ``main()`` runs as it would alone, with ``sys.argv`` set to its arguments;
the scripts share the job's start-up (a TensorFlow import per rank, MPI, Horovod) instead of paying it once each.
A script's own ``hetsync.init()`` / ``hetsync.shutdown()`` (an engine script's own engine start and shutdown) open
and close hetsync around it, as in a job of its own.

After each script's ``main()`` returns on a rank, that rank prints ``PASSED <label> rank=R`` (tests/conftest.py's
``assert_passed`` looks for it); an exception prints its traceback and ``FAIL <label> rank=R`` and ends the process
at once (the launcher then ends the job: no peer is left waiting for the failed rank until a timeout).  Rank 0 prints
``[i/N] label`` before each and its time after it (``--durations`` of the scripts inside one job).  Scripts that kill or hang a rank on purpose keep a job of their own.
"""
import importlib.util
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import horovod.tensorflow as hvd  # noqa: E402

import hetsync  # noqa: E402,F401  (before hvd.init(), as the scripts import it: MPI is hetsync's to finalize)


def load(path, index):
    """The script as a module of its own (its ``if __name__ == "__main__"`` block does not run)."""
    spec = importlib.util.spec_from_file_location(f"together_{index}", os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(label, path, args, index):
    sys.argv = [os.path.join(ROOT, path), *args]
    module = load(path, index)
    try:
        module.main()
    except SystemExit as done:
        if done.code not in (None, 0):
            raise


def main():
    runs = json.loads(sys.argv[1])
    hvd.init()
    for i, (label, path, *args) in enumerate(runs, 1):
        began = time.monotonic()
        if hvd.rank() == 0:
            print(f"[{i}/{len(runs)}] {label}: {path} {' '.join(args)}", flush=True)
        try:
            run(label, path, args, i)
        except BaseException:  # noqa: BLE001 -- report anything, then end this rank loudly
            traceback.print_exc()
            print(f"FAIL {label} rank={hvd.rank()}", flush=True)
            sys.stderr.flush()
            os._exit(1)
        print(f"PASSED {label} rank={hvd.rank()}", flush=True)
        if hvd.rank() == 0:
            print(f"[{i}/{len(runs)}] {label}: {time.monotonic() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()

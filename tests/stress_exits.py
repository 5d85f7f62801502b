"""Exit stress: N short jobs in a row, cycling through every registered mode (or the ``--modes`` given), each
exiting normally, or with ``--fail RANK`` each ending on that rank's uncaught exception.

    python tests/stress_exits.py [--jobs 50] [--np 2] [--modes ripples-smart,od-sgd] [--fail 1]

A normal job must exit with code 0 and print OK on every rank; a failing one must exit non-zero with the raising
rank's traceback in its output.  Either way no process may die of a signal (a segfault at exit was seen when the
library left threads, channels or a server running into interpreter teardown; a SIGABRT when an engine MPI call
raced Horovod's MPI_Finalize).  Prints one line
per job with [i/N] and an ETA.  `make test` runs one job per mode (tests/test_exits.py); the 50-job run is
documented in the README with its result.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from conftest import mpi_env  # noqa: E402

SIGNALS = ("Segmentation fault", "signal 11", "signal 6", "Process received signal", "core dumped", "(Aborted)",
           "called after MPI_FINALIZE")


def run_job(mode, np_, timeout=180, fail=None):
    """(ok, seconds, text) of one exit_job.py run (``fail``: the rank that raises, as in tests/test_exits.py)."""
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable,
           os.path.join(HERE, "mpi", "exit_job.py"), mode] + ([] if fail is None else ["fail", str(fail)])
    began = time.monotonic()
    env = mpi_env() if fail is None else mpi_env(HETSYNC_TIMEOUT=120)
    proc = subprocess.run(cmd, cwd=os.path.dirname(HERE), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    text = proc.stdout
    if any(s in text for s in SIGNALS):
        return False, time.monotonic() - began, text
    if fail is None:
        ok = proc.returncode == 0 and all(f"OK rank={r}" in text for r in range(np_))
    else:
        ok = proc.returncode != 0 and f"RuntimeError: user bug on rank {fail}" in text
    return ok, time.monotonic() - began, text


def main(argv=None):
    from hetsync import available_modes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--modes", default="", help="comma-separated modes (default: every registered mode)")
    parser.add_argument("--fail", type=int, default=None, help="this rank raises in epoch 2 of each job")
    parser.add_argument("--keep", default=None, help="write each failed job's whole output into this directory")
    args = parser.parse_args(argv)
    modes = args.modes.split(",") if args.modes else available_modes()
    began, failures = time.monotonic(), []
    for i in range(args.jobs):
        mode = modes[i % len(modes)]
        ok, seconds, text = run_job(mode, args.np, fail=args.fail)
        if not ok:
            failures.append((mode, text[-6000:]))
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                with open(os.path.join(args.keep, f"job{i + 1}-{mode}.txt"), "w") as f:
                    f.write(text)
        elapsed = time.monotonic() - began
        eta = elapsed / (i + 1) * (args.jobs - i - 1)
        print(f"[{i + 1}/{args.jobs}] {mode}: {'ok' if ok else 'FAILED'} in {seconds:.1f} s (ETA {eta:.0f} s)",
              flush=True)
    for mode, tail in failures:
        print(f"--- {mode} ---\n{tail}", file=sys.stderr)
    print(f"{args.jobs - len(failures)}/{args.jobs} jobs ended as they should in {time.monotonic() - began:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

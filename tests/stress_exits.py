"""Exit stress (issue 18): N short jobs in a row, cycling through every registered mode, each exiting normally.

    python tests/stress_exits.py [--jobs 50] [--np 2]

Every job must exit with code 0 and print OK on every rank; no process may die of a signal (a segfault at exit
was seen when the library left threads, channels or a server running into interpreter teardown).  Prints one line
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


def run_job(mode, np_, timeout=180):
    """(ok, seconds, text) of one exit_job.py run."""
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable,
           os.path.join(HERE, "mpi", "exit_job.py"), mode]
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=os.path.dirname(HERE), env=mpi_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    text = proc.stdout
    ok = (proc.returncode == 0 and not any(s in text for s in SIGNALS)
          and all(f"OK rank={r}" in text for r in range(np_)))
    return ok, time.monotonic() - began, text


def main(argv=None):
    from hetsync import available_modes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--np", type=int, default=2)
    args = parser.parse_args(argv)
    modes = available_modes()
    began, failures = time.monotonic(), []
    for i in range(args.jobs):
        mode = modes[i % len(modes)]
        ok, seconds, text = run_job(mode, args.np)
        if not ok:
            failures.append((mode, text[-3000:]))
        elapsed = time.monotonic() - began
        eta = elapsed / (i + 1) * (args.jobs - i - 1)
        print(f"[{i + 1}/{args.jobs}] {mode}: {'ok' if ok else 'FAILED'} in {seconds:.1f} s (ETA {eta:.0f} s)",
              flush=True)
    for mode, tail in failures:
        print(f"--- {mode} ---\n{tail}", file=sys.stderr)
    print(f"{args.jobs - len(failures)}/{args.jobs} jobs exited cleanly in {time.monotonic() - began:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared helpers: launch real multi-process jobs (mpirun / horovodrun) with the project's virtualenv Python."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "full: a long variant that only `make test-full` runs (`make test` runs a "
                                       "shorter job checking the same property in every mode)")


_USER_ENV = {"proc": None, "dir": None}


def pytest_collection_finish(session):
    """When tests/test_install.py is collected, its user environment starts building now, in the background
    (tests/user_env.py): its pip installs overlap the tests that run before it.  At the lowest CPU priority (nice
    19): its ~1 CPU-minute then runs when the tests leave a core idle (a rank sleeping as a slow one, ranks waiting
    on a timeout) instead of slowing the jobs it overlaps; the test waits for whatever is left."""
    if any(item.nodeid.startswith("tests/test_install.py") for item in session.items):
        import tempfile

        where = tempfile.mkdtemp(prefix="hetsync-user-env-")
        _USER_ENV["dir"] = where
        _USER_ENV["proc"] = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "user_env.py"), where],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             preexec_fn=lambda: os.nice(19))


def pytest_sessionfinish(session, exitstatus):
    proc, where = _USER_ENV["proc"], _USER_ENV["dir"]
    if proc is not None:
        import shutil

        proc.kill()
        proc.wait()
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def user_env():
    """The directory whose ``env/`` is a fresh environment with TensorFlow and Horovod, then hetsync's documented
    build requirements and scikit-learn, and whose ``before.json`` is its ``pip list`` before those two
    (tests/user_env.py)."""
    proc, where = _USER_ENV["proc"], _USER_ENV["dir"]
    assert proc is not None, "the user environment was not started (pytest_collection_finish)"
    rc = proc.wait(timeout=900)
    log = open(os.path.join(where, "build.log"), encoding="utf-8").read()
    assert rc == 0, f"building the user environment failed ({rc}):\n{log[-4000:]}"
    return where


def mpi_env(**extra):
    env = dict(os.environ, **MPI_ENV, **{k: str(v) for k, v in extra.items()})
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_mpi(np_, script, *args, timeout=240, env=None, launcher="mpirun"):
    """Runs ``script`` on ``np_`` ranks; returns the CompletedProcess (stdout+stderr merged in .stdout)."""
    if launcher == "horovodrun":
        cmd = ["horovodrun", "--mpi", "-np", str(np_), "-H", f"localhost:{np_}"]
    else:
        cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    cmd += [sys.executable, os.path.join(ROOT, script), *map(str, args)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env or mpi_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        keep_log(script, out)
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout}s:\n{out[-6000:]}")
    keep_log(script, proc.stdout)
    return proc


def leftovers(tag, grace=10.0):
    """Processes whose command line names this test's directory, after up to ``grace`` seconds for the launcher's
    last signals to land."""
    deadline = time.monotonic() + grace
    while True:
        found = subprocess.run(["pgrep", "-f", tag], stdout=subprocess.PIPE, text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def keep_log(script, text):
    """With ``HETSYNC_TEST_JOB_LOGS=<dir>``, every job's whole output is kept there (a run_together job's output
    has each script's time: where a job's minutes go)."""
    where = os.environ.get("HETSYNC_TEST_JOB_LOGS")
    if not where:
        return
    os.makedirs(where, exist_ok=True)
    name = os.path.basename(script).removesuffix(".py")
    index = len([f for f in os.listdir(where) if f.startswith(name + "-")])
    with open(os.path.join(where, f"{name}-{index}.log"), "w", encoding="utf-8") as out:
        out.write(text or "")


def assert_ok(proc, np_):
    """Every rank printed 'OK rank=R' and the job exited 0."""
    tail = proc.stdout[-8000:]
    assert proc.returncode == 0, f"job failed ({proc.returncode}):\n{tail}"
    for r in range(np_):
        assert f"OK rank={r}" in proc.stdout, f"rank {r} did not report OK:\n{tail}"


def connected(n, groups, nodes=None):
    """True when the union of ``groups`` (lists of ranks) connects ``nodes`` (default all n) -- Ripples §3.3."""
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for group in groups:
        members = list(group)
        for m in members[1:]:
            parent[find(m)] = find(members[0])
    nodes = range(n) if nodes is None else nodes
    return len({find(x) for x in nodes}) == 1


def run_together(np_, runs, timeout=900, env=None):
    """Several test scripts in one job (tests/mpi/together.py): ``runs`` is a list of [label, script, arg, ...];
    each script's main() runs in turn on every rank, sharing one start-up of the ranks."""
    return run_mpi(np_, "tests/mpi/together.py", json.dumps([[str(a) for a in r] for r in runs]), timeout=timeout,
                   env=env)


def tagged(stdout, tag):
    """The JSON objects a job's scripts printed as ``TAG {...}``.  mpirun merges the ranks' output, and Python writes
    a print's text and its newline apart, so another rank's text can land right before or after a tagged object on
    the same line: each object is found by its tag and decoded up to its own end."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(stdout, m.end())[0] for m in re.finditer(rf"{tag} (?={{)", stdout)]


def first_error(text):
    """The first traceback of a failed job, with what led to it (the tail shows only the other ranks' shutdown
    errors)."""
    at = text.find("Traceback")
    return text[max(0, at - 1500):at + 5000] if at >= 0 else ""


def assert_passed(proc, label, np_):
    """The script run as ``label`` in a run_together job returned on every rank.  On failure: the job's first
    traceback (a failing script ends the job, so the scripts after it did not run either)."""
    missing = [r for r in range(np_) if f"PASSED {label} rank={r}" not in proc.stdout]
    if missing:
        pytest.fail(f"{label} did not pass on ranks {missing} (job exit {proc.returncode}):\n"
                    f"{first_error(proc.stdout)}\n...\n"
                    f"{proc.stdout[-5000:]}")
    if "\nFAIL " not in proc.stdout and not proc.stdout.startswith("FAIL "):  # (a failed script is its own test's)
        tail = proc.stdout[-5000:]
        assert proc.returncode == 0, f"the job exited {proc.returncode} after its scripts passed:\n{tail}"


SLOWED_EXAMPLE = ["--steps", "60", "--slowdown", "deterministic", "--slow-ranks", "3", "--factor", "3",
                  "--base-time", "0.01"]
RANDOM_EXAMPLE = ["--steps", "80", "--slowdown", "random", "--factor", "4", "--base-time", "0.01"]


@pytest.fixture(scope="session")
def keras_job(tmp_path_factory):
    """The 4-rank Keras scripts of test_keras_modes.py, test_balanced.py and test_switching.py in one job (they
    neither kill nor hang a rank for good; ESync's, which hangs one until the others have named it, runs last): the
    job's output, and the directory with each run's files (a folder per run; sync="auto"'s log directory is
    ``auto-logs``).  One job instead of two saves a start-up of four TensorFlow processes and their first traces."""
    base = tmp_path_factory.mktemp("keras_modes")
    runs = [
        ["balanced", "tests/mpi/balanced_job.py", base / "balanced"],  # first: its shares follow measured speeds
        ["auto", "tests/mpi/keras_auto.py", base / "auto-logs"],  # early, for the same reason
        ["wiring", "tests/mpi/keras_modes.py"],
        ["ripples-static-train", "tests/mpi/keras_ripples_train.py", 0.35],
        ["example-ripples-static", "examples/train.py", "--sync", "ripples-static", *SLOWED_EXAMPLE,
         "--log-dir", base / "example-ripples-static"],
        ["gg-ripples-random", "tests/mpi/keras_gg_train.py", "ripples-random", 0.4],
        ["gg-ripples-smart", "tests/mpi/keras_gg_train.py", "ripples-smart", 0.4],
        ["eager-fidelity", "tests/mpi/eager_fidelity.py"],
        *[[f"example-{m}", "examples/train.py", "--sync", m, *RANDOM_EXAMPLE, "--log-dir", base / f"example-{m}"]
          for m in ("eager-solo", "eager-majority")],
        ["hop", "tests/mpi/keras_hop.py", 0.9],
        ["switch-cycle", "tests/mpi/keras_switch.py", "all", "cycle"],
        ["conservation", "tests/mpi/switch_conservation.py"],
        ["late-request", "tests/mpi/late_request.py"],
        ["esync", "tests/mpi/keras_esync.py"],  # last: it ends with a rank hung until the others have named it
    ]
    return run_together(4, runs, timeout=1200), base

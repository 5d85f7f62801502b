"""``hetsync check``: does hetsync work in this environment?  In the manner of ``horovodrun --check-build``.

One line per check, ``[ok]`` or ``[FAIL]``; a failure names what to do.  The checks, in order (a failed one skips
those that need it):

1. versions: TensorFlow (with Keras 2), Horovod (built with MPI and TensorFlow), hetsync;
2. the ops: ``hetsync/_lib/hetsync_ops.so`` loads into this TensorFlow, and this process maps one MPI library
   (the one Horovod's extension links: a second one would mean hetsync was built against another MPI);
3. the coordinator: a Group Generator server binds a free port on the address other hosts reach this one at
   (``HETSYNC_GG_HOST``, else this host's first non-loopback IPv4 address; loopback when there is none, which
   serves single-host jobs) and a client connects to it;
4. a 2-rank loopback job (``mpirun -np 2``, or this job's ranks when already under a launcher): MPI is
   ``MPI_THREAD_MULTIPLE``, and a P-Reduce and a partial allreduce round-trip with the expected averages.

Exit status 0 when every check passed, 1 otherwise.  Nothing here runs at ``import hetsync``.
"""
import os
import subprocess
import sys

from hetsync._version import __version__

JOB_MARK = "hetsync-check-job"


def _line(ok, what, fix=None):
    if os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":  # under a launcher: rank 0 speaks for the job
        return ok
    print(f"[{'ok' if ok else 'FAIL'}] {what}" + ("" if ok or not fix else f" -- {fix}"), flush=True)
    return ok


def check_versions():
    """TensorFlow, Keras 2, Horovod with MPI and TensorFlow, hetsync: one line each."""
    ok = True
    try:
        import tensorflow as tf

        from hetsync.compat import checks  # deferred (here and below): a failing import is this check's finding

        keras = checks.keras_version()
        keras_ok = keras.split(".")[0] == "2"
        ok &= _line(keras_ok, f"TensorFlow {tf.__version__} (Keras {keras})",
                    "hetsync needs Keras 2 (tf.keras); Keras 3 is not supported: TensorFlow <= 2.15 or tf-keras")
    except ImportError as exc:
        return _line(False, f"TensorFlow: {exc}", "install TensorFlow 2.12-2.15 into this environment")
    try:
        import horovod
        import horovod.tensorflow as hvd

        ok &= _line(bool(hvd.mpi_built()), f"Horovod {horovod.__version__} (built with MPI: {hvd.mpi_built()})",
                    "rebuild Horovod with HOROVOD_WITH_MPI=1 HOROVOD_WITH_TENSORFLOW=1")
    except ImportError as exc:
        return _line(False, f"Horovod: {exc}", "install Horovod >= 0.28 built with MPI and TensorFlow")
    _line(True, f"hetsync {__version__} ({os.path.dirname(os.path.abspath(__file__))})")
    return ok


def _mpi_libraries():
    """The MPI libraries mapped into this process (paths, resolved)."""
    found = set()
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if os.path.basename(path).startswith("libmpi.so"):
                found.add(os.path.realpath(path))
    return sorted(found)


def check_ops():
    """The ops load; one MPI library in the process (Horovod's)."""
    try:
        import horovod.tensorflow  # noqa: F401 -- maps the MPI library Horovod's extension links

        from hetsync import ops  # noqa: F401 -- deferred: a missing build is this check's finding
    except ImportError as exc:
        return _line(False, f"hetsync ops: {exc}",
                     "reinstall hetsync in this environment: pip install --no-build-isolation <hetsync>")
    libraries = _mpi_libraries()
    if len(libraries) != 1:
        return _line(False, f"MPI libraries in this process: {libraries or 'none'}",
                     "hetsync and Horovod must use the same MPI: rebuild hetsync with the mpicxx of Horovod's MPI")
    return _line(True, f"hetsync ops load; MPI library {libraries[0]} (shared with Horovod)")


def check_coordinator():
    """rank 0's services bind this host's address and answer a client (what other hosts' ranks will do)."""
    import grpc

    from hetsync.coordinator import server as gg_server  # deferred: each check loads only what it checks
    from hetsync.coordinator._client import channel as service_channel  # deferred: as above

    note = ""
    try:
        host = gg_server._routable_host()
    except OSError:  # a single-host job binds loopback anyway (coordinator/server.py, start_for_job)
        host, note = "127.0.0.1", " (no non-loopback address here: single-host jobs only; for several hosts set " \
                                  "HETSYNC_GG_HOST)"
    try:
        server, address = gg_server.start_server(2, "random", host=host, port=0)
    except Exception as exc:  # noqa: BLE001 -- grpc raises RuntimeError on a failed bind
        return _line(False, f"coordinator: cannot bind {host} ({exc})",
                     "set HETSYNC_GG_HOST to an address of this host that other hosts can reach")
    try:
        channel = service_channel(address)  # the clients' own channel settings
        grpc.channel_ready_future(channel).result(timeout=10)
        channel.close()
    except grpc.FutureTimeoutError:
        return _line(False, f"coordinator: {address} does not answer",
                     "a firewall between ranks and this port? set HETSYNC_GG_HOST")
    finally:
        server.stop(grace=None)
    return _line(True, f"coordinator port binds and answers on {address}{note}")


def run_job_checks():
    """Inside the 2-rank job: thread level, a P-Reduce and a partial allreduce (rank 0 prints)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hetsync
    from hetsync import ops, ops_partial  # deferred: the launcher process of `hetsync check` loads no TensorFlow

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    say = _line
    if not hvd.mpi_threads_supported():
        return say(False, "MPI is not MPI_THREAD_MULTIPLE",
                   "use an MPI built with thread support (Open MPI: the default) and unset HOROVOD_MPI_THREADS_DISABLE")
    say(True, f"MPI_THREAD_MULTIPLE on {size} ranks ({', '.join(ops.mpi_settings() or ['no settings yet'])})")
    hetsync.init(timeout=30)
    expected = sum(range(1, size + 1)) / size
    out = ops.p_reduce(tf.fill([1024], float(rank + 1)), list(range(size)))
    ok = say(abs(float(out[0]) - expected) < 1e-6, f"P-Reduce over ranks 0-{size - 1}: {float(out[0]):g}",
             f"expected {expected:g}: the engine's exchange is broken; see docs/engine.md")
    result = ops_partial.partial_allreduce(tf.fill([1024], float(rank + 1)), mode="all", name="hetsync-check")
    value = float(tf.reshape(result.tensors, [-1])[0])
    ok &= say(abs(value - expected) < 1e-6, f"partial allreduce (all ranks): {value:g}",
              f"expected {expected:g}: the engine's partial collectives are broken; see docs/engine.md")
    hetsync.shutdown()
    return ok


def _run_job(np_):
    """``mpirun -np N`` of this module's job part; its rank 0's lines are this command's."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable, "-m", "hetsync.check",
           JOB_MARK]
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300)
    except FileNotFoundError:
        return _line(False, "mpirun not found", "put Open MPI's bin directory on PATH")
    except subprocess.TimeoutExpired:
        return _line(False, f"the {np_}-rank job did not end in 300 s", "run it by hand: " + " ".join(cmd))
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("[ok]", "[FAIL]"))]
    for line in lines:
        print(line, flush=True)
    if proc.returncode != 0 or not lines or any(line.startswith("[FAIL]") for line in lines):
        if not lines:
            print(proc.stdout[-3000:], flush=True)
        return _line(False, f"the {np_}-rank job ended with status {proc.returncode}",
                     "its output is above; launch with mpirun (Open MPI) and check `horovodrun --check-build`")
    return True


def main(argv=None):
    """``hetsync check [--np N]`` (``argv``: the arguments after ``check``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="hetsync check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2, help="ranks of the loopback job (default 2)")
    args = parser.parse_args(argv)
    ok = check_versions()
    ok = check_ops() and ok
    ok = check_coordinator() and ok
    if "OMPI_COMM_WORLD_SIZE" in os.environ:  # already a rank of a job: check with its ranks
        ok = run_job_checks() and ok
    else:
        ok = _run_job(args.np) and ok
    print("hetsync check: " + ("every check passed" if ok else "FAILED (see the [FAIL] lines)"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == [JOB_MARK]:
        sys.exit(0 if run_job_checks() else 1)
    sys.exit(main(sys.argv[1:]))

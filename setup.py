"""hetsync's compiled part; the package's metadata is pyproject.toml's ``[project]``.

The C++ TensorFlow ops and the MPI engine (tf_ops/) are built by ``make -C tf_ops`` against the TensorFlow of the
Python that runs this build, because a custom op must match that TensorFlow's ABI exactly; the gRPC code of the
coordinator services is generated from protos/ at the same time.  pip must therefore build without isolation
(``pip install --no-build-isolation ...``), in the environment that will run hetsync.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_REL = os.path.join("hetsync", "_lib", "hetsync_ops.so")
TENSORFLOW_RANGE = ((2, 12), (2, 16))  # the versions hetsync is built for: >= 2.12, < 2.16 (Keras 2)


def _build_problem():
    """What this environment lacks for the build, as a sentence naming the fix (None when nothing)."""
    probe = ("import sys, tensorflow as tf; v = tuple(int(p) for p in tf.__version__.split('.')[:2]); "
             f"sys.exit(0 if {TENSORFLOW_RANGE[0]!r} <= v < {TENSORFLOW_RANGE[1]!r} else 3)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    rc = subprocess.call([sys.executable, "-c", probe], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    if rc == 3:
        return (f"hetsync's ops build for TensorFlow >= 2.12, < 2.16; {sys.executable} has another version")
    if rc != 0:
        return (f"TensorFlow is not importable by {sys.executable}: hetsync's C++ ops compile against the "
                "TensorFlow of the environment it is installed into.  Install with "
                "`pip install --no-build-isolation ...` in an environment that has TensorFlow and Horovod")
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        return ("grpcio-tools is missing (it generates the coordinator's gRPC code at build time): "
                "`pip install setuptools wheel grpcio-tools`, then install hetsync with --no-build-isolation")
    if shutil.which("mpicxx") is None:
        return "mpicxx is missing: install an MPI development package (Debian: libopenmpi-dev)"
    return None


class BuildTfOps(build_ext):
    """Runs tf_ops/Makefile and the protobuf generator instead of setuptools' own compiler driver."""

    def run(self):
        problem = _build_problem()
        if problem:
            raise SystemExit(f"hetsync build: {problem}")
        jobs = f"-j{os.cpu_count() or 1}"  # one compiler per core: tf_ops/Makefile is -j safe
        subprocess.check_call(["make", jobs, "-C", os.path.join(HERE, "tf_ops"), f"PYTHON={sys.executable}"])
        sys.path.insert(0, os.path.join(HERE, "hetsync", "coordinator"))
        import _proto  # hetsync/coordinator/_proto.py imports nothing from hetsync

        _proto.ensure_generated()
        if not self.inplace:
            for rel in [LIB_REL] + _proto.generated_files(relative=True):
                dest = os.path.join(self.build_lib, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(os.path.join(HERE, rel), dest)

    def get_outputs(self):
        return [os.path.join(self.build_lib, LIB_REL)]


setup(
    ext_modules=[Extension("hetsync._lib.hetsync_ops", sources=[])],
    cmdclass={"build_ext": BuildTfOps},
)

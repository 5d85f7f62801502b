"""hetsync packaging.

The compiled part (tf_ops/, C++ TensorFlow custom ops + the MPI engine) is built by ``make -C tf_ops`` against the
TensorFlow of the Python that runs this build, because a custom op must match that TensorFlow's ABI exactly.
The gRPC code of the coordinator services is generated from protos/ at the same time.  Build with
``pip install --no-build-isolation -e .`` (scripts/install.sh does), so that the installed TensorFlow is used: pip
builds through pyproject.toml's PEP 517 backend (setuptools.build_meta), which runs this file.  The version is
hetsync/_version.py's.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_REL = os.path.join("hetsync", "_lib", "hetsync_ops.so")


def _version():
    """hetsync/_version.py's __version__, read as text: importing hetsync would start its imports (and MPI)."""
    with open(os.path.join(HERE, "hetsync", "_version.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if match is None:
        raise RuntimeError("no __version__ in hetsync/_version.py")
    return match.group(1)


def _readme():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


class BuildTfOps(build_ext):
    """Runs tf_ops/Makefile and the protobuf generator instead of setuptools' own compiler driver."""

    def run(self):
        jobs = f"-j{os.cpu_count() or 1}"  # one compiler per core: the ops are ~20 files (tf_ops/Makefile is -j safe)
        subprocess.check_call(["make", jobs, "-C", os.path.join(HERE, "tf_ops"), f"PYTHON={sys.executable}"])
        sys.path.insert(0, HERE)
        from hetsync.coordinator import _proto

        _proto.ensure_generated()
        if not self.inplace:
            for rel in [LIB_REL] + _proto.generated_files(relative=True):
                dest = os.path.join(self.build_lib, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(os.path.join(HERE, rel), dest)

    def get_outputs(self):
        return [os.path.join(self.build_lib, LIB_REL)]


setup(
    name="hetsync",
    version=_version(),
    description="Heterogeneity-aware synchronization for Horovod + Keras (Ripples, Hop, eager-SGD, ESync, OD-SGD)",
    long_description=_readme(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["hetsync", "hetsync.*", "keras_callbacks", "keras_callbacks.*"]),
    package_data={"hetsync": ["_lib/*.so", "coordinator/*.py"]},
    ext_modules=[Extension("hetsync._lib.hetsync_ops", sources=[])],
    cmdclass={"build_ext": BuildTfOps},
    entry_points={"console_scripts": ["hetsync=hetsync.cli:main"]},
    python_requires=">=3.10",
    install_requires=["tensorflow-cpu==2.15.1", "horovod==0.28.1", "numpy<2", "grpcio==1.62.3"],
)

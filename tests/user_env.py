"""Builds a user's Horovod environment for tests/test_install.py: ``python tests/user_env.py DIR``.

A fresh virtual environment in DIR/env holding only TensorFlow (pip, at this machine's tested versions:
requirements/runtime.txt as constraints) and Horovod (the wheel scripts/install.sh built and cached, then Horovod's
own dependencies); pip does not byte-compile them, one import of TensorFlow and Horovod does, for what it imports.
That is the user's environment: its ``pip list`` is written to DIR/before.json.  Then the two installs that come
before hetsync's own (the test sees them only through ``pip list``): the documented build requirements (README,
docs/install.md) and scikit-learn (the quickstart example's data).

tests/conftest.py starts it in the background when test_install.py is collected, so the two minutes of unpacking
overlap the tests before it; the test waits for it, then installs hetsync.  Exit status 0 when the environment is
ready; the pip output goes to DIR/build.log.
"""
import glob
import os
import subprocess
import sys

import horovod
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSTRAINTS = ["-c", os.path.join(ROOT, "requirements", "runtime.txt"),
               "-c", os.path.join(ROOT, "requirements", "build.txt")]


def horovod_wheel():
    """The Horovod wheel scripts/install.sh built for this TensorFlow and Python (its cache)."""
    cache = os.environ.get("HETSYNC_WHEEL_CACHE", os.path.expanduser("~/.cache/hetsync/wheels"))
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    found = glob.glob(os.path.join(cache, f"horovod-{horovod.__version__}-tf{tf.__version__}-{tag}-*", "*.whl"))
    if not found:
        raise SystemExit(f"no cached Horovod wheel under {cache} (scripts/install.sh builds it)")
    return found[0]


def main(where):
    env_dir = os.path.join(where, "env")
    python = os.path.join(env_dir, "bin", "python")
    pip = [python, "-m", "pip", "install", "-q", "--no-compile"]
    users = [[sys.executable, "-m", "venv", env_dir],
             pip + CONSTRAINTS + [f"tensorflow-cpu=={tf.__version__}"],
             pip + ["--no-deps", horovod_wheel()],
             pip + CONSTRAINTS + [f"horovod=={horovod.__version__}"],  # Horovod's own dependencies
             [python, "-c", "import tensorflow, horovod.tensorflow.keras"]]  # byte-code of what a job imports
    before_hetsync = [pip + CONSTRAINTS + ["setuptools", "wheel", "grpcio-tools"],  # the documented build needs
                      pip + CONSTRAINTS + ["scikit-learn"]]  # the quickstart example's data
    # pip's byte-compiling of all of TensorFlow is half of the build's CPU time, which the tests running beside it
    # lose; the byte-code a job needs is written by one import instead (where PYTHONDONTWRITEBYTECODE is set, as on
    # this project's machine, every later import would otherwise compile TensorFlow again: 12 s instead of 4 s)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with open(os.path.join(where, "build.log"), "w", encoding="utf-8") as log:
        if not all(step(cmd, log, log, env) for cmd in users):
            return 1
        with open(os.path.join(where, "before.json"), "w", encoding="utf-8") as listing:
            if not step([python, "-m", "pip", "list", "--format=json"], listing, log, env):
                return 1
        return 0 if all(step(cmd, log, log, env) for cmd in before_hetsync) else 1


def step(cmd, out, log, env):
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    return subprocess.call(cmd, stdout=out, stderr=log, env=env) == 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""hetsync installs into an existing Horovod environment and touches nothing there (README "Install into your Horovod
environment", docs/install.md).

The environment is built as a user's would be (tests/user_env.py, started in the background at collection by
tests/conftest.py): a fresh virtual environment with TensorFlow (pip, at the versions this machine's tested
environment has: requirements/runtime.txt as constraints) and Horovod (the wheel scripts/install.sh built and
cached), nothing else; its ``pip list`` then.  Then the documented commands: the build requirements (installed in the
background too, with the example's scikit-learn), and ``pip install --no-build-isolation <checkout>`` (not
editable), which the test runs.  Checked: every distribution the environment had is
still there at the same version (``pip list``) (TensorFlow and Horovod included), no other TensorFlow distribution appeared;
``hetsync check`` passes with the installed package; and the README's quickstart example trains on 2 ranks from a
directory outside the checkout, importing the installed hetsync, with one model on both ranks.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess

import horovod
import tensorflow as tf
from conftest import ROOT, mpi_env


def _run(cmd, cwd, env=None, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    noise = re.compile(r"^WARNING: Location '.*' is ignored", re.M)  # this machine's pip configuration
    out = noise.sub("", proc.stdout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _freeze(python, cwd):
    """{distribution: version} of the environment (pip list: also a wheel installed from a file has a version)."""
    return _listing(_run([python, "-m", "pip", "list", "--format=json"], cwd))


def _listing(out):
    """{distribution: version} from ``pip list --format=json`` output (anything pip printed before the JSON)."""
    return {d["name"].lower(): d["version"] for d in json.loads(out[out.index("["):])}


def test_pip_install_into_an_environment_with_only_tensorflow_and_horovod(user_env, tmp_path):
    env_dir, job_dir = pathlib.Path(user_env) / "env", tmp_path / "job"
    job_dir.mkdir()
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q"]
    # the user's environment before anything else was installed, then after the documented build requirements and
    # the example's scikit-learn (both installed by tests/user_env.py, in the background)
    before = _listing((pathlib.Path(user_env) / "before.json").read_text())
    assert before["tensorflow-cpu"] == tf.__version__ and before["horovod"] == horovod.__version__
    ready = _freeze(python, tmp_path)
    assert {"grpcio-tools", "scikit-learn"} <= set(ready) - set(before), sorted(set(ready) - set(before))
    _run(pip + ["--no-build-isolation", ROOT], tmp_path)
    after = _freeze(python, tmp_path)
    changed = {name: (version, after.get(name)) for name, version in ready.items() if after.get(name) != version}
    assert not changed, f"installing hetsync replaced or removed: {changed}"
    build_tools = {"pip", "setuptools", "wheel"}  # the user's own build step may upgrade these, nothing else
    changed = {name: (version, after.get(name)) for name, version in before.items()
               if after.get(name) != version and name not in build_tools}
    assert not changed, f"the documented install replaced or removed: {changed}"
    assert [n for n in after if n.startswith("tensorflow") and n not in before] == [], after
    assert "hetsync" in after

    env = mpi_env(PATH=f"{env_dir / 'bin'}:{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    where = _run([python, "-c", "import hetsync; print(hetsync.__file__)"], job_dir, env=env).strip()
    assert where.startswith(str(env_dir)), f"imported {where}, not the installed package"
    check = _run([str(env_dir / "bin" / "hetsync"), "check"], job_dir, env=env)
    assert "hetsync check: every check passed" in check, check

    # the README's quickstart example, from outside the checkout (its data: scikit-learn's digits)
    for name in ("horovod_keras_mnist.py", "common.py", "user_callbacks.py"):
        shutil.copy(os.path.join(ROOT, "examples", name), job_dir)
    out = _run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", python, "horovod_keras_mnist.py",
                "--sync", "ripples-smart", "--epochs", "2", "--steps-per-epoch", "10"], job_dir, env=env)
    # not anchored to lines: mpirun forwards each rank's output in chunks, and two ranks' lines can share one
    sums = re.findall(r"rank (\d): sync=ripples-smart .*? checksum ([0-9a-f]{16})", out)
    assert sorted(r for r, _ in sums) == ["0", "1"], out[-3000:]
    assert len({c for _, c in sums}) == 1, f"the ranks ended with different models: {sums}"

"""Package conventions (issue 22): one version everywhere, `python -m hetsync`, the "hetsync" logger's defaults,
no print() in the library, the bench command's name and its message outside a checkout, the PEP 517 build files.

Fast: no mpirun, no TensorFlow import (the subprocesses run `import hetsync`, which is light; see its __init__)."""
import ast
import io
import logging
import os
import re
import subprocess
import sys
import tomllib

import pytest

from hetsync import _logging, cli
from hetsync._version import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    """This environment without the MPI launcher's variables (so `import hetsync` starts no MPI)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}


def _python(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)


def test_version_is_one_value_everywhere():
    out = _python("-m", "hetsync", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"hetsync {__version__}"
    setup = _python("setup.py", "--version")
    assert setup.returncode == 0, setup.stderr
    assert setup.stdout.strip().splitlines()[-1] == __version__
    package = _python("-c", "import hetsync; print(hetsync.__version__)")
    assert package.stdout.strip() == __version__, package.stderr
    changelog = open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8").read()
    assert f"## [{__version__}]" in changelog


def test_import_and_cli_load_no_tensorflow():
    """`python -m hetsync --version` and the `hetsync` command stay fast: the public names load on first use."""
    code = ("import sys, hetsync, hetsync.cli, hetsync.__main__; "
            "print('tensorflow' in sys.modules, 'init' in dir(hetsync), callable(hetsync.__getattr__))")
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


def test_pep621_metadata_fits_an_existing_environment():
    """pyproject.toml's [project]: compatible ranges, never a pin, and no TensorFlow distribution among the
    dependencies (pip would put a second TensorFlow beside the user's: tensorflow, tensorflow-cpu and vendors' builds
    are different distributions); the build requirements include grpcio-tools; extras [report] and [test]."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    build, project = meta["build-system"], meta["project"]
    assert build["build-backend"] == "setuptools.build_meta"
    assert {re.split(r"[<>=!~ ]", r)[0] for r in build["requires"]} >= {"setuptools", "wheel", "grpcio-tools"}
    names = {re.split(r"[<>=!~ \[]", r)[0]: r for r in project["dependencies"]}
    assert not [n for n in names if n.startswith("tensorflow")], names
    assert {"horovod", "grpcio", "numpy"} <= set(names)
    assert not [r for r in project["dependencies"] if "==" in r], project["dependencies"]
    extras = project["optional-dependencies"]
    assert {"report", "test"} <= set(extras) and any(r.startswith("matplotlib") for r in extras["report"])
    assert project["license"] == {"text": "Apache-2.0"} and project["dynamic"] == ["version"]
    license_text = open(os.path.join(ROOT, "LICENSE"), encoding="utf-8").read()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "Copyright 2026 The hetsync authors" in license_text


def test_api_doc_lists_exactly_the_commands_the_parser_has():
    """docs/api.md's command block names every subcommand of `hetsync` and no other (a dropped `hetsync bench`, or a
    new command left undocumented, fails here)."""
    text = open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8").read()
    block = text.split("## Command line", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    documented = {line.split()[1] for line in block.strip().splitlines() if not line.split()[1].startswith("-")}
    actions = [a for a in cli.parser()._actions if a.dest == "command"]
    assert documented == set(actions[0].choices), (documented, set(actions[0].choices))
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--preset", "demo"])
    assert exc.value.code == 2


# ----- the "hetsync" logger -----

@pytest.fixture
def hetsync_logger():
    """The "hetsync" logger, bare as an application finds it, restored afterwards (root logger checked untouched)."""
    logger = logging.getLogger("hetsync")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    root = (list(logging.getLogger().handlers), logging.getLogger().level)
    logger.handlers, logger.level, logger.propagate = [], logging.NOTSET, True
    yield logger
    assert (list(logging.getLogger().handlers), logging.getLogger().level) == root, "the root logger was touched"
    logger.handlers, logger.level, logger.propagate = saved


def _emit_all():
    child = logging.getLogger("hetsync.switching")
    child.debug("a debug line")
    child.info("step 3: switched allreduce -> esync")
    child.warning("a warning line")


def test_rank0_defaults_to_info(hetsync_logger):
    stream = io.StringIO()
    assert _logging.configure(0, environ={}, stream=stream) is True
    assert hetsync_logger.level == logging.INFO and hetsync_logger.propagate is False
    _emit_all()
    assert stream.getvalue().splitlines() == ["[hetsync rank 0] step 3: switched allreduce -> esync",
                                              "[hetsync rank 0] WARNING: a warning line"]


def test_other_ranks_default_to_warning(hetsync_logger):
    stream = io.StringIO()
    assert _logging.configure(3, environ={}, stream=stream)
    _emit_all()
    assert stream.getvalue().splitlines() == ["[hetsync rank 3] WARNING: a warning line"]


@pytest.mark.parametrize("value, level", [("DEBUG", logging.DEBUG), ("info", logging.INFO),
                                          ("WARNING", logging.WARNING), ("15", 15)])
def test_env_level_applies_on_every_rank(hetsync_logger, value, level):
    for rank in (0, 1):
        hetsync_logger.handlers, hetsync_logger.level = [], logging.NOTSET
        assert _logging.configure(rank, environ={"HETSYNC_LOG_LEVEL": value}, stream=io.StringIO())
        assert hetsync_logger.level == level


def test_env_level_debug_shows_debug_lines(hetsync_logger):
    stream = io.StringIO()
    _logging.configure(2, environ={"HETSYNC_LOG_LEVEL": "DEBUG"}, stream=stream)
    _emit_all()
    assert "[hetsync rank 2] a debug line" in stream.getvalue().splitlines()


def test_bad_env_level_raises(hetsync_logger):
    with pytest.raises(ValueError, match="HETSYNC_LOG_LEVEL='loud' is not a logging level"):
        _logging.configure(0, environ={"HETSYNC_LOG_LEVEL": "loud"})
    assert hetsync_logger.handlers == []


def test_configured_once(hetsync_logger):
    assert _logging.configure(0, environ={}, stream=io.StringIO())
    assert not _logging.configure(0, environ={"HETSYNC_LOG_LEVEL": "DEBUG"}, stream=io.StringIO())
    assert len(hetsync_logger.handlers) == 1 and hetsync_logger.level == logging.INFO


def test_user_handler_is_left_alone(hetsync_logger):
    mine = logging.StreamHandler(io.StringIO())
    hetsync_logger.addHandler(mine)
    assert not _logging.configure(0, environ={"HETSYNC_LOG_LEVEL": "DEBUG"}, stream=io.StringIO())
    assert hetsync_logger.handlers == [mine]
    assert hetsync_logger.level == logging.NOTSET and hetsync_logger.propagate is True


def test_user_level_opts_in_to_propagation(hetsync_logger):
    hetsync_logger.setLevel(logging.DEBUG)
    assert not _logging.configure(1, environ={}, stream=io.StringIO())
    assert hetsync_logger.handlers == [] and hetsync_logger.propagate is True
    assert hetsync_logger.level == logging.DEBUG


# ----- no print() in the library -----

def _allowed_prints(tree):
    """Lines of print() calls in `if __name__ == "__main__":` blocks and in main() of a module that has one."""
    def is_main_guard(node):
        return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")

    allowed = set()
    has_guard = any(is_main_guard(n) for n in tree.body)
    for node in tree.body:
        if is_main_guard(node) or (has_guard and isinstance(node, ast.FunctionDef) and node.name == "main"):
            allowed |= {n.lineno for n in ast.walk(node) if isinstance(n, ast.Call)}
    return allowed


def test_library_logs_instead_of_printing():
    found = []
    for package in ("hetsync",):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)
                if not name.endswith(".py") or "_pb2" in name or rel in (os.path.join("hetsync", "cli.py"),
                                                                            os.path.join("hetsync", "check.py")):
                    continue
                tree = ast.parse(open(path, encoding="utf-8").read(), rel)
                allowed = _allowed_prints(tree)
                found += [f"{rel}:{n.lineno}" for n in ast.walk(tree)
                          if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
                          and n.lineno not in allowed]
    assert not found, f"print() in library code (use logging.getLogger('hetsync...')): {found}"


def test_import_touches_nothing_even_under_an_mpi_launcher():
    """`import hetsync` (and its public names' table) loads no MPI library, no TensorFlow and no Horovod, and changes
    no environment variable -- also in a process an MPI launcher started (its variables set).  What hetsync needs
    from MPI is applied at hetsync.init() (tests/mpi/init_order.py checks that part under mpirun)."""
    code = ("import os, sys; before = dict(os.environ); import hetsync; dir(hetsync); "
            "maps = open('/proc/self/maps').read(); "
            "print('libmpi' in maps, 'tensorflow' in sys.modules, 'horovod' in sys.modules, dict(os.environ) == before)")
    env = dict(_env(), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False", "True"], out.stdout

"""Generation of the gRPC modules of the Group Generator from ``protos/group_generator.proto``.

The generated files (``group_generator_pb2.py`` and ``group_generator_pb2_grpc.py``) are git-ignored; they are
(re)generated into this directory by :func:`ensure_generated` whenever they are missing or older than the
``.proto``.  setup.py calls it at build time; :mod:`hetsync.coordinator.server` and
:mod:`hetsync.coordinator.client` import the generated modules through :func:`load`.

This module imports nothing from hetsync and can also be run as a script
(``python hetsync/coordinator/_proto.py [--force]``).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
REPO_ROOT = _HERE.parents[1]
PROTO_DIR = REPO_ROOT / "protos"
PROTO_FILE = PROTO_DIR / "group_generator.proto"
_STEM = "group_generator"
_OUTPUTS = (f"{_STEM}_pb2.py", f"{_STEM}_pb2_grpc.py")


def generated_files(relative: bool = False) -> list[str]:
    """Paths of the generated modules; ``relative=True`` gives them relative to the repository root."""
    paths = [_HERE / name for name in _OUTPUTS]
    if relative:
        return [str(p.relative_to(REPO_ROOT)) for p in paths]
    return [str(p) for p in paths]


def _up_to_date() -> bool:
    outs = [_HERE / name for name in _OUTPUTS]
    if not all(p.exists() for p in outs):
        return False
    if not PROTO_FILE.exists():  # installed package without protos/: trust what is there
        return True
    src = PROTO_FILE.stat().st_mtime
    return all(p.stat().st_mtime >= src for p in outs)


def ensure_generated(force: bool = False) -> list[str]:
    """Run ``grpc_tools.protoc`` if the generated modules are missing or stale; return their paths.

    Safe when several processes (ranks) call it at once: each generates into a private temporary directory and
    moves the finished files in place with :func:`os.replace`.
    """
    if not force and _up_to_date():
        return generated_files()
    if not PROTO_FILE.exists():
        raise FileNotFoundError(f"{PROTO_FILE} not found and the generated gRPC modules are missing")
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - environment problem
        raise ImportError("grpcio-tools is needed to generate the Group Generator gRPC code") from exc

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="hetsync-proto-", dir=str(_HERE)) as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO_FILE),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed with exit code {rc}: {' '.join(args)}")
        grpc_path = Path(tmp) / f"{_STEM}_pb2_grpc.py"
        text = grpc_path.read_text()
        # protoc emits an absolute "import group_generator_pb2 as ..."; make it package-relative.
        text = re.sub(rf"^import {_STEM}_pb2 as ", f"from . import {_STEM}_pb2 as ", text, flags=re.M)
        grpc_path.write_text(text)
        for name in _OUTPUTS:
            os.replace(Path(tmp) / name, _HERE / name)
    return generated_files()


def load():
    """Return the generated ``(group_generator_pb2, group_generator_pb2_grpc)`` modules, generating them first."""
    ensure_generated()
    from . import group_generator_pb2, group_generator_pb2_grpc  # deferred: they exist only once generated

    return group_generator_pb2, group_generator_pb2_grpc


if __name__ == "__main__":  # pragma: no cover
    for path in ensure_generated(force="--force" in sys.argv[1:]):
        print(path)

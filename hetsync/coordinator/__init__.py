"""Ripples Group Generator (GG) coordinator: state machines (pure Python), gRPC server and client.

Importing this package is cheap and needs no gRPC: the server/client modules are imported lazily
(``hetsync.coordinator.server`` / ``hetsync.coordinator.client``).  See docs/group_generator.md.
"""

from .group_generator import (  # noqa: F401
    GGError,
    Group,
    GroupFailed,
    InvalidArgument,
    InvariantViolation,
    ProtocolViolation,
    RandomGroupGenerator,
    SmartGroupGenerator,
    WaitInfo,
    WorkerEvicted,
    make_generator,
)

_LAZY = {
    "GroupGeneratorClient": "client",
    "GroupInfo": "client",
    "GGServer": "server",
    "start_server": "server",
    "start_for_job": "server",
    "connect_for_job": "client",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Registry of synchronization methods: ``sync=`` name -> SyncAlgorithm subclass.

Each method is one module that registers itself with ``@register``; importing this package imports them all.
"""
import importlib

_REGISTRY = {}
_MODULES = ["allreduce", "ripples_static", "ripples_gg", "eager", "hop", "esync", "od_sgd", "balanced"]


def register(cls):
    """Class decorator: makes ``cls`` available as ``sync=cls.name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"sync mode {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all():
    for module in _MODULES:
        importlib.import_module(f"{__name__}.{module}")


def available_modes():
    """The valid ``sync=`` names, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def create(sync, **options):
    """Instantiates the algorithm registered as ``sync``; ValueError lists the valid names."""
    _load_all()
    if not isinstance(sync, str) or sync not in _REGISTRY:
        raise ValueError(f"unknown sync mode {sync!r}; valid modes: {', '.join(available_modes())}")
    return _REGISTRY[sync](**options)

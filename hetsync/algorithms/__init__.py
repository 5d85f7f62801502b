"""Registry of synchronization methods: ``sync=`` name -> SyncAlgorithm subclass.

Each method is one module that registers itself with ``@register``; importing this package imports them all.
"""
import importlib

from hetsync.algorithms.options import did_you_mean

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


def declared_options(sync):
    """{option name: Option} that mode ``sync`` declares (its ``OPTIONS``)."""
    _load_all()
    return dict(_REGISTRY[canonical(sync)].OPTIONS)


def departures():
    """[(mode, option name, Option)] for every option whose default is hetsync's own variant of its paper's rule
    (``Option.paper_rule`` holds the paper's value): what docs/paper-fidelity.md measures."""
    _load_all()
    return [(mode, name, option) for mode in sorted(_REGISTRY)
            for name, option in _REGISTRY[mode].OPTIONS.items() if option.departs]


def canonical(sync):
    """The registered spelling of a mode name: underscores read as hyphens (``ripples_smart`` is
    ``ripples-smart``); anything else is returned as given (``create`` then says what is wrong with it)."""
    return sync.replace("_", "-") if isinstance(sync, str) else sync


def create(sync, **options):
    """Instantiates the algorithm registered as ``sync`` (underscores read as hyphens); ValueError lists the valid
    names and the closest one."""
    _load_all()
    name = canonical(sync)
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown sync mode {sync!r}; valid modes: {', '.join(available_modes())}"
                         f"{did_you_mean(name, available_modes()) if isinstance(name, str) else ''}")
    return _REGISTRY[name](**options)

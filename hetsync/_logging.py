"""hetsync's messages: ``logging.getLogger("hetsync")`` and its children ("hetsync.switching", "hetsync.training", ...).

Defaults, set once by ``hetsync.init()`` (:func:`configure`), unless the application configured the logger itself:

* one handler on the "hetsync" logger, to stderr, each line prefixed ``[hetsync rank R]`` (``WARNING:`` and
  ``ERROR:`` follow the prefix on such records);
* level INFO on rank 0 and WARNING on the other ranks, so that a job of N ranks prints its progress once, and a
  warning wherever it happens;
* ``HETSYNC_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR, CRITICAL or a number) sets the level on every rank instead;
* no propagation to the root logger: TensorFlow's absl handler there (or the application's ``basicConfig``) would
  print each line a second time.  The root logger is never touched.

The application configured the logger when, before ``hetsync.init()``, the "hetsync" logger has a handler or a
level of its own: hetsync then leaves it (and its propagation) as it is, and ``HETSYNC_LOG_LEVEL`` is not applied.
``logging.getLogger("hetsync").setLevel(logging.INFO)`` is thus the opt-in to propagation: hetsync's records go to
the root logger's handlers, formatted as the application formats everything else.
"""
import logging
import os
import sys

NAME = "hetsync"
ENV_LEVEL = "HETSYNC_LOG_LEVEL"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def get_logger(name=None):
    """The "hetsync" logger, or its child "hetsync.<name>"."""
    return logging.getLogger(NAME if not name else f"{NAME}.{name}")


def parse_level(value):
    """A logging level from a name (any case) or a number; ValueError naming ``HETSYNC_LOG_LEVEL`` otherwise."""
    text = str(value).strip()
    if text.upper() in _LEVELS:
        return getattr(logging, text.upper())
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {ENV_LEVEL}={value!r} is not a logging level "
                         f"({', '.join(_LEVELS)} or a number)") from None


class _Formatter(logging.Formatter):
    def __init__(self, rank):
        super().__init__()
        self.prefix = f"[hetsync rank {rank}]"

    def format(self, record):
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{self.prefix} {record.levelname}: {text}"
        return f"{self.prefix} {text}"


class DefaultHandler(logging.StreamHandler):
    """hetsync's own handler (its class tells it from the application's: :func:`configure` runs once)."""


def default_installed(logger=None):
    """True once :func:`configure` installed hetsync's handler."""
    return any(isinstance(h, DefaultHandler) for h in (logger or get_logger()).handlers)


def user_configured(logger=None):
    """True when the application gave the "hetsync" logger a handler or a level (hetsync's defaults aside)."""
    logger = logger or get_logger()
    if default_installed(logger):
        return len(logger.handlers) > 1
    return bool(logger.handlers) or logger.level != logging.NOTSET


def configure(rank, environ=None, stream=None):
    """Installs the defaults described above on the "hetsync" logger for ``rank``; True when it did.  Nothing
    when hetsync's handler is already there (a second ``init``) or the application configured the logger.  A bad
    ``HETSYNC_LOG_LEVEL`` raises ValueError in every case (every rank has the same environment: all raise)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_LEVEL)
    level = parse_level(value) if value not in (None, "") else None
    logger = get_logger()
    if default_installed(logger) or user_configured(logger):
        return False
    if level is None:
        level = logging.INFO if rank == 0 else logging.WARNING
    handler = DefaultHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(_Formatter(rank))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return True

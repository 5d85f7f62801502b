"""Typed options, declared once per mode: the one source of the defaults, the checks and their error messages.

A mode declares ``OPTIONS = {"name": Option(default, kind, ...)}``; ``SyncAlgorithm.__init__`` checks every value
with :func:`check_all` before anything else runs, so a bad value is a ``ValueError`` naming the option, the value
and what was expected, on the rank that passed it (and, through ``hetsync.DistributedOptimizer``'s agreement step,
on every rank: hetsync/training/options.py).  ``sync="auto"`` declares its own settings the same way
(hetsync/optimizer.py).  Checks between options (Hop's ``skip`` needs ``backup_workers`` or ``staleness``) stay in
each mode's ``validate``.
"""
import difflib
import numbers

KINDS = ("int", "number", "bool", "str", "list")
SAME = object()  # Option's paper_rule when the default is the paper's own rule


class Option:
    """One option: its default and what a value must be.

    Args:
      default: the value when the user gives none.
      kind: one kind or a tuple of kinds: "int" (a Python/NumPy integer, not a bool), "number" (an int or float, not a bool), "bool", "str" or "list" (a list or tuple; its items are the mode's
        ``validate``'s to check).
      minimum: the smallest allowed value (ints and numbers); ``above=True`` makes it a strict bound.
      choices: the allowed values (any kind); with ``kind`` they are *extra* allowed values (e.g. Hop's
        ``node_links``: 1 or "all").
      none: None is allowed (it means "hetsync decides", e.g. the engine's timeout).
      maximum: the largest allowed value, with ``below=True`` a strict bound.
      doc: one line for the option reference (docs/options.md, ``python -m hetsync.docs``); when None is allowed it
        says what None means.
      paper: the paper's section the option implements (e.g. "Hop §4.4"), or "" (hetsync's own, or no section).
      paper_rule: where the default is hetsync's own variant, the value that is the paper's rule (implemented and
        tested, so a user can choose it); unset when the default is the paper's.  ``benchmarks/run.py
        --paper-rules`` measures each such option against its default.
      acts_with: options under which alone this one acts (ESync's ``on_ready`` only with ``non_blocking=True``):
        a comparison of its values sets them too.
    """

    def __init__(self, default, kind=None, *, minimum=None, above=False, maximum=None, below=False, choices=None,
                 none=False, doc="", paper="", paper_rule=SAME, acts_with=None):
        kinds = () if kind is None else (kind,) if isinstance(kind, str) else tuple(kind)
        if any(k not in KINDS for k in kinds):
            raise TypeError(f"Option kind must be one or more of {KINDS}, got {kind!r}")
        self.default, self.kinds = default, kinds
        self.minimum, self.above, self.maximum, self.below = minimum, above, maximum, below
        self.choices = tuple(choices) if choices is not None else None
        self.none, self.doc, self.paper = none, doc, paper
        self.paper_rule, self.acts_with = paper_rule, dict(acts_with or {})

    @property
    def departs(self):
        """Whether the default is hetsync's own variant of the paper's rule (``paper_rule`` is then the paper's)."""
        return self.paper_rule is not SAME

    def expected(self):
        """What a value must be, in words (the error message's "expected ...")."""
        parts = []
        if self.kinds:
            what = " or ".join({"int": "an int", "number": "a number", "bool": "True or False", "str": "a string",
                                "list": "a list"}[k] for k in self.kinds)
            bounds = []
            if self.minimum is not None:
                bounds.append(f"{'>' if self.above else '>='} {self.minimum}")
            if self.maximum is not None:
                bounds.append(f"{'<' if self.below else '<='} {self.maximum}")
            parts.append(what + (" " + " and ".join(bounds) if bounds else ""))
        if self.choices is not None:
            parts.append(" or ".join(repr(c) for c in self.choices))
        if self.none:
            parts.append("None")
        return " or ".join(parts)

    def accepts(self, value):
        if value is None:
            return self.none
        if self.choices is not None and _in(value, self.choices):
            return True
        if not any(_of_kind(value, k) for k in self.kinds):
            return False
        if isinstance(value, (list, tuple)):
            return True  # the mode's validate checks a list's items
        if self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum):
            return False
        if self.maximum is not None and (value >= self.maximum if self.below else value > self.maximum):
            return False
        return True


TIMEOUT = Option(None, "number", minimum=0, above=True, none=True,
                 doc="seconds one of the mode's waits may block before it fails naming the ranks (None: hetsync.init's "
                     "timeout)")


def did_you_mean(unknown, valid):
    """"; did you mean 'x'?": the closest valid name (difflib) to each unknown one, or "" when none is close.

    ``unknown``: one name or a list of names; with several, each hint names the unknown it is for."""
    names = [unknown] if isinstance(unknown, str) else list(unknown)
    hints = []
    for name in names:
        close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6) if isinstance(name, str) else []
        if close:
            hints.append(repr(close[0]) if len(names) == 1 else f"{close[0]!r} for {name!r}")
    return f"; did you mean {', '.join(hints)}?" if hints else ""


def _in(value, choices):
    return any(type(value) is type(c) and value == c for c in choices)  # 1 is not True, "1" is not 1


def _of_kind(value, kind):
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, numbers.Integral)
    if kind == "number":
        return isinstance(value, numbers.Real)
    if kind == "list":
        return isinstance(value, (list, tuple))
    return isinstance(value, str)


def check(owner, name, option, value):
    """Raises ValueError naming ``owner`` (e.g. "sync='hop'"), the option, the value and what was expected."""
    if not option.accepts(value):
        raise ValueError(f"{owner}: option {name}={value!r} ({type(value).__name__}) is invalid: expected "
                         f"{option.expected()}")


def check_all(owner, declared, given):
    """Checks every given value against its declaration; returns the defaults updated with ``given``."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(f"{owner}: unknown option(s) {unknown}; valid options: {', '.join(sorted(declared))}"
                         f"{did_you_mean(unknown, declared)}")
    for name, value in given.items():
        check(owner, name, declared[name], value)
    return {**defaults(declared), **given}


def defaults(declared):
    """{name: default} of a declaration."""
    return {name: option.default for name, option in declared.items()}



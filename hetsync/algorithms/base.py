"""The one interface every synchronization method implements (one module per method, registered by name).

``DistributedOptimizer`` only looks a name up in the registry and asks the algorithm to wrap the user's optimizer;
everything method-specific lives in the algorithm's module.
"""


class SyncAlgorithm:
    """Base class of a synchronization method.

    Subclasses set ``name`` (the ``sync=`` string), ``OPTIONS`` (option name -> default) and implement
    ``wrap(optimizer)``.  Decentralized methods (workers hold different parameters between synchronizations) use
    the ``on_consensus_*`` hooks (see decentralized.py) to withdraw the worker from hetsync's collectives while the
    job averages parameters with Horovod, so nobody waits on a worker that is busy elsewhere.
    """

    name = None
    OPTIONS = {}

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            valid = ", ".join(sorted(self.OPTIONS)) or "(none)"
            raise ValueError(f"unknown option(s) {unknown} for sync={self.name!r}; valid options: {valid}")
        self.options = {**self.OPTIONS, **options}
        self.validate()

    def validate(self):
        """Checks option values; raise ValueError naming the option and what is allowed."""

    def wrap(self, optimizer):
        """Returns a Keras optimizer that trains with this method."""
        raise NotImplementedError

    def on_consensus_begin(self):
        """Called by the Consensus step before the global average (e.g. to tell a coordinator we pause)."""

    def on_consensus_end(self, finished):
        """Called after the global average; ``finished`` is True on a worker whose training has ended."""

    def metrics(self):
        """Method-specific counters for reports (dict of numbers)."""
        return {}

    def __repr__(self):
        return f"{type(self).__name__}({self.options})"

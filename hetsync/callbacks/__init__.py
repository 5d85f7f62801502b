"""hetsync's Keras callbacks, named as Horovod names its own (``hvd.callbacks.*Callback``).  All are optional: a
model compiled with a ``hetsync.DistributedOptimizer`` already ends every epoch and ``fit`` with one model.

* :class:`ConsensusCallback` -- how often decentralized training averages the workers' models;
* :class:`SyncModeCallback` -- live sync-mode switches (a per-epoch schedule, and ``request(mode)``, the flag);
* :class:`HeterogeneityReportCallback` -- what each worker does, for TensorBoard and ``hetsync report``.

Heterogeneity emulation for tests and benchmarks (slower ranks, emulated compute) is in :mod:`hetsync.testing`.
"""
from hetsync.callbacks.consensus import ConsensusCallback
from hetsync.callbacks.report import HeterogeneityReportCallback
from hetsync.callbacks.sync_mode import SyncModeCallback

__all__ = ["ConsensusCallback", "SyncModeCallback", "HeterogeneityReportCallback"]

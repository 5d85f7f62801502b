"""``hetsync.callbacks.HeterogeneityReportCallback``: what each worker does, for TensorBoard and ``hetsync report``.

The callback lives in hetsync/training/report.py (the training layer adds it by itself beside a user's TensorBoard
callback, and hetsync never imports this package); it is offered here with the other callbacks.
"""
from hetsync.training.report import HeterogeneityReportCallback

__all__ = ["HeterogeneityReportCallback"]

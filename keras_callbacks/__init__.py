"""Keras callbacks for hetsync: heterogeneity injection (Slowdown, EmulatedCompute), Consensus averaging, live
sync-mode switches (SyncMode) and the heterogeneity report (HeterogeneityReport)."""
from keras_callbacks.consensus import Consensus
from keras_callbacks.report import HeterogeneityReport
from keras_callbacks.slowdown import MODES as SLOWDOWN_MODES
from keras_callbacks.slowdown import EmulatedCompute, PhasedSlowdown, Slowdown
from keras_callbacks.sync_mode import SyncMode

__all__ = ["Consensus", "Slowdown", "EmulatedCompute", "PhasedSlowdown", "SLOWDOWN_MODES", "SyncMode",
           "HeterogeneityReport"]

"""Keras callbacks for hetsync: heterogeneity injection (Slowdown, EmulatedCompute) and Consensus averaging."""
from keras_callbacks.consensus import Consensus
from keras_callbacks.slowdown import MODES as SLOWDOWN_MODES
from keras_callbacks.slowdown import EmulatedCompute, Slowdown

__all__ = ["Consensus", "Slowdown", "EmulatedCompute", "SLOWDOWN_MODES"]

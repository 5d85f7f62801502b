"""Heterogeneity emulation, for tests and benchmarks: Keras callbacks that make chosen ranks slower per train step
(the papers' delay patterns) or add emulated compute, so that a small CPU machine behaves like a cluster whose
workers differ in speed.  Nothing here slows a rank unless told which: every callback names its ranks or factors.

* :class:`SlowdownCallback` -- the papers' slowdowns: ``"deterministic"``, ``"random"``, ``"random-one"``,
  ``"imbalance"`` (:data:`SLOWDOWN_MODES`);
* :class:`PhasedSlowdownCallback` -- a heterogeneity that changes during the job;
* :class:`EmulatedComputeCallback` -- a fixed sleep per step on every rank, standing for model compute.
"""
from hetsync.testing.slowdown import MODES as SLOWDOWN_MODES
from hetsync.testing.slowdown import EmulatedComputeCallback, PhasedSlowdownCallback, SlowdownCallback

__all__ = ["SlowdownCallback", "PhasedSlowdownCallback", "EmulatedComputeCallback", "SLOWDOWN_MODES"]

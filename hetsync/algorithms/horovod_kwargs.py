"""Horovod's ``DistributedOptimizer`` keyword arguments, accepted by every sync mode.

A Horovod Keras script changes one line, ``hvd.DistributedOptimizer(opt, **kw)`` ->
``hetsync.DistributedOptimizer(opt, sync=..., **kw)``, so every keyword that
``horovod.tensorflow.keras.DistributedOptimizer`` accepts is accepted by every mode.  ``sync="allreduce"`` hands them all to Horovod unchanged.  The parameter-averaging
modes (which wrap the optimizer with ``_wrap.wrap_post_update``) apply those with a meaning for them (``APPLIED``) and
accept the others with one warning on rank 0 that names each one and says why it does not apply (``REASONS``).  A
kwarg passed with Horovod's default value asks for nothing, so it is accepted silently everywhere.

``support_table()`` gives, per registered mode, which kwargs are applied and which are ignored (for the README);
``markdown_table()`` renders it.
"""
import numbers
import os
import re
import sys
import warnings
from hetsync import algorithms

# The keyword arguments of horovod.tensorflow.keras.DistributedOptimizer (Horovod 0.28.1), in its order.
# tests/test_horovod_kwargs.py checks this against the installed Horovod's signature.
NAMES = (
    "name", "device_dense", "device_sparse", "compression", "sparse_as_dense", "gradient_predivide_factor", "op",
    "backward_passes_per_step", "average_aggregated_gradients", "num_groups", "groups", "process_set",
    "scale_local_gradients",
)

# What the parameter-averaging modes do with the kwargs they apply (``wrap_post_update`` and the base class).
APPLIED = {
    "name": "name scope of the ops the wrapper adds (gradient accumulation, the sync); default "
            "'Distributed<OptimizerClass>' as in Horovod",
    "compression": "Compression.none or Compression.fp16: kept as algorithm.compression, what the sync sends on the "
                   "wire; any other compressor is a ValueError",
    "sparse_as_dense": "IndexedSlices gradients are made dense before the local update",
    "backward_passes_per_step": "gradients of N passes accumulate locally, then ONE local update and ONE sync; "
                                "the other passes neither update, sync nor count in optimizer.iterations",
    "average_aggregated_gradients": "the accumulated gradient is divided by backward_passes_per_step",
    "process_set": "only the global process set (hetsync's collectives span all ranks); any other is a ValueError",
}
APPLIED_BY_WRAPPER = frozenset(APPLIED)

# Why the others have no meaning for a parameter-averaging mode ({mode} is the sync= name).
REASONS = {
    "device_dense": "it places Horovod's gradient allreduce ops on a device; sync={mode!r} runs its collectives in "
                    "hetsync's engine (MPI, host memory) and allreduces no gradients",
    "device_sparse": "it places Horovod's sparse gradient allgather ops on a device; sync={mode!r} runs its "
                     "collectives in hetsync's engine (MPI, host memory) and gathers no gradients",
    "gradient_predivide_factor": "it splits the averaging of a gradient sum into scaling before and after the "
                                 "allreduce; sync={mode!r} averages parameters with P-Reduce and sums no gradients",
    "op": "sync={mode!r} averages parameters with P-Reduce, not gradients: the group average is the only "
          "reduction (op=Average, Horovod's default)",
    "num_groups": "it batches gradient allreduces into fusion groups; sync={mode!r} synchronizes all parameters in "
                  "one operation per step",
    "groups": "it batches gradient allreduces into fusion groups; sync={mode!r} synchronizes all parameters in one "
              "operation per step",
    "scale_local_gradients": "it scales the gradients of variables registered with register_local_var inside a "
                             "gradient allreduce; sync={mode!r} allreduces no gradients (each worker applies its "
                             "own gradients unscaled)",
}
assert set(APPLIED) | set(REASONS) == set(NAMES) and not set(APPLIED) & set(REASONS)

_SCOPE_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class HorovodKwargWarning(UserWarning):
    """A Horovod DistributedOptimizer kwarg was accepted but has no meaning for the chosen sync mode."""


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def _compression():
    from horovod.tensorflow.compression import Compression

    return Compression


def _reduce_ops():
    hvd = _hvd()
    return {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Adasum: "Adasum", hvd.Min: "Min", hvd.Max: "Max",
            hvd.Product: "Product"}


def _is_global(process_set):
    return process_set is None or getattr(process_set, "process_set_id", None) == 0


def is_default(key, value):
    """True when ``value`` is Horovod's default for ``key`` (it then asks for nothing in any mode)."""
    if key in ("device_dense", "device_sparse"):
        return value in ("", None)
    if key == "compression":
        return value is _compression().none
    if key == "gradient_predivide_factor":
        return value == 1.0
    if key == "op":
        return value is None or (not isinstance(value, bool) and value == _hvd().Average)
    if key == "num_groups":
        return value == 0 and not isinstance(value, bool)
    if key == "process_set":
        return _is_global(value)
    defaults = {"name": None, "sparse_as_dense": False, "backward_passes_per_step": 1,
                "average_aggregated_gradients": False, "groups": None, "scale_local_gradients": True}
    return value is defaults[key] or (value == defaults[key] and type(value) is type(defaults[key]))


def _describe(key, value):
    if key == "op":
        return _reduce_ops().get(value, repr(value))
    return repr(value)


def _check_bool(key, value):
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be True or False, got {value!r}")


def _check(key, value):
    """ValueError naming ``key`` when ``value`` is not something Horovod would accept for it."""
    if key == "name":
        if value is not None and (not isinstance(value, str) or not _SCOPE_NAME.match(value)):
            raise ValueError(f"name must be None or a TensorFlow name-scope string (letters, digits, '_.-/'), "
                             f"got {value!r}")
    elif key in ("device_dense", "device_sparse"):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{key} must be a device string, got {value!r}")
    elif key in ("sparse_as_dense", "average_aggregated_gradients", "scale_local_gradients"):
        _check_bool(key, value)
    elif key == "backward_passes_per_step":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {value!r}")
    elif key == "gradient_predivide_factor":
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"gradient_predivide_factor must be a number > 0, got {value!r}")
    elif key == "op":
        if isinstance(value, bool) or value not in _reduce_ops():
            raise ValueError(f"op must be one of Horovod's reduce ops (hvd.Average, hvd.Sum, hvd.Adasum, ...), "
                             f"got {value!r}")
    elif key == "num_groups":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"num_groups must be an int >= 0, got {value!r}")
    elif key == "groups":
        if value is not None and not isinstance(value, list) and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0):
            raise ValueError(f"groups must be None, an int >= 0 or a list of lists of tf.Variable, got {value!r}")


class Resolved:
    """The Horovod kwargs of one optimizer, resolved for a parameter-averaging mode."""

    def __init__(self, compression, sparse_as_dense, backward_passes_per_step, average_aggregated_gradients,
                 scope_name, ignored):
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.scope_name = scope_name
        self.ignored = ignored  # kwarg -> "value: reason", in NAMES order


def resolve(mode, kwargs, applied=APPLIED_BY_WRAPPER, reasons=None):
    """Validates Horovod ``kwargs`` (only names from NAMES) for sync=``mode``; returns a Resolved.

    ``applied`` are the kwargs the mode applies; the others, when not at Horovod's default, land in
    ``Resolved.ignored`` with the reason (``reasons`` overrides REASONS for a mode that exchanges gradients).  Raises ValueError naming the kwarg for a bad value, a compressor other
    than none/fp16, or a process set other than the global one.
    """
    for key in NAMES:
        if key in kwargs:
            _check(key, kwargs[key])
    compression_cls = _compression()
    compression = kwargs.get("compression", compression_cls.none)
    if "compression" in applied and compression is not compression_cls.none \
            and compression is not compression_cls.fp16:
        raise ValueError(f"compression={compression!r} is not supported by sync={mode!r}: use "
                         f"hvd.Compression.none or hvd.Compression.fp16")
    if "process_set" in applied and not _is_global(kwargs.get("process_set")):
        raise ValueError(f"process_set={kwargs['process_set']!r} is not supported by sync={mode!r}: hetsync's "
                         f"collectives (P-Reduce, the Group Generator, consensus) span all ranks of the job, so "
                         f"only the global process set (hvd.global_process_set, the default) is valid")
    ignored = {}
    for key in NAMES:
        if key in kwargs and key not in applied and not is_default(key, kwargs[key]):
            reason = {**REASONS, **(reasons or {})}.get(key, "sync={mode!r} does not apply it").format(mode=mode)
            ignored[key] = f"{key}={_describe(key, kwargs[key])} has no meaning for sync={mode!r}: {reason}"

    def setting(key, default):
        return kwargs.get(key, default) if key in applied else default

    return Resolved(
        compression=compression if "compression" in applied else compression_cls.none,
        sparse_as_dense=setting("sparse_as_dense", False),
        backward_passes_per_step=int(setting("backward_passes_per_step", 1)),
        average_aggregated_gradients=setting("average_aggregated_gradients", False),
        scope_name=setting("name", None),
        ignored=ignored,
    )


def _is_rank0():
    try:
        hvd = _hvd()
        return not hvd.is_initialized() or hvd.rank() == 0
    except Exception:  # noqa: BLE001 (Horovod missing or half-initialised: warn rather than stay silent)
        return True


def _caller_stacklevel():
    """stacklevel pointing at the first frame outside the hetsync package (the user's line)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def part_time(mode, kwargs, reasons):
    """For a mode that hands the kwargs to Horovod's optimizer for part of the training only: ``{kwarg: text}`` for
    those in ``reasons`` (not applied in the rest) that are set to another value than Horovod's default."""
    return {key: f"{key}={_describe(key, kwargs[key])} applies only while Horovod's optimizer runs sync={mode!r}: "
                 f"{reasons[key]}"
            for key in NAMES if key in reasons and key in kwargs and not is_default(key, kwargs[key])}


def warn_ignored(mode, ignored):
    """Emits ONE HorovodKwargWarning for this optimizer, on rank 0 only (or when Horovod is not initialised)."""
    if not ignored or not _is_rank0():
        return
    lines = "\n".join(f"  - {text}" for text in ignored.values())
    warnings.warn(
        f"hetsync.DistributedOptimizer(sync={mode!r}) accepted Horovod keyword argument(s) "
        f"{', '.join(ignored)} without applying them in every step:\n{lines}",
        HorovodKwargWarning, stacklevel=_caller_stacklevel())


def support_table(modes=None):
    """Per registered mode: ``{mode: {"applied": {kwarg: how}, "ignored": {kwarg: why}}}``.

    "ignored" kwargs are accepted and produce the warning when set to a value other than Horovod's default.
    """
    algorithms._load_all()
    table = {}
    for mode in modes or algorithms.available_modes():
        cls = algorithms._REGISTRY[mode]
        if cls.HOROVOD_PASSTHROUGH:
            applied = {k: "passed to hvd.DistributedOptimizer unchanged" for k in NAMES}
        else:
            applied = {k: APPLIED.get(k, "applied by the mode") for k in NAMES if k in cls.HOROVOD_APPLIED}
        why = {**REASONS, **cls.HOROVOD_REASONS}
        ignored = {k: why.get(k, "sync={mode!r} does not apply it").format(mode=mode) for k in NAMES if k not in applied}
        table[mode] = {"applied": applied, "ignored": ignored}
    return table


def markdown_table(modes=None):
    """The support table as Markdown: one row per kwarg, one column per mode ("applied" / "warning")."""
    table = support_table(modes)
    modes = list(table)
    rows = ["| kwarg | " + " | ".join(f"`{m}`" for m in modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for key in NAMES:
        cells = ["applied" if key in table[m]["applied"] else "accepted; warns unless Horovod's default"
                 for m in modes]
        rows.append(f"| `{key}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)

"""The checks behind the table's "refused" and "warned" cells, called from the places that refuse
(DistributedOptimizer, fit, hetsync.init, job_steps, a live switch)."""
import os
import warnings

from hetsync import algorithms, marks
from hetsync.algorithms.horovod_kwargs import _is_rank0
from hetsync.training.hooks import SwitchSchedule

def keras_version():
    """The version of the Keras ``tf.keras`` is."""
    import tensorflow as tf

    version = getattr(tf.keras, "__version__", None)
    if version is None:
        try:
            import keras

            version = keras.__version__ if tf.keras.__name__.startswith("keras") else "2"
        except ImportError:
            version = "2"
    return str(version)


def keras_problem(version=None):
    version = keras_version() if version is None else str(version)
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    if major >= 3:
        return (f"Keras {version} (Keras 3) is not supported: hetsync, like Horovod 0.28, wraps tf.keras 2 optimizers "
                "and Model.fit; use TensorFlow <= 2.15, or tf-keras with TF_USE_LEGACY_KERAS=1")
    return None


def runtime_problem(environ=None):
    """Elastic Horovod, refused at ``hetsync.init()`` (Horovod's elastic launcher sets HOROVOD_ELASTIC=1)."""
    environ = os.environ if environ is None else environ
    if str(environ.get("HOROVOD_ELASTIC", "0")).strip() not in ("", "0"):
        return ("Elastic Horovod (HOROVOD_ELASTIC=1: horovodrun --min-np/--host-discovery-script, hvd.elastic.run) "
                "is not supported: hetsync's engine, Job Clock and coordinator services are sized for a fixed set "
                "of ranks; launch with a fixed -np")
    return None


def call_problem(sync, hvd_kwargs):
    """``hetsync.DistributedOptimizer``'s own refusals (every mode): Keras 3, a process set other than the global
    one.  A string, or None."""
    problem = keras_problem()
    if problem:
        return problem
    process_set = hvd_kwargs.get("process_set")
    if process_set is not None and getattr(process_set, "process_set_id", None) != 0:
        return (f"process_set={process_set!r} is not supported by sync={sync!r}: hetsync's sync points, job epochs "
                "and consensus average all ranks of the job, so only the global process set "
                "(hvd.global_process_set, the default) is valid")
    return None


def steps_per_execution(model):
    """Keras' steps_per_execution of a compiled model: an int, or -1 for "auto"."""
    if getattr(model, "_autotune_steps_per_execution", False):
        return -1
    variable = getattr(model, "_steps_per_execution", None)
    return int(variable.numpy()) if variable is not None else 1


def _sync_batch_norms(model):
    try:
        from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
    except ImportError:  # pragma: no cover
        return []
    return [m for m in getattr(model, "submodules", ()) if isinstance(m, SyncBatchNormalization)]


def fit_modes(family, algorithm, user_callbacks):
    """The modes a fit may train in: the one in force, sync="auto"'s candidates, a SyncModeCallback schedule's."""
    found = [family.current[0] if family is not None and family.current else algorithm.name]
    if family is not None and family.auto:
        found += [mode for mode, _ in family.auto["candidates"].values()]
    for cb in user_callbacks:
        if isinstance(cb, SwitchSchedule):
            found += [mode for mode, _ in cb.schedule.values()]
    return list(dict.fromkeys(found))


def fit_problem(model, modes_used, auto=False):
    """This rank's reason to refuse a fit of ``model`` that may train in ``modes_used`` (a string), or None."""
    algorithms._load_all()
    where = "sync='auto' (its candidate {mode!r})" if auto else "sync={mode!r}"
    spe = steps_per_execution(model)
    if spe != 1:
        for mode in modes_used:
            if mode != "allreduce":
                shown = '"auto"' if spe < 0 else spe
                return (f"steps_per_execution={shown} is not supported by {where.format(mode=mode)}: hetsync runs its "
                        "exchange, sync points and job epochs around every Keras step, and Keras would run several "
                        "train steps per call; compile with steps_per_execution=1 (the default), or use "
                        "sync='allreduce'")
    layers = _sync_batch_norms(model)
    if layers:
        for mode in modes_used:
            cls = algorithms._REGISTRY.get(mode)
            if cls is not None and cls.STEPPING != "lockstep":
                return (f"hvd.SyncBatchNormalization (layer {layers[0].name!r}) is not supported by "
                        f"{where.format(mode=mode)}: it allreduces batch statistics over all ranks in every train "
                        "step, and ranks that take different numbers of steps never pair them (a hang); use "
                        "tf.keras.layers.BatchNormalization (hetsync averages its moving statistics at every sync "
                        "point), or sync='allreduce'")
    return None


def switch_problem(model, mode):
    """A live switch's extra check (switching.preflight): the model's features against the new mode."""
    return fit_problem(model, [mode]) if model is not None else None


def loop_problem(optimizer):
    """``hetsync.job_steps``'s refusal of ``optimizer`` (besides a mode's NO_CUSTOM_LOOPS), or None."""
    family = marks.family_of(optimizer)
    if family is not None and family.auto:
        return ("sync='auto' is not supported in custom loops (hetsync.job_steps): it switches modes inside "
                "Model.fit only, so the loop would train in its first candidate throughout; pass a fixed mode")
    return None


_TAPE = {"warned": False}


def tape_problem(algorithm):
    """``hvd.DistributedGradientTape`` in a ``hetsync.job_steps`` loop of ``algorithm``'s mode: the refusal (a
    string), or None after one warning on rank 0 in a mode that allreduces gradients anyway."""
    if algorithm.HOROVOD_PASSTHROUGH:
        if not _TAPE["warned"]:
            _TAPE["warned"] = True

            if _is_rank0():
                warnings.warn(f"hvd.DistributedGradientTape in a hetsync.job_steps loop with sync={algorithm.name!r}: "
                              "the optimizer allreduces each step's gradients itself and takes the tape's allreduce "
                              "for its own, but the tape counts the gradients of ranks that are only stepping "
                              "along (past their own steps, or stopped), which hetsync weights 0; use a plain "
                              "tf.GradientTape", UserWarning, stacklevel=5)
        return None
    return (f"hvd.DistributedGradientTape is not supported by sync={algorithm.name!r}: it allreduces every step's "
            "gradients over all ranks, and ranks stepping at their own pace never pair those allreduces (a hang); "
            "the mode exchanges through the optimizer: use a plain tf.GradientTape")


_LOADED = {"warned": False}


def horovod_optimizer_warning(model, hetsync_initialized):
    """A fit in a hetsync process (``hetsync_initialized``) of a model whose optimizer is Horovod's own
    DistributedOptimizer (what ``hvd.load_model`` returns): one warning on rank 0, since none of hetsync's modes is
    in it."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or _LOADED["warned"] or not type(optimizer).__module__.startswith("horovod"):
        return
    if not hasattr(optimizer, "_allreduce") or not hetsync_initialized:
        return
    _LOADED["warned"] = True

    if _is_rank0():
        warnings.warn("this model's optimizer is Horovod's own DistributedOptimizer (hvd.load_model returns one): it "
                      "trains with plain allreduce, not with a hetsync mode; load with "
                      "tf.keras.models.load_model(path, compile=False) and compile with hetsync.DistributedOptimizer",
                      UserWarning, stacklevel=4)


# -- docs/compatibility.md -----------------------------------------------------------------------------------------

"""``hetsync.load_model``: Horovod's resume recipe with a hetsync optimizer.

Horovod's Keras examples resume from a full-model checkpoint (``ModelCheckpoint`` writing ``.h5``) with
``hvd.load_model``, which rebuilds the saved optimizer as a ``hvd.DistributedOptimizer`` with its slots and step
count.  A model compiled with ``hetsync.DistributedOptimizer`` saves its optimizer under the user's class name
(``Adam``, ...), so ``tf.keras.models.load_model`` gives back a plain Keras optimizer and ``hvd.load_model`` a
Horovod one.  :func:`load_model` gives back the model compiled with ``hetsync.DistributedOptimizer(<the saved
optimizer>, sync=..., **options)`` -- the same mode and options the script passes at its first start -- with the
saved slots and ``iterations`` restored by Keras' own loading (docs/resume.md).  When a live switch had changed the
mode before the checkpoint was written, the file says so (training/saved_mode.py) and the next fit resumes in that
mode.
"""
import tensorflow as tf

from hetsync import marks
from hetsync.optimizer import DistributedOptimizer
from hetsync.training import saved_mode

# The Keras optimizers a saved model may name, new and legacy (Keras deserializes built-in names in lower case).
_BUILT_IN = ("Adadelta", "Adagrad", "Adam", "Adamax", "Ftrl", "Nadam", "RMSprop", "SGD")


def load_model(filepath, *, sync, custom_optimizers=None, custom_objects=None, compile=True, **options):  # noqa: A002
    """``tf.keras.models.load_model(filepath)`` whose optimizer comes back as
    ``hetsync.DistributedOptimizer(<saved optimizer>, sync=sync, **options)``, with its saved state.

    Like ``hvd.load_model``: call it after ``hvd.init()`` and ``hetsync.init()``, on every rank that loads (Horovod's
    recipe loads on rank 0 and lets ``BroadcastGlobalVariablesCallback(0)`` hand the model and the optimizer state to
    the others, whose scripts build and compile the model with the same ``hetsync.DistributedOptimizer`` line).
    ``custom_optimizers``: your own optimizer classes the file may name (as in Horovod); ``custom_objects``:
    anything else it names.  ``options``: the mode's options and Horovod's ``DistributedOptimizer`` keywords, as in
    ``hetsync.DistributedOptimizer``.  ``compile=False``: the model alone, to compile yourself.

    A checkpoint written after a live switch (``hetsync.callbacks.SyncModeCallback``) records the mode then in
    force: the next ``hetsync.keras.fit`` switches to it before its first step, on every rank (``sync="auto"``
    measures again instead).  An unknown mode or option in the file is a ValueError here.
    """
    objects = dict(custom_objects or {})
    if compile:
        for name, classes in _optimizer_classes(custom_optimizers).items():
            rebuild = _rebuilding(name, classes, sync, options)
            objects.setdefault(name, rebuild)
            objects.setdefault(name.lower(), rebuild)
    model = tf.keras.models.load_model(filepath, custom_objects=objects, compile=compile)
    family = marks.family_of(getattr(model, "optimizer", None)) if compile else None
    saved = saved_mode.read(filepath) if family is not None else None
    if saved is not None and family.auto is None:
        try:
            family.validate(*saved)
        except ValueError as e:
            raise ValueError(f"{filepath} was saved in sync mode {saved[0]!r} with options {saved[1]}, which this "
                             f"hetsync cannot run: {e}") from None
        family.resumed = saved
    return model


def _optimizer_classes(custom_optimizers):
    """{class name: (new class or None, legacy class or None)} of every optimizer a saved model may name."""
    found = {name: (getattr(tf.keras.optimizers, name, None), getattr(tf.keras.optimizers.legacy, name, None))
             for name in _BUILT_IN}
    for cls in custom_optimizers or ():
        legacy = issubclass(cls, tf.keras.optimizers.legacy.Optimizer)
        found[cls.__name__] = (None, cls) if legacy else (cls, None)
    return found


def _rebuilding(name, classes, sync, options):
    """What Keras calls with the saved optimizer's config: the user's class rebuilt from it (legacy or not, as the
    config says), wrapped by hetsync.DistributedOptimizer.  Keras then builds its slots and sets the saved values."""
    new, legacy = classes

    def from_config(config, custom_objects=None):
        cls = legacy if config.get("is_legacy_optimizer", new is None) else new
        cls = cls or legacy or new
        plain = cls.from_config(config, custom_objects) if custom_objects else cls.from_config(config)
        return DistributedOptimizer(plain, sync=sync, **options)

    return type(name, (), {"from_config": staticmethod(from_config), "__module__": __name__})

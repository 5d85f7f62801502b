"""Horovod's TF2 custom loop step (its ``tensorflow2_mnist.py``) with a hetsync optimizer, as the README's custom-loop
quickstart writes it: ``DistributedGradientTape`` dropped, the first batch's broadcast kept.  Test scripts that run
users' loops build their step here, so they all run the same one."""
import horovod.tensorflow as hvd
import tensorflow as tf


def horovod_training_step(model, opt, loss, traced=True):
    """The step ``(images, labels, first_batch) -> loss``, in a ``tf.function`` unless ``traced=False``."""

    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss(labels, model(images, training=True))
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss_value

    return tf.function(training_step) if traced else training_step

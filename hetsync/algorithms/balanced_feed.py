"""``sync="balanced"``'s micro-batches: this rank's batches from Keras' iterator, cut and joined into the samples
each update of its share needs (hetsync/algorithms/balanced.py)."""
import tensorflow as tf


def _first(data):
    return [t for t in tf.nest.flatten(data) if t is not None][0]


@tf.autograph.experimental.do_not_convert
def samples_of(data):
    """Graph: the micro-batch's samples (its first tensor's batch dimension).  Not converted by AutoGraph: seen
    converted to another function of this module once (under sync="auto"'s pretrace), and there is nothing to
    convert."""
    return tf.cast(tf.shape(_first(data))[0], tf.float32)


def _size(data):
    return int(_first(data).shape[0])


def _cut(data, start, stop):
    return tf.nest.map_structure(lambda t: None if t is None else t[start:stop], data)


def _join(parts):
    if len(parts) == 1:
        return parts[0]
    return tf.nest.map_structure(lambda *ts: None if ts[0] is None else tf.concat(ts, 0), *parts)


class MicroBatchFeed:
    """This rank's samples: its batches from Keras' iterator, cut and joined into micro-batches of at most its
    batch size (or ``cap`` samples).  The rest of a cut batch is the start of the next update's samples, so no sample is skipped."""

    def __init__(self, cap=None):
        self.rest, self.batch, self.cap = None, None, cap

    def reset(self):
        self.rest = None

    def _next(self, iterator):
        data = next(iterator)
        n = _size(data)
        self.batch = max(self.batch or 0, n)
        return data

    def micro_batches(self, iterator, need):
        """Yields (data, samples) adding up to ``need`` samples (``None``: one batch, whole); fewer when the
        iterator runs out after the first (it raises when it is out at once, as Keras' own step does)."""
        if need is None:
            if self.rest is not None:
                data, self.rest = self.rest, None
            else:
                data = self._next(iterator)
            yield data, _size(data)
            return
        given = 0
        while given < need:
            parts, got = [], 0
            while True:
                limit = min(need - given, self.cap or self.batch) if self.batch else need - given
                if got >= limit:
                    break
                if self.rest is None:
                    try:
                        self.rest = self._next(iterator)
                    except (StopIteration, tf.errors.OutOfRangeError):
                        if given == 0 and not parts:
                            raise
                        break
                    continue
                have = _size(self.rest)
                take = min(limit - got, have)
                parts.append(_cut(self.rest, 0, take) if take < have else self.rest)
                self.rest = _cut(self.rest, take, have) if take < have else None
                got += take
            if not parts:
                return
            given += got
            yield _join(parts), got

"""Run under mpirun -np 4: examples/horovod_keras_mnist.py's training, once per case, in one job (argument: a JSON
list of [summary directory, script arguments]).  The script's own ``train`` runs each case as its ``main`` would,
between one ``hetsync.init()`` and one ``hetsync.shutdown()``: the cases of tests/test_dropin.py's "stopping on their
own" scenario share the job's start-up (four TensorFlow imports, MPI, the engine) instead of paying it once each.
Prints OK rank=R.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402

import hetsync  # noqa: E402
import horovod_keras_mnist as example  # noqa: E402


def main():
    hvd.init()
    hetsync.init()
    for out, argv in json.loads(sys.argv[1]):
        example.train(example.parse(argv + ["--summary-dir", out]))
    hetsync.shutdown()
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()

"""Run under mpirun -np 4: examples/horovod_keras_mnist.py's training, once per case, in one job (argument: a JSON
list of [summary directory, script arguments]).  The script's own ``train`` runs each case as its ``main`` would,
between one ``hetsync.init()`` and one ``hetsync.shutdown()``: tests/test_dropin.py's cases (a slow rank in every
mode, ranks stopping on their own in every mode) share the job's start-up (four TensorFlow imports, MPI, the engine)
instead of paying it once each.
Prints OK rank=R.
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402

import hetsync  # noqa: E402
import horovod_keras_mnist as example  # noqa: E402


def main():
    hvd.init()
    hetsync.init()
    cases = json.loads(sys.argv[1])
    for i, (out, argv) in enumerate(cases, 1):
        began = time.monotonic()
        if hvd.rank() == 0:
            print(f"[{i}/{len(cases)}] {' '.join(argv)}", flush=True)
        example.train(example.parse(argv + ["--summary-dir", out]))
        if hvd.rank() == 0:
            print(f"[{i}/{len(cases)}] {time.monotonic() - began:.1f} s", flush=True)
    hetsync.shutdown()
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()

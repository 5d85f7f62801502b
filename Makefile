# hetsync: `make test` and `make demo` set everything up on a fresh Debian machine (scripts/install.sh is
# idempotent: a second run only checks) and then run the test suite or the main job.
VENV   := .venv
PY     := $(VENV)/bin/python
# Open MPI as root, oversubscribed on a small machine; ranks yield the CPU while they wait.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OMPI_MCA_mpi_yield_when_idle := 1
export OMPI_MCA_btl_vader_single_copy_mechanism := none
export TF_CPP_MIN_LOG_LEVEL := 2
export PYTHONUNBUFFERED := 1

.PHONY: install build test test-full test-cluster demo bench bench-quota bench-rules bench-cluster clean

install:
	bash scripts/install.sh

build:
	$(MAKE) -C tf_ops PYTHON=$(abspath $(PY))

# `make test`: the suite CI runs (docs/testing.md: its time); `make test-full` adds the long variants marked `full`
# (every ordered pair of modes switched, 181 switches).  -ra: every skip and xfail is listed with its reason.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -ra --durations=40

test: install
	$(PYTEST) -m "not full" tests

test-full: install
	$(PYTEST) tests

# tests/test_cluster.py alone on scripts/cluster.sh's emulated cluster (root): the 2-host job (part of `test` too)
# and the killed host (part of `test-full`).
test-cluster: install
	$(PY) -m pytest -q -p no:cacheprovider tests/test_cluster.py

demo: install
	$(PY) examples/benchmark.py --preset demo --out results/demo

# `make bench`: every scenario of benchmarks/run.py first -- per-rank CPU quotas, 2 emulated hosts, the
# sleep-emulated slow GPU (root) -- every mode against plain Horovod, 3 runs each, stored under
# benchmarks/results/<date>/ and turned into the README's tables; then the sleep-emulated Ripples grid (not stored).
# `make bench-quota` is the first part alone; `make bench-rules` compares, in the slow-node scenario and the
# sleep-emulated slow GPU, each option whose default departs from its paper (declared with the option:
# Option.paper_rule) with the paper's own rule (docs/paper-fidelity.md), same repeat.  New runs take repeat numbers
# past the stored ones (benchmarks/run.py --first-repeat).
bench: bench-quota bench-rules
	$(PY) examples/benchmark.py --preset full --out results/bench

bench-quota: install
	$(PY) benchmarks/run.py --scenarios all
	$(PY) benchmarks/tables.py

bench-rules: install
	$(PY) benchmarks/run.py --scenarios slow-node,slow-gpu --modes horovod --paper-rules
	$(PY) benchmarks/tables.py

# Every part of examples/bench_cluster.py on the emulated cluster (root); not stored (docs/cluster.md).
bench-cluster: install
	$(PY) examples/bench_cluster.py --out results/cluster

clean:
	rm -rf tf_ops/build hetsync/_lib/*.so results

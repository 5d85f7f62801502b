#!/usr/bin/env bash
# Idempotent set-up for hetsync on a fresh Debian 12 machine (what `make demo` and `make test` run first).
# Each step says what it does and is skipped when its result is already there:
#   1. Debian Open MPI 4.1.4 (openmpi-bin, libopenmpi-dev) through apt, when mpicxx is missing.
#   2. A Python 3.11 virtual environment in .venv with the pinned packages of requirements/: runtime.txt (TensorFlow
#      and what hetsync and Horovod need), build.txt (what building hetsync needs), test.txt (the suite's tools).
#   3. Horovod 0.28.1 built from source against that TensorFlow, with MPI + Gloo, no PyTorch/MXNet.  The built wheel
#      is kept in $HETSYNC_WHEEL_CACHE (default ~/.cache/hetsync/wheels), keyed by the Horovod, TensorFlow, Python
#      and Open MPI versions: the next fresh clone on this machine installs it instead of building again (2-4 min).
#   4. hetsync itself, editable, the way a user installs it into an existing environment (pip, no build
#      isolation): compiles tf_ops/ into hetsync/_lib/hetsync_ops.so, generates the gRPC code.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3.11}
VENV="$ROOT/.venv"
HOROVOD_VERSION=0.28.1

say() { echo "[install] $*"; }

if ! command -v mpicxx >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
  say "installing Debian Open MPI (openmpi-bin libopenmpi-dev)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
else
  say "Open MPI present: $(mpirun --version 2>/dev/null | head -n1)"
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

PINS=$(cat requirements/runtime.txt requirements/build.txt requirements/test.txt)
if [ "$PINS" != "$(cat "$VENV/.requirements.installed" 2>/dev/null)" ]; then
  say "installing pinned Python packages (requirements/runtime.txt, build.txt, test.txt)"
  "$VPY" -m pip install -q --upgrade pip==24.3.1
  # The three files pin the whole closure, so two pip processes can unpack disjoint halves at once (--no-deps): the
  # two biggest wheels beside all the others, one core each (~35 s -> ~22 s here).  A plain install of the same
  # files then resolves the dependencies and adds whatever a pin list missed.  pip byte-compiles on one core
  # (TensorFlow: ~45 s here): --no-compile, and compileall does it below with every core.
  ALL_PINS=$(grep -hvE '^(#|$)' requirements/runtime.txt requirements/build.txt requirements/test.txt)
  BIG='^(tensorflow-cpu|scipy)=='
  # shellcheck disable=SC2046  # one argument per pin line
  "$VPY" -m pip install -q --no-compile --no-deps $(grep -E "$BIG" <<<"$ALL_PINS") & BIG_PID=$!
  # shellcheck disable=SC2046
  "$VPY" -m pip install -q --no-compile --no-deps $(grep -vE "$BIG" <<<"$ALL_PINS")
  wait "$BIG_PID"
  "$VPY" -m pip install -q --no-compile -r requirements/runtime.txt -r requirements/build.txt -r requirements/test.txt
  say "byte-compiling the environment's packages (every core; not the packages' own test suites, which nothing imports)"
  "$VPY" -m compileall -q -j0 -x '/tests?/' \
    "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
  echo "$PINS" > "$VENV/.requirements.installed"
else
  say "pinned Python packages already installed"
fi

if ! "$VPY" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null \
   || ! "$VPY" -c "import horovod.tensorflow as h; assert h.mpi_built()" 2>/dev/null; then
  TF_VERSION=$("$VPY" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null)
  PY_TAG=$("$VPY" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
  OMPI_VERSION=$(mpirun --version 2>/dev/null | head -n1 | awk '{print $NF}')
  WHEELS="${HETSYNC_WHEEL_CACHE:-$HOME/.cache/hetsync/wheels}/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-ompi$OMPI_VERSION"
  if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION from source (MPI + Gloo + TensorFlow; about 2-4 minutes) into $WHEELS"
    # The PyPI cmake 4.x cannot read Horovod's CMake files: use the system cmake 3.25.
    if ! command -v cmake >/dev/null 2>&1; then
      SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake >/dev/null
    fi
    rm -rf "$WHEELS.tmp" && mkdir -p "$WHEELS.tmp"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j2" \
      "$VPY" -m pip wheel -q --no-build-isolation --no-cache-dir --no-deps -w "$WHEELS.tmp" "horovod==$HOROVOD_VERSION"
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"  # only a complete build becomes the cache
  else
    say "installing Horovod $HOROVOD_VERSION from the wheel built earlier on this machine ($WHEELS)"
  fi
  "$VPY" -m pip install -q --no-deps "$WHEELS"/horovod-*.whl
  "$VPY" -m pip install -q "horovod==$HOROVOD_VERSION"  # its Python dependencies (pinned in requirements/runtime.txt)
else
  say "Horovod $HOROVOD_VERSION with MPI already built"
fi

say "building hetsync (tf_ops C++ library, gRPC code) in editable mode"
"$VPY" -m pip install -q --no-build-isolation --no-deps -e .
"$VPY" -c "import hetsync.ops" && say "hetsync ready: $VPY"

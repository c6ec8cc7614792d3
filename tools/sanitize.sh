#!/usr/bin/env bash
# Build emfast's compiled core with AddressSanitizer and UndefinedBehaviorSanitizer in a scratch copy, and run the
# kernel tests against that build. Any out-of-bounds access, use after free or undefined behaviour in csrc/ stops
# the run with a report. Needs gcc (or clang) with libasan and libubsan; nothing outside the scratch folder changes.
#
#     tools/sanitize.sh                 # the kernel tests
#     tools/sanitize.sh tests/test_x.py # other tests
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$repo/src" "$repo/csrc" "$repo/tests" "$repo/setup.py" "$repo/pyproject.toml" "$repo/README.md" "$work/"
cd "$work"
python3 -m venv --system-site-packages venv
venv/bin/python -m pip install -q "setuptools>=77" "Cython>=3.0" "numpy>=2.0"
EMFAST_SANITIZE=1 venv/bin/python setup.py -q build_ext --inplace
asan=$(${CC:-gcc} -print-file-name=libasan.so)
# Python itself is not built with ASan: preload the runtime, and leave leak checks to the interpreter-free tests.
export LD_PRELOAD="$asan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH="$work/src"
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_kernels.py tests/test_targets.py tests/test_warp.py tests/test_intensity.py
                                 tests/test_sampling.py tests/test_defects.py tests/test_chunkcache.py)
venv/bin/python -c "import emfast._core.gather as k; assert '$work' in k.__file__, k.__file__"
venv/bin/python -m pytest -q -p no:cacheprovider -p no:randomly --rootdir="$work" "${tests[@]}"

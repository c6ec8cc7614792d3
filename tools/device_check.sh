#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, as one run on a lent machine (Python 3.12, CUDA, torch, no network):
# install pycuda and the pure-Python packages the tests need from .whl/ (wheels made on a machine with network,
# see benchmarks/README.md), build emfast's core (unless .whl/_core holds it, built for that Python), run the GPU
# tests and the GPU benchmarks. Reports go to $OUT. STEPS picks some of: tests transfer lifetime predict switch
# profile trace (default the first four; switch: predict with a 0.5 ms GIL switch interval; profile: a py-spy
# record of one predict, the row named by PROFILE_ROW, default cuda_graphs, if py-spy was carried; trace: a
# torch.profiler trace of one predict with cuda_graphs, tools/profile_predict_cuda.py).
set -u
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
root=$PWD
STEPS=${STEPS:-tests transfer lifetime predict}
stamp() { echo "== $1 at ${SECONDS} s"; }
step() { [[ " $STEPS " == *" $1 "* ]] && stamp "$1"; }

stamp install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root/src
probe='import pycuda.driver as d; d.init(); print("pycuda", d.get_version(), d.Device(0).name())'
if ! python3 -c "$probe"; then  # the wheel was built elsewhere: build pycuda here from its sdist
    stamp "pycuda from source"
    rm -rf /tmp/site/pycuda* && mkdir -p /tmp/pycuda &&
        tar xzf .whl/pycuda-*.tar.gz -C /tmp/pycuda --strip-components 1
    (cd /tmp/pycuda && python3 configure.py --cuda-root=/usr/local/cuda --no-cuda-enable-curand > /dev/null &&
        python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site . > /tmp/pycuda.log 2>&1) ||
        { tail -30 /tmp/pycuda.log; exit 1; }
    python3 -c "$probe" || exit 1
fi

stamp build
cp .whl/_core/*.so src/emfast/_core/ 2>/dev/null  # the core built for this Python elsewhere, if it was carried
modules=$(cd src/emfast/_core && ls *.pyx | sed 's/\.pyx$//; s/^/emfast._core./' | paste -sd,)
python3 -c "import importlib; [importlib.import_module(m) for m in '$modules'.split(',')]" 2>/dev/null ||
    EMFAST_BUILD_JOBS=$(nproc) python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 ||
    { tail -30 /tmp/build.log; exit 1; }

step tests && python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu.py tests/test_predict_device.py \
    tests/test_transfer.py tests/test_lifetime.py 2>&1 | tee "$OUT/tests.txt" | tail -25

step transfer && { python3 benchmarks/gpu_transfer.py --seconds 5 --json "$OUT/gpu-transfer.json" \
    > "$OUT/gpu-transfer.txt" 2>&1; tail -12 "$OUT/gpu-transfer.txt"; }

step lifetime && python3 benchmarks/lifetime.py --rounds 3 --batches 200 --json "$OUT/lifetime.json" 2>&1 |
    tee "$OUT/lifetime.txt"

step predict && python3 benchmarks/predict_cuda.py --json "$OUT/predict-cuda.json" 2>&1 |
    tee "$OUT/predict-cuda.txt"
step switch && python3 benchmarks/predict_cuda.py --switch-interval 0.0005 --json "$OUT/predict-cuda-switch.json" \
    2>&1 | tee "$OUT/predict-cuda-switch.txt"
step profile && /tmp/site/bin/py-spy record --idle --threads -r 100 -f raw -o "$OUT/predict-cuda-profile.txt" -- \
    python3 benchmarks/predict_cuda.py --rounds 1 --only "${PROFILE_ROW:-cuda_graphs}" | tail -6
step trace && { python3 tools/profile_predict_cuda.py > "$OUT/trace.txt" 2>&1; tail -30 "$OUT/trace.txt"; }
stamp done

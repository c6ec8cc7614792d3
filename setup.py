"""Build the compiled core: C++ kernels in csrc/ behind thin Cython wrappers in src/emfast/_core/.

All compiler settings live here, in one place.
"""
import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
    "embedsignature": True,
}

if sys.platform == "win32":
    COMPILE_ARGS = ["/O2", "/std:c++17", "/fp:precise"]
else:
    # -ffp-contract=off: no fused multiply-add, so x * scale + shift rounds exactly as NumPy does.
    COMPILE_ARGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-strict-aliasing"]


# EMFAST_SANITIZE=1 (tools/sanitize.sh): AddressSanitizer and UBSan, for checking the kernels, never for wheels.
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"] \
    if os.environ.get("EMFAST_SANITIZE") == "1" else []


def extension(name, sources, depends=()):
    """One module of the compiled core: a Cython wrapper plus its C++ kernels, all built with the settings above."""
    return Extension(
        f"emfast._core.{name}",
        sources=[f"src/emfast/_core/{name}.pyx"] + [f"csrc/{source}" for source in sources],
        include_dirs=["csrc", np.get_include()],
        depends=["csrc/common.h", "src/emfast/_core/common.pxd"] + [f"csrc/{header}" for header in depends],
        language="c++",
        extra_compile_args=COMPILE_ARGS + SANITIZE,
        extra_link_args=SANITIZE,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
    )


EXTENSIONS = [
    extension("common", []),
    extension("gather", ["gather.cpp"], ["gather.h", "half.h"]),
    extension("random", ["philox.cpp"], ["philox.h"]),
    extension("targets", ["targets.cpp", "lsd.cpp", "grow.cpp"], ["targets.h", "lsd.h", "grow.h", "vector.h"]),
    extension("intensity", ["intensity.cpp", "philox.cpp"], ["intensity.h", "half.h", "philox.h"]),
    extension("warp", ["warp.cpp", "gather.cpp"], ["warp.h", "gather.h", "half.h", "vector.h"]),
    extension("sampling", ["sampling.cpp"], ["sampling.h"]),
    extension("blend", ["blend.cpp"], ["blend.h", "half.h", "vector.h"]),
    extension("rescale", ["rescale.cpp"], ["rescale.h", "half.h"]),
    extension("files", ["files.cpp", "zstd.cpp", "blosc.cpp", "deflate.cpp", "cseg.cpp"],
              ["files.h", "zstd.h", "blosc.h", "deflate.h", "kept_context.h", "cseg.h"]),
]

# The modules are independent: Cython translates them and the compiler builds them on every core at once
# (a first `pip install .` took 2.5 minutes on 2 cores one module after another). EMFAST_BUILD_JOBS overrides.
JOBS = int(os.environ.get("EMFAST_BUILD_JOBS", os.cpu_count() or 1))

# include_path: the wrappers cimport emfast._core.common from src/.
setup(ext_modules=cythonize(EXTENSIONS, compiler_directives=CYTHON_DIRECTIVES, include_path=["src"], nthreads=JOBS),
      options={"build_ext": {"parallel": JOBS}})

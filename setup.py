"""Build the compiled core: C++ kernels in csrc/ behind thin Cython wrappers in src/emfast/.

All compiler settings live here, in one place.
"""
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

kernels = Extension(
    "emfast._kernels",
    sources=["src/emfast/_kernels.pyx", "csrc/gather.cpp", "csrc/philox.cpp"],
    include_dirs=["csrc", np.get_include()],
    depends=["csrc/gather.h", "csrc/philox.h"],
    language="c++",
    extra_compile_args=COMPILE_ARGS,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
)

targets = Extension(
    "emfast._targets",
    sources=["src/emfast/_targets.pyx", "csrc/targets.cpp"],
    include_dirs=["csrc", np.get_include()],
    depends=["csrc/targets.h", "csrc/gather.h"],
    language="c++",
    extra_compile_args=COMPILE_ARGS,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
)

setup(ext_modules=cythonize([kernels, targets], compiler_directives=CYTHON_DIRECTIVES))

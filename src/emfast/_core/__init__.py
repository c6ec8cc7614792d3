"""The compiled core: thin Cython wrappers (this folder) over the C++ kernels in ``csrc/``. ``common.pxd`` and
``csrc/common.h`` declare what every wrapper and kernel shares (element types, status codes, argument checks);
``gather``, ``warp``, ``intensity``, ``targets``, ``sampling``, ``random``, ``blend`` and ``rescale`` (fields at
other voxel sizes onto raw's grid) wrap one kernel family each. Each wrapper checks its arguments and calls its
kernel once per batch with the GIL released. Each compiled module has a typed stub beside it (``name.pyi``) for
editors and type checkers; ``tests/test_stubs.py`` holds it to the module's real signatures.

May import: nothing else of emfast.
"""

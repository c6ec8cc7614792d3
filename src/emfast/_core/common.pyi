# Stub of the compiled module emfast._core.common (common.pyx): the dtype sets every wrapper shares.
from typing import Tuple

import numpy as np

RAW_DTYPES: Tuple[np.dtype, ...]
FLOAT_DTYPES: Tuple[np.dtype, ...]
LABEL_DTYPES: Tuple[np.dtype, ...]
MAX_KERNEL_REACH: int

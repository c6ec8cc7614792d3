"""``emfast bench``: emfast against a NumPy reference (``_reference``), a PyTorch DataLoader and the memory-copy
floor on the standard task, with the report, the JSON record and the plot (``_bench``).

May import: everything but ``emfast.cli``.
"""
from ._bench import (QUICK, SCHEMA, TARGET_FLOOR_RATIO, Settings, add_arguments, command, machine_info, plot,
                     rss_bytes, run, settings)

__all__ = ["QUICK", "SCHEMA", "TARGET_FLOOR_RATIO", "Settings", "add_arguments", "command", "machine_info", "plot",
           "rss_bytes", "run", "settings"]

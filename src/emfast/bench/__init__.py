"""``emfast bench``: emfast against a NumPy reference (``_reference``), a PyTorch DataLoader and the memory-copy
floor on the standard task. One module per responsibility: ``_settings`` (what a run measures, checked),
``_host`` (the machine, memory, leftovers), ``_pipelines`` (the timed pipelines), ``_runs`` (the comparison, the
curves, :func:`run`), ``_record`` (every measurement kept as it is taken), ``_report`` (the text report and the
plot), ``_command`` (the command line).

May import: everything but ``emfast.cli``.
"""
from ._command import add_arguments, command
from ._host import machine_info, rss_bytes
from ._report import plot
from ._runs import run
from ._settings import QUICK, SCHEMA, TARGET_FLOOR_RATIO, Settings, settings

__all__ = ["QUICK", "SCHEMA", "TARGET_FLOOR_RATIO", "Settings", "add_arguments", "command", "machine_info", "plot",
           "rss_bytes", "run", "settings"]

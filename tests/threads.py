"""emfast's own threads, as the tests see them: every one is named ``emfast-...``."""
import threading
import time


def emfast_threads():
    """Names of the emfast threads alive now."""
    return [t.name for t in threading.enumerate() if t.name.startswith("emfast-")]


def threads_end(seconds=10):
    """Whether every emfast thread has ended within ``seconds`` (a loader stopped by its finalizer ends them on a
    thread of its own, shortly after)."""
    deadline = time.time() + seconds
    while emfast_threads() and time.time() < deadline:
        time.sleep(0.01)
    return not emfast_threads()

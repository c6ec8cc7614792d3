"""emfast's own threads, as the tests see them: every one is named ``emfast-...``."""
import threading
import time

from emfast.io._decode import HELPER_IDLE_SECONDS

#: The decode helpers' names: they end HELPER_IDLE_SECONDS after their last task, not with the read itself.
DECODE_HELPER = "emfast-decode-"


def emfast_threads():
    """Names of the emfast threads alive now, once idle decode helpers have had their idle time (and a second
    more) to end: a helper alive after that is listed like any other thread."""
    deadline = time.time() + HELPER_IDLE_SECONDS + 1.0
    while time.time() < deadline and any(t.name.startswith(DECODE_HELPER) for t in threading.enumerate()):
        time.sleep(0.005)
    return [t.name for t in threading.enumerate() if t.name.startswith("emfast-")]


def threads_end(seconds=10):
    """Whether every emfast thread has ended within ``seconds`` (a loader stopped by its finalizer ends them on a
    thread of its own, shortly after)."""
    deadline = time.time() + seconds
    while emfast_threads() and time.time() < deadline:
        time.sleep(0.01)
    return not emfast_threads()


def errors_on_threads(work, count):
    """Run ``work(n)`` for n < ``count`` on as many threads at once; the exceptions they raised (to assert on in
    the test's own thread, where pytest sees them)."""
    errors = []

    def run(n):
        try:
            work(n)
        except BaseException as error:  # noqa: BLE001 - returned to the test
            errors.append(error)
    workers = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


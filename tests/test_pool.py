"""SlotPool on its own: the interleavings a loader cannot easily force (close against give-back, interrupts in a
give-back, failing frees)."""
import contextlib
import sys
import threading

import pytest

from emfast.pipeline._pool import SlotPool
from emfast.pipeline._ring import RingClosed


class Memory:
    """Records where and how it was freed."""

    made = 0

    def __init__(self):
        Memory.made += 1
        self.number = Memory.made
        self.freed_on = None


def make_pool(capacity=3, on_give_back=None, fail_free=lambda memory: False):
    local = threading.local()

    def free(memory):
        if fail_free(memory):
            raise RuntimeError("free failed")
        memory.freed_on = (threading.current_thread().name, getattr(local, "active", False))

    @contextlib.contextmanager
    def activate():
        local.active = True
        try:
            yield
        finally:
            local.active = False

    return SlotPool(Memory, free, capacity, on_give_back, activate)


def test_slots_come_back_when_the_lease_dies_and_are_reused():
    pool = make_pool()
    first = pool.acquire(0)
    lease = pool.lease(first)
    assert pool.acquire(1) is not first  # still lent out: a second slot
    del lease
    assert pool.acquire(2) is first and pool.allocations == 2


def test_a_slot_given_back_after_close_is_freed_there_inside_activate():
    pool = make_pool()
    slot = pool.acquire(0)
    lease = pool.lease(slot)
    other = pool.acquire(1)
    memory, other_memory = slot.memory, other.memory
    pool.close()
    assert other_memory.freed_on == (threading.current_thread().name, False)  # the owner, directly
    assert memory.freed_on is None and pool.live == 1
    holder = [lease]
    del lease

    def drop():
        holder.clear()

    thread = threading.Thread(target=drop, name="consumer")
    thread.start()
    thread.join()
    assert memory.freed_on == ("consumer", True) and pool.live == 0
    with pytest.raises(RingClosed) as closed:
        pool.acquire(2)
    import pickle  # an error a worker process may hand back: its message is not an argument
    assert str(pickle.loads(pickle.dumps(closed.value))) == "the loader was closed"


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_give_back_interrupted_in_its_hook_still_returns_the_slot(error, monkeypatch):
    def hook(memory):
        raise error("interrupted while noting the stream")

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: unraisable.append(report.exc_type))
    pool = make_pool(capacity=1, on_give_back=hook)
    slot = pool.acquire(0)
    lease = pool.lease(slot)
    del lease  # the finalizer's exception is only reported, as Python does for every finalizer
    assert unraisable == [error]
    assert pool.acquire(1) is slot  # not lost: with capacity 1 a lost slot would block here forever


def test_close_frees_every_slot_even_if_one_free_fails():
    failing = []
    pool = make_pool(fail_free=lambda memory: memory in failing)
    slots = [pool.acquire(n) for n in range(3)]
    memories = [slot.memory for slot in slots]
    failing.append(memories[0])
    with pytest.raises(RuntimeError, match="free failed"):
        pool.close()
    assert all(memory.freed_on is not None for memory in memories[1:]) and pool.live == 0

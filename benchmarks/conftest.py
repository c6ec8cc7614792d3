"""Fixtures of the pytest-benchmark suite: the standard workload, built once per session."""
from __future__ import annotations

import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # _workload.py sits next to this file

from _workload import Workload  # noqa: E402


@pytest.fixture(scope="session")
def workload() -> Workload:
    """(96, 384, 384) uint8 raw + uint64 labels in memory and 16 fixed plans of 8 x (32, 128, 128)."""
    return Workload.create()


@pytest.fixture
def next_plan(workload):
    """A callable returning the fixed plans in turn (a fresh cycle per benchmark, so every row replays them)."""
    plans = itertools.cycle(workload.plans)
    return lambda: next(plans)

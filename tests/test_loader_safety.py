"""The loader refuses sizes that cannot fit, never hands one batch to two consumers, and leaves no thread behind
when its start is interrupted."""
import os
import random
import signal
import textwrap
import threading
import time

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast._machine import available_bytes
from emfast.cli import main
from emfast.pipeline import InsufficientMemoryError
from threads import emfast_threads, threads_end

PATCH = (4, 16, 16)


@pytest.fixture
def raw():
    return np.random.default_rng(0).integers(0, 256, (12, 48, 48), dtype=np.uint8)


def _gib(nbytes):
    return f"{nbytes / 2**30:,.2f} GiB"


# -- sizes ------------------------------------------------------------------------------------------------------


def test_a_batch_size_whose_bytes_overflow_int64_is_refused_with_the_exact_numbers(raw):
    batch_size = 2**62
    slot = batch_size * 4 * 16 * 16 * 4  # float32 raw: 2**76 bytes, beyond int64
    with pytest.raises(InsufficientMemoryError) as caught:
        ef.Loader(raw, patch=PATCH, batch_size=batch_size, threads=1, buffers=2)
    message = str(caught.value)
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, ValueError)
    assert f"the loader needs {_gib(3 * slot)} but only" in message, message
    assert f"3 batch slots (buffers=2, plus one per producer thread) of {_gib(slot)} each" in message
    assert f"batch_size={batch_size} x patch_in {PATCH}" in message


def test_sizes_beyond_available_memory_are_refused_and_those_within_accepted(raw):
    available = available_bytes()
    if available is None:
        pytest.skip("this system does not report available memory (/proc/meminfo MemAvailable)")
    example = 4 * 16 * 16 * 4
    too_many = 2 * available // example  # two slots of this alone exceed what is available
    with pytest.raises(MemoryError, match=f"batch_size={too_many} x patch_in"):
        ef.Loader(raw, patch=PATCH, batch_size=too_many)
    assert ef.Loader(raw, patch=PATCH, batch_size=64).slot_bytes == 64 * example


def test_lazy_fields_count_each_threads_scratch(tmp_path, raw):
    path = tmp_path / "raw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=raw, chunks=(4, 16, 16))
    volume = ef.hdf5(path, "raw", in_memory=False)
    loader = ef.Loader(volume, patch=PATCH, batch_size=8, threads=3)
    assert loader._gatherer.scratch_bytes() == 8 * 4 * 16 * 16  # one uint8 read buffer per example
    volume.close()


def _config(folder, batch_size):
    with h5py.File(folder / "a.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((12, 48, 48), np.uint8))
    path = folder / "train.yaml"
    path.write_text(textwrap.dedent(f"""\
        data:
          samples:
            - {{file: a.h5, raw: raw}}
        loader: {{patch: [4, 16, 16], batch_size: {batch_size}}}
        """))
    return path


@pytest.mark.parametrize("batch_size", [2**62, 2**40])
def test_check_refuses_a_huge_batch_size_with_exit_2_and_one_line(tmp_path, capsys, batch_size):
    assert main(["check", str(_config(tmp_path, batch_size))]) == 2
    captured = capsys.readouterr()
    assert "valid" not in captured.out
    error = captured.err.strip()
    assert f"batch_size={batch_size} x patch_in" in error and "of memory is available" in error, error


def test_demo_refuses_a_huge_batch_size_with_exit_2(tmp_path, capsys):
    arguments = ["demo", "--batch-size", str(2**40), "--volume-shape", "8", "40", "40", "--patch", "4", "16", "16",
                 "--batches", "1", "--threads", "1", "--cache-dir", str(tmp_path)]
    assert main(arguments) == 2
    assert f"batch_size={2**40} x patch_in" in capsys.readouterr().err

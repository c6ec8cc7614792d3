# cython: language_level=3
"""Philox4x64-10 counter-based draws (csrc/philox.h), identical to NumPy's ``Philox``; the loader's random streams
(emfast.pipeline._rng) come from here."""
from libc.stdint cimport int64_t, uint64_t

import numpy as np


cdef extern from "philox.h" nogil:
    void emf_philox4x64(const uint64_t *key, const uint64_t *counter, uint64_t *out)
    void emf_uniform_batch(const uint64_t *key, uint64_t batch, uint64_t stream_word, int64_t examples,
                           int64_t draws, double *out)


def philox4x64(key, counter):
    """One Philox4x64-10 block: four uint64 from a 2-word key and a 4-word counter (for testing)."""
    cdef uint64_t c_key[2]
    cdef uint64_t c_counter[4]
    cdef uint64_t c_out[4]
    for i in range(2):
        c_key[i] = key[i]
    for i in range(4):
        c_counter[i] = counter[i]
    emf_philox4x64(c_key, c_counter, c_out)
    return np.array([c_out[0], c_out[1], c_out[2], c_out[3]], dtype=np.uint64)


def uniform_batch(uint64_t key0, uint64_t key1, uint64_t batch, uint64_t stream_word, Py_ssize_t examples,
                  Py_ssize_t draws):
    """Uniform doubles in [0, 1) of shape (examples, draws); see ``emf_uniform_batch`` in csrc/philox.h."""
    if examples < 0 or draws < 0:
        raise ValueError("examples and draws must be >= 0")
    result = np.empty((examples, draws), dtype=np.float64)
    cdef double[:, ::1] view = result
    cdef uint64_t c_key[2]
    c_key[0] = key0
    c_key[1] = key1
    if examples and draws:
        with nogil:
            emf_uniform_batch(c_key, batch, stream_word, examples, draws, &view[0, 0])
    return result

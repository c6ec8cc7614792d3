"""The compiled batch file reader (emfast._core.files through emfast.io._filebatch): every file, range and kind of
path read as Python's own file reads read it, FIFOs and directories refused without blocking, buffers reused."""
import errno
import os
import threading

import h5py
import numpy as np
import pytest

from emfast._core import files as compiled
from emfast.io import _filebatch, _hdf5files
from emfast.io._filebatch import FileBuffer, lent_buffer, read_regular_files


def random_files(directory, count, rng):
    paths = []
    for n in range(count):
        path = directory / f"f{n}"
        path.write_bytes(rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes())
        paths.append(path)
    return paths


def test_whole_files_and_ranges_read_as_python_reads_them(tmp_path):
    rng = np.random.default_rng(0)
    paths = random_files(tmp_path, 40, rng)
    sizes = [p.stat().st_size for p in paths]
    starts = [int(rng.integers(-s - 10, s + 10)) for s in sizes]  # negative: from the end; some past either end
    lengths = [int(rng.integers(-1, 3000)) for _ in sizes]
    contents, versions = read_regular_files(paths, "a test file", starts, lengths)
    for path, start, length, got, version in zip(paths, starts, lengths, contents, versions):
        data = path.read_bytes()
        first = max(len(data) + start, 0) if start < 0 else start
        expected = data[first:] if length < 0 else data[first:first + length]
        assert bytes(got) == expected, (path, start, length)
        status = os.stat(path)
        assert version == (status.st_size, status.st_mtime_ns)
    whole, _ = read_regular_files(paths, "a test file")
    assert [bytes(c) for c in whole] == [p.read_bytes() for p in paths]


def test_files_of_exactly_the_size_of_their_destination_are_read_into_it(tmp_path):
    (tmp_path / "a").write_bytes(bytes(range(16)))
    (tmp_path / "b").write_bytes(bytes(range(15)))  # one byte short of its destination: read into the buffer
    into = [np.zeros((2, 8), np.uint8), np.zeros(16, np.uint8)]
    contents, _ = read_regular_files([tmp_path / "a", tmp_path / "b"], "a test file", into=into)
    assert contents[0] is True and into[0].tobytes() == bytes(range(16))
    assert bytes(contents[1]) == bytes(range(15)) and not into[1].any()
    with pytest.raises(TypeError, match=r"into\[0\] must be a writeable C-contiguous NumPy array"):
        read_regular_files([tmp_path / "a"], "a test file", into=[np.zeros((4, 8), np.uint8)[:, ::2]])


def test_missing_files_are_none_and_other_kinds_are_refused_without_blocking(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "directory").mkdir()
    contents, versions = read_regular_files([tmp_path / "none", tmp_path / "file" / "below"], "a zarr chunk")
    assert contents == [None, None] and versions == [(0, 0), (0, 0)]
    with pytest.raises(IsADirectoryError, match=r"directory is a directory, not a regular file: a zarr chunk must"):
        read_regular_files([tmp_path / "file", tmp_path / "directory"], "a zarr chunk")
    if not hasattr(os, "mkfifo"):
        return
    os.mkfifo(tmp_path / "fifo")  # nobody writes to it: opening it to read without O_NONBLOCK would block
    reader = threading.Thread(target=lambda: pytest.raises(OSError, read_regular_files, [tmp_path / "fifo"], "x"))
    reader.start()
    reader.join(10)
    assert not reader.is_alive()
    with pytest.raises(OSError, match=r"fifo is a FIFO \(named pipe\), not a regular file: a zarr chunk must be"):
        read_regular_files([tmp_path / "fifo"], "a zarr chunk")


def test_an_unreadable_file_names_itself_and_the_reason(tmp_path):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root reads files without read permission")
    (tmp_path / "locked").write_bytes(b"secret")
    (tmp_path / "locked").chmod(0)
    with pytest.raises(PermissionError, match=r"cannot read a zarr chunk: Permission denied") as raised:
        read_regular_files([tmp_path / "locked"], "a zarr chunk")
    assert raised.value.filename == str(tmp_path / "locked") and raised.value.errno == errno.EACCES


def test_a_lent_buffer_is_its_own_memory_map_reused_while_the_reads_fit(tmp_path):
    """Reads go to the buffer's memory map, which stays the buffer's; files that do not fit go to new memory of
    their own and leave the buffer as it was. A buffer taken from malloc by each reader thread stayed in that
    thread's arena once freed (a lazy loader over 64 KiB zstd chunks: 14-22 MiB beside a 32 MiB cache)."""
    import mmap
    (tmp_path / "small").write_bytes(b"a" * 100)
    (tmp_path / "large").write_bytes(b"b" * 5000)
    buffer = FileBuffer()
    kept = buffer.array
    assert isinstance(kept.base.obj, mmap.mmap) and kept.nbytes == _filebatch.KEPT_BUFFER_BYTES
    for name, size in [("large", 5000), ("small", 100)]:
        contents, _ = read_regular_files([tmp_path / name], "x", buffer=buffer)
        assert bytes(contents[0]) == {"large": b"b", "small": b"a"}[name] * size and buffer.array is kept
        assert np.shares_memory(np.frombuffer(contents[0], np.uint8), kept)
    (tmp_path / "huge").write_bytes(b"c" * (_filebatch.KEPT_BUFFER_BYTES + 1))
    contents, _ = read_regular_files([tmp_path / "huge", tmp_path / "small"], "x", buffer=buffer)
    assert [len(c) for c in contents] == [_filebatch.KEPT_BUFFER_BYTES + 1, 100] and buffer.array is kept
    assert not np.shares_memory(np.frombuffer(contents[0], np.uint8), kept)
    with lent_buffer() as first, lent_buffer() as second:
        assert first is not second  # two reads in flight never share a buffer


def test_more_files_than_one_call_holds_open_are_read_in_parts_each_into_its_own_memory(tmp_path):
    rng = np.random.default_rng(3)
    count = 2 * _filebatch.FILES_PER_CALL + 17
    paths = random_files(tmp_path, count, rng)
    sizes = [p.stat().st_size for p in paths]
    starts = [int(rng.integers(-s - 10, s + 10)) for s in sizes]
    lengths = [int(rng.integers(-1, 3000)) for _ in sizes]
    into = [np.empty(s, np.uint8) if n % 3 == 0 else None for n, s in enumerate(sizes)]
    with lent_buffer() as buffer:
        contents, versions = read_regular_files(paths, "a test file", starts, lengths, into, buffer)
        for n, (path, start, length, got) in enumerate(zip(paths, starts, lengths, contents)):
            data = path.read_bytes()
            first = max(len(data) + start, 0) if start < 0 else start
            expected = data[first:] if length < 0 else data[first:first + length]
            if got is True:  # read into its destination: only where the whole file was asked for
                assert into[n] is not None and bytes(into[n]) == expected == data, n
            else:  # every part's views still hold their bytes: the parts did not share the lent buffer
                assert bytes(got) == expected, (n, start, length)
    assert versions == [(os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths]


_DESCRIPTOR_LIMITED = """
import os, resource, sys
import numpy as np, zarr
import emfast as ef
from emfast.io import _decode
store, spare, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
_decode._cores = _decode._idle_cores = lambda: cores  # a machine of that many idle cores: decode helpers side by side
data = zarr.open_array(store, mode="r")[...]
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    assert np.array_equal(ef.open(store)[...][0], data)
    for _ in range(10):
        lazy = ef.open(store, in_memory=False, cache_bytes=64 << 20)
        out = np.empty((1,) + data.shape, data.dtype)
        lazy.read_box((0, 0, 0), data.shape, out)
        assert np.array_equal(out[0], data)
        lazy.close()
    print("read")
except OSError as error:
    print("error:", error)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc/self/fd (Linux)")
def test_a_store_of_many_small_chunks_reads_within_a_low_descriptor_limit(tmp_path):
    """zarr-python reads a store of 512 chunk files under ``ulimit -n 256``; emfast opened every file of a batch
    of them at once and failed with EMFILE. Now a call holds at most FILES_PER_CALL open, and calls side by side
    (a review: decode helpers on 8 or 16 idle cores, each with its part of a batch) share a quarter of the limit;
    where even one call's files are too many, the error says that the limit ran out, and which it is."""
    import subprocess
    import sys
    zarr = pytest.importorskip("zarr")
    store = str(tmp_path / "small-chunks.zarr")
    zarr.create_array(store, shape=(8, 128, 256), chunks=(1, 16, 16), dtype="uint8", zarr_format=2)[...] = \
        np.random.default_rng(0).integers(0, 256, (8, 128, 256), dtype=np.uint8)
    script = tmp_path / "limited.py"
    script.write_text(_DESCRIPTOR_LIMITED)

    def run(spare, cores=1):
        done = subprocess.run([sys.executable, str(script), store, str(spare), str(cores)], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    for cores in (1, 8, 16):  # the chunk files (1024) are far more than the limit
        assert run(2 * _filebatch.FILES_PER_CALL + 40, cores) == "read", cores
    refused = run(3)
    assert refused.startswith("error:") and "small-chunks.zarr" in refused, refused
    assert "ulimit -n" in refused and "limit of" in refused, refused


_MANY_HDF5 = """
import os, resource, sys
import numpy as np
import emfast as ef
folder, count, spare = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
volumes, most = [], 0
try:
    for i in range(count):
        volumes.append(ef.open(os.path.join(folder, f"{i}.h5"), "raw", in_memory=False))
    for order in (range(count), reversed(range(count)), range(0, count, 7)):
        for i in order:
            assert (np.asarray(volumes[i]) == i).all(), i
            most = max(most, len(os.listdir("/proc/self/fd")))
    from emfast.io._hdf5files import most_open
    print("read", most - open_now, most_open())
except OSError as error:
    print(f"error after {len(volumes)}:", error)
"""


def _many_hdf5(tmp_path, count: int, spare: int) -> str:
    """What _MANY_HDF5 printed, over ``count`` small HDF5 files and ``spare`` descriptors above those open."""
    import subprocess
    import sys
    for i in range(count):
        with h5py.File(tmp_path / f"{i}.h5", "w") as f:
            f.create_dataset("raw", data=np.full((2, 4, 4), i, np.uint8), chunks=(1, 4, 4), compression="gzip")
    script = tmp_path / "many.py"
    script.write_text(_MANY_HDF5)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(count), str(spare)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc/self/fd (Linux)")
def test_lazy_hdf5_volumes_beyond_the_descriptor_limit_read_on(tmp_path):
    """A lazily read HDF5 volume held its file open while it lived: a training set of more cutouts than the
    descriptor limit failed (a review of 1500 cutouts under ``ulimit -n 256``). The files of the volumes read
    least recently are now closed beyond a quarter of the limit (at least FEWEST_OPEN) and opened again when read:
    120 volumes read correctly, in three orders, with 80 descriptors to spare."""
    printed = _many_hdf5(tmp_path, 120, 80)
    assert printed.startswith("read "), printed
    held, bound = map(int, printed.split()[1:])
    assert bound == (80 + len(os.listdir("/proc/self/fd"))) // 4 or bound < 40, printed  # a quarter of the limit
    assert held <= bound + 2, printed  # a file being reopened beside those held, and the script's listing


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc/self/fd (Linux)")
def test_lazy_hdf5_volumes_within_too_few_descriptors_say_so(tmp_path):
    """Where even the files held open (at least FEWEST_OPEN) exceed the limit, the error names it and what to
    do, not h5py's words alone ("Too many open files")."""
    refused = _many_hdf5(tmp_path, 40, _hdf5files.FEWEST_OPEN // 2)
    assert refused.startswith("error after") and ".h5 as an HDF5 file" in refused, refused
    assert "ulimit -n" in refused and "limit of" in refused and "in memory" in refused, refused


def test_no_descriptor_limit_bounds_nothing(monkeypatch):
    """RLIM_INFINITY (BSD, macOS) gave the tightest bound, one call at a time (a review)."""
    import resource
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert _filebatch._OpenFiles._most() > 1 << 20
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert _filebatch._OpenFiles._most() == 256


def test_where_the_compiled_reader_reads_nothing_python_reads_the_files(tmp_path, monkeypatch):
    """Windows builds report every file unsupported: the same contents come from Python's reads."""
    rng = np.random.default_rng(3)
    paths = random_files(tmp_path, 6, rng) + [tmp_path / "none"]
    expected, _ = read_regular_files(paths, "x", [0, 5, -7, 0, 2, 0, 0], [-1, 10, -1, 0, 3000, 7, -1])
    expected = [None if c is None else bytes(c) for c in expected]

    def unsupported(paths, starts, lengths, into, scratch):
        n = len(paths)
        return (np.empty(0, np.uint8), np.full(n, -1), np.zeros(n, np.int64),
                np.full(n, compiled.FILE_UNSUPPORTED, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32),
                np.zeros(n, np.int64), np.zeros(n, np.int64))
    monkeypatch.setattr(_filebatch, "read_files", unsupported)
    contents, _ = read_regular_files(paths, "x", [0, 5, -7, 0, 2, 0, 0], [-1, 10, -1, 0, 3000, 7, -1])
    assert [None if c is None else bytes(c) for c in contents] == expected


def test_the_compiled_reader_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"2 paths but 1 starts"):
        compiled.read_files([tmp_path / "a", tmp_path / "b"], [0])
    with pytest.raises(TypeError, match=r"scratch must be a writeable C-contiguous NumPy array"):
        (tmp_path / "a").write_bytes(b"x")
        compiled.read_files([tmp_path / "a"], scratch=np.zeros(8, np.uint8)[::2])
    # a 2-D scratch of the right first extent but no bytes: the reader wrote past it (AddressSanitizer)
    (tmp_path / "b").write_bytes(bytes(range(64)))
    flat = np.zeros((1000, 0), np.uint8)
    data, *_ = compiled.read_files([tmp_path / "b"], scratch=flat)
    assert bytes(data) == bytes(range(64)) and not np.shares_memory(data, flat)


@pytest.mark.parametrize("codec", ["raw", "zstd", "blosc", "deflate"])
def test_files_read_and_decoded_in_one_call_equal_numcodecs_and_leave_the_rest_to_the_general_way(tmp_path, codec):
    """read_decoded_files fills each whole chunk as numcodecs decodes its file, across calls of FILES_PER_CALL
    files (their bytes in a lent buffer too small at first); a missing file is CHUNK_MISSING; a damaged frame, a
    frame or raw file of another size, an empty file and a directory are CHUNK_AGAIN, their arrays left to the
    general reader, which names what is wrong."""
    numcodecs = pytest.importorskip("numcodecs")
    from emfast.io import _blosc, _deflate, _zstd
    found = {"raw": lambda: True, "zstd": _zstd.system_zstd, "blosc": _blosc.native_blosc,
             "deflate": _deflate.system_deflate}[codec]
    if not found():
        pytest.skip(f"no {codec} library on this machine")
    encoder = {"raw": None, "zstd": numcodecs.Zstd(level=3), "blosc": numcodecs.Blosc(cname="lz4"),
               "deflate": numcodecs.GZip()}[codec]
    rng = np.random.default_rng(5)
    chunks = [rng.integers(0, 40, 3000, dtype=np.uint16) for _ in range(_filebatch.FILES_PER_CALL + 10)]
    paths = []
    for n, chunk in enumerate(chunks):
        path = tmp_path / f"c{n}"
        path.write_bytes(chunk.tobytes() if encoder is None else bytes(encoder.encode(chunk)))
        paths.append(str(path))
    damaged = {3: lambda data: data[:len(data) // 2], 7: lambda data: b"", 11: lambda data: data + b"\0" * 8}
    for n, change in damaged.items():
        path = tmp_path / f"c{n}"
        path.write_bytes(change(path.read_bytes()))
    os.remove(paths[5])
    os.mkdir(paths[5] + "d")
    paths[9] = paths[5] + "d"
    outs = [np.zeros_like(chunk) for chunk in chunks]
    buffer = FileBuffer()
    buffer.array = np.empty(10, np.uint8)
    results, _ = _filebatch.read_decoded_files(paths, codec, outs, buffer)
    expected = [compiled.CHUNK_MISSING if n == 5 else compiled.CHUNK_AGAIN if n in (3, 7, 9, 11) else
                compiled.CHUNK_FILLED for n in range(len(chunks))]
    assert results == expected
    for n, (out, chunk) in enumerate(zip(outs, chunks)):
        if results[n] == compiled.CHUNK_FILLED:
            np.testing.assert_array_equal(out, chunk)
    assert buffer.array.nbytes == 10  # encoded bytes that did not fit went to new memory, the buffer stays


def test_read_decode_files_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="codec must be one of zstd, blosc, deflate, got 'lz4'"):
        compiled.read_decode_files("lz4", [], [])
    with pytest.raises(ValueError, match="1 paths but 0 destinations"):
        compiled.read_decode_files("raw", [str(tmp_path / "x")], [])
    with pytest.raises(TypeError, match=r"outs\[0\] must be a writeable C-contiguous NumPy array"):
        compiled.read_decode_files("raw", [str(tmp_path / "x")], [np.zeros(8)[::2]])


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_byte_ranges_read_and_decoded_in_one_call_and_the_files_versions(tmp_path, codec):
    """read_decoded_files with ranges (inner chunks of shards) fills each chunk from its range of a shared file and
    gives each file's (size, mtime) as it was read; a range reaching past the file's end (however far), or a
    negative one, is CHUNK_AGAIN; a missing file is CHUNK_MISSING with version (0, 0)."""
    numcodecs = pytest.importorskip("numcodecs")
    from emfast.io import _zstd
    if codec == "zstd" and not _zstd.system_zstd():
        pytest.skip("no libzstd on this machine")
    rng = np.random.default_rng(8)
    chunks = [rng.integers(0, 30, 2000, dtype=np.uint32) for _ in range(12)]
    frames = [chunk.tobytes() if codec == "raw" else bytes(numcodecs.Zstd().encode(chunk)) for chunk in chunks]
    shard = tmp_path / "shard"
    shard.write_bytes(b"head" + b"".join(frames))
    starts = np.cumsum([4] + [len(frame) for frame in frames[:-1]])
    ranges = [(int(start), len(frame)) for start, frame in zip(starts, frames)]
    ranges[4] = (ranges[4][0], shard.stat().st_size)  # past the end
    ranges[6] = (-1, ranges[6][1])
    ranges[7] = (1, 2**63 - 1)  # past the end by more than int64 holds: no overflow in the check
    paths = [str(shard)] * len(chunks)
    paths[9] = str(tmp_path / "gone")
    outs = [np.zeros_like(chunk) for chunk in chunks]
    results, versions = _filebatch.read_decoded_files(paths, codec, outs, FileBuffer(), ranges)
    assert results == [compiled.CHUNK_AGAIN if n in (4, 6, 7) else compiled.CHUNK_MISSING if n == 9 else
                       compiled.CHUNK_FILLED for n in range(len(chunks))]
    status = os.stat(shard)
    assert versions == [(0, 0) if n == 9 else (status.st_size, status.st_mtime_ns) for n in range(len(chunks))]
    for n, (out, chunk) in enumerate(zip(outs, chunks)):
        if results[n] == compiled.CHUNK_FILLED:
            np.testing.assert_array_equal(out, chunk)
    with pytest.raises(ValueError, match="2 paths but 1 ranges"):
        compiled.read_decode_files("raw", paths[:2], outs[:2], None, [(0, 8)])


def _read_in_child(path, go):
    go.wait(30)
    with lent_buffer() as buffer:
        read_regular_files([path], "x", buffer=buffer)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child (a DataLoader worker under fork)")
def test_a_forked_child_reads_into_memory_of_its_own_not_its_parents_kept_buffer(tmp_path):
    """The buffers were mapped shared (Python's default for anonymous maps): a DataLoader worker forked while the
    parent kept one read into the same pages as the parent, and samples came out wrong or "corrupt" (a review:
    514 of 4000 N5 samples, false zstd errors in zarr)."""
    import multiprocessing
    (tmp_path / "a").write_bytes(b"A" * 1000)
    (tmp_path / "b").write_bytes(b"B" * 1000)
    with lent_buffer():
        pass  # kept for the next reads, in the parent and (as a copy) in the child
    context = multiprocessing.get_context("fork")
    go = context.Event()
    child = context.Process(target=_read_in_child, args=(tmp_path / "b", go))
    child.start()
    try:
        with lent_buffer() as buffer:
            contents, _ = read_regular_files([tmp_path / "a"], "x", buffer=buffer)
            go.set()
            child.join(30)
            assert child.exitcode == 0 and bytes(contents[0]) == b"A" * 1000
    finally:
        if child.is_alive():
            child.kill()

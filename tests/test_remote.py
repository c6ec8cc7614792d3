"""Remote stores: zarr (v2, v3, sharded), OME-Zarr, N5 and precomputed written by the field's own tools, served by
real servers on 127.0.0.1 (an HTTP server adding latency and failing on demand, moto's S3 server), read in memory,
lazily and through a Loader, and compared voxel by voxel with the local read; then every way a server can fail."""
import contextlib
import json
import multiprocessing
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import numcodecs
import numpy as np
import pytest
import zarr

import emfast as ef
from emfast.config import ConfigError, load_config, load_predict_config
from emfast.io import RemoteReadError, RemoteStore
from reference import lift_voxel_size_check
from remote_servers import free_port, http_server, s3_server, upload
from threads import threads_end

SHAPE = (20, 30, 40)
CHUNKS = (8, 8, 8)
BUCKET = "emfast-test"
#: Options that keep the failure tests short: few retries, short timeouts.
QUICK = {"retries": 2, "timeout": 1.0}


def needs(module):
    return pytest.importorskip(module, reason=f"{module} writes this test's store")


def write_stores(root):
    """Every layout, written by its own tool; returns {name: (path below root, open arguments)}."""
    data = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
    stores = {}
    v2 = zarr.create_array(root / "v2.zarr", shape=SHAPE, chunks=CHUNKS, dtype=np.uint8, zarr_format=2,
                           compressors=numcodecs.Blosc(cname="lz4"))
    v2[...] = data
    v2.attrs.update(resolution=[40, 4, 4], offset=[80, 8, 4])
    stores["zarr v2"] = ("v2.zarr", {})
    zarr.create_array(root / "v3.zarr", shape=SHAPE, chunks=CHUNKS, dtype=np.uint8,
                      compressors=zarr.codecs.ZstdCodec())[...] = data
    stores["zarr v3"] = ("v3.zarr", {})
    zarr.create_array(root / "sharded.zarr", shape=SHAPE, chunks=(4, 8, 8), shards=(8, 16, 16),
                      dtype=np.uint8)[...] = data
    stores["zarr v3 sharded"] = ("sharded.zarr", {})
    writer = needs("ome_zarr.writer")
    from ome_zarr.format import FormatV04
    group = zarr.open_group(str(root / "ome.zarr"), mode="w", zarr_format=2)
    writer.write_image(data, group, scale_factors=(), axes="zyx", fmt=FormatV04(),
                       scale={"z": 0.04, "y": 0.004, "x": 0.004}, axes_units={a: "micrometer" for a in "zyx"},
                       storage_options={"chunks": CHUNKS})
    stores["OME-Zarr"] = ("ome.zarr", {})
    z5py = needs("z5py")
    z5py.File(str(root / "s.n5"), mode="a").create_dataset("raw", data=data, chunks=CHUNKS, compression="gzip")
    stores["N5"] = ("s.n5/raw", {})
    cloudvolume = needs("cloudvolume")
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=1, layer_type="image", data_type="uint8", encoding="raw", resolution=[4, 4, 40],
        voxel_offset=[3, 5, 7], chunk_size=[8, 8, 8], volume_size=list(SHAPE[::-1]))
    volume = cloudvolume.CloudVolume(f"file://{root / 'pc'}", info=info, compress="gzip", progress=False)
    volume.commit_info()
    volume[3:3 + SHAPE[2], 5:5 + SHAPE[1], 7:7 + SHAPE[0]] = data.T
    stores["precomputed"] = ("pc", {})  # no suffix: told by its info
    ts = needs("tensorstore")
    scale = {"resolution": [4, 4, 40], "voxel_offset": [0, 0, 0], "size": list(SHAPE[::-1]), "chunk_size": [8, 8, 8],
             "encoding": "raw", "sharding": {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 1,
                                             "hash": "identity", "minishard_bits": 1, "shard_bits": 1,
                                             "minishard_index_encoding": "gzip", "data_encoding": "gzip"}}
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(root / "pcs")},
                     "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
                     "scale_metadata": scale, "create": True}).result()
    store[...] = data.T[..., np.newaxis]
    stores["precomputed sharded"] = ("pcs", {"format": "precomputed"})
    return data, stores


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    data, stores = write_stores(root)
    return root, data, stores


@pytest.fixture(scope="module")
def http(written):
    with http_server(written[0], latency=0.005) as server:
        yield server


@pytest.fixture
def served(http):
    """The HTTP server, with no faults queued before or after the test."""
    http.faults.clear()
    http.requests.clear()
    yield http
    http.faults.clear()
    http.throttled.clear()
    http.release_hangs()  # else their clients' retries, once the server lets go, reach the next tests
    http.missing = 404


#: Faults of the S3 server (see ``s3_server``), cleared by each test that queues some.
S3_FAULTS: dict = {}


@pytest.fixture(scope="module")
def s3(written):
    with s3_server(faults=S3_FAULTS) as endpoint:
        upload(endpoint, BUCKET, written[0])
        yield endpoint


def remote_url(request, where, name):
    """The URL and open arguments of store ``name`` on the HTTP or S3 server (started on first use)."""
    path, args = request.getfixturevalue("written")[2][name]
    if where == "http":
        return f"{request.getfixturevalue('http').url}/{path}", dict(args)
    endpoint = request.getfixturevalue("s3")
    return f"s3://{BUCKET}/{path}", dict(args, storage_options={"endpoint_url": endpoint})


def lazy_box(volume, corner=(0, 0, 0), extent=SHAPE):
    out = np.empty((volume.channels,) + tuple(extent), volume.dtype)
    volume.read_box(corner, extent, out)
    return out[0]


NAMES = ["zarr v2", "zarr v3", "zarr v3 sharded", "OME-Zarr", "N5", "precomputed", "precomputed sharded"]


@pytest.mark.parametrize("where", ["http", "s3"])
@pytest.mark.parametrize("name", NAMES)
def test_remote_reads_equal_local_reads(request, written, where, name):
    root, data, stores = written
    url, args = remote_url(request, where, name)
    local = ef.open(root / stores[name][0], **stores[name][1])
    np.testing.assert_array_equal(local.array[0], data)  # the fixture itself is right
    remote = ef.open(url, **args)
    np.testing.assert_array_equal(remote.array[0], local.array[0])
    assert (remote.resolution, remote.offset, remote.chunks) == (local.resolution, local.offset, local.chunks)
    with ef.open(url, in_memory=False, **args) as lazy:
        np.testing.assert_array_equal(lazy_box(lazy), data)
        np.testing.assert_array_equal(lazy_box(lazy, (3, 5, 7), (9, 17, 20)), data[3:12, 5:22, 7:27])
        again = pickle.loads(pickle.dumps(lazy))  # reopened from its URL and options
        np.testing.assert_array_equal(lazy_box(again), data)
        again.close()


def loader_batches(volume, count=4):
    loader = ef.Loader(volume, patch=(6, 12, 14), batch_size=4, threads=2, seed=3,
                       augment=[ef.Mirror(), ef.Transpose("zyx")], isotropic=True)
    with loader:
        return [batch.copy()["raw"] for _, batch in zip(range(count), loader)]


@pytest.mark.parametrize("where,name", [("http", "zarr v3"), ("s3", "zarr v2"), ("http", "N5"),
                                        ("s3", "precomputed"), ("http", "zarr v3 sharded")])
def test_a_loader_over_a_remote_store_makes_the_batches_of_the_local_one(request, written, where, name, monkeypatch):
    lift_voxel_size_check(monkeypatch)  # transposes across z of the (40, 4, 4) nm stores: the permuted reads
    root, data, stores = written
    url, args = remote_url(request, where, name)
    expected = loader_batches(ef.Volume.from_array(data))
    with ef.open(url, in_memory=False, cache_bytes=30 * 8 ** 3, **args) as lazy:  # far smaller than the volume
        got = loader_batches(lazy)
    assert threads_end()
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(have, want)


@pytest.mark.parametrize("where", ["http", "s3"])
def test_a_pickled_loader_over_a_remote_mask_keeps_its_samplers_index(request, written, where, monkeypatch):
    """A spawned DataLoader worker reopens remote volumes by URL: the masked sampler's index (of a mask, here the
    raw store) travels with the pickled loader and is reused there, the metadata being unchanged."""
    from emfast.sampling import _masked

    builds = []
    build = _masked.Masked._index
    monkeypatch.setattr(_masked.Masked, "_index", lambda self, *args: builds.append(1) or build(self, *args))
    url, args = remote_url(request, where, "zarr v3")
    sample = ef.Sample(ef.open(url, in_memory=False, **args), mask=ef.open(url, in_memory=False, **args))
    loader = ef.Loader(sample, patch=(6, 12, 14), batch_size=2, epoch_size=2, augment=(),
                       sampler=ef.sampling.Masked(0.5))
    built = len(builds)
    reopened = pickle.loads(pickle.dumps(sample.mask))  # its own store object: the stamps compare by URL and digest
    assert reopened.stamp == sample.mask.stamp
    reopened.close()
    worker = pickle.loads(pickle.dumps(loader))
    assert len(builds) == built > 0
    with loader, worker:
        assert [np.array_equal(a["raw"], b["raw"]) for a, b in zip(loader, worker)] == [True, True]
    worker.dataset.close()
    loader.dataset.close()


def test_a_config_names_a_remote_store_by_url(written, served, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(f"""
data:
  samples:
    - file: {served.url}/v3.zarr
      raw: ""
      lazy: true
loader:
  patch: [6, 12, 14]
  batch_size: 2
""")
    loaded = load_config(config)
    assert loaded.samples[0].volumes()[0][1].file == f"{served.url}/v3.zarr"
    dataset = loaded.dataset()
    np.testing.assert_array_equal(lazy_box(dataset.samples[0].raw), written[1])
    assert any("v3.zarr/c/" in request for request in served.requests)


def identity_config(folder, monkeypatch, input_, output):
    """A predict config of the identity network beside its module in ``folder``: ``input:`` as given (YAML)."""
    (folder / "nets.py").write_text("def load():\n    return lambda batch: batch\n")
    monkeypatch.syspath_prepend(str(folder))
    config = folder / "predict.yaml"
    config.write_text(f"predict:\n  model: nets:load\n  input: {input_}\n  output: {folder / output}\n"
                      "  patch_in: [8, 16, 16]\n")
    return config


def test_a_predict_config_takes_a_remote_file_and_its_dataset(written, served, tmp_path, monkeypatch):
    """``input: {file: URL, dataset: ...}``, as CONFIG.md writes it for any file: the URL and the dataset are one
    path (a URL is a string, not a path: joining them raised a TypeError, an "internal error")."""
    config = identity_config(tmp_path, monkeypatch, f"{{file: {served.url}/ome.zarr/, dataset: /s0}}", "out.zarr/p")
    spec = load_predict_config(config)
    assert spec.input_path() == f"{served.url}/ome.zarr/s0"
    spec.run(progress=False)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr/p"))[0], written[1] * np.float32(1 / 255))


def test_predict_and_its_config_take_storage_options_for_a_remote_input(written, s3, tmp_path, monkeypatch):
    """An S3-compatible server named only in storage_options: predict had no such setting, and a predict config's
    input no such key, as a sample has (a Python user could open the volume first; a config could not)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    url, options = f"s3://{BUCKET}/v3.zarr", {"endpoint_url": s3}
    expected = written[1] * np.float32(1 / 255)
    ef.predict(lambda batch: batch, url, tmp_path / "py.zarr/p", patch_in=(8, 16, 16), storage_options=options)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "py.zarr/p"))[0], expected)
    with pytest.raises(ValueError, match=r"storage_options apply to remote stores .*, not to a local path"):
        ef.predict(lambda batch: batch, written[0] / "v3.zarr", tmp_path / "local.zarr/p", patch_in=(8, 16, 16),
                   storage_options=options)
    with pytest.raises(TypeError, match=r"storage_options are for an input given as a URL, not a ndarray"):
        ef.predict(lambda batch: batch, written[1], tmp_path / "array.zarr/p", patch_in=(8, 16, 16),
                   storage_options=options)
    config = identity_config(tmp_path, monkeypatch, f"{{file: {url}, storage_options: {{endpoint_url: '{s3}'}}}}",
                             "yaml.zarr/p")
    spec = load_predict_config(config)
    assert "endpoint_url" not in repr(spec)  # storage_options may hold credentials: never shown
    assert load_predict_config(config) == spec and spec.to_yaml()["input"] == {"file": url,
                                                                              "storage_options": options}
    spec.run(progress=False)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "yaml.zarr/p"))[0], expected)
    config.write_text(config.read_text().replace(url, f"s3://{BUCKET}/nothere.zarr"))
    with pytest.raises(ConfigError, match=r"line 3: predict.input.file: .*nothere.zarr"):  # the file's key, not input's
        load_predict_config(config).plan()
    config.write_text(config.read_text().replace(f"s3://{BUCKET}/nothere.zarr", str(written[0] / "v3.zarr")))
    with pytest.raises(ConfigError, match=r"line 3: predict.input.storage_options: storage_options applies to remote "
                                          r"files .*; this input reads none"):
        load_predict_config(config)


@pytest.mark.parametrize("options,words", [
    ("{endpoint_ulr: ENDPOINT}", r"an option this URL's filesystem does not take .*endpoint_ulr"),
    ("{endpoint_url: HOSTPORT}", r"endpoint_url must be an http:// or https:// URL .*got '127\.0\.0\.1:"),
    ("{endpoint_url: ENDPOINT, anon: 'no'}",
     r"anon must be true or false, got the string 'no' \(in YAML, leave out the quotes\)"),
])
def test_mistakes_in_storage_options_are_blamed_on_them(written, s3, tmp_path, monkeypatch, options, words):
    """A typo in an option's name was reported at the sample's raw.dataset, an endpoint without its scheme as the
    file being unreadable, and a quoted anon: 'no' (a true string) as denied credentials (a helper's trial): each
    is refused at storage_options, in a training config, a predict config and the Python API."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    options = options.replace("HOSTPORT", f"'{s3.split('://')[1]}'").replace("ENDPOINT", f"'{s3}'")
    train = tmp_path / "train.yaml"
    train.write_text(f"data:\n  samples:\n    - file: s3://{BUCKET}/v3.zarr\n      raw: ''\n"
                     f"      storage_options: {options}\nloader: {{patch: [6, 12, 14], batch_size: 2}}\n")
    with pytest.raises(ConfigError, match=rf"line 5: data.samples\[0\].storage_options: .*{words}"):
        load_config(train).dataset()
    predict = identity_config(tmp_path, monkeypatch, f"{{file: s3://{BUCKET}/v3.zarr, storage_options: {options}}}",
                              "out.zarr/p")
    with pytest.raises(ConfigError, match=rf"line 3: predict.input.storage_options: .*{words}"):
        load_predict_config(predict).plan()
    import yaml
    with pytest.raises(ValueError, match=words):
        ef.open(f"s3://{BUCKET}/v3.zarr", storage_options=yaml.safe_load(options))


def test_a_prediction_stopped_by_its_remote_input_says_that_a_resume_continues(written, served, tmp_path,
                                                                               monkeypatch, capsys):
    """A server that fails for good mid-run: the error named the URL and chunk but not that the output was left
    unfinished and resumable (a helper killed its server; the resume then finished the output). It says so, and
    the resume makes the output of an uninterrupted run."""
    from emfast.cli import main

    config = identity_config(tmp_path, monkeypatch, f"{{file: {served.url}/v3.zarr, storage_options: {{retries: 0}}}}",
                             "out.zarr/p")
    config.write_text(config.read_text() + "  chunks: [8, 16, 16]\n  block: [8, 16, 16]\n")
    served.faults["/v3.zarr/c/2/"] = [500] * 1000  # the last chunks along z: some blocks finish first
    assert main(["predict", str(config)]) == 2
    error = capsys.readouterr().err
    assert "v3.zarr/c/2/" in error and f"(the output {tmp_path / 'out.zarr'}/p is unfinished, its finished blocks " \
        "recorded: run again with --resume to continue)" in error, error
    served.faults.clear()
    assert main(["predict", str(config), "--resume"]) == 0
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr/p"))[0], written[1] * np.float32(1 / 255))


def test_the_resume_note_is_left_off_where_a_resume_would_not_mend_the_run():
    """A chunk that changed while read, or a corrupt one, got the note advising a resume, which would mix the
    store's versions or meet the same chunk again (a second review)."""
    from emfast.inference._predict import _resumable
    from emfast.io import ChunkChangedError, CorruptChunkError, InputChangedError

    for unmended in (ChunkChangedError("changed"), CorruptChunkError("corrupt"), InputChangedError("changed")):
        with pytest.raises(type(unmended)) as raised, _resumable("out.zarr/p"):
            raise unmended
        assert not getattr(raised.value, "__notes__", None)
    with pytest.raises(RemoteReadError) as raised, _resumable("out.zarr/p"):
        raise RemoteReadError("gone")
    assert raised.value.__notes__ == ["the output out.zarr/p is unfinished, its finished blocks recorded: run again "
                                      "with resume=True to continue"]


def test_anon_is_refused_only_as_a_string():
    """The filesystems take any value for anon's truth (NumPy's bools, 0 and 1 included); only a string, such as
    YAML's quoted 'no', is a mistake (a second review found np.bool_ refused)."""
    for anon in (np.True_, 0, 1, False):
        RemoteStore("s3://bucket/data.zarr", {"anon": anon})
    with pytest.raises(ValueError, match="anon must be true or false, got the string 'false'"):
        RemoteStore("s3://bucket/data.zarr", {"anon": "false"})


def test_a_missing_chunk_is_the_fill_value_where_the_format_says_so(written, served, tmp_path):
    """zarr: the array's fill value; N5 and precomputed: 0. Served from a copy with a chunk removed."""
    root, data, _ = written
    with http_server(root, latency=0) as server:
        server.faults["/v3.zarr/c/0/0/0"] = [404] * 100
        server.faults["/s.n5/raw/0/0/0"] = [404] * 100
        for path, args in (("v3.zarr", {}), ("s.n5/raw", {})):
            volume = ef.open(f"{server.url}/{path}", **args)
            expected = data.copy()
            expected[:8, :8, :8] = 0
            np.testing.assert_array_equal(volume.array[0], expected)
        zarr.create_array(tmp_path / "f.zarr", shape=SHAPE, chunks=CHUNKS, dtype=np.uint8, fill_value=7)
    with http_server(tmp_path, latency=0) as server:  # a store with no chunk at all
        np.testing.assert_array_equal(ef.open(f"{server.url}/f.zarr").array, 7)


def test_missing_metadata_is_an_error_naming_the_url(served):
    with pytest.raises(ef.io.DatasetNotFoundError, match=rf"{served.url}/nothere.zarr"):
        ef.open(f"{served.url}/nothere.zarr")
    with pytest.raises(ef.io.DatasetNotFoundError, match="nothere"):
        ef.open(f"{served.url}/s.n5/nothere")
    with pytest.raises(FileNotFoundError, match=rf"{served.url}/nothere"):
        ef.open(f"{served.url}/nothere", format="precomputed")


def test_a_denied_request_names_url_and_key(served):
    served.faults["/v3.zarr/zarr.json"] = [403]
    with pytest.raises(RemoteReadError, match=rf"{served.url}/v3.zarr/zarr.json: access denied"):
        ef.open(f"{served.url}/v3.zarr", storage_options=QUICK)
    assert sum("/v3.zarr/zarr.json" in r for r in served.requests) == 1  # not retried: it will not change
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options=QUICK) as lazy:
        served.faults["/v3.zarr/c/1/0/2"] = [403]
        with pytest.raises(RemoteReadError, match=r"v3.zarr/c/1/0/2: access denied"):
            lazy_box(lazy)


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_server_ignoring_range_requests_is_named_not_taken_for_a_corrupt_store(served, in_memory):
    """A server may answer a byte-range request with the whole object (200): zarr took its first bytes for the
    shard's chunk, and the error said the store was corrupt (a checksum mismatch)."""
    served.faults["/sharded.zarr/c/"] = ["whole"] * 1000
    with pytest.raises(RemoteReadError, match=rf"{served.url}/sharded.zarr/c/\d/\d/\d: \d+ bytes came for a request "
                                              r"of \d+ \(a byte range\): the server ignores HTTP Range requests"):
        volume = ef.open(f"{served.url}/sharded.zarr", in_memory=in_memory, storage_options=QUICK)
        lazy_box(volume)


@pytest.mark.parametrize("name", NAMES)
def test_a_server_denying_missing_keys_still_opens_every_format(request, written, served, name):
    """S3 answers a missing key with 403 to a reader without s3:ListBucket: opening asks for other formats'
    metadata (zarr v2's .zarray beside a v3 store, N5's attributes.json), and every format but N5 failed with
    "access denied". A denied metadata file is taken as missing; a denied chunk stays an error."""
    url, args = remote_url(request, "http", name)
    served.missing = 403
    np.testing.assert_array_equal(ef.open(url, storage_options=QUICK, **args).array[0], written[1])


def test_metadata_denied_where_no_volume_is_found_is_access_denied(served):
    """Wrong credentials deny every key: that is said, not "no volume here" or "cannot tell its format"."""
    served.missing = 403
    served.faults["/v3.zarr/zarr.json"] = [403]
    with pytest.raises(RemoteReadError, match=rf"{served.url}/v3.zarr/[.a-z]+: access denied .*\(no volume found "
                                              r"where the server denied its metadata; \d+ denied\)"):
        ef.open(f"{served.url}/v3.zarr", storage_options=QUICK)
    with pytest.raises(RemoteReadError, match=r"access denied .*no volume found"):
        ef.open(f"{served.url}/nothere.zarr", storage_options=QUICK)


def test_zarr_v2_stores_without_empty_zattrs_open_where_missing_keys_are_denied(tmp_path):
    """zarr-python 2, tensorstore and ome-zarr-py over zarr 2 write no .zattrs where there are no attributes: an
    OME-NGFF image's levels, groups above an array. Denied (S3 without s3:ListBucket), only an array's own .zattrs
    may place it; a second review found all three stores refused."""
    writer = needs("ome_zarr.writer")
    from ome_zarr.format import FormatV04
    data = np.random.default_rng(1).integers(0, 256, (16, 16, 16), dtype=np.uint8)
    writer.write_image(data, zarr.open_group(str(tmp_path / "ome.zarr"), mode="w", zarr_format=2), axes="zyx",
                       scale_factors=[2], fmt=FormatV04())
    nested = zarr.open_group(str(tmp_path / "nested.zarr"), mode="w", zarr_format=2).create_group("raw")
    writer.write_image(data, nested, axes="zyx", scale_factors=[2], fmt=FormatV04())
    array = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w", zarr_format=2).create_group("a").create_array(
        "raw", shape=data.shape, chunks=(8, 8, 8), dtype=np.uint8)
    array[...] = data
    array.attrs["resolution"] = [40, 4, 4]
    for attributes in tmp_path.rglob(".zattrs"):
        if json.loads(attributes.read_text()) == {}:
            attributes.unlink()
    with http_server(tmp_path) as server:
        server.missing = 403
        for path, dataset, resolution in [("ome.zarr", None, (1, 1, 1)), ("nested.zarr", "raw", (1, 1, 1)),
                                          ("plain.zarr", "a/raw", (40, 4, 4))]:
            with ef.open(f"{server.url}/{path}", dataset, in_memory=False, storage_options=QUICK) as volume:
                assert tuple(volume.resolution) == resolution, path
                np.testing.assert_array_equal(lazy_box(volume, extent=(16, 16, 16)), data)


@pytest.mark.parametrize("missing", [404, 403])
def test_a_denied_zattrs_is_never_read_as_absent_attributes(written, served, missing):
    """A zarr v2 array's .zattrs holds what places it (resolution, offset): denied, it was taken as missing and the
    array opened without them, silently (a review of the 403 handling)."""
    served.missing = missing
    served.faults["/v2.zarr/.zattrs"] = [403] * 10
    with pytest.raises(RemoteReadError, match=rf"{served.url}/v2.zarr/.zattrs: access denied .*the attributes that "
                                              r"place the volume \(resolution, offset\) may be there"):
        ef.open(f"{served.url}/v2.zarr", storage_options=QUICK)


def test_a_scale_tensorstore_is_denied_is_access_denied_naming_the_url(served):
    """emfast reads a precomputed info itself, then tensorstore opens the scale: its 403 was a StoreMetadataError,
    "tensorstore cannot open scale 0", as if the info were malformed (credentials that only fsspec had, a review
    found: S3 keys in ~/.aws)."""
    served.faults["/pcs/info"] = ["served", 403, 403, 403, 403]  # emfast's read, then tensorstore's
    with pytest.raises(RemoteReadError, match=rf"{served.url}/pcs \(scale 0\): access denied \(.*403"):
        ef.open(f"{served.url}/pcs", format="precomputed", storage_options=QUICK)
    served.faults["/pcs/info"] = ["served", 404, 404, 404, 404]
    with pytest.raises(RemoteReadError, match=rf"{served.url}/pcs \(scale 0\): tensorstore found no info where "
                                              r"emfast has just read one: the store changed"):
        ef.open(f"{served.url}/pcs", format="precomputed", storage_options=QUICK)


def test_transient_failures_are_retried_with_backoff(written, served):
    served.faults["/v3.zarr/c/0/1/1"] = [503, 503, "truncate"]
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"retries": 3}) as lazy:
        np.testing.assert_array_equal(lazy_box(lazy), written[1])
    assert sum(r.endswith("/v3.zarr/c/0/1/1") for r in served.requests) == 4
    served.faults["/s.n5/raw/1/0/0"] = [500]
    np.testing.assert_array_equal(ef.open(f"{served.url}/s.n5/raw").array[0], written[1])


def test_a_malformed_response_is_retried_and_described_briefly(written, served):
    """aiohttp reports a response it cannot parse as status 400: it was taken as the server's refusal, never
    retried, and its message quoted kilobytes of the bytes it could not parse (a review: a server whose body ran
    past its Content-Length left them on the kept-alive connection, and the next request read them)."""
    served.faults["/v3.zarr/c/0/1/1"] = ["garbled"]
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"retries": 3}) as lazy:
        np.testing.assert_array_equal(lazy_box(lazy), written[1])
    assert sum(r.endswith("/v3.zarr/c/0/1/1") for r in served.requests) == 2
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options=QUICK) as lazy:
        served.faults["/v3.zarr/c/2/3/4"] = ["garbled"] * 3
        with pytest.raises(RemoteReadError, match=rf"{served.url}/v3.zarr/c/2/3/4: cannot read it after 3 attempts "
                                                  r"\(a malformed response") as raised:
            lazy_box(lazy)
    assert len(str(raised.value)) < 600


@contextlib.contextmanager
def garbling_server():
    """A server on 127.0.0.1 that answers every request with bytes where the status line belongs; yields (its URL,
    a one-element list counting the connections)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    connections, stop = [0], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:  # the timeout: look at stop again
                continue
            connections[0] += 1
            with connection:
                connection.settimeout(2)
                connection.recv(65536)
                connection.sendall(b"\x28\xb5\x2f\xfd" + bytes(range(256)) + b"\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", connections
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize("protocol", ["http", "s3"])
def test_a_malformed_response_is_retried_on_s3_too(protocol, monkeypatch):
    """botocore carries aiohttp's error as its context, not its cause: on S3 a response that could not be parsed
    was still not retried (a second review)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with garbling_server() as (endpoint, connections):
        url = f"{endpoint}/v3.zarr" if protocol == "http" else "s3://bucket/v3.zarr"
        options = dict(QUICK, **({"endpoint_url": endpoint} if protocol == "s3" else {}))
        with pytest.raises(RemoteReadError, match=r"v3.zarr/zarr.json: cannot read it after 3 attempts \(a malformed "
                                                  r"response: "):
            ef.open(url, storage_options=options)
    assert connections[0] == 3


def test_a_long_library_message_keeps_its_start_and_its_end():
    """tensorstore names the URL twice before the status, and puts payloads after it (the server's error page,
    source locations, its spec): cut after 300 characters, a 503 lost its status."""
    from emfast.io._remote import DESCRIBED_CHARS, describe_error
    url = "http://127.0.0.1:1/" + "neuroglancer-janelia-flyem-hemibrain/emdata/clahe_yz/jpeg/" * 4
    message = (f"Error reading {url}: Error retrieving {url}: All 3 retry attempts failed: Service Unavailable "
               "[HTTP code 503]")
    payloads = (" [http_response_body='<!DOCTYPE HTML>\\n<html lang=\"en\">'] [source locations='x.cc:1'] "
                "[tensorstore_spec='{\"driver\":\"neuroglancer_precomputed\"}']")
    for text in (describe_error(ValueError(message)), describe_error(ValueError(message + payloads))):
        assert text.startswith("ValueError: Error reading http://127.0.0.1:1/") and text.endswith("[HTTP code 503]")
        assert len(text) <= DESCRIBED_CHARS + 5


@pytest.mark.parametrize("fault,why", [(503, "503"), ("truncate", "Payload|payload|not completed|Content"),
                                       ("hang", r"no answer within 1 s each \(storage_options timeout\)")])
def test_a_failure_that_lasts_names_url_and_chunk_after_the_retries(served, fault, why):
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options=QUICK) as lazy:
        served.faults["/v3.zarr/c/2/3/4"] = [fault] * 3
        start = time.perf_counter()
        with pytest.raises(RemoteReadError, match=rf"{served.url}/v3.zarr/c/2/3/4: cannot read it after 3 "
                                                  rf"attempts \(.*({why})"):
            lazy_box(lazy)
        assert time.perf_counter() - start < 3 * QUICK["timeout"] + 5
    assert sum(r.endswith("/v3.zarr/c/2/3/4") for r in served.requests) == 3


def test_a_throttling_server_is_given_the_wait_its_retry_after_asks(written, served):
    """A 429 with Retry-After: 2 was tried again after emfast's own backoffs alone (0.1 s doubling): the attempts
    ran out within a second, and a short throttle failed the read. The last error says what the server asked."""
    served.throttled["/v3.zarr/c/1/2/3"] = time.monotonic() + 2
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"retries": 3}) as lazy:
        np.testing.assert_array_equal(lazy_box(lazy), written[1])
    assert 2 <= sum(r.endswith("/v3.zarr/c/1/2/3") for r in served.requests) <= 4
    served.throttled["/v3.zarr/c/1/2/3"] = time.monotonic() + 60
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"retries": 0}) as lazy:
        with pytest.raises(RemoteReadError, match=r"c/1/2/3: cannot read it after 1 attempts .*429.*the server last "
                                                  r"asked to wait (59|60) s \(Retry-After\)"):
            lazy_box(lazy)


@pytest.mark.parametrize("name", ["zarr v2", "N5", "precomputed sharded"])
def test_a_static_host_answering_missing_files_with_a_page_opens_every_format(request, written, served, name):
    """Some static hosts answer a missing file with a web page and status 200: emfast's probe for zarr.json of a
    zarr v2 store, an N5 or a precomputed volume failed as "malformed metadata: not JSON". A page where a JSON
    metadata file belongs counts as missing. (A page for a missing chunk stays a corrupt chunk, named: a chunk's
    bytes may begin as a page does.)"""
    served.missing = "page"
    url, args = remote_url(request, "http", name)
    with ef.open(url, in_memory=False, storage_options=QUICK, **args) as lazy:
        np.testing.assert_array_equal(lazy_box(lazy), written[1])


def test_an_unreachable_server_is_an_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/gone.zarr"  # nothing listens there
    start = time.perf_counter()
    with pytest.raises(RemoteReadError, match=rf"{url}/zarr.json: cannot read it after 3 attempts"):
        ef.open(url, storage_options=QUICK)
    assert time.perf_counter() - start < 10


def test_the_training_loop_raises_a_remote_error_naming_url_and_chunk(served):
    served.faults["/v3.zarr/c/"] = [503] * 1000  # every chunk, every attempt
    with ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"retries": 1}) as lazy:
        with ef.Loader(lazy, patch=(6, 12, 14), batch_size=2, threads=2) as loader:
            with pytest.raises(RemoteReadError, match=rf"{served.url}/v3.zarr/c/\d+/\d+/\d+: cannot read it"):
                next(iter(loader))
    assert threads_end()


@pytest.mark.parametrize("name", ["zarr v3", "N5", "precomputed", "zarr v3 sharded", "precomputed sharded"])
def test_close_returns_promptly_while_requests_hang(written, served, name):
    """Also for the stores read through zarr-python (sharded zarr) and tensorstore (sharded precomputed), whose
    own blocking calls waited for the network: close() did not return in 15 s."""
    path, args = written[2][name]
    with ef.open(f"{served.url}/{path}", in_memory=False, storage_options={"timeout": 60}, **args) as lazy:
        served.faults[f"/{path}/"] = ["hang"] * 1000  # every chunk request hangs (the metadata was read)
        before = len(served.requests)
        loader = ef.Loader(lazy, patch=(6, 12, 14), batch_size=2, threads=2)
        loader.start()
        deadline = time.monotonic() + 10
        while len(served.requests) < before + 2 and time.monotonic() < deadline:  # chunk requests in flight
            time.sleep(0.01)
        assert len(served.requests) >= before + 2
        closed = threading.Event()
        start = time.perf_counter()
        threading.Thread(target=lambda: (loader.close(), closed.set()), daemon=True).start()
        assert closed.wait(10), "close() did not return while requests hang"
        assert time.perf_counter() - start < 2
    assert threads_end()


def test_ctrl_c_ends_a_prediction_promptly_while_its_reads_hang(written, served, tmp_path):
    """Ctrl-C while a reader waits for a chunk the server holds: predict held the interrupt until the read gave
    up (after every retry: 184 s in a helper's run), as it waited for its readers; their reads are now abandoned,
    as a closing loader abandons its own."""
    import signal

    def model(batch):
        if not served.faults:  # from the first batch on every chunk request hangs: the reads ahead wait
            served.faults["/v3.zarr/c/"] = ["hang"] * 1000
            before = len(served.requests)
            threading.Thread(target=interrupt_once_reads_hang, args=(before,), daemon=True).start()
        return batch

    interrupted = []

    def interrupt_once_reads_hang(before):
        deadline = time.monotonic() + 10
        while len(served.requests) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        interrupted.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    volume = ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"timeout": 60})
    with pytest.raises(KeyboardInterrupt):
        ef.predict(model, volume, tmp_path / "p.zarr/p", patch_in=(4, 8, 8), blend="none", chunks=(4, 8, 8),
                   block=(4, 8, 8), channels=1, threads=2)
    assert interrupted and time.monotonic() - interrupted[0] < 5
    served.faults.clear()
    volume.close()
    assert threads_end()


def test_a_models_error_ends_a_prediction_promptly_while_its_next_read_hangs(written, served, tmp_path):
    """The model fails while the calling thread waits for the next block's read, which the server holds: the
    run ended only when the read gave up (about 100 s), with the read's error instead of the model's. (A second
    reviewer's case: only the first block's chunk is served.)"""
    served.faults["/v3.zarr/c/0/0/0"] = [None] * 1000  # served as it is
    served.faults["/v3.zarr/c/"] = ["hang"] * 1000
    raised = []

    def model(batch):
        time.sleep(1.0)  # the next block's read is hanging by now
        raised.append(time.monotonic())
        raise RuntimeError("model failed")

    volume = ef.open(f"{served.url}/v3.zarr", in_memory=False, storage_options={"timeout": 15})
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(model, volume, tmp_path / "p.zarr/p", patch_in=(4, 8, 8), blend="none", chunks=(4, 8, 8),
                   block=(4, 8, 8), channels=1, threads=2, batch_size=1)
    assert time.monotonic() - raised[-1] < 5
    served.faults.clear()
    volume.close()
    assert threads_end()


def test_profile_reports_fetch_apart_from_decode(served):
    served.latency = 0.03
    try:
        with ef.open(f"{served.url}/v3.zarr", in_memory=False) as lazy:
            cache = lazy.chunk_cache
            timings = Timings()
            boxes = cache.boxes([(0, 0, 0)], [SHAPE])
            cache.pin(boxes, timings)
            cache.unpin(boxes)
    finally:
        served.latency = 0.005
    assert lazy.cache_stats.misses == 3 * 4 * 5
    assert timings.seconds["fetch"] >= 0.03  # the requests, made together, waited the latency at least once
    assert 0 < timings.seconds["decode"] < timings.seconds["fetch"]


@pytest.mark.parametrize("name", [n for n in NAMES if n != "precomputed sharded"])  # tensorstore reads its info
def test_opening_a_remote_volume_requests_each_metadata_file_once(request, written, served, name):
    """Opening an OME-Zarr image made 24 requests for 9 files (zarr.json 5 times), a zarr v2 array 10 for 3: each a
    round trip, with emfast's checks and zarr-python's format probing reading the same files over again. Reads
    after the open are not remembered: a store changing under a loader is still seen. (A sharded precomputed
    volume's info is read by emfast and again by tensorstore, through a store of its own.)"""
    url, args = remote_url(request, "http", name)
    with ef.open(url, in_memory=False, **args) as lazy:
        opened = list(served.requests)
        assert opened and len(opened) == len(set(opened)), sorted(opened)
        served.requests.clear()
        lazy_box(lazy, extent=(2, 4, 4))
        if name.startswith("zarr"):  # a stamp's metadata is requested again, not taken from the open's
            assert lazy.stamp.unchanged()
            assert any(key.endswith(f"/{lazy.stamp.marker}") for key in served.requests), served.requests


@pytest.mark.parametrize("path", ["v3.zarr", "v2.zarr", "s.n5/raw"])
def test_the_chunks_of_a_read_are_requested_together(written, served, path):
    with ef.open(f"{served.url}/{path}", in_memory=False) as lazy:
        served.most_in_flight = 0
        np.testing.assert_array_equal(lazy_box(lazy), written[1])
    assert served.most_in_flight >= 8  # of 60 chunks; one at a time would wait 60 round trips


def test_a_loader_profile_has_fetch_and_decode(served):
    with ef.open(f"{served.url}/v3.zarr", in_memory=False) as lazy:
        with ef.Loader(lazy, patch=(6, 12, 14), batch_size=2, threads=1) as loader:
            next(iter(loader))
            report = loader.profile
    assert "decode" in str(report) and "fetch" in str(report)
    assert report.seconds["fetch"] + report.seconds["ahead"] > 0


class Timings:
    def __init__(self):
        self.seconds = {}

    def add(self, stage, seconds):
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


def test_remote_store_options_are_checked():
    with pytest.raises(ValueError, match="retries must be an integer >= 0"):
        RemoteStore("http://127.0.0.1:1/x.zarr", {"retries": -1})
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        RemoteStore("s3://bucket/x.zarr", {"timeout": 0})
    with pytest.raises(ValueError, match="storage_options apply to remote stores"):
        ef.open("local.zarr", storage_options={"anon": True})


def test_remote_hdf5_is_refused_naming_the_url():
    with pytest.raises(ValueError, match="s3://bucket/f.h5: HDF5 is not read remotely"):
        ef.open("s3://bucket/f.h5/raw", storage_options={"endpoint_url": "http://127.0.0.1:1"})


def test_s3_endpoint_from_the_environment_and_credentials_checked(written, s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    np.testing.assert_array_equal(ef.open(f"s3://{BUCKET}/v3.zarr").array[0], written[1])
    np.testing.assert_array_equal(ef.open(f"s3://{BUCKET}/pcs").array[0], written[1])  # through tensorstore
    with pytest.raises(ef.io.DatasetNotFoundError, match=f"s3://{BUCKET}/nothere.zarr"):
        ef.open(f"s3://{BUCKET}/nothere.zarr")


def test_gs_without_gcsfs_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
    with pytest.raises(ImportError, match="reading gs:// needs gcsfs"):
        ef.open("gs://bucket/sample.zarr")


@pytest.mark.parametrize("url", ["abfs://container/x.zarr", "s3a://bucket/x.zarr", "ftp://host/x.zarr"])
def test_a_url_of_a_scheme_emfast_does_not_read_is_named_so(tmp_path, monkeypatch, url):
    """abfs://c/x.zarr was joined onto the working folder: "zarr store not found: /tmp/abfs:/c/x.zarr", and with
    storage_options "not to a local path" (a review of remote reads)."""
    monkeypatch.chdir(tmp_path)
    scheme = url.split("://")[0]
    message = f"{url}: emfast reads no {scheme}:// URL; it reads s3://, gs://, http\\(s\\)://"
    for options in (None, {"anon": True}):
        with pytest.raises(ValueError, match=message):
            ef.open(url, storage_options=options)
    assert list(tmp_path.iterdir()) == []


def read_in_child(volume, queue):
    queue.put(lazy_box(volume).tobytes())


def refused_in_child(volume, queue):
    try:
        lazy_box(volume)
        queue.put("read")
    except RuntimeError as error:
        queue.put(str(error))


def in_a_forked_child(volume, target):
    """(exit code, what ``target(volume, queue)`` put) in a forked child, after the parent read and cleared its
    cache: a PyTorch worker is such a fork."""
    lazy_box(volume, (0, 0, 0), (8, 8, 8))  # the parent has read: its event loop and threads run
    volume.chunk_cache.clear()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=target, args=(volume, queue))
    child.start()
    try:
        put = queue.get(timeout=60)  # before joining: a child exits only once its queue is drained
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    return child.exitcode, put


@pytest.mark.parametrize("path", ["v3.zarr", "sharded.zarr"])
def test_a_lazy_remote_volume_reads_in_a_forked_worker(written, served, path):
    """The parent's connections and event loop are not usable in a fork (a sharded array, read through
    zarr-python, failed with 'Timeout context manager should be used inside a task')."""
    with ef.open(f"{served.url}/{path}", in_memory=False) as lazy:
        exitcode, got = in_a_forked_child(lazy, read_in_child)
    assert exitcode == 0
    np.testing.assert_array_equal(np.frombuffer(got, np.uint8).reshape(SHAPE), written[1])


def threads_read_in_child(volume, queue):
    """Four threads read a box each at once, the first reads of this process, while starting the process's own
    filesystem takes a while (as it may: a connection pool, credentials)."""
    from emfast.io import _remote
    starting = _remote._filesystem

    def slow_start(*args, **kwargs):
        time.sleep(0.2)
        return starting(*args, **kwargs)

    _remote._filesystem = slow_start
    read, errors = {}, []

    def read_box(x):
        try:
            read[x] = lazy_box(volume, (0, 0, x), (8, 8, 8)).tobytes()
        except Exception as error:  # noqa: BLE001 - sent to the parent
            errors.append(repr(error))

    threads = [threading.Thread(target=read_box, args=(8 * i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put((read, errors))


def test_threads_reading_at_once_in_a_forked_worker_all_use_its_own_filesystem(written, served):
    """A DataLoader worker's producer threads, forked with a lazy remote volume: 13 of 20 epochs failed with
    fsspec's "This class is not fork-safe" (a review): the first thread marked the store as started in this
    process before replacing the parent's filesystem, and the others used the parent's meanwhile."""
    with ef.open(f"{served.url}/v3.zarr", in_memory=False) as lazy:
        exitcode, (read, errors) = in_a_forked_child(lazy, threads_read_in_child)
    assert exitcode == 0 and not errors, errors
    assert sorted(read) == [0, 8, 16, 24]
    for x, data in read.items():
        np.testing.assert_array_equal(np.frombuffer(data, np.uint8).reshape(8, 8, 8), written[1][:8, :8, x:x + 8])


def test_a_tensorstore_volume_is_refused_in_a_forked_child_not_aborted(written):
    """tensorstore aborts a forked child that uses it (SIGABRT: a DataLoader says only that a worker exited): the
    child gets an error saying what to do instead."""
    with ef.open(str(written[0] / "pcs"), in_memory=False, format="precomputed") as lazy:
        exitcode, message = in_a_forked_child(lazy, refused_in_child)
    assert exitcode == 0
    assert "read through tensorstore, which cannot be used in a process forked after it started" in message
    assert "'spawn'" in message


@pytest.mark.parametrize("fault", ["whole", "redirect"])
def test_tensorstore_behind_a_redirect_or_a_server_ignoring_ranges_says_so(served, fault):
    """tensorstore reads the sharded precomputed scale and follows no redirect (a CDN, a signed URL): the error
    called the volume's metadata malformed, or the box corrupt, quoting tensorstore's whole spec; a server that
    ignores Range requests made the box "corrupt" too."""
    with ef.open(f"{served.url}/pcs", in_memory=False, format="precomputed", storage_options=QUICK) as lazy:
        served.faults["/pcs/"] = [("redirect", served.url) if fault == "redirect" else fault] * 1000
        message = (r"the server redirected the request \(HTTP 302\), and tensorstore, which reads this volume, does "
                   r"not follow redirects" if fault == "redirect" else r"the server ignores HTTP Range requests")
        with pytest.raises(RemoteReadError, match=rf"{served.url}/pcs: the box at .*: {message}") as raised:
            lazy_box(lazy)
        assert "tensorstore_spec" not in str(raised.value)


@pytest.mark.parametrize("fault, message", [(403, "PERMISSION_DENIED"), ("hang", r"no answer within \d+ s \(3 requests in a row, each with 1 retries of 1 s\)")])
def test_tensorstore_reads_retry_time_out_and_fail_as_remote_reads(served, fault, message):
    """tensorstore reads the sharded precomputed scale: the storage options' retries and timeout bound its wait
    (a hanging server held it for as long as the server held the request), and a refusal is a RemoteReadError
    naming the URL (a CorruptChunkError before)."""
    with ef.open(f"{served.url}/pcs", in_memory=False, format="precomputed",
                 storage_options={"retries": 1, "timeout": 1}) as lazy:
        served.faults["/pcs/"] = [fault] * 1000
        start = time.perf_counter()
        with pytest.raises(RemoteReadError, match=rf"{served.url}/pcs: the box at .*{message}"):
            lazy_box(lazy)
        assert time.perf_counter() - start < 10
    # tensorstore keeps the requests emfast gave up on (cancelling its read drops only the result) and asks again
    # once the server lets them go: 68 requests in the window of a later test that counted its own (a flaky test)
    served.faults.clear()
    served.release_hangs()
    quiet_until(served, 0.5)


def quiet_until(server, seconds: float, limit: float = 10.0) -> None:
    """Wait until ``server`` has had no new request for ``seconds`` (at most ``limit`` seconds)."""
    count, since, deadline = len(server.requests), time.monotonic(), time.monotonic() + limit
    while time.monotonic() - since < seconds and time.monotonic() < deadline:
        time.sleep(0.02)
        if len(server.requests) != count:
            count, since = len(server.requests), time.monotonic()


# -- remote inputs of the commands ----------------------------------------------------------------------------------

def identity(batch):
    return batch


@pytest.mark.parametrize("where", ["http", "s3"])
def test_predict_and_convert_read_a_remote_input_as_they_read_a_local_one(request, written, where, tmp_path):
    root, data, stores = written
    url, args = remote_url(request, where, "zarr v2")
    with ef.open(url, in_memory=False, **args) as volume:
        ef.predict(identity, volume, str(tmp_path / "p.zarr/p"), patch_in=(8, 16, 16), blend="none")
        again = ef.predict(identity, volume, str(tmp_path / "p.zarr/p"), patch_in=(8, 16, 16), blend="none",
                           resume=True)
    ef.io.convert(url, str(tmp_path / "c.zarr/raw"), **args)
    assert again.computed == 0  # the record matched: same URL, same metadata
    local = str(root / stores["zarr v2"][0])
    ef.predict(identity, local, str(tmp_path / "local.zarr/p"), patch_in=(8, 16, 16), blend="none")
    predicted = ef.open(str(tmp_path / "p.zarr/p"))
    np.testing.assert_array_equal(predicted.array, ef.open(str(tmp_path / "local.zarr/p")).array)
    assert predicted.resolution == (40.0, 4.0, 4.0) and predicted.offset == (80.0, 8.0, 4.0)
    converted = ef.open(str(tmp_path / "c.zarr/raw"))
    np.testing.assert_array_equal(converted.array[0], data)
    assert converted.resolution == (40.0, 4.0, 4.0)


def test_resuming_from_a_remote_input_whose_metadata_changed_is_refused(written, served, tmp_path):
    import json
    import shutil
    root = written[0]
    shutil.copytree(root / "v3.zarr", root / "changing.zarr")
    try:
        url = f"{served.url}/changing.zarr"
        out = str(tmp_path / "p.zarr/p")
        ef.predict(identity, url, out, patch_in=(8, 16, 16), blend="none")
        metadata = json.loads((root / "changing.zarr/zarr.json").read_text())
        metadata["attributes"] = {"rewritten": True}
        (root / "changing.zarr/zarr.json").write_text(json.dumps(metadata))
        with pytest.raises(ef.inference.OutputExistsError, match=r"changing.zarr/.* has other array metadata"):
            ef.predict(identity, url, out, patch_in=(8, 16, 16), blend="none", resume=True)
    finally:
        shutil.rmtree(root / "changing.zarr")


@pytest.mark.parametrize("name", ["zarr v2", "precomputed"])
def test_info_shows_a_remote_volume(written, served, name, capsys):
    from emfast.cli import main
    path, _ = written[2][name]
    url = f"{served.url}/{path}"
    assert main(["info", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(url) and "shape=(20, 30, 40) dtype=uint8 chunks=(8, 8, 8)" in out, out
    assert "resolution=(40.0, 4.0, 4.0)" in out and "values from 16 of 60 chunks" in out, out


def test_info_and_convert_take_storage_options_on_the_command_line(written, served, tmp_path, capsys):
    """emfast info on a server that never answered waited 6 attempts of 30 s (187 s), and could not be told a
    timeout: the CLI took no storage options (nor could convert reach an S3-compatible endpoint by option)."""
    from emfast.cli import main
    url = f"{served.url}/{written[2]['zarr v2'][0]}"
    quick = json.dumps({"timeout": 1, "retries": 1})
    served.faults["/.zarray"] = ["hang"] * 10
    start = time.perf_counter()
    assert main(["info", url, "--storage-options", quick]) == 2
    assert time.perf_counter() - start < 30
    assert "cannot read it after 2 attempts (no answer within 1 s each" in capsys.readouterr().err
    served.faults.clear()
    served.release_hangs()
    assert main(["convert", url, str(tmp_path / "copy.zarr/raw"), "--storage-options", quick]) == 0
    np.testing.assert_array_equal(ef.open(tmp_path / "copy.zarr/raw").array[0], written[1])
    assert main(["info", url, "--storage-options", '{"anon": true}']) == 2  # an option of s3's, not of https'
    assert "storage_options hold an option this URL's filesystem does not take" in capsys.readouterr().err
    for bad, words in (("{anon: true}", "not JSON"), ("[1, 2]", "expected a JSON object")):
        with pytest.raises(SystemExit):
            main(["info", url, "--storage-options", bad])
        assert words in capsys.readouterr().err
    assert main(["info", str(written[0] / written[2]["zarr v2"][0]), "--storage-options", quick]) == 2
    assert "storage_options apply to remote stores" in capsys.readouterr().err


def test_a_config_gives_storage_options_for_a_samples_remote_files(written, s3, tmp_path):
    from emfast.config import dump_config
    config = tmp_path / "train.yaml"
    text = f"""
data:
  samples:
    - file: s3://{BUCKET}/v3.zarr
      raw: ""
      lazy: true
      storage_options: {{endpoint_url: "{s3}"}}
loader:
  patch: [6, 12, 14]
  batch_size: 2
"""
    config.write_text(text)
    loaded = load_config(config)
    assert f"storage_options: {{endpoint_url: '{s3}'}}" in dump_config(loaded)
    dataset = loaded.dataset()
    np.testing.assert_array_equal(lazy_box(dataset.samples[0].raw), written[1])
    dataset.close()
    config.write_text(text.replace(f"s3://{BUCKET}/v3.zarr", str(written[0] / "v3.zarr")))
    with pytest.raises(ConfigError, match="line 7: data.samples\\[0\\].storage_options: .*this sample reads none"):
        load_config(config)


def test_a_url_as_output_or_with_a_query_is_refused_by_name(tmp_path, monkeypatch, capsys):
    """Found by a helper converting remote stores: `convert ... s3://bkt/out.zarr/raw` said "wrote" and made a
    local folder `s3:` (nothing reached the bucket); a URL with `?token=...` glued the query to every key and the
    metadata was "malformed". Both are refused, naming what to do."""
    from emfast.cli import main
    monkeypatch.chdir(tmp_path)
    zarr.create_array(str(tmp_path / "in.zarr"), shape=(4, 8, 8), dtype=np.uint8)[...] = 1
    for destination in ("s3://bkt/out.zarr/raw", "https://example.org/out.h5/raw"):
        assert main(["convert", str(tmp_path / "in.zarr"), destination]) == 2
        assert f"destination={destination} is a URL" in capsys.readouterr().err
        with pytest.raises(ValueError, match="is a URL"):
            ef.predict(lambda batch: batch, np.zeros((4, 8, 8), np.uint8), destination, patch_in=(4, 8, 8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr"]  # no folder "s3:" or "https:"
    for url in ("http://127.0.0.1:9/v2.zarr?token=abc", "https://127.0.0.1:9/v2.zarr#frag"):
        with pytest.raises(ValueError, match=r"'#' starts a fragment and '\?' a query, which name no object"):
            ef.open(url)


@pytest.mark.parametrize("outcome", ["result", "its own TimeoutError"])
def test_a_read_ending_as_its_wait_slice_times_out_gives_its_outcome(outcome):
    """A tensorstore read finishing just as a 50 ms wait slice timed out was reported as "no answer within 549 s"
    (a helper's loader over a sharded precomputed volume failed 1 run in 8 to 32): the slice's own TimeoutError
    was raised for a future that had succeeded."""
    import concurrent.futures

    from emfast.io._remote import _wait, abandoned_when

    class EndsAsTheSliceTimesOut:
        def __init__(self):
            self.calls = 0

        def result(self, timeout=None):
            self.calls += 1
            if self.calls == 1:
                raise concurrent.futures.TimeoutError()  # the slice; the read ends right after
            if outcome == "result":
                return b"chunk"
            raise TimeoutError("the read's own")

        def done(self):
            return self.calls >= 1

    with abandoned_when(lambda: False):
        if outcome == "result":
            assert _wait(EndsAsTheSliceTimesOut(), time.monotonic() + 60) == b"chunk"
        else:
            with pytest.raises(TimeoutError, match="the read's own"):
                _wait(EndsAsTheSliceTimesOut(), time.monotonic() + 60)


def test_a_remote_input_replaced_while_predict_reads_it_ends_the_run_unfinished(tmp_path):
    """A remote input was known by the metadata read when it was opened, and compared with itself at the end: a
    store replaced while predict read it (other data type, other values) gave an output mixing both versions,
    recorded complete. Its metadata is now read again before the output is recorded complete."""
    from emfast.io import InputChangedError

    def write(value, dtype):
        shutil.rmtree(tmp_path / "in.zarr", ignore_errors=True)
        zarr.create_array(str(tmp_path / "in.zarr"), shape=(16, 32, 32), chunks=(8, 16, 16), dtype=dtype,
                          zarr_format=3)[...] = value

    write(10, np.uint8)
    calls = []

    def model(batch):
        calls.append(1)
        if len(calls) == 1:
            write(100, np.int8)
        return batch

    with http_server(tmp_path) as server:
        with pytest.raises(InputChangedError, match=r"in.zarr.* changed while .*p.zarr/p was written from it \(its "
                                                    r"array metadata zarr.json differs"):
            ef.predict(model, f"{server.url}/in.zarr", str(tmp_path / "p.zarr/p"), patch_in=(8, 16, 16),
                       blend="none", block=(8, 16, 16), chunks=(8, 16, 16), threads=1, batch_size=1)
    assert zarr.open_array(str(tmp_path / "p.zarr/p")).attrs["emfast_predict"]["complete"] is False


def test_a_bucket_that_does_not_exist_is_named_not_read_as_missing_chunks(written, s3, tmp_path):
    """S3 answers a key of a bucket that does not exist (deleted, or asked at the wrong endpoint) with 404
    NoSuchBucket: read as a missing chunk, a lazy volume gave fill values, silently, and opening said "no zarr
    array or group" as for a wrong path. Without any credentials, the error said NoCredentialsError alone."""
    options = {"endpoint_url": s3, "retries": 1}
    with pytest.raises(RemoteReadError, match=r"s3://nobucket/v3.zarr/zarr.json: the bucket does not exist "
                                              r"\(NoSuchBucket\)"):
        ef.open("s3://nobucket/v3.zarr", storage_options=options)
    S3_FAULTS.clear()
    try:
        for store in ("v3.zarr", "sharded.zarr"):  # the sharded one read through zarr-python's store
            with ef.open(f"s3://{BUCKET}/{store}", in_memory=False, storage_options=options) as lazy:
                S3_FAULTS[f"/{store}/c/"] = [404] * 100
                with pytest.raises(RemoteReadError, match=rf"{store}/c/[\d/]+: the bucket does not exist"):
                    lazy_box(lazy)
            S3_FAULTS.clear()
    finally:
        S3_FAULTS.clear()
    # a process of its own: this one's filesystems (fsspec caches them) hold credentials
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environment.update(HOME=str(tmp_path), AWS_CONFIG_FILE=str(tmp_path / "none"), PYTHONPATH=os.pathsep.join(sys.path),
                       AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    script = (f"import emfast as ef\ntry:\n    ef.open('s3://{BUCKET}/v3.zarr', storage_options={options!r})\n"
              "except ef.io.RemoteReadError as error:\n"
              "    print('denied' if isinstance(error, ef.io._remote.RemoteAccessDenied) else 'other', error)")
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120)
    assert re.search(r"^denied .*zarr.json: no S3 credentials were found: .*storage_options="
                     r"\{'anon': True\}", done.stdout), done.stdout + done.stderr


def test_tensorstore_s3_reads_pay_as_requested_and_name_an_unused_profile(monkeypatch):
    """The scales tensorstore reads dropped ``requester_pays``, and a denial blamed the credentials; tensorstore
    sends it as x-amz-requester-payer, which S3 does not read, so a denial says that. A denial told a user with
    AWS_PROFILE set that credentials come from the AWS_* variables, which they had set."""
    monkeypatch.setenv("AWS_PROFILE", "lab")
    refused = ValueError("Error reading: PERMISSION_DENIED: AccessDenied")
    store = RemoteStore("s3://bucket-x/pcs", {"requester_pays": True, "endpoint_url": "http://127.0.0.1:1"})
    assert store.kvstore_spec()["requester_pays"] is True
    assert "sends the requester-pays header as x-amz-requester-payer" in str(store.tensorstore_failure(refused, "pcs"))
    denied = str(RemoteStore("s3://bucket-x/pcs", {"endpoint_url": "http://127.0.0.1:1"}).tensorstore_failure(
        refused, "pcs"))
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in denied and "may not use the profile 'lab'" in denied


def test_credentials_botocore_could_not_obtain_and_timeouts_are_named():
    """An SSO login expired or a failing credential_process was "cannot read it (SSOTokenLoadError ...)", and an
    S3 request with no answer was botocore's ReadTimeoutError, not the timeout emfast set."""
    from emfast.io._remote import _no_credentials, describe_error
    for name in ("SSOTokenLoadError", "CredentialRetrievalError", "TokenRetrievalError"):
        error = type(name, (Exception,), {})("botocore's words")
        assert "could not be obtained" in _no_credentials(error)
    timed_out = type("ReadTimeoutError", (Exception,), {})("Read timeout on endpoint URL")
    assert describe_error(timed_out, 2.0) == "no answer within 2 s each (storage_options timeout)"


@pytest.mark.parametrize("status", [500, 503])
def test_s3_internal_errors_and_slow_downs_are_retried(written, s3, status):
    """s3fs turns S3's 500 InternalError and 503 SlowDown into OSErrors that carry only S3's message: they were
    taken as permanent, and the read failed after s3fs's single retry whatever ``retries`` said."""
    chunk = "/v3.zarr/c/1/0/2"
    S3_FAULTS.clear()
    S3_FAULTS[chunk] = [status] * 3
    try:
        with ef.open(f"s3://{BUCKET}/v3.zarr", in_memory=False,
                     storage_options={"endpoint_url": s3, "retries": 5}) as lazy:
            np.testing.assert_array_equal(lazy_box(lazy), written[1])
        assert S3_FAULTS[chunk] == []  # every fault was met, and the read went on
    finally:
        S3_FAULTS.clear()


@pytest.mark.parametrize("name", ["zarr v3", "N5"])
def test_closing_a_volume_ends_the_reads_its_cache_announced(written, served, name):
    """A closed loader and volume left the chunk reads announced for read-ahead running, each retried against a
    server that did not answer (about six times the timeout per chunk)."""
    path, args = written[2][name]
    lazy = ef.open(f"{served.url}/{path}", in_memory=False, storage_options={"timeout": 0.5, "retries": 5}, **args)
    served.faults[f"/{path}/"] = ["hang"] * 1000  # every chunk request hangs (the metadata was read)
    before = len(served.requests)
    loader = ef.Loader(lazy, patch=(6, 12, 14), batch_size=2, threads=2).start()
    deadline = time.monotonic() + 10
    while len(served.requests) < before + 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    loader.close()
    lazy.close()
    # Requests sent before close may reach a loaded server's threads a little later (CI: 8 within 20 ms): counted
    # once the server has had nothing new for 0.2 s, less than the 0.5 s after which a read still running retries.
    quiet_until(served, 0.2, limit=5)
    closed = len(served.requests)
    time.sleep(2.0)  # each announced read would have timed out and asked again, at least once
    assert len(served.requests) == closed
    assert threads_end()


def test_an_s3_request_is_made_as_many_times_as_the_retries_say(written, s3):
    """botocore's ``max_attempts`` counts retries, not attempts: each of emfast's attempts was two requests, and a
    hung chunk took twice the time its ``timeout`` and ``retries`` promised."""
    chunk = "/v3.zarr/c/1/0/2"
    S3_FAULTS.clear()
    S3_FAULTS[chunk] = [500] * 10
    try:
        with ef.open(f"s3://{BUCKET}/v3.zarr", in_memory=False,
                     storage_options={"endpoint_url": s3, "retries": 1}) as lazy:
            with pytest.raises(RemoteReadError, match=f"{chunk}: cannot read it after 2 attempts"):
                lazy_box(lazy)
        assert len(S3_FAULTS[chunk]) == 10 - 2
    finally:
        S3_FAULTS.clear()


CHUNK_FILES = {"zarr v3": ("c/0/0/0", "c/0/0/1"), "zarr v3 sharded": ("c/0/0/0", "c/0/0/1"),
               "N5": ("0/0/0", "1/0/0"), "precomputed": ("3-11_5-13_7-15.gz", "11-19_5-13_7-15.gz")}


@pytest.mark.parametrize("name", list(CHUNK_FILES))
@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_a_chunk_that_changes_between_two_reads_is_an_error_naming_it(written, served, name, change):
    """A lazy volume reads a chunk again once its cache dropped it; a store written meanwhile gave batches mixing
    its old and new contents, with no error (the metadata stays the same)."""
    root, data, stores = written
    path, args = stores[name]
    container, _, dataset = path.partition("/")
    copy = f"changing-{name.replace(' ', '-')}{os.path.splitext(container)[1]}"
    shutil.copytree(root / container, root / copy)
    volume = root / copy / dataset
    chunk, other = CHUNK_FILES[name]
    if name == "precomputed":
        chunk, other = (f"{json.loads((volume / 'info').read_text())['scales'][0]['key']}/{c}" for c in (chunk, other))
    url = f"{served.url}/{copy}/{dataset}".rstrip("/")
    try:
        with ef.open(url, in_memory=False, cache_bytes=2 * 8 ** 3, **args) as lazy:
            np.testing.assert_array_equal(lazy_box(lazy), data)  # each chunk read once, most dropped after
            if change == "rewritten":
                shutil.copyfile(volume / other, volume / chunk)  # another chunk's bytes
            else:
                os.remove(volume / chunk)
            now = "other bytes, as many" if change == "rewritten" else "absent"
            with pytest.raises(RemoteReadError, match=rf"{url}/{chunk}: changed while emfast read the store "
                                                      rf"\(\d+ bytes when read before, {now} now\)"):
                lazy_box(lazy)
    finally:
        shutil.rmtree(root / copy)


def test_chunks_read_again_unchanged_are_no_error(written, served):
    path, args = written[2]["zarr v3"]
    with ef.open(f"{served.url}/{path}", in_memory=False, cache_bytes=2 * 8 ** 3, **args) as lazy:
        for _ in range(3):
            np.testing.assert_array_equal(lazy_box(lazy), written[1])


def test_chunk_digests_forget_a_chunk_whose_bucket_is_full_and_never_mix_two():
    from emfast.io._rereads import WAYS, ChunkDigests
    digests = ChunkDigests(most_slots=WAYS)  # one bucket
    paths = [f"c/{i}" for i in range(WAYS + 1)]
    assert all(digests.changed(path, b"x") is None for path in paths)  # the last takes one of the others' slots
    remembered = [path for path in paths if (hash(path) or 1) in digests._paths]
    assert len(remembered) == WAYS and paths[-1] in remembered
    assert digests.changed(remembered[0], b"w") == "1 bytes when read before, other bytes, as many now"
    assert digests.changed(remembered[0], None) == "1 bytes when read before, absent now"
    assert digests.changed(remembered[0], b"x") is None  # the first bytes are kept
    forgotten, = set(paths) - set(remembered)
    assert digests.changed(forgotten, b"w") is None  # remembered anew, unchecked


def test_chunk_digests_grow_with_the_chunks_read_and_keep_them():
    from emfast.io._rereads import FIRST_SLOTS, ChunkDigests
    digests = ChunkDigests()
    paths = [f"c/{i}" for i in range(3 * FIRST_SLOTS)]
    assert all(digests.changed(path, path.encode()) is None for path in paths)
    assert FIRST_SLOTS < digests._paths.size <= 16 * FIRST_SLOTS  # grown, and sized by the chunks read
    table = digests._paths
    remembered = [path for path in paths if (hash(path) or 1) in table[(hash(path) or 1) % len(table)]]
    assert len(remembered) > 0.9 * len(paths)  # doubling loses none; a bucket that filled up forgot one (5 %)
    assert digests.changed(remembered[0], b"other") == f"{len(remembered[0])} bytes when read before, 5 bytes now"

"""The predict section as ``emfast check`` and ``emfast predict`` read it: a predict-only config is checked as it
is run, the model factory is imported (never called) by check, and every problem names the config file, the line
and the key path (``predict.model_args.gian``); a data file given instead of a config is named as such."""
import re
import sys
import textwrap

import h5py
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emfast.cli import main
from emfast.config import ConfigError, check_config, load_config, load_predict_config

NETS = '''\
import pathlib

import numpy as np


def load(gain=1.0):
    pathlib.Path("factory-called").touch()
    def network(batch):
        return batch[:, :, 2:-2, 4:-4, 4:-4] * np.float32(gain)
    return network


def needs_checkpoint(checkpoint, gain=1.0):
    return open(checkpoint, "rb")
'''

PREDICT = """\
predict:
  model: nets:load
  model_args: {gain: 2.0}
  input: {file: in.h5, dataset: raw}
  output: out.zarr/pred
  patch_in: [10, 20, 20]
  patch_out: [6, 12, 12]
  overlap: [2, 4, 4]
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder as a user has it: the network's module, an HDF5 input with chunks (8, 16, 16), and the working
    directory there (so a factory that was called leaves its marker)."""
    (tmp_path / "nets.py").write_text(NETS)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.random.default_rng(0).integers(0, 256, (24, 48, 48), dtype=np.uint8),
                         chunks=(8, 16, 16))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))  # sys.path is restored after the test
    return tmp_path


def _config(folder, text, name="predict.yaml"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _line_of(text, needle):
    return next(n for n, line in enumerate(text.splitlines(), start=1) if needle in line)


def _check_and_predict_fail(path, capsys):
    """The error of ``emfast check`` and of ``emfast predict`` on ``path``, which must be the same one line."""
    assert main(["check", str(path)]) == 2
    checked = capsys.readouterr()
    assert main(["predict", str(path)]) == 2
    predicted = capsys.readouterr().err
    assert checked.out == "" and checked.err == predicted and "Traceback" not in predicted
    return predicted


def test_check_accepts_the_predict_only_config_that_predict_runs(folder, capsys):
    path = _config(folder, PREDICT)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"predict: model nets:load ({folder / 'nets.py'}) with gain=2.0" in out
    assert "input" in out and "shape (24, 48, 48)" in out and out.rstrip().endswith("valid")
    assert not (folder / "factory-called").exists()  # check imports the factory, never calls it
    assert main(["predict", str(path)]) == 0
    assert (folder / "factory-called").exists() and (folder / "out.zarr").is_dir()


@pytest.mark.parametrize("input_", ["{file: FOLDER/in.h5, dataset: /raw}", "'file://FOLDER/in.h5/raw'",
                                    "{file: 'file://localhost/FOLDER/in.h5', dataset: raw}", "~/in.h5/raw",
                                    "{file: FOLDER/in.h5/raw, dataset: null}"])
def test_the_input_as_users_write_paths_elsewhere(folder, capsys, monkeypatch, input_):
    """An HDF5 dataset named with its leading "/" (as h5py names it; it replaced the file's path), cloud-volume's
    and tensorstore's file:// URLs (read as a path relative to the config), ~, and a dataset left empty (null: not
    given, as it always was; refused for a while, a helper found)."""
    monkeypatch.setenv("HOME", str(folder))
    path = _config(folder, PREDICT.replace("{file: in.h5, dataset: raw}", input_.replace("FOLDER", str(folder))))
    assert main(["predict", str(path)]) == 0, capsys.readouterr().err
    assert (folder / "out.zarr" / "pred").is_dir()


@pytest.mark.parametrize("normalize", ["[1.0e300, 0]", "{mean: 0, std: 1.0e-45}"])
def test_check_refuses_a_normalisation_float32_cannot_apply_as_predict_does(folder, capsys, normalize):
    """``emfast check`` said valid, then predict refused the setting without naming the config's key."""
    text = PREDICT + f"  normalize: {normalize}\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"line {_line_of(text, 'normalize')}: predict.normalize: " in error and "beyond float32" in error


def test_check_lays_the_blocks_predict_lays_within_the_memory_budget(folder, capsys):
    """`emfast check` printed the blocks of no budget: a config with memory: 4MiB was checked as 1 block and ran
    as 15 (a helper auditing the docs' promises)."""
    import re
    path = _config(folder, PREDICT + "  memory: 1MiB\n  chunks: [8, 16, 16]\n  channels: 1\n")
    assert main(["check", str(path)]) == 0
    checked = int(re.search(r"in (\d+) blocks of", capsys.readouterr().out).group(1))
    assert main(["predict", str(path)]) == 0
    ran = int(re.search(r"(\d+) of \1 blocks", capsys.readouterr().out).group(1))
    assert checked == ran > 1


def test_an_output_store_reached_through_a_link_keeps_the_name_that_says_its_format(folder, capsys):
    """``fast.zarr`` a link to a scratch folder without a suffix: the config resolved the whole path first and
    refused the output it led to ("must name a dataset in a .zarr or .h5 container ... got .../scratch/pred"),
    where the Python API writes it. The folders above the store are still resolved."""
    (folder / "scratch").mkdir()
    (folder / "fast.zarr").symlink_to(folder / "scratch")
    (folder / "configs").mkdir()
    (folder / "configs" / "nets.py").write_text(NETS)  # the model beside the config, as the other tests have it
    path = _config(folder, PREDICT.replace("in.h5", "../in.h5").replace("out.zarr/pred", "../fast.zarr/pred"),
                   "configs/predict.yaml")
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    assert f"output {folder / 'fast.zarr' / 'pred'}" in capsys.readouterr().out
    assert main(["predict", str(path)]) == 0, capsys.readouterr().err
    assert (folder / "scratch" / "pred").is_dir()


@pytest.mark.parametrize("layout", ["module", "namespace package", "module named as one of the standard library",
                                    "module importing one beside it"])
def test_a_dask_engine_gets_the_model_beside_the_config_whatever_the_working_directory(folder, layout):
    """The model's module beside the config is imported with the config's folder on the path, but Dask worker
    processes could not import it by name ("No module named 'nets'", reported as an internal error) unless run
    from that folder: it now travels with its code, and so do the modules beside it that it imports (a helper's:
    "No module named 'helpers'" on Dask, where the local engine ran)."""
    import os
    import subprocess
    from pathlib import Path
    pytest.importorskip("distributed")
    # a namespace package has no __init__.py; a worker finds the standard library's nntplib, not this one
    module = folder / {"module": "netclass.py", "namespace package": "nsnets/netclass.py"}.get(layout, "nntplib.py")
    module.parent.mkdir(exist_ok=True)
    module.write_text(
        "import numpy as np\n\n\nclass Crop:  # an instance of a class of this module: pickled by name\n"
        "    def __call__(self, batch):\n        return batch[:, :, 2:-2, 4:-4, 4:-4] * np.float32(2)\n\n\n"
        "def load():\n    return Crop()\n")
    if layout == "module importing one beside it":
        (folder / "cropping.py").write_text("import numpy as np\n\n\ndef crop_twice(batch):\n"
                                            "    return batch[:, :, 2:-2, 4:-4, 4:-4] * np.float32(2)\n")
        module.write_text("from cropping import crop_twice\n\n\nclass Crop:\n    def __call__(self, batch):\n"
                          "        return crop_twice(batch)\n\n\ndef load():\n    return Crop()\n")
    name = {"module": "netclass", "namespace package": "nsnets.netclass"}.get(layout, "nntplib")
    text = PREDICT.replace("nets:load", f"{name}:load").replace("  model_args: {gain: 2.0}\n", "")
    path = _config(folder, text + "  engine: {dask: {workers: 1}}\n")
    (folder / "elsewhere").mkdir()
    source = str(Path(__import__("emfast").__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-m", "emfast", "predict", str(path)], cwd=folder / "elsewhere",
                          env=dict(os.environ, PYTHONPATH=source), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["predict", str(_config(folder, text.replace("out.zarr", "local.zarr"), "local.yaml"))]) == 0
    import zarr
    np.testing.assert_array_equal(zarr.open_array(str(folder / "out.zarr/pred"))[...],
                                  zarr.open_array(str(folder / "local.zarr/pred"))[...])


def test_check_refuses_a_block_that_memory_cannot_hold_as_predict_does(folder, capsys):
    """`emfast check` said "valid", and only the run refused the block, after loading the model and calling it
    once. Check counts the output channels as `channels` says, or as 1."""
    text = PREDICT + "  chunks: [8, 16, 16]\n  block: [24, 48, 48]\n  memory: 2MiB\n"
    path = _config(folder, text)
    error = _check_and_predict_fail(path, capsys)
    assert re.search(r"line 10: predict\.block: block=\(24, 48, 48\) needs about \d+ bytes .* more than the -?\d+ "
                     r"of memory=2097152 .* \(counting 1 output channel: the model may have more\)", error), error
    assert not (folder / "factory-called").exists()
    _config(folder, text.replace("memory: 2MiB", "memory: 64MiB"))
    assert main(["check", str(path)]) == 0


@pytest.mark.parametrize("training", ["", "data: {samples: [{file: in.h5, raw: raw}]}\nloader: {patch: [8, 16, 16]}\n"])
def test_an_empty_predict_section_is_refused_by_check_as_by_predict(folder, capsys, training):
    """`emfast check` said "valid" of a config whose `predict:` held nothing, which `emfast predict` refuses."""
    path = _config(folder, "predict:\n" + training)
    error = _check_and_predict_fail(path, capsys)
    assert error.startswith(f"emfast: error: {path}, line 1: predict: expected a mapping"), error


def test_check_of_a_training_config_with_a_predict_section_checks_both(folder, capsys):
    text = PREDICT.replace("nets:load", "nets:lod") + "data: {samples: [{file: in.h5, raw: raw}]}\n" \
                                                      "loader: {patch: [8, 16, 16]}\n"
    path = _config(folder, text)
    assert main(["check", str(path)]) == 2
    assert f"{path}, line 2: predict.model: the module 'nets'" in capsys.readouterr().err
    _config(folder, text.replace("nets:lod", "nets:load"))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "sample" in out and "predict: model nets:load" in out and out.rstrip().endswith("valid")
    assert out.splitlines().count("valid") == 1


@pytest.mark.parametrize("module, model, words", [
    (None, "nosuch:load", ["cannot import the module 'nosuch'", "No module named 'nosuch'"]),
    ("def load(:\n", "broken:load", ["SyntaxError", "broken.py, line 1"]),
    ("import os\nimport not_installed_anywhere\n", "broken:load",
     ["No module named 'not_installed_anywhere'", "broken.py, line 2"]),
    ("raise RuntimeError('needs a GPU at import')\n", "broken:load",
     ["RuntimeError: needs a GPU", "broken.py, line 1"]),
    (None, "nets:lod", ["has no 'lod'; did you mean 'load'?"]),
    ("load = 3\n", "broken:load", ["broken:load is the integer 3, not a factory function"]),
])
def test_a_model_that_cannot_be_imported_names_the_model_key_and_line(folder, capsys, module, model, words):
    if module is not None:
        (folder / "broken.py").write_text(module)
    text = PREDICT.replace("nets:load", model)
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert error.startswith(f"emfast: error: {folder / 'predict.yaml'}, line 2: predict.model: "), error
    for word in words:
        assert word in error


@pytest.mark.parametrize("args, key, words", [
    ("{gian: 2.0}", "predict.model_args.gian", ["takes no argument 'gian'; did you mean 'gain'?"]),
    ("{gain: 2.0, depth: 3}", "predict.model_args.depth", ["takes no argument 'depth'", "(it takes: gain)"]),
])
def test_model_args_that_the_factory_does_not_take_name_their_key(folder, capsys, args, key, words):
    text = PREDICT.replace("{gain: 2.0}", args)
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"predict.yaml, line 3: {key}: " in error
    for word in words:
        assert word in error
    assert not (folder / "factory-called").exists()


def test_a_factory_that_fails_names_the_model_key_and_the_line_that_raised(folder, capsys):
    text = PREDICT.replace("nets:load", "nets:needs_checkpoint")
    path = _config(folder, text)
    assert main(["check", str(path)]) == 2
    assert "predict.yaml, line 3: predict.model_args: nets:needs_checkpoint needs 'checkpoint'" in \
        capsys.readouterr().err
    _config(folder, text.replace("{gain: 2.0}", "{checkpoint: unet.pt}"))
    assert main(["check", str(path)]) == 0  # the factory is not called: its checkpoint is not looked at
    capsys.readouterr()
    assert main(["predict", str(path)]) == 2
    error = capsys.readouterr().err
    assert "predict.yaml, line 2: predict.model: nets:needs_checkpoint(**model_args) failed: FileNotFoundError" \
        in error and "unet.pt" in error and f"{folder / 'nets.py'}, line 14)" in error


def test_a_rerun_of_a_finished_prediction_with_resume_never_loads_its_model(folder, capsys):
    """emfast predict --resume of an output already complete leaves it as it is without calling the model's
    factory (a checkpoint read, a device set up, for nothing); an unfinished one loads the model to go on."""
    zarr = pytest.importorskip("zarr")
    path = _config(folder, PREDICT)
    assert main(["predict", str(path)]) == 0
    written = zarr.open_array(str(folder / "out.zarr"), path="pred", mode="r")[...]
    (folder / "factory-called").unlink()
    assert main(["predict", str(path), "--resume"]) == 0
    assert not (folder / "factory-called").exists()
    np.testing.assert_array_equal(zarr.open_array(str(folder / "out.zarr"), path="pred", mode="r")[...], written)
    (folder / "flaky.py").write_text(FLAKY)
    unfinished = _config(folder, PREDICT.replace("nets:load", "flaky:load"), "unfinished.yaml")
    assert main(["predict", str(unfinished), "--overwrite"]) == 2  # its network fails: the output is left unfinished
    assert "out of memory, this once" in capsys.readouterr().err
    (folder / "factory-called").unlink()
    assert main(["predict", str(unfinished), "--resume"]) == 0
    assert (folder / "factory-called").exists()
    np.testing.assert_array_equal(zarr.open_array(str(folder / "out.zarr"), path="pred", mode="r")[...], written)
    capsys.readouterr()


@pytest.mark.parametrize("complete", [False, True])
def test_a_resume_after_a_run_killed_while_creating_the_output_replaces_what_it_left(folder, capsys, complete):
    """The lock file's mark of an output being created (a run killed before its record and flags were both
    written, or a crash after) has --resume replace it and compute it anew: the look for a finished output does
    not consume the mark, which the run itself must find."""
    import json
    zarr = pytest.importorskip("zarr")
    path = _config(folder, PREDICT)
    assert main(["predict", str(path)]) == 0
    written = zarr.open_array(str(folder / "out.zarr"), path="pred", mode="r")[...]
    metadata = folder / "out.zarr" / "pred" / "zarr.json"
    document = json.loads(metadata.read_text())
    document["attributes"]["emfast_predict"]["complete"] = complete
    metadata.write_text(json.dumps(document))
    for chunk in (folder / "out.zarr" / "pred" / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(b"")  # what the killed run wrote is not to be kept
    (folder / ".out.zarr.emfast-lock").write_text(json.dumps({"pid": 999999, "creating": "pred"}))
    (folder / "factory-called").unlink()
    assert main(["predict", str(path), "--resume"]) == 0, capsys.readouterr().err
    assert (folder / "factory-called").exists()
    np.testing.assert_array_equal(zarr.open_array(str(folder / "out.zarr"), path="pred", mode="r")[...], written)
    assert "creating" not in json.loads((folder / ".out.zarr.emfast-lock").read_text())
    capsys.readouterr()


FLAKY = NETS.replace("    def network(batch):\n", """    calls = []
    def network(batch):
        calls.append(1)
        if len(calls) == 2 and not pathlib.Path("failed-once").exists():  # after the output was made
            pathlib.Path("failed-once").touch()
            raise RuntimeError("out of memory, this once")
""")


def test_a_factory_returning_no_network_is_the_users_error_at_the_model_key(folder, capsys):
    """A factory returning its checkpoint's state dict (not callable) was reported as a bug in emfast, exit 1."""
    (folder / "statedict.py").write_text("def load(gain=1.0):\n    return {'conv.weight': [gain]}\n")
    path = _config(folder, PREDICT.replace("nets:load", "statedict:load"))
    assert main(["predict", str(path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"emfast: error: {path}, line 2: predict.model: statedict:load(**model_args) returned ")
    assert "not a network" in error
    (folder / "pair.py").write_text("def load(gain=1.0):\n    return ('unet', {str(k): [gain] * 9 for k in range(200)})\n")
    _config(folder, PREDICT.replace("nets:load", "pair:load"))
    assert main(["predict", str(path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # (model, checkpoint): shortened, not 42,000 characters
    assert "returned a tuple ('unet', {'0': [2.0, 2.0," in error and len(error) < 400, error


@pytest.mark.parametrize("old, new, key, words", [
    ("patch_out: [6, 12, 12]", "patch_out: [5, 12, 12]", "predict.patch_out", ["by an even number"]),
    ("overlap: [2, 4, 4]", "overlap: [2, 12, 4]", "predict.overlap", ["must be smaller than patch_out"]),
    ("overlap: [2, 4, 4]", "overlap: [2, 4, 4]\n  roi: {start: [0, 0, 0], stop: [30, 48, 48]}", "predict.roi",
     ["inside the volume of shape (24, 48, 48)"]),
    ("overlap: [2, 4, 4]", "overlap: [2, 4, 4]\n  block: [12, 16, 16]", "predict.block",
     ["multiple of the output chunks (24, 48, 48)"]),
    ("dataset: raw}", "dataset: rwa}", "predict.input.dataset", ["rwa"]),
    ("file: in.h5,", "file: missing.h5,", "predict.input.file", ["missing.h5"]),
])
def test_values_that_do_not_fit_the_input_name_their_key_and_line(folder, capsys, old, new, key, words):
    text = PREDICT.replace(old, new)
    error = _check_and_predict_fail(_config(folder, text), capsys)
    line = _line_of(text, key.split(".")[-1] + ":") if "input" not in key else _line_of(text, "input:")
    assert f"predict.yaml, line {line}: {key}: " in error, error
    for word in words:
        assert word in error
    assert not (folder / "out.zarr").exists()


def test_threads_far_beyond_the_cores_are_refused_by_check_as_by_predict_except_on_dask(folder, capsys):
    """emfast check said valid, emfast predict refused it (a second review); a Dask engine starts no reader
    threads here, so the cores of the machine that submits do not limit it."""
    text = PREDICT + "  threads: 1000\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"predict.yaml, line {_line_of(text, 'threads:')}: predict.threads: threads=1000 is far beyond" in error
    from emfast.config import load_predict_config
    assert load_predict_config(_config(folder, text + "  engine: {dask: {workers: 1}}\n")).options["threads"] == 1000


def test_a_dask_engine_with_an_hdf5_output_is_refused_by_check_as_by_predict(folder, capsys):
    """emfast check said valid; emfast predict then refused it naming the Python argument client=, with no key or
    line (a helper's trial)."""
    text = PREDICT.replace("out.zarr/pred", "out.h5/pred") + "  engine: {dask: {workers: 1}}\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"predict.yaml, line {_line_of(text, 'output:')}: predict.output: a Dask engine writes from many " \
           "processes at once, which HDF5 does not allow" in error
    assert not (folder / "out.h5").exists()


def test_a_dask_scheduler_that_does_not_answer_is_named_at_its_address(folder, capsys):
    """A wrong scheduler address failed after Dask's connect timeout with its bare message ("Timed out trying to
    connect"), no key, no line (a helper's trial)."""
    dask = pytest.importorskip("dask")
    pytest.importorskip("distributed")
    from remote_servers import free_port

    text = PREDICT + f"  engine: {{dask: {{address: 'tcp://127.0.0.1:{free_port()}'}}}}\n"
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        assert main(["predict", str(_config(folder, text))]) == 2
    error = capsys.readouterr().err
    assert f"predict.yaml, line {_line_of(text, 'engine:')}: predict.engine.dask.address: no Dask scheduler " \
           "answers at 'tcp://127.0.0.1:" in error and "Traceback" not in error
    assert not (folder / "out.zarr").exists()


def test_a_memory_in_scientific_notation_is_a_number_of_bytes(folder, capsys):
    """memory: 1e9 is a number in YAML 1.2 (PyYAML read the string '1e9', refused as not a number of bytes)."""
    assert main(["check", str(_config(folder, PREDICT + "  memory: 1e9\n"))]) == 0


def test_a_memory_too_small_for_the_inputs_chunk_cache_names_the_memory_key(folder, capsys):
    """memory: 2000 (meaning MB?) gives the input's chunk cache 500 bytes, less than one chunk: emfast check said
    valid, then emfast predict failed naming cache_bytes, a setting the user never wrote, with no key or line."""
    text = PREDICT + "  memory: 2000\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"predict.yaml, line {_line_of(text, 'memory:')}: predict.memory: " in error
    assert re.search(r"memory=2000 bytes is too small for the input's chunk cache: it gets 1/4 of memory, 500 "
                     r"bytes, less than one block of .* \((\d+) bytes\); give memory of at least (\d+) bytes", error)
    needed, advised = map(int, re.search(r"\((\d+) bytes\); give memory of at least (\d+)", error).groups())
    assert advised == 4 * needed  # it advised the block's bytes, which memory=2000 already exceeded once x 4
    assert not (folder / "out.zarr").exists()


def test_a_memory_too_small_for_a_block_names_the_memory_key_when_predict_finds_it(folder, capsys):
    """What the run finds names its key too; check finds it first where one output channel already needs more
    (it lays the blocks as predict does, counting the channels it is told, else 1: the least)."""
    text = PREDICT + "  memory: 200KiB\n"
    for command in ("check", "predict"):
        assert main([command, str(_config(folder, text))]) == 2
        error = capsys.readouterr().err
        assert f"predict.yaml, line {_line_of(text, 'memory:')}: predict.memory: memory=204800 bytes is too small" \
            in error


@pytest.mark.parametrize("old, new, key, words", [
    ("output: out.zarr/pred", "output: out.n5/pred", "predict.output", ["in a .zarr or .h5 container"]),
    ("output: out.zarr/pred", "output: out.h5/pred\n  compression: blosc", "predict.compression",
     ["HDF5 outputs support the compressions gzip and none"]),
])
def test_output_errors_name_their_key_when_the_config_is_read(folder, old, new, key, words):
    text = PREDICT.replace(old, new)
    path = _config(folder, text)
    for read in (load_predict_config, check_config):
        with pytest.raises(ConfigError) as info:
            read(path)
        assert (info.value.path, info.value.line, info.value.source) == (key, _line_of(text, key.split(".")[1]),
                                                                           str(path))
        for word in words:
            assert word in str(info.value)


def test_a_device_without_pytorch_names_the_device_key(folder, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not installed
    text = PREDICT + "  device: cuda\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"predict.yaml, line {_line_of(text, 'device')}: predict.device: device 'cuda' feeds the model torch " \
           "tensors, but PyTorch is not installed" in error


def test_model_args_that_are_no_mapping_are_named(folder, capsys):
    """model_args: 5 was an internal TypeError ("a bug in emfast"); 0 and [] were read as no arguments."""
    for value, words in (("5", "the integer 5"), ("[]", "a list []"), ("0", "the integer 0")):
        text = PREDICT.replace("model_args: {gain: 2.0}", f"model_args: {value}")
        error = _check_and_predict_fail(_config(folder, text), capsys)
        assert f"line {_line_of(text, 'model_args')}: predict.model_args: expected a mapping of the factory's " \
               f"keyword arguments, got {words}" in error


def test_a_key_of_the_section_written_outside_it_is_refused(folder, capsys):
    """tta: 8 one level too far out was ignored by check and predict, which ran without it."""
    text = PREDICT + "tta: 8\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"line {_line_of(text, 'tta: 8')}: tta: unknown key 'tta'" in error
    with pytest.raises(ConfigError, match="unknown key 'tta'"):
        load_predict_config(textwrap.dedent(text))


def test_cuda_without_a_gpu_names_the_device_key(folder, capsys):
    torch = pytest.importorskip("torch", reason="torch not installed (the test extra does not carry it)")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: cuda is usable")
    text = PREDICT + "  device: cuda\n"
    error = _check_and_predict_fail(_config(folder, text), capsys)
    assert f"line {_line_of(text, 'device')}: predict.device: device 'cuda': no usable NVIDIA GPU here" in error


def test_the_model_module_comes_from_the_configs_folder(folder, tmp_path_factory, capsys):
    """Two configs in two folders, each with its own nets.py, in one process: each gets its own module, not the
    one imported first."""
    assert main(["check", str(_config(folder, PREDICT))]) == 0
    other = tmp_path_factory.mktemp("other")
    (other / "nets.py").write_text(NETS.replace("def load(gain=1.0)", "def load(gain=1.0, depth=2)"))
    (other / "in.h5").symlink_to(folder / "in.h5")
    assert main(["check", str(_config(other, PREDICT.replace("{gain: 2.0}", "{depth: 3}")))]) == 0
    assert f"predict: model nets:load ({other / 'nets.py'}) with depth=3" in capsys.readouterr().out


def test_predict_spec_errors_name_the_file_not_text(folder):
    """Errors raised after reading (importing, calling the model) still name the config file and the line."""
    path = _config(folder, PREDICT.replace("nets:load", "nets:lod"))
    spec = load_predict_config(path)
    with pytest.raises(ConfigError) as info:
        spec.load_model()
    assert (info.value.source, info.value.line, info.value.path) == (str(path), 2, "predict.model")


# -- a data file instead of a config --------------------------------------------------------------------------------

def test_a_data_file_or_store_given_as_the_config_is_named_as_such(folder, capsys):
    import zarr

    zarr.create_array(folder / "store.zarr", shape=(4, 4, 4), dtype="uint8", chunks=(2, 2, 2))
    (folder / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    cases = {"in.h5": "is an HDF5 file, not a YAML config file", "store.zarr": "is a folder (a zarr or N5 store?)",
             "picture.png": "is not a YAML config file: it looks like a binary file"}
    for name, words in cases.items():
        for command in ("check", "predict", "demo"):
            argv = [command, "--config", name] if command == "demo" else [command, name]
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"emfast: error: {name}: {words}") and "codec" not in err, err
        with pytest.raises(ConfigError, match=re.escape(words)):
            load_config(folder / name)
    assert (folder / "in.h5").stat().st_size > 0 and h5py.is_hdf5(folder / "in.h5")  # never written


def test_the_info_hint_quotes_a_path_with_spaces(folder):
    """'emfast info with space/a b.zarr lists its arrays' failed when pasted into a shell (a review)."""
    import zarr

    zarr.create_array(folder / "a b.zarr", shape=(4, 4, 4), dtype="uint8", chunks=(2, 2, 2))
    with pytest.raises(ConfigError, match=re.escape(f"emfast info '{folder / 'a b.zarr'}' lists its arrays")):
        load_config(folder / "a b.zarr")


def test_an_hdf5_file_with_a_user_block_is_recognised(folder):
    with h5py.File(folder / "block.h5", "w", userblock_size=1024) as f:
        f.create_dataset("raw", data=np.zeros((2, 2, 2), np.uint8))
    with pytest.raises(ConfigError, match="is an HDF5 file"):
        check_config(folder / "block.h5")


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.integers(0, len(PREDICT) - 1), length=st.integers(0, 8),
       insert=st.text(alphabet="[]{}:,-_/.# \nabcdeinrw0129", max_size=8))
def test_a_mutated_predict_config_is_valid_or_names_its_line(folder, position, length, insert):
    """The class, not only the instances above: whatever a typo does to a predict config, check either accepts it
    or raises a ConfigError that names the config file and a line; no other exception escapes."""
    text = PREDICT[:position] + insert + PREDICT[position + length:]
    path = folder / "mutated.yaml"
    path.write_text(text)
    try:
        check_config(path)
    except ConfigError as error:
        assert error.source == str(path) and error.line is not None and error.reason, str(error)


@pytest.mark.parametrize("extra, words", [
    ("cuda_graphs: true", "CUDA graphs need device: cuda (or cuda:N), not nothing"),
    ("device: cpu\n  cuda_graphs: true", "CUDA graphs need device: cuda (or cuda:N), not the string 'cpu'"),
    ("device: cuda\n  cuda_graphs: 1", "expected true or false"),
])
def test_cuda_graphs_need_a_boolean_and_a_cuda_device(folder, extra, words):
    text = PREDICT + f"  {extra}\n"
    path = _config(folder, text)
    with pytest.raises(ConfigError) as info:
        load_predict_config(path)
    assert (info.value.path, info.value.line) == ("predict.cuda_graphs", _line_of(text, "cuda_graphs"))
    assert words in str(info.value)


def test_cuda_graphs_reach_predict(folder):
    spec = load_predict_config(_config(folder, PREDICT + "  device: cuda:1\n  cuda_graphs: true\n"))
    assert spec.options["cuda_graphs"] is True and spec.options["device"] == "cuda:1"


FAILING_NETS = '''\
def wrong_channels(gain=1.0):
    def network(batch):
        raise RuntimeError("expected input to have 2 channels, but got 1 channels instead")
    return network


def numpy_style(gain=1.0):
    def network(batch):
        return batch.repeat(3, axis=1).no_such_method()
    return network
'''


@pytest.mark.parametrize("factory, raised", [("wrong_channels", "RuntimeError"), ("numpy_style", "AttributeError")])
def test_an_error_the_model_raises_is_the_users_with_its_traceback(folder, capsys, factory, raised):
    """A torch network given the wrong channel count raises RuntimeError, a NumPy network given what it did not
    expect a TypeError or AttributeError: these were called "a bug in emfast, not in your input" (exit 1). They
    are the model's: its traceback, then one line naming the model, exit 2."""
    (folder / "failing.py").write_text(FAILING_NETS)
    path = _config(folder, PREDICT.replace("nets:load", f"failing:{factory}"))
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'failing.py", line' in err  # where in the user's code
    last = err.rstrip().splitlines()[-1]
    assert last.startswith(f"emfast: error: the model failing:{factory}") and f"raised {raised}: " in last
    assert "bug in emfast" not in err


def test_the_models_error_keeps_its_type_and_says_where_it_came_from(tmp_path):
    """Library callers catch their own errors by type: predict raises the model's exception itself, with a note
    naming the model; an error of emfast's own is not blamed on the model."""
    import emfast as ef
    from emfast.inference import model_blamed

    class OutOfMemory(RuntimeError):
        pass

    def network(batch):
        raise OutOfMemory("CUDA out of memory")

    volume = np.zeros((8, 16, 16), np.uint8)
    with pytest.raises(OutOfMemory) as raised:
        ef.predict(network, volume, tmp_path / "p.zarr/p", patch_in=(8, 16, 16))
    assert model_blamed(raised.value).endswith("network")
    assert any("raised by the model" in note for note in raised.value.__notes__)
    with pytest.raises(ValueError) as raised:  # emfast's own check of the input, before the model runs
        ef.predict(network, volume, tmp_path / "q.zarr/p", patch_in=(8, 16, 16), overlap=(9, 0, 0))
    assert model_blamed(raised.value) is None


def test_only_the_models_own_call_is_blamed_and_its_exception_is_never_replaced(tmp_path):
    """A device's failures around the call (page-locked memory, a copy) are emfast's, not the model's; an
    exception that takes no mark (a frozen dataclass) is raised as it was, not replaced by the marking's error."""
    import dataclasses

    import emfast as ef
    from emfast.inference import model_blamed
    from emfast.transfer._fake import FakeDevice

    volume = np.random.default_rng(0).integers(0, 255, (16, 32, 32), dtype=np.uint8)
    for failing in (dict(fail_open=True), dict(fail_copy_at=1)):
        with pytest.raises((MemoryError, RuntimeError), match="fake device") as raised:
            ef.predict(lambda batch: np.asarray(batch) * 1.0, volume, tmp_path / f"{len(failing)}{failing}.zarr/p",
                       patch_in=(8, 16, 16), device=FakeDevice(**failing))
        assert model_blamed(raised.value) is None

    @dataclasses.dataclass(frozen=True)
    class Frozen(Exception):
        code: int

    def network(batch):
        raise Frozen(7)

    with pytest.raises(Frozen) as raised:
        ef.predict(network, volume, tmp_path / "frozen.zarr/p", patch_in=(8, 16, 16))
    assert raised.value.code == 7 and model_blamed(raised.value) is None


def test_a_boolean_input_in_a_config_is_told_in_one_line_by_check_and_predict(folder, capsys):
    with h5py.File(folder / "mask.h5", "w") as file:
        file["mask"] = np.ones((24, 48, 48), bool)
    path = _config(folder, PREDICT.replace("{file: in.h5, dataset: raw}", "{file: mask.h5, dataset: mask}"))
    error = _check_and_predict_fail(path, capsys)
    assert "predict.input.file: " in error and "predict's input must be intensities (integers or floats), not bool" \
        in error


def test_a_fill_the_inputs_dtype_cannot_hold_is_named_by_check_and_predict(folder, capsys, tmp_path):
    """``pad="constant", fill=300`` on a uint8 input raised the gather kernel's "not representable in out's dtype
    uint8" (its own buffer, not the user's output) after the model was set up, and ``emfast check`` said valid."""
    import emfast as ef
    path = _config(folder, PREDICT + "  pad: constant\n  fill: 300\n")
    error = _check_and_predict_fail(path, capsys)
    assert "predict.fill: fill=300 does not fit the input's dtype uint8" in error
    with pytest.raises(ValueError, match=r"fill=-1 does not fit the input's dtype uint8"):
        ef.predict(lambda batch: batch, np.zeros((8, 16, 16), np.uint8), tmp_path / "p.zarr/p", patch_in=(8, 16, 16),
                   pad="constant", fill=-1)
    floats = np.random.default_rng(0).random((8, 16, 16)).astype(np.float32)
    ef.predict(lambda batch: batch[:, :, 2:-2, 4:-4, 4:-4], floats, tmp_path / "f.zarr/p", patch_in=(8, 16, 16),
               patch_out=(4, 8, 8), pad="constant", fill=0.1)  # rounded to float32 (a YAML 0.1 was refused)
    ef.predict(lambda batch: batch[:, :, 2:-2, 4:-4, 4:-4], floats, tmp_path / "f.zarr/p", patch_in=(8, 16, 16),
               patch_out=(4, 8, 8), pad="constant", fill=np.float32(0.1), resume=True)  # the same padding value
    with pytest.raises(ValueError, match=r"fill=100000.0 does not fit the input's dtype float16"):  # not inf
        ef.predict(lambda batch: batch, floats.astype(np.float16), tmp_path / "h.zarr/p", patch_in=(8, 16, 16),
                   pad="constant", fill=1e5)
    for fill in (float("nan"), np.float32("nan"), float("inf"), -np.inf):  # a NaN run could never be resumed
        with pytest.raises(ValueError, match=r"fill=\S*(nan|inf)\)? must be a finite number"):
            ef.predict(lambda batch: batch, floats, tmp_path / "n.zarr/p", patch_in=(8, 16, 16), pad="constant",
                       fill=fill)
    from fractions import Fraction
    for fill in (np.array(3), 2 ** 64, Fraction(1, 2), np.float32(2.5)):  # numbers, recorded as floats (reviews)
        ef.predict(lambda batch: batch, floats, tmp_path / "z.zarr/p", patch_in=(8, 16, 16), pad="reflect",
                   fill=fill, overwrite=True)
    for pad in ("constant", "reflect"):  # the same rule whatever the padding (a review: True passed as constant)
        for fill in (True, 1 + 0j):
            with pytest.raises(ValueError, match=r"must be a finite number"):
                ef.predict(lambda batch: batch, floats, tmp_path / "n.zarr/p", patch_in=(8, 16, 16), pad=pad,
                           fill=fill)
    from fractions import Fraction
    ef.predict(lambda batch: batch, floats, tmp_path / "q.zarr/p", patch_in=(8, 16, 16), pad="constant",
               fill=Fraction(1, 2))  # as 0.5
    for fill in (float("nan"), float("inf"), 2 ** 1024, "zero", True):  # recorded whatever the padding: refused too
        with pytest.raises(ValueError, match=r"must be a finite number"):
            ef.predict(lambda batch: batch, floats, tmp_path / "n.zarr/p", patch_in=(8, 16, 16), pad="reflect",
                       fill=fill)
    assert not (tmp_path / "n.zarr").exists()
    for pad in ("reflect", "edge"):  # only constant padding reads fill (a review: the kernel refused it anyway)
        ef.predict(lambda batch: batch[:, :, 2:-2, 4:-4, 4:-4], np.zeros((8, 16, 16), np.uint8),
                   tmp_path / f"{pad}.zarr/p", patch_in=(8, 16, 16), patch_out=(4, 8, 8), pad=pad, fill=300)


@pytest.mark.parametrize("output, words", [("in.h5/pred", "is in the input's HDF5 file"),
                                           ("z.zarr/volumes/raw", "is the input itself"),
                                           ("z.zarr/volumes/raw/inner", "is inside the input"),
                                           ("z.zarr/volumes", "is a folder containing the input")])
def test_an_output_where_the_input_is_is_refused_by_check_at_its_key(folder, capsys, output, words):
    """emfast check said "valid" for a config whose output is the input, inside it, above it or in its HDF5
    file, which predict always refuses, naming no line (found by a helper writing configs as users do)."""
    import zarr
    zarr.open_group(str(folder / "z.zarr"), mode="w").create_array(
        "volumes/raw", data=np.zeros((24, 48, 48), np.uint8), chunks=(8, 16, 16))
    text = PREDICT if output.startswith("in.h5") else PREDICT.replace("{file: in.h5, dataset: raw}",
                                                                          "z.zarr/volumes/raw")
    path = _config(folder, text.replace("output: out.zarr/pred", f"output: {output}"))
    error = _check_and_predict_fail(path, capsys)
    assert f"line {_line_of(path.read_text(), 'output:')}: predict.output: " in error and words in error


def test_a_torchscript_model_is_named_by_the_class_it_was_made_from():
    """Every scripted or traced network's class is torch's own (torch.jit._script:RecursiveScriptModule): an error
    it raised named no network of the user's."""
    torch = pytest.importorskip("torch")
    from emfast.inference._model import model_name

    class Net(torch.nn.Module):
        def forward(self, x):
            return x * 2

    assert model_name(torch.jit.script(Net())) == "torch.jit:Net"
    assert model_name(torch.jit.script(double)) == "torch.jit:double"
    assert model_name(torch.jit.trace(Net(), torch.zeros(1, 1, 2, 2, 2))) == "torch.jit:Net"
    assert model_name(Net()).endswith(":test_a_torchscript_model_is_named_by_the_class_it_was_made_from.<locals>.Net")


def double(x):
    """A network written as a function, scripted in the test above (TorchScript reads its source)."""
    return x * 2


def test_the_commands_warnings_are_one_line_each(folder):
    """A warning of emfast's (here: a uint8 output clipped) printed its file, line and source line in the middle of
    the command's messages; it is one line, as the command's errors are, named by its category (another
    package's warning, raised under emfast's frames, is not passed off as emfast's)."""
    import os
    import pathlib
    import subprocess

    import emfast as ef

    path = _config(folder, PREDICT + "  dtype: uint8\n")  # gain 2: values above 1, clipped
    source = str(pathlib.Path(ef.__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-m", "emfast", "predict", str(path)], cwd=folder, text=True,
                            capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=source))
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "clipped" in line]
    assert len(warned) == 1 and warned[0].startswith("SaturationWarning: "), result.stderr
    assert "warnings.warn" not in result.stderr and ".py:" not in result.stderr, result.stderr


def _ome_zarr_image(folder, group="raw"):
    """An OME-Zarr image of two levels as ome-zarr-py writes it, in ``group`` of img.zarr ("": the root), voxel
    sizes (40, 4, 4) and (40, 8, 8) nm. Returns the coarser level's data."""
    writer = pytest.importorskip("ome_zarr.writer")
    from ome_zarr.format import FormatV04
    zarr = pytest.importorskip("zarr")
    full = np.random.default_rng(1).integers(0, 256, (16, 64, 64), dtype=np.uint8)
    levels = [full, full[:, ::2, ::2].copy()]
    root = zarr.open_group(str(folder / "img.zarr"), mode="w", zarr_format=2)
    group = root.create_group(group) if group else root
    writer.write_multiscale(levels, group, fmt=FormatV04(), storage_options={"chunks": (8, 16, 16)},
                            axes=[{"name": axis, "type": "space", "unit": "nanometer"} for axis in "zyx"],
                            scale={"z": 40.0, "y": 4.0, "x": 4.0})
    return levels[1]


@pytest.mark.parametrize("group, dataset", [("raw", "dataset: raw, "), ("", ""), ("", "dataset: '', ")])
@pytest.mark.parametrize("choice", ["level: 1", "resolution: [40, 8, 8]", "level: 1, resolution: null"])
def test_the_input_may_be_a_coarser_level_of_an_ome_zarr_image(folder, capsys, choice, group, dataset):
    """A config could name an image (its finest level) or a level's array (without the image's voxel size, so the
    output had none): a coarser level is chosen as the data section chooses one, by index or voxel size, of an
    image in a group or at the store's root (no dataset, or "", as a reviewer found refused at first)."""
    import emfast as ef
    coarse = _ome_zarr_image(folder, group)
    path = _config(folder, PREDICT.replace("{file: in.h5, dataset: raw}", f"{{file: img.zarr, {dataset}{choice}}}"))
    assert main(["check", str(path)]) == 0
    shown = choice.replace(", resolution: null", "").replace(":", "").replace("[40, 8, 8]", "(40.0, 8.0, 8.0)")
    assert f"({shown})" in capsys.readouterr().out  # null: not given, as for the other optional keys
    assert main(["predict", str(path)]) == 0, capsys.readouterr().err
    sys.path.insert(0, str(folder))
    try:
        import nets
        expected = ef.predict(nets.load(gain=2.0), coarse, folder / "expected.zarr/pred", patch_in=(10, 20, 20),
                              patch_out=(6, 12, 12), overlap=(2, 4, 4))
    finally:
        sys.path.remove(str(folder))
    written = ef.open(folder / "out.zarr/pred")
    assert written.shape == expected.shape[1:] == coarse.shape and written.resolution == (40.0, 8.0, 8.0)
    np.testing.assert_array_equal(written.array, ef.open(folder / "expected.zarr/pred").array)


@pytest.mark.parametrize("choice, key, words", [
    ("level: 2", "level", r"level must be an index in \[0, 2\), got 2"),
    ("resolution: [40, 2, 2]", "resolution", r"no level has resolution \(40.0, 2.0, 2.0\)"),
    ("level: -1", "level", r"expected an integer >= 0"),
    ("level: 1, resolution: [40, 8, 8]", "resolution", r"give level or resolution, not both")])
def test_a_level_the_input_does_not_have_names_its_key(folder, capsys, choice, key, words):
    _ome_zarr_image(folder)
    path = _config(folder, PREDICT.replace("{file: in.h5, dataset: raw}", f"{{file: img.zarr, dataset: raw, "
                                                                          f"{choice}}}"))
    error = _check_and_predict_fail(path, capsys)
    assert re.search(rf"predict\.input\.{key}: .*{words}", error), error
    assert not (folder / "out.zarr").exists()


@pytest.mark.parametrize("input_", ["{file: img.zarr, level: 1}", "{file: img.zarr, resolution: [40, 8, 8]}",
                                   "{file: a.h5, dataset: raw}", "img.zarr/s0"])
def test_a_predict_section_written_back_reads_as_the_same(tmp_path, input_):
    """to_yaml wrote the input's dataset alone: a level or resolution chosen was written as the finest's."""
    config = tmp_path / "predict.yaml"
    config.write_text(f"predict:\n  model: nets:load\n  input: {input_}\n  output: out.zarr/p\n"
                      "  patch_in: [8, 16, 16]\n")
    spec = load_predict_config(config)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump({"predict": spec.to_yaml()}))
    assert load_predict_config(again) == spec


def test_a_predict_config_writes_the_zarr_format_it_names(folder, capsys):
    path = _config(folder, PREDICT + "  zarr_format: 2\n")
    assert main(["predict", str(path)]) == 0
    assert (folder / "out.zarr/pred/.zarray").is_file() and not (folder / "out.zarr/pred/zarr.json").exists()
    capsys.readouterr()
    bad = _config(folder, PREDICT.replace("out.zarr", "other.zarr") + "  zarr_format: 4\n", "bad.yaml")
    error = _check_and_predict_fail(bad, capsys)
    line = _line_of(bad.read_text(), "zarr_format")
    assert f"line {line}: predict.zarr_format: expected one of 2, 3, got the integer 4" in error


def test_a_2d_patch_in_a_predict_config_is_told_how_to_be_one_section(folder, capsys):
    path = _config(folder, PREDICT.replace("patch_in: [10, 20, 20]", "patch_in: [20, 20]"))
    error = _check_and_predict_fail(path, capsys)
    assert ("predict.patch_in: expected a list of 3 integers >= 1 [z, y, x], got a list [20, 20]: a 2-D patch is "
            "one section deep, (1, 20, 20)") in error

"""YAML configs: parsing, round trip, the objects they build, every error with key path and line, emfast check and
emfast demo --config."""
import gc
import json
import os
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

import emfast as ef
from emfast._registry import registered
from emfast.cli import main
from emfast.config import BUILTIN_CONFIG, ConfigError, close_volumes, describe, dump_config, load_config
from emfast.sampling import Balanced, Tiled

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.yaml"
SHAPE = (16, 48, 48)


def _labels(rng, shape=SHAPE):
    """Blocky ids with stripes of background (x < 12) and of id 3 (12 <= x < 18), so boundaries, interiors,
    background and id 3 all occur."""
    coarse = rng.integers(1, 20, (shape[0] // 4 + 1, shape[1] // 8 + 1, shape[2] // 8 + 1)).astype(np.uint64)
    labels = coarse.repeat(4, 0).repeat(8, 1).repeat(8, 2)[:shape[0], :shape[1], :shape[2]].copy()
    labels[:, :, :12] = 0
    labels[:, :, 12:18] = 3
    return labels


@pytest.fixture
def files(tmp_path):
    """Two samples a.h5 and b.h5 (raw uint8, labels uint64, mask uint8 with the first quarter of y masked out)."""
    rng = np.random.default_rng(7)
    for name in ("a", "b"):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f.create_dataset("volumes/raw", data=rng.integers(0, 256, SHAPE, dtype=np.uint8), chunks=(4, 16, 16))
            f.create_dataset("volumes/labels", data=_labels(rng))
            mask = np.ones(SHAPE, np.uint8)
            mask[:, :12] = 0
            f.create_dataset("volumes/mask", data=mask)
            f.create_dataset("volumes/small", data=np.zeros((8, 8, 8), np.uint64))
    return tmp_path


BASE = """\
data:
  samples:
    - name: A
      file: a.h5
      raw: volumes/raw
      labels: volumes/labels
    - name: B
      raw: {file: b.h5, dataset: volumes/raw}
      labels: {file: b.h5, dataset: volumes/labels}
loader:
  patch: [4, 16, 16]
  batch_size: 2
  seed: 3
augment:
  - mirror
  - intensity: {scale: 0.2, shift: 0.1}
"""


def _write(folder: Path, text: str, name: str = "config.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


FULL = """\
data:
  samples:
    - name: A
      file: a.h5
      raw: volumes/raw
      labels: volumes/labels
      mask: volumes/mask
      extra: {second: volumes/raw}
      weight: 2.5
      label_offset: [0, 0, 0]
    - name: B
      file: b.h5
      raw: volumes/raw
      labels: volumes/labels
      mask: volumes/mask
      extra: {second: volumes/raw}
      lazy: true
      cache_bytes: 1000000
  hold_out: [B]
loader:
  patch_in: [6, 20, 20]
  patch_out: [4, 16, 16]
  batch_size: 2
  threads: 2
  seed: 5
  epoch_size: 3
  normalize: {mean: 100, std: 50}
augment:
  - mirror: {axes: yx, p: 0.25}
  - transpose
  - intensity: {scale: 0.1, shift: 0.1}
targets:
  - affinities: {offsets: [[1, 0, 0], [0, 1, 0], [0, 0, 2]], ignore: 7}
  - boundaries
sampler:
  balanced: {classes: {0: background, 3: three}, priors: {background: 1, three: 2}}
validation:
  loader: {batch_size: 1}
  sampler: {tiled: {stride: [4, 8, 8]}}
  augment: []
"""


def test_round_trip_gives_an_equal_config_and_equivalent_objects(files, tmp_path):
    config = load_config(_write(files, FULL))
    text = dump_config(config, tmp_path / "elsewhere.yaml")
    assert yaml.safe_load(text) == config.to_dict()
    for again in (load_config(text), load_config(tmp_path / "elsewhere.yaml")):
        assert again == config
        for split in ("train", "validation"):
            ours, theirs = config.loader_kwargs(split), again.loader_kwargs(split)
            assert ours.keys() == theirs.keys()
            sampler, other = ours.pop("sampler"), theirs.pop("sampler")
            assert type(sampler) is type(other) and vars(sampler) == vars(other)
            assert ours == theirs  # augmentations and targets are dataclasses: compared by their parameters
    assert config.samples[1].raw.file == (files / "b.h5").resolve()
    assert config != load_config(_write(files, FULL.replace("weight: 2.5", "weight: 3"), "other.yaml"))


def test_sections_become_the_python_objects(files):
    config = load_config(_write(files, FULL))
    train = config.loader_kwargs("train")
    assert train["augment"] == [ef.Mirror(axes="yx", p=0.25), ef.Transpose(), ef.Intensity(0.1, 0.1)]
    assert train["targets"] == [ef.Affinities(offsets=((1, 0, 0), (0, 1, 0), (0, 0, 2)), ignore=7), ef.Boundaries()]
    assert isinstance(train["sampler"], Balanced) and train["sampler"].mapping == {0: "background", 3: "three"}
    assert train["epoch_size"] == 3 and train["normalize"] == {"mean": 100, "std": 50}
    validation = config.loader_kwargs("validation")
    assert validation["augment"] == [] and validation["batch_size"] == 1 and "epoch_size" not in validation
    assert isinstance(validation["sampler"], Tiled) and validation["sampler"].stride == (4, 8, 8)
    with config.loader("validation") as loader:
        assert loader.dataset.names == ["B"] and not loader.dataset.samples[0].raw.in_memory
        assert loader.dataset.samples[0].raw.cache_stats.budget_bytes == 1000000
        assert loader.epoch_size == loader.sampler.batches_per_epoch() and loader.augmentations == []
        assert set(loader.fields) >= {"raw", "second", "mask", "affinities", "affinities_mask", "boundaries"}
    close_volumes(loader.dataset)


def test_config_loader_gives_the_batches_of_the_same_loader_built_by_hand(files):
    config = load_config(_write(files, BASE))
    with config.loader() as loader:
        ours = [loader.next_batch().copy() for _ in range(2)]
    samples = [ef.Sample(ef.hdf5(files / f"{n.lower()}.h5", "volumes/raw"),
                         ef.hdf5(files / f"{n.lower()}.h5", "volumes/labels"), name=n) for n in "AB"]
    with ef.Loader(ef.Dataset(samples), patch=(4, 16, 16), batch_size=2, seed=3,
                   augment=[ef.Mirror(), ef.Intensity(scale=0.2, shift=0.1)]) as reference:
        theirs = [reference.next_batch().copy() for _ in range(2)]
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_a_default_cache_budget_too_small_for_a_chunk_is_reported_at_lazy(files, monkeypatch):
    """A lazy sample without cache_bytes whose chunk exceeds the default budget was reported at
    data.samples[0].cache_bytes, a key the config does not have (a reviewer's case): it is said at lazy, as the
    default's, with what to set."""
    from emfast.io import _chunkcache
    monkeypatch.setattr(_chunkcache, "DEFAULT_BUDGET_CAP", 1000)
    text = BASE.replace("      labels: volumes/labels\n    - name: B",
                        "      labels: volumes/labels\n      lazy: true\n    - name: B")
    config = load_config(_write(files, text))
    with pytest.raises(ConfigError) as info:
        config.loader()
    assert info.value.path == "data.samples[0].lazy" and info.value.line == _line_of(text, "lazy")
    assert str(info.value).endswith("(the default budget: set this sample's cache_bytes)")


def test_relative_paths_resolve_against_the_config_folder(files, tmp_path, monkeypatch):
    path = _write(files, BASE)
    monkeypatch.chdir(tmp_path.parent)
    config = load_config(str(path))
    assert config.samples[0].raw.file == (files / "a.h5").resolve()
    assert config.source == str(path)


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(textwrap.dedent(text))
    return info.value


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


@pytest.mark.parametrize("old, new, path, needle, words", [
    ("  batch_size: 2", "  bach_size: 2", "loader.bach_size", "bach_size", ["did you mean 'batch_size'"]),
    # the Loader's own checks and words (pipeline.LOADER_SETTINGS), before any volume is opened
    ("  patch: [4, 16, 16]", "  patch: big", "loader.patch", "patch: big", ["patch must be 3 integers", "'big'"]),
    ("  patch: [4, 16, 16]", "  patch: [4, 16]", "loader.patch", "patch: [4, 16]", ["patch must be 3 integers"]),
    ("  seed: 3", "  seed: three", "loader.seed", "seed: three", ["seed must be an integer"]),
    ("  batch_size: 2", "  batch_size: 2\n  dtype: float64", "loader.dtype", "dtype", ["'float32' or 'float16'"]),
    ("  seed: 3", "  max_buffers: 1", "loader.max_buffers", "max_buffers", ["integer >= 2"]),
    ("  - mirror", "  - mirorr", "augment[0]", "mirorr", ["unknown augmentation", "did you mean 'mirror'"]),
    ("{scale: 0.2", "{scael: 0.2", "augment[1].intensity.scael", "scael",
     ["did you mean 'scale'", "parameters: scale, shift"]),
    ("{scale: 0.2", "{scale: 2.0", "augment[1].intensity.scale", "intensity", ["scale must be in [0, 1)"]),
    ("  - mirror", "  - mirror: 3", "augment[0].mirror", "mirror: 3", ["must be a mapping"]),
    ("  - mirror", "  - {mirror: {}, transpose: {}}", "augment[0]", "transpose", ["with one name"]),
    ("      raw: {file: b.h5, dataset: volumes/raw}", "      raw: {file: b.h5, datset: volumes/raw}",
     "data.samples[1].raw.datset", "datset", ["did you mean 'dataset'"]),
    ("      raw: {file: b.h5, dataset: volumes/raw}", "      raw: {file: b.h5}", "data.samples[1].raw",
     "raw: {file: b.h5}", ["missing required key 'dataset'"]),
    ("      raw: volumes/raw\n", "", "data.samples[0]", "- name: A", ["missing required key 'raw'"]),
    ("  patch: [4, 16, 16]\n", "", "loader", "loader:", ["missing required key 'patch'"]),
    ("    - name: A\n", "    - name: A\n      weight: -1\n", "data.samples[0].weight", "weight", ["positive"]),
    ("    - name: A\n", "    - name: A\n      lazy: yes please\n", "data.samples[0].lazy", "lazy", ["true or false"]),
    ("loader:", "  hold_out: [C]\nloader:", "data.hold_out[0]", "hold_out", ["'C' matches no sample", "'A', 'B'"]),
    ("loader:", "  hold_out: [A, B]\nloader:", "data.hold_out", "hold_out", ["every sample"]),
    # a review: two samples named A, one held out, was "a Dataset needs at least one Sample" at data.samples
    ("    - name: B\n", "    - name: A\n", "data.samples", "samples:", ["names must be unique", "['A']"]),
    ("    - name: B\n      raw: {file: b.h5, dataset: volumes/raw}\n      labels: {file: b.h5, dataset: volumes/labels}\n",
     "    - name: A\n      raw: {file: b.h5, dataset: volumes/raw}\n      labels: {file: b.h5, dataset: volumes/labels}\n"
     "  hold_out: [A]\n", "data.samples", "samples:", ["names must be unique"]),
    ("loader:", "validation: {sampler: tiled}\nloader:", "validation", "validation", ["hold_out"]),
    ("augment:", "targets: [affinity]\naugment:", "targets[0]", "affinity", ["did you mean 'affinities'"]),
    ("augment:", "targets: [boundaries, boundaries]\naugment:", "targets", "targets", ["two targets write the field 'boundaries'"]),
    # class weights reading a field no target before them writes, or one that is not class ids: that entry
    ("augment:", "targets: [boundaries, {class_weights: {of: affinities}}]\naugment:", "targets[1].class_weights.of",
     "class_weights", ["no target listed before it writes the field 'affinities'", "'boundaries'"]),
    ("augment:", "targets:\n  - classes\n  - class_weights: {of: classes, classes: 2}\naugment:",
     "targets[1].class_weights.classes", "class_weights", ["holds the classes [0, 1, 2]"]),
    ("augment:", "sampler: balance\naugment:", "sampler", "balance", ["unknown sampler", "did you mean 'balanced'"]),
    ("augment:", "sampler: {masked: {fraction: 0.5}}\naugment:", "sampler.masked.fraction", "fraction",
     ["did you mean 'min_fraction'", "parameters: min_fraction, source, unlabelled"]),
    ("augment:", "sampler: {tiled: {last: never}}\naugment:", "sampler.tiled.last", "tiled", ["'keep'"]),
    ("  - mirror", "  - transpose: {axes: zyx}", "augment[0]", "zyx", ["isotropic=True"]),
    ("augment:", "augmentations: []\naugment:", "augmentations", "augmentations", ["did you mean 'augment'"]),
])
def test_bad_input_names_the_key_path_and_line(old, new, path, needle, words):
    assert old in BASE
    text = BASE.replace(old, new)
    error = _error(text)
    assert error.path == path, str(error)
    assert error.line == _line_of(text, needle), str(error)
    assert isinstance(error, ValueError) and f"line {error.line}: {path}: " in str(error)
    for word in words:
        assert word in str(error)
    import pickle  # as a spawned worker or Dask hands it back: the same message, not "<text>: " before it
    back = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(error))))
    assert (str(back), back.path, back.line, back.source, back.reason) == \
           (str(error), error.path, error.line, error.source, error.reason)


def test_a_device_this_machine_lacks_is_a_config_error_at_its_key(files, capsys):
    """device: cuda where pycuda or a GPU is missing is the machine's state, told in one line at loader.device
    (it was a RuntimeError: a traceback, "internal error", exit 1)."""
    from emfast.transfer import cuda_unavailable

    if cuda_unavailable() is None:
        pytest.skip("this machine has a usable CUDA device")
    path = _write(files, BASE.replace("  seed: 3", "  seed: 3\n  device: cuda"))
    with pytest.raises(ConfigError) as info:
        load_config(path).loader()
    assert info.value.path == "loader.device" and "device='cuda' cannot be used" in str(info.value)
    assert info.value.line == _line_of(path.read_text(), "device: cuda")
    assert main(["check", str(path)]) == 2
    error = capsys.readouterr().err
    assert "loader.device: device='cuda' cannot be used" in error and "Traceback" not in error


def test_numbers_in_scientific_notation_are_numbers():
    """1e-1 and 5.0e2 are numbers in YAML 1.2 and JSON; PyYAML's YAML 1.1 patterns read them as strings (wanting a
    dot and a signed exponent), which were refused as "must be in [0, 1), got '1e-1'"."""
    text = BASE.replace("intensity: {scale: 0.2, shift: 0.1}", "intensity: {scale: 1e-1, shift: 5E-2}")
    intensity = load_config(textwrap.dedent(text)).loader_kwargs()["augment"][1]
    assert (intensity.scale, intensity.shift) == (0.1, 0.05)
    error = _error(text.replace("scale: 1e-1", "scale: '1e-1'"))  # quoted, it stays a string, refused as one
    assert error.path == "augment[1].intensity.scale"


def test_numbers_are_read_without_yaml_1_1s_octal_and_base_60():
    """YAML 1.1 made "seed: 010" the octal 8 and "epoch_size: 1:30" the base-60 90, silently (a review). A leading
    zero is neither octal nor decimal: such a value stays a string (a sample named 08 as before, a reviewer of the
    first fix found it read as the integer 8), refused where a number belongs."""
    assert load_config(textwrap.dedent(BASE.replace("seed: 3", "seed: 0x1f"))).loader_kwargs()["seed"] == 31
    for value in ("010", "1:30", "!!int 0b11"):
        error = _error(BASE.replace("seed: 3", f"seed: {value}"))
        assert error.line == _line_of(BASE, "seed:") and ("loader.seed" in str(error) or "is no integer" in str(error))
    assert load_config(textwrap.dedent(BASE.replace("name: A", "name: 08"))).samples[0].name == "08"
    error = _error(BASE.replace("shift: 0.1", "shift: 1:30.5"))  # YAML 1.1's base-60 float 90.5
    assert error.path == "augment[1].intensity.shift" and "'1:30.5'" in str(error)


def test_a_sample_whose_raw_is_left_empty_is_named(files):
    """An empty "raw:" (its dataset commented out) was an internal TypeError, reported as a bug in emfast."""
    text = BASE.replace("raw: volumes/raw", "raw:")
    error = _error(text)
    assert error.path == "data.samples[0].raw" and error.line == _line_of(text, "raw:") and "is empty" in str(error)


def test_dump_quotes_every_string_the_loader_would_read_as_a_number(files):
    """A sample named "1e5" was dumped plain and read back as the number 100000.0, which the name refused."""
    config = load_config(_write(files, BASE.replace("name: A", "name: '1e5'").replace("name: B", "name: '010'")))
    assert load_config(dump_config(config)) == config


def test_the_loader_keys_are_the_loaders_arguments():
    error = _error(BASE.replace("  seed: 3", "  label_offset: [0, 0, 0]"))
    assert error.path == "loader.label_offset" and "device" in error.reason and "patch_in" in error.reason


@pytest.mark.parametrize("text, line, words", [
    ("data: !!python/object/apply:os.system [echo hi]\nloader: {}\n", 1, ["not allowed", "python/object"]),
    ("data:\n  samples: [a\nloader: {}\n", 3, ["invalid YAML", "flow sequence that starts on line 2"]),
    # a quote or bracket left open: its own line, not the line past the end where the parser gave up (a review)
    ('data: {}\nloader:\n  seed: "abc\n', 3, ["quoted scalar", "line 3 opens it and the text ends"]),
    ("data: {}\nloader:\n  batch_size: [1\n\n\n", 3, ["flow sequence", "line 3 opens it"]),
    ("data: {}\ndata: {}\n", 2, ["appears twice"]),
    ("- a\n- b\n", 1, ["expected a mapping", "got a list"]),
])
def test_unsafe_or_malformed_yaml_is_refused_with_its_line(text, line, words):
    error = _error(text)
    assert error.line == line, str(error)
    for word in words:
        assert word in str(error)


def test_alias_bomb_is_refused_before_expanding():
    """Nine nested levels of nine aliases would expand to 9**9 values (about 80 GB through the line marks).

    The time bound is a hang guard, not a speed target: expanding would take minutes and tens of GB, refusing
    takes milliseconds, so 20 s tells them apart on any loaded machine."""
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        name, previous = chr(ord("a") + level), chr(ord("a") + level - 1)
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    text = "data:\n" + "".join(f"  {line}\n" for line in levels) + "loader: {patch: [1, 1, 1]}\n"
    started = time.perf_counter()
    error = _error(text)
    assert time.perf_counter() - started < 20
    assert "more than 100,000 values" in str(error) and "aliases" in str(error)


@pytest.mark.parametrize("text", ["data: &a [*a]\nloader: {patch: [1, 1, 1]}\n",
                                  "data: &a {x: *a}\nloader: {patch: [1, 1, 1]}\n",
                                  "data: " + "[" * 200 + "]" * 200 + "\nloader: {patch: [1, 1, 1]}\n"])
def test_an_alias_that_contains_itself_or_deep_nesting_is_refused(text):
    error = _error(text)
    assert "nests more than 64 levels" in str(error)


def test_a_few_aliases_are_still_fine():
    text = BASE.replace("  patch: [4, 16, 16]", "  patch: &p [4, 16, 16]").replace("  seed: 3", "  seed: 3\n  patch_in: *p")
    assert load_config(text).loader_args["patch_in"] == [4, 16, 16]


def test_a_python_tag_never_runs(tmp_path):
    marker = tmp_path / "ran"
    error = _error(f"data: !!python/object/apply:os.system ['touch {marker}']\nloader: {{patch: [1, 1, 1]}}\n")
    assert error.path == "data" and not marker.exists()


def test_a_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_text_is_an_empty_config_not_the_working_folder(text):
    """load_config("") (an empty file's text) said "." is a folder, a zarr or N5 store."""
    with pytest.raises(ConfigError, match=r"^<text>: expected a mapping with keys data, .*got nothing"):
        load_config(text)


@pytest.mark.parametrize("old, new, path, needle, words", [
    ("file: a.h5", "file: missing.h5", "data.samples[0].file", "missing.h5", ["not found", "missing.h5"]),
    # a folder no format recognises: the file's key, not the dataset's (a review found "raw.dataset")
    ("file: a.h5", "file: .", "data.samples[0].file", "file: .", ["cannot tell its format"]),
    ("{file: b.h5, dataset: volumes/raw}", "{file: nowhere.h5, dataset: volumes/raw}", "data.samples[1].raw.file",
     "nowhere.h5", ["nowhere.h5"]),
    ("      labels: volumes/labels\n", "      labels: volumes/lables\n", "data.samples[0].labels.dataset",
     "lables", ["'volumes/lables' not found", "volumes/labels"]),
    ("      labels: volumes/labels\n", "      labels: volumes/small\n", "data.samples[0]", "name: A",
     ["has shape (16, 48, 48)", "label_offset"]),
    ("      labels: volumes/labels\n", "", "data.samples", "samples:", ["'A' and 'B' differ", "labels"]),
    ("  patch: [4, 16, 16]", "  patch: [4, 64, 16]", "loader.patch", "patch:", ["does not fit"]),
    ("augment:", "sampler: masked\naugment:", "sampler", "sampler:", ["has no mask"]),
    # the message names two keys: the refusal says which one it is about
    ("  batch_size: 2", "  batch_size: 2\n  buffers: 4\n  max_buffers: 3", "loader.max_buffers", "max_buffers",
     ["must be at least buffers (4)"]),
    ("  batch_size: 2", "  batch_size: 2\n  threads: 100000", "loader.threads", "threads", ["usable cores"]),
    # raised while the sampler is bound, about a loader key
    ("  seed: 3\naugment:", "  seed: 3\n  epoch_size: 3\nsampler: tiled\naugment:", "loader.epoch_size",
     "epoch_size", ["leave epoch_size out"]),
    # the windows given as patch_in/patch_out: the key the loader was given
    ("  patch: [4, 16, 16]", "  patch_in: [4, 64, 16]\n  patch_out: [4, 64, 16]", "loader.patch_in", "patch_in",
     ["does not fit"]),
    # an entry of augment or targets refused once the windows or the labels are known: that entry and parameter
    ("augment:", "targets: [boundaries, {foreground: {background: -1}}]\naugment:",
     "targets[1].foreground.background", "foreground:", ["cannot occur in uint64"]),
    ("shift: 0.1}\n", "shift: 0.1}\n  - blur: {p: 0.5, sigma: [0, 30]}\n", "augment[2].blur.sigma", "blur:",
     ["more than 4 times the longest side of the raw section (16, 16)", "below 21.5"]),
    ("augment:", "targets: [boundaries, {foreground: {name: raw}}]\naugment:", "targets[1].foreground.name",
     "foreground:", ["collides with the batch field"]),
    # one entry written as a mapping, not a list: no entry to name but the section
    ("augment:\n  - mirror\n  - intensity: {scale: 0.2, shift: 0.1}\n", "augment:\n  blur: {sigma: [0, 30]}\n",
     "augment", "augment:", ["more than 4 times"]),
    # a lazy sample's budget too small for one chunk: the budget's key, not the raw dataset's (as before)
    ("      labels: volumes/labels\n    - name: B", "      labels: volumes/labels\n      lazy: true\n"
     "      cache_bytes: 1000\n    - name: B", "data.samples[0].cache_bytes", "cache_bytes",
     ["more than cache_bytes=1000"]),
])
def test_errors_when_building_name_the_section_they_come_from(files, old, new, path, needle, words):
    assert old in BASE
    text = BASE.replace(old, new)
    config = load_config(_write(files, text))
    with pytest.raises(ConfigError) as info:
        config.loader()
    error = info.value
    assert error.path == path, str(error)
    assert error.line == _line_of(text, needle), str(error)
    for word in words:
        assert word in str(error)


def test_check_prints_the_summary_and_exits_0(files, capsys):
    text = FULL.replace("  balanced: {classes: {0: background, 3: three}, priors: {background: 1, three: 2}}",
                        "  masked: {min_fraction: 0.9}")
    assert main(["check", str(_write(files, text))]) == 0
    out = capsys.readouterr().out
    assert "sample 'A' (train, weight 2.5)" in out and "sample 'B' (validation, weight 1)" in out
    assert f"{(files / 'a.h5').resolve()}:volumes/raw, shape (16, 48, 48), uint8, chunks (4, 16, 16)" in out
    assert "origin (0, 0, 0) in raw voxels; overlap with raw (16, 48, 48) = 100.0% of raw" in out
    assert "background (id 0) 25.0%" in out  # x < 12 of 48, counted on every voxel (a small volume)
    # windows lie in z [1, 15), y and x [2, 46) (patch_in adds 1, 2, 2 of context): 11 x 29 x 29 corners; the
    # mask covers y >= 12, so a window (16 voxels along y) is covered to 90% from y corner 11 on: 20 of 29
    assert "Masked(min_fraction=0.9, source='mask'): 69.0% of 9,251 window positions qualify" in out
    assert "lazy, chunk cache 976.6 KiB" in out and "loader (validation): batch 1" in out
    assert "memory: volumes in memory" in out and out.rstrip().endswith("valid")


def test_check_reports_the_masked_share_and_balanced_classes_exactly(files):
    config = load_config(_write(files, FULL.replace("  hold_out: [B]\n", "").replace(
        "validation:\n  loader: {batch_size: 1}\n  sampler: {tiled: {stride: [4, 8, 8]}}\n  augment: []\n", "")))
    text = describe(config)
    with config.loader() as loader:
        labels = loader.dataset.samples[0].placed_labels.volume.array[0]
        region = loader.regions[0]
    close_volumes(loader.dataset)
    half = (np.asarray([4, 16, 16]) - 1) // 2  # voxels whose centred window fits, for both transposes
    box = labels[tuple(slice(lo + h, hi - e + h + 1) for lo, hi, e, h in zip(region.lo, region.hi, (4, 16, 16),
                                                                          half))]
    zero, three = np.count_nonzero(box == 0), np.count_nonzero(box == 3)
    assert f"background {100 * zero / (zero + three):.1f}%, three {100 * three / (zero + three):.1f}%" in text


def test_check_fails_with_exit_2_and_the_message(files, capsys):
    text = BASE.replace("  batch_size: 2", "  bach_size: 2")
    path = _write(files, text)
    assert main(["check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"emfast: error: {path}, line {_line_of(text, 'bach')}: loader.bach_size: unknown key" in captured.err
    assert "Traceback" not in captured.err


def test_demo_streams_from_a_config(files, capsys):
    path = _write(files, BASE)
    assert main(["demo", "--config", str(path), "--batches", "3"]) == 0
    captured = capsys.readouterr()
    assert "3 batches in" in captured.out
    assert "samples: A, B" in captured.err and "3/3 batches" in captured.err


def test_demo_with_the_builtin_config(tmp_path, capsys):
    assert BUILTIN_CONFIG.is_file()
    args = ["demo", "--config", "--batches", "1", "--cache-dir", str(tmp_path), "--volume-shape", "40", "160", "160"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "1 batch in" in captured.out and "sampler: balanced" in captured.err
    assert [p.name for p in tmp_path.glob("*.h5")] == ["demo-v1-40x160x160-s0.h5"]


def test_the_example_config_loads_and_validates(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path))
    config = load_config(EXAMPLE)
    assert load_config(dump_config(config)) == config and config.hold_out
    assert main(["check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "(validation," in out and out.rstrip().endswith("valid")
    assert all(name in registered("augmentation") for name in (item.name for item in config.augment))


def test_the_example_says_what_its_tiled_validation_pass_covers(tmp_path, monkeypatch):
    """The comment under examples/train.yaml's tiled sampler quotes the tiles, the share of the volume they cover
    and how often the covered voxels come: measured here from the validation loader's windows."""
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path))
    comment = EXAMPLE.read_text().split("sampler: tiled", 1)[1]
    with load_config(EXAMPLE).loader("validation") as loader:
        shape, patch = loader.dataset.samples[0].raw.shape, loader.patch
        count = np.zeros(shape, np.int32)
        tiles = 0
        for batch in loader:
            for z, y, x in batch.positions[:batch.valid]:
                count[z:z + patch[0], y:y + patch[1], x:x + patch[2]] += 1
                tiles += 1
    close_volumes(loader.dataset)
    covered = count > 0
    assert f"{tiles} output windows of {patch}" in comment
    assert f"{round(100 * covered.mean())}% of B's {' x '.join(map(str, shape))} voxels" in comment
    shares = {times: round(100 * np.count_nonzero(count == times) / covered.sum()) for times in (1, 2, 4)}
    assert f"{shares[1]}% of the covered voxels come once, {shares[2]}% twice and {shares[4]}% four times" in \
        " ".join(line.lstrip("# ") for line in comment.splitlines())


def test_check_and_demo_config_have_help(capsys):
    for command in (["check", "--help"], ["demo", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: emfast check" in out and "--config [FILE]" in out


def test_errors_say_what_they_concern_as_data_not_in_their_wording():
    """The attributes a config reads to name a key: set by the code that knows, whatever the message says."""
    raw = np.zeros((8, 32, 32), np.uint8)
    with pytest.raises(ValueError) as info:
        ef.Loader(raw, patch=(4, 16, 16), buffers=4, max_buffers=3)
    assert info.value.emfast_setting == "max_buffers" and "buffers (4)" in str(info.value)
    with pytest.raises(ValueError) as info:
        ef.Loader(raw, patch=(4, 64, 16))
    assert info.value.emfast_setting == ("patch", "patch_in", "patch_out")
    with pytest.raises(ValueError) as info:
        ef.Intensity(scale=2.0)
    assert info.value.emfast_setting == "scale"
    with pytest.raises(ValueError) as info:
        ef.Loader(raw, patch=(4, 16, 16), sampler=ef.Masked())
    assert info.value.emfast_section == "sampler"
    with pytest.raises(ValueError) as info:
        ef.Loader(raw, patch=(4, 16, 16), targets=[ef.Affinities()])
    assert info.value.emfast_section == "targets"


def _open_files(folder: Path) -> set:
    """The files under ``folder`` this process has open (from /proc/self/fd)."""
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            names.add(Path(target).name)
    return names


LAZY = BASE.replace("    - name: A\n", "    - name: A\n      lazy: true\n").replace(
    "    - name: B\n", "    - name: B\n      lazy: true\n")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open files through /proc (Linux)")
def test_a_config_loader_closes_the_files_the_config_opened(files):
    config = load_config(_write(files, LAZY))
    loader = config.loader()
    with loader:
        loader.next_batch()
        assert _open_files(files) == {"a.h5", "b.h5"}
    assert _open_files(files) == set()
    # a volume the caller opened and passed in stays open: it is theirs to close
    raw = ef.open(str(files / "a.h5/volumes/raw"), in_memory=False)
    with ef.Loader(raw, patch=(4, 16, 16), batch_size=2) as own:
        own.next_batch()
    assert _open_files(files) == {"a.h5"}
    raw.close()
    assert _open_files(files) == set()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open files through /proc (Linux)")
def test_a_failing_or_abandoned_config_loader_leaves_no_file_open(files):
    config = load_config(_write(files, LAZY.replace("  patch: [4, 16, 16]", "  patch: [4, 64, 16]")))
    with pytest.raises(ConfigError, match="loader.patch: .*does not fit"):
        config.loader()
    assert _open_files(files) == set()
    loader = load_config(_write(files, LAZY)).loader().start()
    loader.next_batch()
    del loader
    gc.collect()  # its finalizer stops the threads on a thread of its own, then closes the files
    deadline = time.monotonic() + 20  # a hang guard, not a timing
    while _open_files(files) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _open_files(files) == set()


@pytest.mark.parametrize("key, value", [("seed", "three"), ("batch_size", 0), ("max_buffers", 1),
                                        ("progress", "maybe"), ("dtype", "float64"), ("patch_in", [4, 16])])
def test_a_bad_loader_value_is_refused_in_the_same_words_from_python_and_yaml(key, value):
    raw = np.zeros((8, 32, 32), np.uint8)
    window = {} if key == "patch_in" else {"patch": (4, 16, 16)}
    with pytest.raises((TypeError, ValueError)) as python:
        ef.Loader(raw, **window, **{key: value})
    patch = "" if key == "patch_in" else "  patch: [4, 16, 16]\n"
    section = f"loader:\n{patch}  {key}: {json.dumps(value)}\n"
    text = BASE.replace("loader:\n  patch: [4, 16, 16]\n  batch_size: 2\n  seed: 3\n", section)
    error = _error(text)
    assert error.path == f"loader.{key}" and error.reason == str(python.value), (str(error), str(python.value))


def test_a_sample_of_a_root_array_survives_dump_and_load(tmp_path):
    """An array at the root of its store (as tensorstore and funlib write them) is the dataset "": written in the
    short form or as {file, dataset}, dumped and loaded back to the same config."""
    zarr = pytest.importorskip("zarr")
    data = np.random.default_rng(5).integers(0, 256, (8, 32, 32), dtype=np.uint8)
    zarr.create_array(str(tmp_path / "root.zarr"), shape=data.shape, chunks=(4, 16, 16), dtype=np.uint8)[...] = data
    for raw in ('file: root.zarr\n      raw: ""', 'raw: {file: root.zarr, dataset: ""}'):
        path = _write(tmp_path, f"data:\n  samples:\n    - {raw}\nloader:\n  patch: [4, 16, 16]\n")
        config = load_config(path)
        again = load_config(dump_config(config))
        assert again == config
        with again.loader() as loader:
            assert loader.next_batch()["raw"].shape == (8, 1, 4, 16, 16)


def test_an_extra_channel_named_like_a_field_is_blamed_on_the_loader_not_on_normalize(files):
    text = BASE.replace("      labels: volumes/labels\n",
                        "      labels: volumes/labels\n      extra: {labels: volumes/raw}\n", 1)
    text = text.replace("    - name: B\n      raw: {file: b.h5, dataset: volumes/raw}\n",
                        "    - name: B\n      raw: {file: b.h5, dataset: volumes/raw}\n"
                        "      extra: {labels: {file: b.h5, dataset: volumes/raw}}\n")
    text = text.replace("  seed: 3\n", "  seed: 3\n  normalize: [0.5, 0]\n")
    with pytest.raises(ConfigError) as info:
        load_config(_write(files, text)).loader()
    assert info.value.path == "loader" and "collides with a batch field" in str(info.value), str(info.value)


def test_targets_refused_for_labels_at_their_own_voxel_size_are_blamed_on_targets(files):
    text = BASE.replace("    - name: A\n", "    - name: A\n      own_resolution: [labels]\n").replace(
        "    - name: B\n", "    - name: B\n      own_resolution: [labels]\n").replace(
        "augment:\n  - mirror\n  - intensity: {scale: 0.2, shift: 0.1}\n", "augment: [mirror]\ntargets: [foreground]\n")
    with pytest.raises(ConfigError) as info:
        load_config(_write(files, text)).loader()
    assert info.value.path == "targets" and "cannot feed them" in str(info.value), str(info.value)


def test_a_tiled_validation_sets_its_epoch_and_a_different_epoch_size_is_refused_at_its_key(files):
    """docs/CONFIG.md: a tiled validation sampler sets epoch_size; validation.loader may only repeat it."""
    base = BASE.replace("  seed: 3\n", "  seed: 3\n  epoch_size: 7\n").replace("loader:\n", "  hold_out: [B]\nloader:\n", 1)
    config = load_config(_write(files, base + "validation: {sampler: tiled}\n"))
    with config.loader("validation") as loader:
        tiled = loader.epoch_size
    assert tiled not in (None, 7)
    config = load_config(_write(files, base + f"validation: {{sampler: tiled, loader: {{epoch_size: {tiled}}}}}\n"))
    with config.loader("validation") as loader:
        assert loader.epoch_size == tiled
    config = load_config(_write(files, base + f"validation: {{sampler: tiled, loader: {{epoch_size: {tiled + 1}}}}}\n"))
    with pytest.raises(ConfigError, match=rf"validation.loader.epoch_size: epoch_size={tiled + 1}, but Tiled"):
        config.loader("validation")


@pytest.mark.parametrize("where, key", [("", "augment"), ("", "targets"), ("", "sampler"),
                                        ("validation", "augment"), ("validation", "targets")])
def test_an_empty_augment_targets_or_sampler_key_is_refused_not_read_as_the_default(files, where, key):
    """``augment:`` with nothing after it is YAML's null, which read as an absent key: the default augmentation,
    or under validation the training one, where the user most likely meant none."""
    lines = FULL.replace("  augment: []\n", "").splitlines()
    if where:
        lines.append(f"  {key}:")
    else:  # the key's own lines go, the key stays
        start = lines.index(f"{key}:")
        end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
        del lines[start + 1:end]
    line = len(lines) if where else lines.index(f"{key}:") + 1
    with pytest.raises(ConfigError) as info:
        load_config(_write(files, "\n".join(lines) + "\n"))
    assert f"{where + '.' if where else ''}{key}: is empty" in str(info.value)
    assert f"line {line}" in str(info.value)

"""``emfast bench``: the NumPy reference does emfast's work exactly, the report's numbers hang together, bad input
fails before anything is measured, and nothing is left running."""
import ast
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import emfast
from emfast import bench
from emfast.bench import _host, _pipelines, _record, _runs
from emfast.bench import _reference as reference
from emfast.cli import main
from emfast.io._demo import demo_volume_path

from reference import affinities_reference, converted

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

#: A tiny run: one short round per row, small curves.
FAST = ["--quick", "--seconds", "0.05"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder holding the quick run's built-in volume, generated once for the module."""
    folder = tmp_path_factory.mktemp("bench-cache")
    demo_volume_path(cache_dir=folder, shape=bench.QUICK["volume_shape"])
    return folder


@pytest.fixture
def children_before():
    """The child processes this test process had before the test: some are not the benchmark's (an earlier test's
    Dask cluster leaves multiprocessing's resource tracker running)."""
    return _host.child_pids()


def nothing_left_running(children_before):
    """No emfast thread and no child process of this process started since ``children_before`` (DataLoader
    workers, RSS probes)."""
    threads = [t.name for t in threading.enumerate() if t.name.startswith(("emfast-", "pt_", "torch"))]
    assert not threads, f"threads still running: {threads}"
    assert [pid for pid in _host.child_pids() if pid not in children_before] == []


# -- the reference does emfast's work ----------------------------------------------------------------------------

def test_reference_equals_the_emfast_batch_for_the_same_windows_and_transforms(rng):
    raw = rng.integers(0, 256, (20, 40, 36), dtype=np.uint8)
    labels = rng.integers(0, 3, (20, 40, 36)).astype(np.uint64)  # few ids: affinities of both values
    patch = (6, 12, 16)  # y != x, so a transposed window reads a differently shaped box
    with emfast.Loader(raw, labels, patch=patch, batch_size=8, augment=[emfast.Mirror(), emfast.Transpose()],
                       targets=[emfast.Affinities()], seed=3) as loader:
        seen = set()
        for _ in range(4):
            batch = loader.next_batch()
            for n in range(8):
                seen.add((tuple(batch.perms[n]), tuple(batch.flips[n])))
                example = reference.Example(tuple(batch.positions[n]), tuple(batch.perms[n]),
                                            tuple(batch.flips[n]), 1 / 255, 0.0)
                expected = reference.reference_example(raw, labels, example, patch)
                assert set(expected) <= set(batch)
                for name, array in expected.items():
                    np.testing.assert_array_equal(array, batch[name][n], err_msg=f"{name}, example {n}")
    assert len(seen) >= 8  # mirrors and transposes both exercised


def test_reference_example_against_the_test_suites_references(rng):
    raw = rng.integers(0, 256, (12, 20, 20), dtype=np.uint8)
    labels = rng.integers(0, 4, (12, 20, 20)).astype(np.uint64)
    patch, example = (4, 6, 8), reference.Example((3, 5, 4), (0, 2, 1), (True, False, True), 0.9 / 255, 0.05)
    result = reference.reference_example(raw, labels, example, patch)
    np.testing.assert_array_equal(result["raw"], converted(raw[np.newaxis], example.corner, patch, example.perm,
                                                           example.flips, example.scale, example.shift,
                                                           np.float32))
    grown = reference.window(labels, example.corner, patch, example.perm, example.flips, reference.MARGIN)
    assert grown.shape == (6, 8, 10)
    affinities, mask = affinities_reference(grown[np.newaxis, np.newaxis], reference.NEAREST_NEIGHBOURS,
                                            reference.MARGIN)
    np.testing.assert_array_equal(result["affinities"], affinities[0])
    np.testing.assert_array_equal(result["affinities_mask"], mask[0])


def test_reference_draws_cover_the_standard_augmentations():
    rng = np.random.default_rng(0)
    examples = reference.draw_examples(rng, 400, (8, 16, 24), (20, 40, 40))
    assert {e.perm for e in examples} == {(0, 1, 2), (0, 2, 1)}
    assert len({e.flips for e in examples}) == 8
    gains = np.array([e.scale for e in examples]) * 255
    assert 0.9 <= gains.min() < 0.95 and 1.05 < gains.max() <= 1.1
    for e in examples:  # windows and their label margin inside the volume
        extent = reference.source_extent((8, 16, 24), e.perm)
        assert all(1 <= c and c + x + 1 <= s for c, x, s in zip(e.corner, extent, (20, 40, 40)))


# -- the run and its report ----------------------------------------------------------------------------------------

def test_quick_run_writes_consistent_json(cache, tmp_path, capsys, children_before):
    out = tmp_path / "results" / "bench.json"
    assert main(["bench", *FAST, "--no-curves", "--cache-dir", str(cache), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["schema"] == bench.SCHEMA
    assert {"cpu", "cores", "usable_cores", "memory_gib", "torch"} <= set(result["machine"])
    assert result["task"]["patch"] == list(bench.QUICK["patch"]) and result["curves"] is None
    rows = result["rows"]
    assert list(rows) == ["emfast", "emfast_1", "numpy", "torch", "copy"] or rows["emfast"]["threads"] == 1
    emfast_ms = rows["emfast"]["ms_per_batch"]
    for name, row in rows.items():
        if row["skipped"]:
            continue
        assert row["ms_per_batch"] == pytest.approx(1e3 * row["seconds"] / row["batches"])
        assert row["batches_per_s"] == pytest.approx(row["batches"] / row["seconds"])
        assert row["ratio_to_emfast"] == pytest.approx(row["ms_per_batch"] / emfast_ms)
        assert row["label"] in printed
    if HAVE_TORCH:
        assert rows["torch"]["skipped"] is None and rows["torch"]["batches"] >= 3
    else:
        assert rows["torch"]["skipped"] == "skipped: torch not installed"
        assert "skipped: torch not installed" in printed
    goals = {goal["name"]: goal for goal in result["targets"]}
    floor = next(goal for name, goal in goals.items() if "copy floor" in name)
    assert floor["measured"] == pytest.approx(emfast_ms / rows["copy"]["ms_per_batch"])
    assert floor["result"] == ("PASS" if floor["measured"] <= bench.TARGET_FLOOR_RATIO else "MISS")
    assert "kernel" in rows["emfast"]["profile_ms_per_batch"] and "where the time goes" in printed
    assert result["leftovers"] == {"threads": [], "processes": []}
    nothing_left_running(children_before)


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib not installed")
def test_curves_and_plot(cache, tmp_path, children_before):
    config = bench.settings(quick=True, seconds=0.05, cache_dir=str(cache), plot=str(tmp_path / "bench.png"))
    config = dataclasses.replace(config, curve_seconds=0.02, thread_curve=(1, 2), patch_curve=(8, 64),
                                 batch_curve=(1, 2), slot_curve=(2, 4))
    result = bench.run(config)
    curves = result["curves"]
    assert [p["threads"] for p in curves["threads"]] == [1, 2]
    assert "does not fit" in curves["patch"][1]["skipped"]  # 64^3 in a (40, 96, 96) volume
    assert curves["patch"][0]["voxels_per_s"] == pytest.approx(curves["patch"][0]["batches_per_s"] * 4 * 8 ** 3)
    small, large = curves["slots"]
    assert large["slot_bytes_total"] == 2 * small["slot_bytes_total"]
    assert large["peak_growth"] > small["peak_growth"]  # each slot is resident: two more cost memory
    assert any("peak RSS" in line for line in result["report"])
    bench.plot(config.plot, config, result["rows"], curves)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    nothing_left_running(children_before)


def test_the_real_command_measures_everything_and_writes_json_and_plot(cache, tmp_path):
    """``emfast bench --quick`` as a user runs it, curves and their fresh RSS processes included: every section of
    the JSON is there and complete, and nothing is left running."""
    out, picture = tmp_path / "bench.json", tmp_path / "bench.png"
    command = [sys.executable, "-m", "emfast", "bench", "--quick", "--seconds", "0.05", "--cache-dir", str(cache),
               "--json", str(out)] + (["--plot", str(picture)] if HAVE_MATPLOTLIB else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["complete"] is True and "error" not in result
    assert result["leftovers"] == {"threads": [], "processes": []}
    slots = result["curves"]["slots"]
    assert [p["slots"] for p in slots] == list(bench.settings(quick=True).slot_curve)
    assert all(p["peak_rss"] > p["rss_before"] > 0 for p in slots)
    assert {m["stage"] for m in result["measurements"]} == {"comparison", "curve"}
    assert "peak RSS against ring slots" in done.stdout
    if HAVE_MATPLOTLIB:
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_late_failure_keeps_every_number_measured_before(cache, tmp_path, monkeypatch, capsys,
                                                             children_before):
    """The failure met: the RSS curve, the last thing measured, could not import its probe; every number of the
    minutes before was lost. Now the JSON and the printed report keep them, with the error."""
    monkeypatch.setattr(_runs, "PROBE_CODE", "from emfast.bench import _rss_probe")
    out = tmp_path / "bench.json"
    assert main(["bench", *FAST, "--cache-dir", str(cache), "--json", str(out)]) != 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["complete"] is False and "_rss_probe" in result["error"]
    assert result["rows"]["emfast"]["batches_per_s"] > 0  # the comparison table, finished before
    rounds = [m for m in result["measurements"] if m["stage"] == "comparison"]
    points = [m for m in result["measurements"] if m["stage"] == "curve"]
    assert {m["row"] for m in rounds} >= {"emfast", "numpy", "copy"}
    assert {m["curve"] for m in points} >= {"threads", "patch", "batch_size"}
    assert "emfast bench stopped (RuntimeError: the RSS measurement" in printed
    for measurement in rounds + points:
        assert _record.measurement_line(measurement) in printed
    assert not list(tmp_path.glob("*.partial"))
    nothing_left_running(children_before)


def test_leftovers_count_only_what_the_bench_started(cache, tmp_path, children_before):
    """A child the caller started before (a Dask test leaves multiprocessing's resource tracker) is not the
    benchmark's leftover: the check holds whatever ran before it."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert sleeper.pid in _host.child_pids()
        config = bench.settings(quick=True, seconds=0.05, curves=False, cache_dir=str(cache))
        assert bench.run(config)["leftovers"] == {"threads": [], "processes": []}
    finally:
        sleeper.kill()
        sleeper.wait()


# -- bad input -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, culprit", [
    (["--patch", "0", "64", "64"], "--patch"),
    (["--patch", "16", "-4", "64"], "--patch"),
    (["--patch", "64", "64", "64"], "does not fit"),
    (["--batch-size", "0"], "--batch-size"),
    (["--threads", "0"], "--threads"),
    (["--rounds", "0"], "--rounds"),
    (["--seconds", "0"], "--seconds"),
    (["--volume-shape", "4", "96", "96"], "--volume-shape"),
    (["--batch-size", "100000000"], "GiB"),
    (["--plot", "out.txt"], ".png"),
])
def test_nonsense_sizes_fail_before_anything_is_built(tmp_path, capsys, args, culprit):
    assert main(["bench", "--quick", "--cache-dir", str(tmp_path), *args]) == 2
    assert culprit in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no volume generated


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_unwritable_output_paths_fail_before_measuring(tmp_path, capsys, option):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for path in (blocker / "out.png", tmp_path):
        assert main(["bench", "--quick", "--cache-dir", str(tmp_path / "cache"), option, str(path)]) == 2
        err = capsys.readouterr().err
        assert option in err and "emfast: error:" in err
    assert not (tmp_path / "cache").exists()


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ValueError, match="--plot needs matplotlib"):
        bench.settings(quick=True, plot=str(tmp_path / "bench.png"))


# -- nothing left running ------------------------------------------------------------------------------------------

def test_an_interruption_closes_the_loaders(cache, monkeypatch, capsys, children_before):
    calls = []
    stream = _pipelines.stream

    def interrupted(produce, seconds, **kwargs):
        calls.append(produce)
        if len(calls) == 2:  # the second row, emfast threads=1, inside its running loader
            raise KeyboardInterrupt
        return stream(produce, seconds, **kwargs)

    monkeypatch.setattr(_pipelines, "stream", interrupted)
    assert main(["bench", *FAST, "--no-curves", "--cache-dir", str(cache)]) == 130
    assert "interrupted" in capsys.readouterr().err
    nothing_left_running(children_before)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_an_error_in_a_dataloader_worker_shuts_the_workers_down(cache, monkeypatch, capsys, children_before):
    def broken(self, index):
        raise ValueError(f"broken item {index}")

    monkeypatch.setattr(reference.ReferenceDataset, "__getitem__", broken)
    assert main(["bench", *FAST, "--no-curves", "--cache-dir", str(cache)]) == 2
    assert "broken item" in capsys.readouterr().err
    nothing_left_running(children_before)


def test_ctrl_c_leaves_no_process_behind(cache):
    """SIGINT to the process group of a running ``emfast bench``, as Ctrl-C in a terminal sends it: exit status
    130, and no process whose command line names this run's cache folder survives (DataLoader workers are forks
    with the same command line)."""
    command = [sys.executable, "-m", "emfast", "bench", "--quick", "--seconds", "0.1", "--cache-dir", str(cache)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    for line in process.stderr:  # interrupt in the torch row, or without torch in the curves
        if "NumPy reference" in line:
            time.sleep(0.2)
            os.killpg(process.pid, signal.SIGINT)
            break
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    time.sleep(0.2)
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(cache).encode() in f.read():
                    survivors.append(int(pid))
        except OSError:
            continue
    assert survivors == []


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--patch", "--batch-size", "--threads", "--json", "--plot", "--quick", "--no-curves"):
        assert option in text


def test_bench_imports_only_the_public_names_of_other_packages():
    """bench sits on top of the house: what it needs from a package below comes from that package's face."""
    folder = os.path.dirname(bench.__file__)
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module:
                package, *inside = node.module.split(".")
                assert not any(part.startswith("_") for part in inside), f"{name} imports {node.module}"


def test_the_profile_covers_the_timed_batches_only(cache):
    """The profile included the warm-up batch but was divided by the timed ones: the consumer's wait per batch
    came out longer than the time per batch (55 ms of 47)."""
    volumes = _pipelines.load_volumes(bench.QUICK["volume_shape"], cache_dir=cache)
    try:
        result = _pipelines.measure_emfast(volumes, (16, 64, 64), 4, 1, 0.0)  # 3 batches, each waited for
    finally:
        volumes.close()
    assert result.profile_ms["wait"] <= result.ms_per_batch * 1.001


def test_a_failure_before_any_measurement_is_told_once(tmp_path, capsys):
    """A user error before anything was measured was printed twice: as "emfast bench stopped (OSError: ...); 0
    measurement(s) taken before:" on stdout and as the error on stderr."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["bench", "--quick", "--no-curves", "--cache-dir", str(blocked / "cache")]) == 2
    captured = capsys.readouterr()
    assert "stopped" not in captured.out and captured.err.count("emfast: error:") == 1


def test_an_error_without_a_message_is_recorded_without_a_dangling_colon():
    record = _record.Record(None)
    record.failed(KeyboardInterrupt())
    assert record.result["error"] == "KeyboardInterrupt"


def test_json_and_plot_replace_only_what_emfast_bench_wrote(tmp_path):
    """``emfast bench --json in.h5`` replaced the user's HDF5 file with the results, and ``--plot fig.png`` any
    PNG: an existing file is replaced only if it is an earlier bench JSON or plot."""
    data = tmp_path / "in.h5"
    data.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    figure = tmp_path / "figure.png"
    figure.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))  # another program's picture
    with pytest.raises(ValueError, match="--json: .*in.h5' exists and is not recognised as emfast bench's"):
        bench.settings(quick=True, json_path=str(data))
    with pytest.raises(ValueError, match="--plot: .*figure.png' exists and is not recognised as emfast bench's"):
        bench.settings(quick=True, plot=str(figure))
    assert data.read_bytes().startswith(b"\x89HDF")
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200000 + "]" * 200000)  # no RecursionError from the JSON parser
    with pytest.raises(ValueError, match="is not recognised as emfast bench's"):
        bench.settings(quick=True, json_path=str(nested))
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"schema": "emfast-bench/1", "complete": True}))
    assert bench.settings(quick=True, json_path=str(earlier)).json == str(earlier)
    if HAVE_MATPLOTLIB:  # a plot emfast bench drew says so in its PNG text, and may be drawn again
        from emfast.bench._report import plot
        config = bench.settings(quick=True, plot=str(tmp_path / "bench.png"))
        plot(config.plot, config, {}, None)
        assert bench.settings(quick=True, plot=config.plot).plot == config.plot

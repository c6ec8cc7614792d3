"""``emfast bench``: emfast against a NumPy pipeline, a PyTorch ``DataLoader`` and the memory-bandwidth floor.

The standard task, on the built-in volume (:func:`emfast.io.demo_volume_path`, held in memory): batches
of 8 windows of (32, 128, 128) at uniformly random positions, each mirrored along z, y, x (p = 0.5 each) and
transposed y<->x (p = 0.5); uint8 raw -> float32 in [0, 1] with a random intensity gain (1 +- 0.1) and bias
(+- 0.1); uint64 labels -> 3 nearest-neighbour affinities (``emfast.Affinities()``) and their mask. Rows:

* emfast ``Loader(..., targets=[Affinities()])`` with ``threads=1`` and ``threads=N`` (N = all cores);
* the NumPy reference (:mod:`emfast.bench._reference`), one thread;
* a PyTorch ``DataLoader`` with ``num_workers=N`` over the same NumPy code as a ``Dataset`` (if torch is there);
* the memory-bandwidth floor: one ``np.copyto`` of as many bytes as the task's outputs (raw, affinities, mask).

Every row streams batches for a fixed time; the rows run in interleaved rounds (the order rotates every round)
and each row's best round counts, so drifts on a shared machine hit all rows alike. Ratios are times per batch
divided by emfast's (threads=N) from the same run. Then curves: emfast throughput against threads, cubic patch
size and batch size, and peak RSS against the number of ring slots.

Nothing is left running: loaders are closed and ``DataLoader`` workers shut down on every exit path, Ctrl-C
included.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Dict, List, Optional

import numpy as np

from .._machine import available_bytes, read_proc_field
from ._host import child_pids, leftovers, log, machine_info, rss_bytes, torch_available, torch_version
from ._pipelines import (Measurement, Volumes, emfast_loader, load_volumes, measure_copy, measure_emfast,
                         measure_numpy, measure_torch)
from ._record import Record
from ._report import report
from ._settings import GiB, MiB, TARGET_FLOOR_RATIO, TARGET_SPEEDUP, Settings, fits, output_bytes, run_bytes


def _rows(config: Settings) -> Dict[str, dict]:
    n = config.threads
    rows = {
        "emfast": {"label": f"emfast, threads={n}", "method": "emfast", "threads": n},
        "emfast_1": {"label": "emfast, threads=1", "method": "emfast", "threads": 1},
        "numpy": {"label": "NumPy reference, 1 thread", "method": "numpy", "threads": 1},
        "torch": {"label": f"PyTorch DataLoader, num_workers={n}", "method": "torch", "threads": n},
        "copy": {"label": f"copy floor: np.copyto {output_bytes(config.patch, config.batch_size) / MiB:.1f} MiB",
                 "method": "copy", "threads": 1},
    }
    if n == 1:
        del rows["emfast_1"]
    return rows


def compare(volumes: Volumes, config: Settings, record: Record) -> dict:
    """The table: every row measured ``rounds`` times, interleaved; each row's best round counts. Every round
    goes to ``record`` as soon as it is measured."""
    rows = _rows(config)
    skipped = {}
    if not torch_available():
        skipped["torch"] = "skipped: torch not installed"
    patch, batch = config.patch, config.batch_size
    measures = {
        "emfast": lambda: measure_emfast(volumes, patch, batch, config.threads, config.seconds, seed=config.seed),
        "emfast_1": lambda: measure_emfast(volumes, patch, batch, 1, config.seconds, seed=config.seed),
        "numpy": lambda: measure_numpy(volumes, patch, batch, config.seconds, seed=config.seed),
        "torch": lambda: measure_torch(volumes, patch, batch, config.threads, config.seconds, seed=config.seed),
        "copy": lambda: measure_copy(output_bytes(patch, batch), config.seconds),
    }
    names = [name for name in rows if name not in skipped]
    runs: Dict[str, List[Measurement]] = {name: [] for name in names}
    for round_ in range(config.rounds):
        shift = round_ % len(names)  # rotate the order so drifts and neighbours hit every row alike
        for name in names[shift:] + names[:shift]:
            result = measures[name]()
            runs[name].append(result)
            record.measured({"stage": "comparison", "row": name, "label": rows[name]["label"],
                             "round": round_ + 1, "batches": result.batches, "seconds": result.seconds,
                             "batches_per_s": result.batches_per_s})
    voxels = batch * int(np.prod(patch))
    best_emfast = max(runs["emfast"], key=lambda m: m.batches_per_s)
    for name, row in rows.items():
        if name in skipped:
            row.update(skipped=skipped[name], batches_per_s=None, voxels_per_s=None, ms_per_batch=None,
                       ratio_to_emfast=None, rounds=[])
            continue
        best = max(runs[name], key=lambda m: m.batches_per_s)
        row.update(skipped=None, batches=best.batches, seconds=best.seconds, cpu_cores=best.cpu_cores,
                   batches_per_s=best.batches_per_s,
                   voxels_per_s=best.batches_per_s * voxels, ms_per_batch=best.ms_per_batch,
                   # time per batch of this row / emfast's: > 1 means emfast is faster
                   ratio_to_emfast=best.ms_per_batch / best_emfast.ms_per_batch,
                   rounds=[{"batches": m.batches, "seconds": m.seconds} for m in runs[name]])
        if best.profile_ms is not None:
            row["profile_ms_per_batch"] = best.profile_ms
    return rows


def targets(rows: Dict[str, dict], config: Settings) -> List[dict]:
    """The issue's targets, each PASS, MISS or SKIP."""
    n = config.threads
    result = []
    for name, what in (("torch", f"PyTorch DataLoader ({n} workers)"), ("numpy", "the NumPy reference")):
        ratio = rows[name]["ratio_to_emfast"]
        result.append({"name": f"emfast ({n} threads) speed-up vs {what}", "measured": ratio,
                       "target": f">= {TARGET_SPEEDUP:g}x",
                       "result": "SKIP" if ratio is None else "PASS" if ratio >= TARGET_SPEEDUP else "MISS"})
    floor = 1.0 / rows["copy"]["ratio_to_emfast"]
    result.append({"name": f"emfast ({n} threads) time / copy floor", "measured": floor,
                   "target": f"<= {TARGET_FLOOR_RATIO:g}",
                   "result": "PASS" if floor <= TARGET_FLOOR_RATIO else "MISS"})
    return result


def _peak_reset() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return read_proc_field("/proc/self/status", "VmHWM") is not None


def _rss_probe(request: dict) -> dict:
    """In a fresh process: load the volume, then run a loader with ``request["slots"]`` slots; peak RSS."""
    volumes = load_volumes(request["volume_shape"], request["cache_dir"])
    try:
        baseline = rss_bytes()
        exact = _peak_reset()
        sampled = [baseline]
        with emfast_loader(volumes, request["patch"], request["batch_size"], request["threads"],
                           buffers=request["slots"], seed=request["seed"]) as loader:
            count, start = 0, time.perf_counter()
            while count < 3 or time.perf_counter() - start < request["seconds"]:
                loader.next_batch()
                sampled.append(rss_bytes())
                count += 1
            slots_total = loader.buffers * loader.slot_bytes
    finally:
        volumes.close()
    peak = int(read_proc_field("/proc/self/status", "VmHWM").split()[0]) * 1024 if exact else max(sampled)
    return {"slots": request["slots"], "threads": request["threads"], "patch": list(request["patch"]),
            "batch_size": request["batch_size"], "batches": count, "rss_before": baseline, "peak_rss": peak,
            "peak_growth": peak - baseline, "slot_bytes_total": slots_total,
            "peak_from": "VmHWM" if exact else "VmRSS sampled after every batch"}


#: What the fresh process of :func:`rss_point` runs: the probe imported from this very module, so that a move or
#: rename cannot break it unseen.
PROBE_CODE = (f"import json, sys; from {__name__} import _rss_probe; "
              "print(json.dumps(_rss_probe(json.loads(sys.argv[1]))))")


def rss_point(config: Settings, slots: int) -> dict:
    """Peak RSS of a fresh process that loads the volume and streams from a loader with ``slots`` slots (the
    run's patch, batch size and threads), and its growth over the same process before the loader started. A
    fresh process, because memory freed by earlier measurements and kept by the allocator would blur the figures."""
    request = {"volume_shape": list(config.volume_shape), "cache_dir": config.cache_dir, "patch": list(config.patch),
               "batch_size": config.batch_size, "threads": config.threads, "slots": slots,
               "seconds": config.curve_seconds, "seed": config.seed}
    seconds = config.curve_seconds
    # run() kills the child on any exception here, Ctrl-C included
    done = subprocess.run([sys.executable, "-c", PROBE_CODE, json.dumps(request)], capture_output=True, text=True,
                          timeout=120 + 10 * seconds)
    if done.returncode != 0:
        raise RuntimeError(f"the RSS measurement with {slots} slots failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def curves(volumes: Volumes, config: Settings, record: Record) -> dict:
    """emfast batches/s and voxels/s against threads, patch size and batch size; peak RSS against slots. Every
    point of every pass goes to ``record`` as soon as it is measured.

    Each throughput curve is measured in two passes, forwards and backwards, of half the time per point; a
    point's better pass counts, so a busy moment of the machine does not bend one curve's shape.
    """
    seconds, patch, batch, n = config.curve_seconds / 2, config.patch, config.batch_size, config.threads
    available = available_bytes()

    def skip_reason(patch_, batch_, threads) -> Optional[str]:
        if not fits(patch_, volumes.shape):
            return f"patch {tuple(patch_)} with its margin does not fit the volume {volumes.shape}"
        need = run_bytes(patch_, batch_, threads)
        if available is not None and need > 0.5 * available:
            return f"needs {need / GiB:.1f} GiB, {available / GiB:.1f} GiB available"
        return None

    def curve(name: str, settings_: List[tuple], floor: bool) -> List[dict]:
        entries = [{"patch": list(p), "batch_size": b, "threads": t} for p, b, t in settings_]
        for entry in entries:
            reason = skip_reason(entry["patch"], entry["batch_size"], entry["threads"])
            if reason:
                entry["skipped"] = reason
        live = [entry for entry in entries if "skipped" not in entry]
        for pass_, entry in [(1, e) for e in live] + [(2, e) for e in live[::-1]]:
            m = measure_emfast(volumes, entry["patch"], entry["batch_size"], entry["threads"], seconds,
                               seed=config.seed)
            record.measured({"stage": "curve", "curve": name, "pass": pass_, "patch": entry["patch"],
                             "batch_size": entry["batch_size"], "threads": entry["threads"],
                             "batches_per_s": m.batches_per_s})
            if m.batches_per_s > entry.get("batches_per_s", 0.0):
                voxels = entry["batch_size"] * int(np.prod(entry["patch"]))
                entry.update(batches_per_s=m.batches_per_s, voxels_per_s=m.batches_per_s * voxels,
                             ms_per_batch=m.ms_per_batch)
        if floor:
            for entry in live:
                c = measure_copy(output_bytes(entry["patch"], entry["batch_size"]), seconds)
                record.measured({"stage": "curve", "curve": f"{name} copy floor", "patch": entry["patch"],
                                 "batch_size": entry["batch_size"], "batches_per_s": c.batches_per_s})
                entry.update(copy_voxels_per_s=c.batches_per_s * entry["voxels_per_s"] / entry["batches_per_s"],
                             vs_copy=entry["ms_per_batch"] / c.ms_per_batch)
        return entries

    result = {}
    log(f"curve: threads {list(config.thread_curve)}")
    result["threads"] = curve("threads", [(patch, batch, t) for t in config.thread_curve], floor=False)
    log(f"curve: cubic patches {list(config.patch_curve)}")
    result["patch"] = curve("patch", [((s, s, s), batch, n) for s in config.patch_curve], floor=True)
    log(f"curve: batch sizes {list(config.batch_curve)}")
    result["batch_size"] = curve("batch_size", [(patch, b, n) for b in config.batch_curve], floor=True)
    log(f"curve: ring slots {list(config.slot_curve)} (one fresh process each)")
    result["slots"] = []
    for slots in config.slot_curve:
        result["slots"].append(rss_point(config, slots))
        record.measured({"stage": "curve", "curve": "slots", **result["slots"][-1]})
    return result


def run(config: Settings, record: Optional[Record] = None) -> dict:
    """Measure everything ``config`` asks for; returns the result that ``--json`` writes.

    Each measurement goes to ``record`` as soon as it is taken; if the run fails, ``record`` keeps them and the
    error, and the exception is raised on.
    """
    record = record if record is not None else Record()
    threads_before, children_before = threading.enumerate(), child_pids()
    info = machine_info()
    info["torch"] = torch_version()
    record.update(machine=info, settings={key: value for key, value in asdict(config).items()
                                          if key not in ("json", "plot")})
    try:
        log(f"emfast bench: preparing the built-in volume {tuple(config.volume_shape)} ...")
        volumes = load_volumes(config.volume_shape, config.cache_dir)
        try:
            record.update(task=_task(volumes.path, config))
            started = time.perf_counter()
            log(f"comparison: {config.rounds} round(s) of ~{config.seconds:g} s per row ...")
            rows = compare(volumes, config, record)
            goals = targets(rows, config)
            record.update(rows=rows, targets=goals)
            curve = curves(volumes, config, record) if config.curves else None
            seconds = time.perf_counter() - started
        finally:
            volumes.close()
    except BaseException as error:
        record.failed(error)
        raise
    record.update(curves=curve, seconds=seconds, leftovers=leftovers(threads_before, children_before),
                  report=report(info, config, volumes.path, rows, goals, curve), complete=True)
    return record.result


def _task(volume_path: str, config: Settings) -> dict:
    """The standard task as the JSON record states it."""
    return {"volume": volume_path, "volume_shape": list(config.volume_shape), "patch": list(config.patch),
            "batch_size": config.batch_size, "raw": "uint8 -> float32, x/255, intensity gain/bias",
            "labels": "uint64 -> affinities (1,0,0) (0,1,0) (0,0,1) float32 + uint8 mask",
            "augment": "mirror z/y/x p=0.5, transpose y<->x p=0.5, intensity",
            "output_bytes": output_bytes(config.patch, config.batch_size)}

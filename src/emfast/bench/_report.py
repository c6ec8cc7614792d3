"""What a run's numbers say: the text report (tables, where emfast's time goes, the curves) and the plot."""
from __future__ import annotations

from typing import Dict, List, Optional

from .._machine import cores
from ..pipeline import STAGES
from . import _reference as reference
from ._settings import PLOT_SOFTWARE, MiB, Settings


def _fmt_ratio(ratio: Optional[float]) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


def explain(rows: Dict[str, dict], config: Settings, load_average) -> List[str]:
    """Where emfast's time goes: its per-stage profile (``loader.profile``) against the copy floor."""
    emfast = rows["emfast"]
    profile = dict(emfast["profile_ms_per_batch"])
    n, wall = config.threads, emfast["ms_per_batch"]
    wait = profile.pop("wait")
    profile.pop("ahead", None)  # read-ahead threads' time, not the producers': it has no share of n x wall
    # Producers are busy all the time when the consumer only takes batches: n threads x wall time per batch is
    # spent in the stages or between them (Python, handing batches over).
    other = max(0.0, n * wall - sum(profile.values()))
    lines = [f"where the time goes: emfast threads={n}, {wall:.2f} ms per batch, {emfast['cpu_cores']:.2f} cores "
             f"busy; loader.profile in ms per batch, summed over the {n} producer thread(s):"]
    for stage, ms in sorted(profile.items(), key=lambda item: -item[1]):
        if ms >= 0.005:
            lines.append(f"  {stage:<8} {ms:8.2f}  {STAGES[stage]}")
    lines.append(f"  {'other':<8} {other:8.2f}  outside the stages: Python, handing batches over")
    lines.append(f"  {'wait':<8} {wait:8.2f}  {STAGES['wait']}")
    copy_ms = rows["copy"]["ms_per_batch"]
    work = n * wall - profile.get("stall", 0.0)
    lines.append(f"  the producers work {work:.2f} ms per batch ({n} x {wall:.2f} ms, less stalls); one np.copyto of "
                 f"the task's outputs takes {copy_ms:.2f} ms.")
    if emfast["cpu_cores"] < 0.8 * min(n, cores()):
        lines.append(f"  WARNING: emfast's {n} threads kept only {emfast['cpu_cores']:.2f} cores busy (load average "
                     f"{load_average}): other processes held the CPU, repeat on a quiet machine")
    return lines


def tables(rows: Dict[str, dict], goals: List[dict]) -> List[str]:
    """The comparison table and the targets table of the report, from the ``rows`` and ``targets`` of a run's
    result (or of its JSON record: the README's tables are checked against the recorded run this way)."""
    lines = [f"{'row':<42} {'batches/s':>10} {'Mvoxel/s':>10} {'ms/batch':>10} {'/ emfast':>9}", "-" * 85]
    for row in rows.values():
        if row["skipped"]:
            lines.append(f"{row['label']:<42} {row['skipped']}")
            continue
        lines.append(f"{row['label']:<42} {row['batches_per_s']:10.1f} {row['voxels_per_s'] / 1e6:10.1f} "
                     f"{row['ms_per_batch']:10.2f} {_fmt_ratio(row['ratio_to_emfast']):>9}")
    lines += ["", f"{'target (same run)':<62} {'measured':>9} {'target':>8}  result", "-" * 89]
    for goal in goals:
        measured = "" if goal["measured"] is None else (f"{goal['measured']:.2f}x" if "speed-up" in goal["name"]
                                                        else f"{goal['measured']:.2f}")
        lines.append(f"{goal['name']:<62} {measured:>9} {goal['target']:>8}  {goal['result']}")
    return lines


def report(info: dict, config: Settings, volumes_path: str, rows: Dict[str, dict], goals: List[dict],
           curve: Optional[dict]) -> List[str]:
    """The text report."""
    lines: List[str] = []
    out = lines.append
    n = config.threads
    out(f"emfast bench{' --quick' if config.quick else ''}: the standard task")
    out(f"  volume: built-in {tuple(config.volume_shape)} uint8 raw + uint64 labels, in memory ({volumes_path})")
    out(f"  batch {config.batch_size} x {tuple(config.patch)}; random windows, mirror z/y/x + transpose y<->x; "
        f"raw uint8 -> float32 (x/255, gain 1+-{reference.INTENSITY[0]:g}, bias +-{reference.INTENSITY[1]:g}); "
        f"labels -> 3 nearest-neighbour affinities + mask")
    out(f"machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), {info['memory_gib']} GiB, "
        f"load average {info['load_average']}")
    out(f"software: Python {info['python']}, NumPy {info['numpy']}, PyTorch {info['torch'] or 'not installed'}, "
        f"emfast {info['emfast']}")
    out(f"timing: {config.rounds} interleaved round(s) of ~{config.seconds:g} s per row; best round per row; "
        f"ratio = time per batch / emfast's (threads={n})")
    out("")
    lines.extend(tables(rows, goals))
    missed = [goal["name"] for goal in goals if goal["result"] == "MISS"]
    out("")
    if missed:
        out(f"MISSED: {'; '.join(missed)}")
    lines.extend(explain(rows, config, info["load_average"]))
    if curve is not None:
        out("")
        out(f"scaling (emfast; best of two passes of ~{config.curve_seconds / 2:g} s per point):")
        out(f"  threads (batch {config.batch_size} x {tuple(config.patch)}):")
        for p in curve["threads"]:
            out(f"    threads={p['threads']:<3} {_point(p)}")
        out(f"  cubic patch (batch {config.batch_size}, threads={n}; copy = np.copyto of the outputs):")
        for p in curve["patch"]:
            out(f"    {p['patch'][0]:>4}^3      {_point(p)}")
        out(f"  batch size ({tuple(config.patch)}, threads={n}):")
        for p in curve["batch_size"]:
            out(f"    batch={p['batch_size']:<4}  {_point(p)}")
        out(f"  peak RSS against ring slots (batch {config.batch_size} x {tuple(config.patch)}, threads={n}):")
        for p in curve["slots"]:
            out(f"    slots={p['slots']:<3}  peak RSS {p['peak_rss'] / MiB:8.1f} MiB, +{p['peak_growth'] / MiB:7.1f} "
                f"MiB over the loader-less process (slots hold {p['slot_bytes_total'] / MiB:.1f} MiB)")
    return lines


def _point(p: dict) -> str:
    if "skipped" in p:
        return f"skipped: {p['skipped']}"
    text = f"{p['batches_per_s']:8.1f} batches/s {p['voxels_per_s'] / 1e6:8.1f} Mvoxel/s"
    if "vs_copy" in p:
        text += f"   time / copy {p['vs_copy']:.2f}"
    return text


def plot(path: str, config: Settings, rows: Dict[str, dict], curve: Optional[dict]) -> None:
    """The comparison bars and, if measured, the four scaling curves, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 5 if curve is not None else 1
    columns = min(panels, 3)
    figure, axes = plt.subplots((panels + columns - 1) // columns, columns, figsize=(5.2 * columns,
                                                                                       4.2 * ((panels + 2) // 3)),
                                squeeze=False)
    axes = axes.ravel()
    measured = [row for row in rows.values() if not row["skipped"]]
    ax = axes[0]
    values = [row["voxels_per_s"] / 1e6 for row in measured]
    colours = ["tab:blue" if row["method"] == "emfast" else "tab:grey" if row["method"] == "copy" else "tab:orange"
               for row in measured]
    bars = ax.barh([row["label"] for row in measured], values, color=colours)
    for bar, row in zip(bars, measured):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {row['ratio_to_emfast']:.2f}x time",
                va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Mvoxel/s (higher is better)")
    ax.set_title(f"batch {config.batch_size} x {tuple(config.patch)}")
    if curve is not None:
        def series(points, key):
            kept = [p for p in points if "skipped" not in p]
            return [p[key] for p in kept], kept

        xs, kept = series(curve["threads"], "threads")
        axes[1].plot(xs, [p["batches_per_s"] for p in kept], "o-")
        axes[1].set(xlabel="producer threads", ylabel="batches/s", title="emfast vs threads", xticks=xs)
        for ax, key, title, xlabel in ((axes[2], "patch", "vs cubic patch size", "patch edge (voxels)"),
                                       (axes[3], "batch_size", "vs batch size", "batch size")):
            points = [p for p in curve[key] if "skipped" not in p]
            xs = [p["patch"][0] if key == "patch" else p["batch_size"] for p in points]
            ax.plot(xs, [p["voxels_per_s"] / 1e6 for p in points], "o-", label="emfast")
            ax.plot(xs, [p["copy_voxels_per_s"] / 1e6 for p in points], "s--", color="tab:grey",
                    label="np.copyto of the outputs")
            ax.set_xscale("log", base=2)
            ax.set(xlabel=xlabel, ylabel="Mvoxel/s", title=f"emfast {title}")
            ax.legend(fontsize=8)
        slots = curve["slots"]
        axes[4].plot([p["slots"] for p in slots], [p["peak_growth"] / MiB for p in slots], "o-", label="peak RSS growth")
        axes[4].plot([p["slots"] for p in slots], [p["slot_bytes_total"] / MiB for p in slots], "s--",
                     color="tab:grey", label="slots x slot size")
        axes[4].set(xlabel="ring slots (buffers)", ylabel="MiB", title="peak RSS vs slots",
                    xticks=[p["slots"] for p in slots])
        axes[4].legend(fontsize=8)
    for ax in axes[1:panels]:
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[panels:]:
        ax.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": PLOT_SOFTWARE})  # known as ours, to be replaced later
    plt.close(figure)

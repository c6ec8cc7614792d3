#!/usr/bin/env python
"""Issue 23's GPU target: ``emfast.predict`` with a torch 3-D U-Net on CUDA against the network's own throughput.

    python benchmarks/predict_cuda.py [--rounds R] [--batch-size B] [--json PATH] [--quick] [--device cuda|cpu]

Network: a 3-D U-Net with valid convolutions, the kind the field trains for affinities: two 3x3x3 convolutions
(ReLU) per level, 12 feature maps multiplied by 5 per level, downsampling (1, 2, 2) then (2, 2, 2) by max-pooling,
transposed-convolution upsampling, cropped skip connections, 3 sigmoid outputs: (44, 140, 140) in,
3 x (20, 100, 100) out.

Baseline: the network alone on a resident batch of ``B`` tiles on the device, in inference mode, synchronised
after each call: tiles per second.
Contender: ``emfast.predict`` over a (100, 1200, 1200) uint8 volume in memory, default settings (gaussian blending,
float32 zarr output, zstd), the same batch size, ``device="cuda"``, ``threads`` 2 (the default) and half the cores,
and ``threads`` 2 with ``cuda_graphs=True`` (the network's calls replayed from captured CUDA graphs): tiles the
model computed per second of predict's wall time (set-up, probe and writing included).
Target: predict >= 0.9x the network alone. Rounds alternate; the best and median of each are reported.
Under each row, the best round's milliseconds per tile by stage of the network's calls: alone, the call (on a GPU
it launches the kernels) and the wait for the device; in predict, ``Prediction.profile`` (the copies to the
device, the call, the wait and copy back) and the share of predict's time the model was busy. A call that takes
longer in predict than alone means the launching thread shares its core or the GIL with predict's others.

``--device cpu`` runs the same code on the CPU (the model converts NumPy batches itself): a smoke test of this
script, not a measurement. ``--stand-in SECONDS`` needs no GPU and no torch: the network is a stand-in that
sleeps SECONDS per batch (releasing the GIL, as waiting for a GPU does) and returns fixed predictions, so the
ratio measures how well predict keeps a device busy on this machine's CPUs (the H100 took 9 ms per batch of 4).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

TARGET = 0.9
PATCH_IN, PATCH_OUT = (44, 140, 140), (20, 100, 100)
VOLUME = (100, 1200, 1200)


def unet(torch, fmaps=12, increase=5, outputs=3):
    """The U-Net above: (44, 140, 140) -> (20, 100, 100) with two levels of downsampling."""
    nn = torch.nn
    factors = [(1, 2, 2), (2, 2, 2)]

    def convs(channels_in, channels_out):
        return nn.Sequential(nn.Conv3d(channels_in, channels_out, 3), nn.ReLU(inplace=True),
                             nn.Conv3d(channels_out, channels_out, 3), nn.ReLU(inplace=True))

    def crop(tensor, shape):
        offsets = [(a - b) // 2 for a, b in zip(tensor.shape[2:], shape)]
        return tensor[(slice(None), slice(None)) + tuple(slice(o, o + s) for o, s in zip(offsets, shape))]

    widths = [fmaps * increase ** level for level in range(len(factors) + 1)]

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.ModuleList([convs(1, widths[0])] +
                                      [convs(widths[i], widths[i + 1]) for i in range(len(factors))])
            self.pool = nn.ModuleList([nn.MaxPool3d(f) for f in factors])
            self.up = nn.ModuleList([nn.ConvTranspose3d(widths[i + 1], widths[i], f, stride=f)
                                     for i, f in enumerate(factors)])
            self.merge = nn.ModuleList([convs(2 * widths[i], widths[i]) for i in range(len(factors))])
            self.head = nn.Conv3d(widths[0], outputs, 1)

        def forward(self, x):
            skips = []
            for level, down in enumerate(self.down):
                x = down(x)
                if level < len(factors):
                    skips.append(x)
                    x = self.pool[level](x)
            for level in reversed(range(len(factors))):
                x = self.up[level](x)
                x = self.merge[level](torch.cat([crop(skips[level], x.shape[2:]), x], dim=1))
            return torch.sigmoid(self.head(x))

    return UNet()


def network_alone(torch, net, device, batch_size, calls):
    """(tiles per second, ms per tile by stage) of ``net`` on a resident batch, synchronised after each call:
    stage "network" is the call (on a GPU, launching its kernels), "from device" the wait for the device."""
    batch = torch.rand((batch_size, 1) + PATCH_IN, device=device)
    with torch.inference_mode():
        output = net(batch)
        assert tuple(output.shape[2:]) == PATCH_OUT, output.shape
        for _ in range(3):
            net(batch)
        _synchronise(torch, device)
        start = launching = time.perf_counter()
        launches = 0.0
        for _ in range(calls):
            launching = time.perf_counter()
            net(batch)
            launches += time.perf_counter() - launching
            _synchronise(torch, device)
        seconds = time.perf_counter() - start
    tiles = calls * batch_size
    return tiles / seconds, {"network": 1e3 * launches / tiles, "from device": 1e3 * (seconds - launches) / tiles}


def _synchronise(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


class StandIn:
    """A device-bound network without a device: ``launches`` calls that give up the GIL and take it back (as each
    kernel launch of a network does, while the device works on), then asleep until ``seconds`` have passed since
    the call began (as synchronising with the device); fixed predictions."""

    def __init__(self, seconds: float, launches: int = 1) -> None:
        self.seconds, self.launches = seconds, launches
        self.predictions = np.random.default_rng(0).random((64, 3) + PATCH_OUT, dtype=np.float32)

    def __call__(self, batch):
        start = time.perf_counter()
        for _ in range(self.launches):
            time.sleep(0)
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - start)))
        return self.predictions[:len(batch)]


def stand_in_rate(net: StandIn, batch_size: int, calls: int = 30) -> tuple:
    """The stand-in's own (tiles per second, ms per tile by stage) (its sleeps overshoot a little)."""
    batch = np.zeros((batch_size, 1) + PATCH_IN, np.float32)
    start = time.perf_counter()
    for _ in range(calls):
        net(batch)
    seconds = time.perf_counter() - start
    return calls * batch_size / seconds, {"network": 1e3 * seconds / (calls * batch_size)}


def predict_stages(result) -> dict:
    """ms per tile computed by stage of the model's calls in a predict (``Prediction.profile``), and the share of
    predict's time the model was busy."""
    stages = {stage: 1e3 * seconds / result.tiles_computed for stage, seconds in result.profile.items()}
    return dict(stages, busy=result.profile["model"] / result.seconds)


def predict_rate(torch, net, device, raw, out, batch_size, threads, cuda_graphs=False):
    """(tiles per second, the Prediction) of emfast.predict with ``net``."""
    if isinstance(net, StandIn):
        model, on = net, None
    elif device == "cuda":
        model, on = net, "cuda"
    else:
        def model(batch):
            with torch.inference_mode():
                return net(torch.from_numpy(batch)).numpy()
        on = None
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    start = time.perf_counter()
    result = ef.predict(model, raw, out, patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=batch_size,
                        device=on, threads=threads, cuda_graphs=cuda_graphs)
    seconds = time.perf_counter() - start
    return result.tiles_computed / seconds, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each measurement (default 2; --quick: 1)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="a small volume and network, 1 round (smoke test)")
    parser.add_argument("--stand-in", type=float, default=None, metavar="SECONDS",
                        help="a network sleeping SECONDS per batch instead of the U-Net (no GPU, no torch)")
    parser.add_argument("--launches", type=int, default=1,
                        help="with --stand-in: give up the GIL and take it back this many times per batch first, "
                             "as a network's kernel launches do")
    parser.add_argument("--switch-interval", type=float, default=None, metavar="SECONDS",
                        help="run with sys.setswitchinterval(SECONDS) (Python's default 0.005): whether the thread "
                             "launching the network's kernels waits for the GIL")
    parser.add_argument("--only", default=None, metavar="TEXT",
                        help="run only the predict rows whose name contains TEXT (for a profile)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.stand_in is not None:
        torch, net, args.device = None, StandIn(args.stand_in, args.launches), "stand-in"
    else:
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            print("predict_cuda: torch sees no CUDA device", file=sys.stderr)
            return 2
        torch.backends.cudnn.benchmark = True
        net = unet(torch, fmaps=2 if args.quick else 12).to(args.device).eval()
    rounds = count_option(args.rounds, 2, 1, args.quick)
    raw, _ = make_em_volume((44, 240, 240) if args.quick else VOLUME, seed=0)
    many = max(2, (os.cpu_count() or 2) // 2)
    contenders = {"network alone": None, "predict threads=2": (2, False), f"predict threads={many}": (many, False)}
    if args.device == "cuda":
        contenders["predict threads=2 cuda_graphs"] = (2, True)
    if args.only is not None:
        contenders = {name: settings for name, settings in contenders.items()
                      if settings is None or args.only in name}
    rates = {name: [] for name in contenders}
    stages = {name: [] for name in contenders}  # per round: ms per tile by stage of the model's calls
    tiles = {}
    directory = tempfile.mkdtemp(prefix="emfast-bench-predict-cuda-")
    try:
        predict_rate(torch, net, args.device, raw, os.path.join(directory, "warm.zarr/p"), args.batch_size, 2)
        for _ in range(rounds):
            for name, settings in contenders.items():
                if settings is None:
                    rate, split = (stand_in_rate(net, args.batch_size) if torch is None else
                                   network_alone(torch, net, args.device, args.batch_size,
                                                 calls=4 if args.quick else 100))
                    rates[name].append(rate)
                    stages[name].append(split)
                    continue
                rate, result = predict_rate(torch, net, args.device, raw, os.path.join(directory, "p.zarr/p"),
                                            args.batch_size, *settings)
                rates[name].append(rate)
                stages[name].append(predict_stages(result))
                tiles[name] = {"plan": result.tiles, "computed": result.tiles_computed, "blocks": result.blocks}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    best = {name: max(values) for name, values in rates.items()}
    medians = {name: statistics.median(values) for name, values in rates.items()}
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    torch_version = None if torch is None else torch.__version__
    network = (f"stand-in, {net.seconds * 1e3:g} ms per batch after {net.launches} launches," if torch is None
               else "3-D U-Net")
    print(f"machine: {machine_info()}; device: {device_name}; torch {torch_version}; "
          f"switch interval {sys.getswitchinterval() * 1e3:g} ms")
    print(f"{network} {PATCH_IN} -> 3 x {PATCH_OUT}, batch {args.batch_size}, volume {raw.shape}, "
          f"best of {rounds} rounds (median), tiles/s:")
    rows = {}
    for name in contenders:
        ratio, ratio_median = best[name] / best["network alone"], medians[name] / medians["network alone"]
        split = stages[name][rates[name].index(best[name])]  # the best round's
        rows[name] = {"tiles_per_s": best[name], "tiles_per_s_median": medians[name], "all": rates[name],
                      "ratio": ratio, "ratio_median": ratio_median, "ms_per_tile": split,
                      **({"tiles": tiles[name]} if name in tiles else {})}
        verdict = "" if name == "network alone" else \
            f"  {ratio:.3f}x ({ratio_median:.3f}x) -> {'met' if ratio >= TARGET else 'NOT met'} (target >= {TARGET}x)"
        print(f"  {name:22s} {best[name]:8.1f} ({medians[name]:.1f}){verdict}")
        busy = f"model busy {split['busy']:.0%}; " if "busy" in split else ""  # kept in the JSON's row
        print(f"  {'':22s} {busy}ms per tile: " + ", ".join(f"{stage} {ms:.2f}" for stage, ms in split.items()
                                                            if stage != "busy"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "device": device_name, "torch": torch_version, "network": network,
                       "switch_interval": sys.getswitchinterval(),
                       "batch_size": args.batch_size, "volume": list(raw.shape), "rounds": rounds, "rows": rows,
                       "target": TARGET}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

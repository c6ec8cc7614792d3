"""Train a small 3-D network on emfast's built-in volume, predict affinities over the whole volume, write them to
zarr, and score them against the built-in labels.

    python examples/train_and_predict.py                  # 300 steps on the 96 x 384 x 384 volume (CPU is fine)
    python examples/train_and_predict.py --quick          # a minute's version on a smaller volume (what CI runs)

Needs torch and zarr (pip install torch "emfast[zarr]").
"""
from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

import emfast as ef
from emfast.io import LABELS_DATASET, RAW_DATASET, demo_volume_path

PATCH_OUT = (8, 44, 44)
CONTEXT = 3  # three valid 3x3x3 convolutions
PATCH_IN = tuple(p + 2 * CONTEXT for p in PATCH_OUT)
#: Valid convolutions take any input size: prediction uses larger tiles, fewer network calls per voxel.
PREDICT_OUT = (16, 96, 96)
#: Boundaries (affinity 0) are a few percent of the voxels; they weigh this much more in the loss.
BOUNDARY_WEIGHT = 5.0
OFFSETS = [(-1, 0, 0), (0, -1, 0), (0, 0, -1)]


def network() -> torch.nn.Module:
    """Three valid convolutions: (B, 1, *PATCH_IN) raw -> (B, 3, *PATCH_OUT) affinity logits."""
    return torch.nn.Sequential(
        torch.nn.Conv3d(1, 16, 3), torch.nn.ReLU(),
        torch.nn.Conv3d(16, 16, 3), torch.nn.ReLU(),
        torch.nn.Conv3d(16, len(OFFSETS), 3))


def train(net: torch.nn.Module, volume_file: Path, steps: int) -> float:
    """Train on affinities from the labels with emfast's loader; returns the last loss."""
    raw = ef.hdf5(volume_file, RAW_DATASET)
    labels = ef.hdf5(volume_file, LABELS_DATASET)
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = ef.Loader(raw, labels, patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=4,
                       augment=[ef.Mirror(), ef.Transpose(), ef.Intensity(scale=0.1, shift=0.1)],
                       targets=[ef.Affinities(offsets=OFFSETS)], epoch_size=steps, threads=2, seed=0)
    loss = float("nan")
    with loader:
        for step, batch in enumerate(loader):
            tensors = batch.torch()
            logits = net(tensors["raw"])
            target = tensors["affinities"]
            weight = tensors["affinities_mask"] * (1.0 + (BOUNDARY_WEIGHT - 1.0) * (1.0 - target))
            loss_value = torch.nn.functional.binary_cross_entropy_with_logits(logits, target, weight=weight)
            optimiser.zero_grad()
            loss_value.backward()
            optimiser.step()
            loss = loss_value.item()
            if step % 50 == 0 or step == steps - 1:
                print(f"step {step:4d}  loss {loss:.4f}")
    return loss


def true_affinities(labels: np.ndarray) -> tuple:
    """Affinities of the whole label volume and where they are known (inside the volume), with emfast's kernel."""
    targets = ef.compute_targets(np.ascontiguousarray(labels[np.newaxis, np.newaxis]),
                                 [ef.Affinities(offsets=OFFSETS)])
    return targets["affinities"][0], targets["affinities_mask"][0]


def score(predicted: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy of the thresholded affinities (with that of always answering the majority class), and the F1
    score of the boundaries (affinity 0), the rare class that matters for segmentation (0 for the majority)."""
    truth, known = true_affinities(labels)
    known = known > 0
    connected = predicted[known] >= 128  # uint8 output: probability 0.5
    actual = truth[known] > 0.5
    found = np.sum(~connected & ~actual)
    f1 = 2 * found / max(1, np.sum(~connected) + np.sum(~actual))
    return {"accuracy": float(np.mean(connected == actual)),
            "majority": float(max(np.mean(actual), np.mean(~actual))), "boundary_f1": float(f1)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))  # the first paragraph
    parser.add_argument("--quick", action="store_true", help="few steps on a small volume (for CI)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 300, quick: 20)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the zarr store to write and keep (default: a temporary one, removed at the end)")
    args = parser.parse_args(argv)
    steps = args.steps or (20 if args.quick else 300)
    volume_file = demo_volume_path(shape=(24, 96, 96) if args.quick else (96, 384, 384))
    torch.manual_seed(0)
    net = network()

    started = time.perf_counter()
    loss = train(net, volume_file, steps)
    print(f"trained {steps} steps in {time.perf_counter() - started:.1f} s, last loss {loss:.4f}")

    net.eval()

    def affinities(batch: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(net(batch))

    with output_store(args.out) as out_dir:
        patch_out = PATCH_OUT if args.quick else PREDICT_OUT
        result = ef.predict(affinities, f"{volume_file}/{RAW_DATASET}", f"{out_dir}/affinities",
                            patch_in=tuple(p + 2 * CONTEXT for p in patch_out), patch_out=patch_out,
                            overlap=tuple(p // 4 for p in patch_out), blend="gaussian", tta=4, dtype="uint8",
                            device="cpu", batch_size=4, overwrite=True, progress=True)
        print(f"predicted {result.shape} in {result.seconds:.1f} s -> {result.path}")

        predicted = ef.open(result.path).array
        labels = ef.hdf5(volume_file, LABELS_DATASET).array[0]
        scores = score(predicted, labels)
    print(f"affinity accuracy {scores['accuracy']:.3f} (always the majority class: {scores['majority']:.3f}), "
          f"boundary F1 {scores['boundary_f1']:.3f}")
    if args.out is None:
        print("the prediction was written to a temporary folder, now removed: pass --out to keep it")
    return dict(scores, loss=loss, path=result.path if args.out is not None else None)


@contextmanager
def output_store(out: Path | None):
    """The zarr store to predict into: ``out`` if given (kept), else one in a temporary folder that is removed on
    leaving, so that runs do not pile up predictions in /tmp."""
    if out is not None:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="emfast-example-") as folder:
        yield Path(folder) / "prediction.zarr"


if __name__ == "__main__":
    main()

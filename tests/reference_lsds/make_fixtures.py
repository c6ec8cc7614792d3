"""Reference local shape descriptors from funkelab's ``lsds`` package, saved as test fixtures.

``lsds`` depends on gunpowder, which pins zarr 2, so this script runs in a virtual environment of its own (it
does not import emfast)::

    python3 -m venv /tmp/lsdvenv && /tmp/lsdvenv/bin/pip install lsds==0.1.3
    /tmp/lsdvenv/bin/python tests/reference_lsds/make_fixtures.py

It writes one ``<case>.npz`` per case beside itself, holding the segmentation (uint64), the voxel size and sigma
(world units), and ``lsds`` as float16 (10, Z, Y, X): ``get_local_shape_descriptors(segmentation, sigma,
voxel_size=voxel_size)`` in gaussian mode over the whole array; and under ``planar/`` the 2-D descriptors of each
section (6, Z, Y, X), with sigma and the voxel size of (y, x). float16 keeps the files small; its rounding
(<= 2.5e-4 in [0, 1]) is far below the 0.01 the tests allow.
"""
import pathlib
import sys

import numpy as np
from lsd.train import local_shape_descriptor

HERE = pathlib.Path(__file__).resolve().parent


def random_segmentation(rng, shape):
    """Blocks of 2 voxels with random ids in 0..5 (0 is background), a third of them replaced by single voxels:
    many small objects, touching background and each other."""
    coarse = rng.integers(0, 6, size=tuple((s + 1) // 2 for s in shape))
    blocks = coarse.repeat(2, 0).repeat(2, 1).repeat(2, 2)[tuple(slice(s) for s in shape)]
    noise = rng.integers(0, 6, size=shape)
    return np.where(rng.random(shape) < 0.3, noise, blocks).astype(np.uint64)


def neurite_segmentation(rng, shape, voxel_size, count):
    """Anisotropic EM-like labels: ``count`` neurites running along z, each a seed whose (y, x) position follows
    a random walk from section to section; every voxel takes the nearest seed in its section (a Voronoi
    partition in world units), voxels near a cell border are background (membranes), and a few objects occupy
    a single section (as cut organelles do)."""
    z, y, x = shape
    seeds = rng.random((count, 2)) * np.array([y * voxel_size[1], x * voxel_size[2]])
    ys, xs = np.meshgrid(np.arange(y) * voxel_size[1], np.arange(x) * voxel_size[2], indexing="ij")
    labels = np.zeros(shape, dtype=np.uint64)
    for section in range(z):
        distance = (ys[None] - seeds[:, 0, None, None]) ** 2 + (xs[None] - seeds[:, 1, None, None]) ** 2
        order = np.sort(distance, axis=0)
        nearest = np.argmin(distance, axis=0)
        membrane = np.sqrt(order[1]) - np.sqrt(order[0]) < 1.5 * voxel_size[1]
        labels[section] = np.where(membrane, 0, nearest + 1)
        seeds += rng.normal(0, 2.0 * voxel_size[1], seeds.shape)
    for organelle in range(3):
        centre = rng.integers(0, shape)
        radius = rng.integers(2, 5)
        disc = (ys - centre[1] * voxel_size[1]) ** 2 + (xs - centre[2] * voxel_size[2]) ** 2 \
            < (radius * voxel_size[1]) ** 2
        labels[centre[0]][disc] = 1000 + organelle
    return labels


CASES = {
    # name: (segmentation maker, voxel size, sigma)
    "random_isotropic": (lambda rng: random_segmentation(rng, (8, 14, 16)), (1, 1, 1), (2.0, 2.0, 2.0)),
    "random_anisotropic": (lambda rng: random_segmentation(rng, (9, 12, 15)), (3, 1, 2), (3.0, 1.5, 5.0)),
    "random_at_voxel_size": (lambda rng: random_segmentation(rng, (7, 10, 11)), (2, 2, 2), (2.0, 2.0, 2.0)),
    "neurites_sigma80": (lambda rng: neurite_segmentation(rng, (10, 32, 32), (40, 4, 4), 6),
                         (40, 4, 4), (80.0, 40.0, 40.0)),
    "neurites_sigma120": (lambda rng: neurite_segmentation(rng, (10, 28, 30), (40, 4, 4), 5),
                          (40, 4, 4), (120.0, 24.0, 32.0)),
}


#: Described in plane, section by section, as lsds describes a 2-D segmentation (written to planar/): sigma and
#: voxel size of (y, x), the volume's z voxel size only placing the sections.
PLANAR_CASES = {
    "planar_random": (lambda rng: random_segmentation(rng, (5, 14, 17)), (1, 1, 2), (2.0, 3.0)),
    "planar_neurites_sigma40": (lambda rng: neurite_segmentation(rng, (6, 32, 30), (40, 4, 4), 6),
                                (40, 4, 4), (40.0, 32.0)),
}


def main(names):
    for number, (name, (make, voxel_size, sigma)) in enumerate(CASES.items()):
        if names and name not in names:
            continue
        segmentation = make(np.random.default_rng(number))
        lsds = local_shape_descriptor.get_local_shape_descriptors(segmentation, sigma, voxel_size=voxel_size)
        np.savez_compressed(HERE / f"{name}.npz", segmentation=segmentation, voxel_size=np.array(voxel_size),
                            sigma=np.array(sigma), lsds=lsds.astype(np.float16))
        print(f"{name}: segmentation {segmentation.shape}, {len(np.unique(segmentation))} ids, "
              f"voxel size {voxel_size}, sigma {sigma}")
    (HERE / "planar").mkdir(exist_ok=True)
    for number, (name, (make, voxel_size, sigma)) in enumerate(PLANAR_CASES.items(), start=len(CASES)):
        if names and name not in names:
            continue
        segmentation = make(np.random.default_rng(number))
        lsds = np.stack([local_shape_descriptor.get_local_shape_descriptors(section, sigma,
                                                                            voxel_size=voxel_size[1:])
                         for section in segmentation], axis=1)  # (6, Z, Y, X)
        np.savez_compressed(HERE / "planar" / f"{name}.npz", segmentation=segmentation,
                            voxel_size=np.array(voxel_size), sigma=np.array(sigma), lsds=lsds.astype(np.float16))
        print(f"planar/{name}: segmentation {segmentation.shape}, voxel size {voxel_size}, sigma (y, x) {sigma}")


if __name__ == "__main__":
    main(sys.argv[1:])

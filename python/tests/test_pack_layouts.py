"""ddl-pack on ImageNet as people download it, written the way the real downloads are: the
devkit's meta.mat by scipy.io.savemat (ILSVRC ids shuffled, inner synsets after the leaves),
Hugging Face's parquet by pyarrow, timm's WebDataset shards, image-net.org's tars, Hugging
Face's gzip-compressed tars, ImageNet-21K-P's and the face-blurred ImageNet's tars of class
folders by tarfile, Kaggle's zip by zipfile, TensorFlow Datasets' and the TPU reference's
TFRecord files by the wire format and google-crc32c (tools/bench/imagenet_layouts.py). Every packed record is matched to its source
photo by its bytes (small baseline JPEGs are stored as they are) and its label compared with
torchvision's: ImageFolder's class index for a train image, and for a val image torchvision's
own reading of the devkit (parse_meta_mat, parse_val_groundtruth_txt)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
from PIL import Image

import ddl
from conftest import ROOT, binary

sys.path.insert(0, str(ROOT / "tools" / "bench"))
import imagenet_layouts  # noqa: E402

WNIDS = ["n01518878", "n01440764", "n01496331", "n01443537", "n01514859", "n01484850"]
TRAIN, VAL = 5, 3


def photo(path: Path, seed: int) -> None:
    """A small baseline JPEG (Pillow: 4:2:0, no progressive), different for every seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w, h = 24 + seed % 9, 20 + seed % 7
    pixels = bytes((x * 7 + y * 3 + seed * 37 + c * 50) % 256
                   for y in range(h) for x in range(w) for c in range(3))
    Image.frombytes("RGB", (w, h), pixels).save(path, "JPEG", quality=90)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source tree in every download form, under ``forms/``."""
    root = tmp_path_factory.mktemp("layouts")
    src = root / "src"
    rows = ["ImageId,PredictionString"]
    for c, w in enumerate(WNIDS):
        for i in range(TRAIN):
            photo(src / "train" / w / f"{w}_{100 + i}.JPEG", 10 * c + i)
    for k in range(len(WNIDS) * VAL):
        w = WNIDS[(k * 5) % len(WNIDS)]
        photo(src / "val" / f"ILSVRC2012_val_{k + 1:08d}.JPEG", 1000 + k)
        rows.append(f"ILSVRC2012_val_{k + 1:08d},{w} 1 2 3 4")
    (src / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    imagenet_layouts.write_all(src, root / "forms", seed=3, per_shard=7)
    return root


def torchvision_devkit_reader(name: str):
    """One of the devkit readers torchvision defines inside ``parse_devkit_archive``
    (``parse_meta_mat``, ``parse_val_groundtruth_txt``), as a function of its own: torchvision's
    code itself, without the archive's md5 check around it."""
    import scipy.io
    from torchvision.datasets import imagenet

    code = next(c for c in imagenet.parse_devkit_archive.__code__.co_consts
                if getattr(c, "co_name", None) == name)
    cells = tuple(types.CellType(scipy.io) for _ in code.co_freevars)  # its `sio`
    return types.FunctionType(code, imagenet.__dict__, name, None, cells)


def torchvision_reference(layouts: Path) -> dict:
    """source bytes -> (label, wnid) as torchvision reads the extracted download."""
    from torchvision.datasets import ImageFolder

    parse_meta_mat = torchvision_devkit_reader("parse_meta_mat")
    parse_val_groundtruth_txt = torchvision_devkit_reader("parse_val_groundtruth_txt")

    extracted = layouts / "forms" / "extracted"
    train = ImageFolder(str(extracted / "train"))
    ref = {Path(p).read_bytes(): (label, train.classes[label]) for p, label in train.samples}
    devkit = str(extracted / "ILSVRC2012_devkit_t12")
    idx_to_wnid, _ = parse_meta_mat(devkit)
    for k, idx in enumerate(parse_val_groundtruth_txt(devkit)):
        wnid = idx_to_wnid[idx]
        image = extracted / "val" / f"ILSVRC2012_val_{k + 1:08d}.JPEG"
        ref[image.read_bytes()] = (train.class_to_idx[wnid], wnid)
    return ref


@pytest.mark.parametrize("form", ["downloads", "extracted", "parquet", "wds", "hf-tars",
                                  "kaggle-zip/imagenet-object-localization-challenge.zip",
                                  "tree-tar/imagenet21k_resized.tar.gz", "blurred",
                                  "tfds/imagenet2012",
                                  "tpu-tfrecord"])
def test_every_record_has_torchvisions_label(layouts: Path, form: str) -> None:
    out = layouts / f"out-{form.split('/')[0]}"
    done = subprocess.run([binary("ddl-pack"), layouts / "forms" / form, "-o", out,
                           "--shards", "2", "--max-short-side", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "val labels:" in done.stdout, done.stdout
    ref = torchvision_reference(layouts)
    for split, count in (("train", len(WNIDS) * TRAIN), ("val", len(WNIDS) * VAL)):
        shards = ddl.Shards(out, split)
        assert len(shards) == count
        got = {}
        for i in range(len(shards)):
            jpeg, label, _, _ = shards[i]
            got[jpeg] = (label, shards.classes[label])
        assert got == {b: ref[b] for b in got}, f"{form} {split}: labels differ"
        assert len(got) == count


def test_a_val_tar_without_the_devkit_is_refused(layouts: Path) -> None:
    lone = layouts / "lone"
    lone.mkdir()
    (lone / "ILSVRC2012_img_val.tar").symlink_to(
        layouts / "forms" / "downloads" / "ILSVRC2012_img_val.tar")
    done = subprocess.run([binary("ddl-pack"), lone, "-o", layouts / "out-lone"],
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stdout
    assert "ILSVRC2012_devkit_t12.tar.gz" in done.stderr and "without labels" in done.stderr
    assert not (layouts / "out-lone" / "manifest.json").exists()

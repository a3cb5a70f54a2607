"""Lays out one ImageNet-style image set in each form people download ImageNet in, written the
way the real ones are (scipy.io.savemat for the devkit's meta.mat, pyarrow for Hugging Face's
parquet, tarfile for the tars):

- ``downloads/``: image-net.org's ILSVRC2012_img_train.tar (a tar of per-class tars),
  ILSVRC2012_img_val.tar (flat) and ILSVRC2012_devkit_t12.tar.gz (data/meta.mat with the
  ILSVRC ids in a shuffled order and inner synsets after the leaves, and the val ground truth);
- ``extracted/``: the same extracted (train/<wnid>/, flat val/, ILSVRC2012_devkit_t12/);
- ``parquet/``: Hugging Face's imagenet-1k repository (data/{train,validation}-*.parquet with
  an ``image`` struct and a ``label``, row groups of 100 rows, the ``huggingface`` metadata, and
  classes.py);
- ``wds/``: timm's WebDataset shards (imagenet1k-{train,validation}-NNNN.tar of KEY.jpg,
  KEY.cls, KEY.json);
- ``hf-tars/``: Hugging Face's imagenet-1k before its parquet conversion
  (data/train_images_{0,1}.tar.gz and data/val_images.tar.gz, gzip level 6, of images named
  NAME_<wnid>.JPEG, and classes.py);
- ``kaggle-zip/imagenet-object-localization-challenge.zip``: Kaggle's download, by zipfile
  (deflated): ILSVRC/Data/CLS-LOC/train/<wnid>/, a flat val/, LOC_val_solution.csv and
  LOC_synset_mapping.txt;
- ``tree-tar/imagenet21k_resized.tar.gz``: a tar of class folders as image-net.org's
  ImageNet-21K-P is (imagenet21k_resized/imagenet21k_{train,val}/<wnid>/, gzip level 6);
- ``blurred/``: image-net.org's face-blurred ImageNet (train_blurred.tar.gz and
  val_blurred.tar.gz of {train,val}_blurred/<wnid>/, gzip level 6);
- ``tfds/imagenet2012/5.1.0/``: TensorFlow Datasets' imagenet2012
  (imagenet2012-{train,validation}.tfrecord-NNNNN-of-NNNNN of shuffled records with ``image``,
  ``label`` and ``file_name``, label.labels.txt, dataset_info.json, features.json);
- ``tpu-tfrecord/``: the TPU reference's imagenet_to_gcs.py output
  ({train,validation}-NNNNN-of-NNNNN: ``image/encoded``, ``image/class/label`` counted from 1,
  ``image/class/synset``, ``image/filename``, ``image/format``).

TFRecord files are written as TensorFlow's record_writer.cc writes them (google-crc32c for the
masked CRC-32Cs), each record a ``tf.train.Example`` encoded by the protobuf wire format
(feature.proto), without TensorFlow.

The source is a tree ``SRC/train/<wnid>/*.JPEG`` and a flat ``SRC/val/`` labelled by
``SRC/LOC_val_solution.csv`` (what ``ddl-synth`` writes). Files are hard-linked where a form
keeps them as files.

Usage: python imagenet_layouts.py SRC OUT [--seed 0] [--per-shard 1000]
"""
import argparse
import csv
import io
import json
import os
import random
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import google_crc32c
import scipy.io

DEVKIT = "ILSVRC2012_devkit_t12"
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
INNER = ["n00001740", "n00002137", "n00002452"]  # entity, abstraction, thing: inner synsets


def read_source(src):
    """(sorted wnids, train [(wnid, path)], val [(wnid, path)] in image-number order)."""
    src = Path(src)
    wnids = sorted(d.name for d in (src / "train").iterdir() if d.is_dir())
    train = [(w, p) for w in wnids for p in sorted((src / "train" / w).iterdir())]
    with open(src / "LOC_val_solution.csv") as f:
        rows = {r["ImageId"]: r["PredictionString"].split()[0] for r in csv.DictReader(f)}
    val = [(rows[p.stem], p) for p in sorted((src / "val").iterdir()) if p.stem in rows]
    return wnids, train, val


def ilsvrc_ids(wnids, seed):
    """wnid -> ILSVRC2012_ID: a shuffled order, as the devkit's is not the sorted one."""
    ids = list(range(1, len(wnids) + 1))
    random.Random(seed).shuffle(ids)
    return dict(zip(wnids, ids))


def write_meta_mat(path, ids):
    """The devkit's data/meta.mat: ``synsets``, leaves then inner synsets, as scipy writes it."""
    rows = [(i, w, 0, np.zeros((1, 0))) for w, i in ids.items()]
    n = len(rows)
    rows += [(n + k + 1, w, 2, np.array([[1.0, 2.0]])) for k, w in enumerate(INNER)]
    rows.sort(key=lambda r: r[0])
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
              "wordnet_height", "num_train_images"]
    synsets = np.empty((len(rows), 1), dtype=[(f, "O") for f in fields])
    for k, (i, w, children, kids) in enumerate(rows):
        synsets[k, 0] = (float(i), w, "words of " + w, "a gloss", float(children), kids, 0.0, 0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(path, {"synsets": synsets}, do_compression=True)


def ground_truth(val, ids):
    return "".join(f"{ids[w]}\n" for w, _ in val)


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def val_name(k):
    return f"ILSVRC2012_val_{k + 1:08d}.JPEG"


def write_downloads(out, wnids, train, val, ids):
    """image-net.org's three archives."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "ILSVRC2012_img_train.tar", "w", format=tarfile.GNU_FORMAT) as outer:
        for w in wnids:
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w", format=tarfile.GNU_FORMAT) as t:
                for _, p in (x for x in train if x[0] == w):
                    t.add(p, arcname=p.name)
            add(outer, f"{w}.tar", inner.getvalue())
    with tarfile.open(out / "ILSVRC2012_img_val.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for k, (_, p) in enumerate(val):
            t.add(p, arcname=val_name(k))
    meta = out / "meta.mat.tmp"
    write_meta_mat(meta, ids)
    with tarfile.open(out / f"{DEVKIT}.tar.gz", "w:gz") as t:
        add(t, f"{DEVKIT}/COPYING", b"the devkit's licence\n")
        t.add(meta, arcname=f"{DEVKIT}/data/meta.mat")
        add(t, f"{DEVKIT}/data/{GROUND_TRUTH}", ground_truth(val, ids).encode())
    meta.unlink()


def write_extracted(out, train, val, ids):
    """The archives extracted: train/<wnid>/, flat val/, the devkit folder."""
    for w, p in train:
        link(p, out / "train" / w / p.name)
    for k, (_, p) in enumerate(val):
        link(p, out / "val" / val_name(k))
    data = out / DEVKIT / "data"
    write_meta_mat(data / "meta.mat", ids)
    (data / GROUND_TRUTH).write_text(ground_truth(val, ids))


def link(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        os.link(src, dst)


def write_parquet(out, wnids, train, val, seed):
    """Hugging Face's imagenet-1k: shuffled rows, row groups of 100 (as ``datasets`` writes
    image datasets), the ``huggingface`` metadata and classes.py."""
    label = {w: i for i, w in enumerate(wnids)}
    features = {"image": {"_type": "Image"}, "label": {"names": wnids, "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("label", pa.int64())], metadata=meta)
    for split, items, files in (("train", train, 2), ("validation", val, 1)):
        rows = [(w, p, p.name if split == "train" else val_name(k)) for k, (w, p) in enumerate(items)]
        random.Random(seed).shuffle(rows)
        for i in range(files):
            part = rows[i::files]
            table = pa.table({
                "image": [{"bytes": p.read_bytes(), "path": name} for _, p, name in part],
                "label": [label[w] for w, _, _ in part],
            }, schema=schema)
            (out / "data").mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out / "data" / f"{split}-{i:05d}-of-{files:05d}.parquet",
                           row_group_size=100)
    entries = "".join(f'        "{w}": "words of {w}",\n' for w in wnids)
    (out / "classes.py").write_text(
        "from collections import OrderedDict\n\nIMAGENET2012_CLASSES = OrderedDict(\n    {\n"
        f"{entries}    }}\n)\n")


def write_wds(out, wnids, train, val, seed, per_shard):
    """timm's WebDataset shards: shuffled samples, KEY.jpg + KEY.cls + KEY.json."""
    label = {w: i for i, w in enumerate(wnids)}
    out.mkdir(parents=True, exist_ok=True)
    for split, items in (("train", train), ("validation", val)):
        samples = [(w, p, p.stem if split == "train" else val_name(k)[:-5])
                   for k, (w, p) in enumerate(items)]
        random.Random(seed).shuffle(samples)
        shards = max(1, -(-len(samples) // per_shard))
        for s in range(shards):
            with tarfile.open(out / f"imagenet1k-{split}-{s:04d}.tar", "w",
                              format=tarfile.GNU_FORMAT) as t:
                for w, p, key in samples[s::shards]:
                    t.add(p, arcname=f"{key}.jpg")
                    add(t, f"{key}.cls", str(label[w]).encode())
                    add(t, f"{key}.json", json.dumps({"filename": p.name, "label": label[w]}).encode())


def write_hf_tars(out, wnids, train, val, seed):
    """Hugging Face's imagenet-1k tars: shuffled images named NAME_<wnid>.JPEG, the training
    images in two gzip-compressed tars, the validation images in one."""
    (out / "data").mkdir(parents=True, exist_ok=True)
    named = [(w, p, f"{p.stem}_{w}.JPEG") for w, p in train]
    random.Random(seed).shuffle(named)
    parts = [(f"train_images_{i}.tar.gz", named[i::2]) for i in range(2)]
    parts.append(("val_images.tar.gz",
                  [(w, p, f"{val_name(k)[:-5]}_{w}.JPEG") for k, (w, p) in enumerate(val)]))
    for file, items in parts:
        with tarfile.open(out / "data" / file, "w:gz", compresslevel=6,
                          format=tarfile.GNU_FORMAT) as t:
            for _, p, name in items:
                t.add(p, arcname=name)
    entries = "".join(f'    "{w}": "words of {w}",\n' for w in wnids)
    (out / "classes.py").write_text(f"IMAGENET2012_CLASSES = {{\n{entries}}}\n")


def write_kaggle_zip(out, wnids, train, val):
    """Kaggle's imagenet-object-localization-challenge.zip, every member deflated."""
    import zipfile
    out.mkdir(parents=True, exist_ok=True)
    root = "ILSVRC/Data/CLS-LOC"
    rows = ["ImageId,PredictionString"]
    with zipfile.ZipFile(out / "imagenet-object-localization-challenge.zip", "w",
                         zipfile.ZIP_DEFLATED) as z:
        for w, p in train:
            z.write(p, f"{root}/train/{w}/{p.name}")
        for k, (w, p) in enumerate(val):
            z.write(p, f"{root}/val/{val_name(k)}")
            rows.append(f"{val_name(k)[:-5]},{w} 0 0 10 10")
        z.writestr("LOC_val_solution.csv", "\n".join(rows) + "\n")
        z.writestr("LOC_synset_mapping.txt", "".join(f"{w} words of {w}\n" for w in wnids))


def write_tree_tar(out, train, val):
    """ImageNet-21K-P's imagenet21k_resized.tar.gz: class folders under a train and a val
    folder."""
    out.mkdir(parents=True, exist_ok=True)
    root = "imagenet21k_resized"
    with tarfile.open(out / "imagenet21k_resized.tar.gz", "w:gz", compresslevel=6,
                      format=tarfile.GNU_FORMAT) as t:
        for w, p in train:
            t.add(p, arcname=f"{root}/imagenet21k_train/{w}/{p.name}")
        for k, (w, p) in enumerate(val):
            t.add(p, arcname=f"{root}/imagenet21k_val/{w}/{w}_{k}.JPEG")


def write_blurred(out, train, val):
    """image-net.org's face-blurred ImageNet: a tar.gz of class folders per split."""
    out.mkdir(parents=True, exist_ok=True)
    for split, items in (("train", [(w, p, p.name) for w, p in train]),
                         ("val", [(w, p, val_name(k)) for k, (w, p) in enumerate(val)])):
        with tarfile.open(out / f"{split}_blurred.tar.gz", "w:gz", compresslevel=6,
                          format=tarfile.GNU_FORMAT) as t:
            for w, p, name in items:
                t.add(p, arcname=f"{split}_blurred/{w}/{name}")


def varint(v):
    """A protobuf varint (a negative int64 as its two's complement, ten bytes)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def proto_field(tag, data):
    """A length-delimited protobuf field (wire type 2)."""
    return varint(tag << 3 | 2) + varint(len(data)) + data


def example(features):
    """A ``tf.train.Example`` of ``{key: bytes or int}`` (feature.proto: Features.feature is a
    map of Feature, a bytes_list (1) or int64_list (3) of one value, packed)."""
    entries = b""
    for key, value in features.items():
        if isinstance(value, int):
            feature = proto_field(3, proto_field(1, varint(value)))
        else:
            feature = proto_field(1, proto_field(1, value))
        entries += proto_field(1, proto_field(1, key.encode()) + proto_field(2, feature))
    return proto_field(1, entries)


def masked_crc(data):
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(path, records):
    """A TFRecord file: each record's length, its masked CRC-32C, the data, its masked CRC-32C."""
    with open(path, "wb") as f:
        for r in records:
            n = len(r).to_bytes(8, "little")
            f.write(n + masked_crc(n).to_bytes(4, "little") + r
                    + masked_crc(r).to_bytes(4, "little"))


def write_sharded(out, name, records, per_shard):
    """``records`` in shards ``{name}-NNNNN-of-NNNNN``."""
    shards = max(1, -(-len(records) // per_shard))
    for s in range(shards):
        write_tfrecord(out / f"{name}-{s:05d}-of-{shards:05d}", records[s::shards])


def write_tfds(out, wnids, train, val, seed, per_shard):
    """TensorFlow Datasets' imagenet2012: shuffled records numbered by the sorted wnids."""
    label = {w: i for i, w in enumerate(wnids)}
    out.mkdir(parents=True, exist_ok=True)
    for split, items in (("train", train), ("validation", val)):
        records = [example({"image": p.read_bytes(), "label": label[w],
                            "file_name": (p.name if split == "train" else val_name(k)).encode()})
                   for k, (w, p) in enumerate(items)]
        random.Random(seed).shuffle(records)
        write_sharded(out, f"imagenet2012-{split}.tfrecord", records, per_shard)
    (out / "label.labels.txt").write_text("".join(f"{w}\n" for w in wnids))
    (out / "dataset_info.json").write_text(json.dumps({"name": "imagenet2012"}))
    (out / "features.json").write_text("{}")


def write_tpu_tfrecord(out, wnids, train, val, seed, per_shard):
    """The TPU reference's imagenet_to_gcs.py output: labels counted from 1 (0 is background),
    the synset beside them."""
    label = {w: i + 1 for i, w in enumerate(wnids)}
    out.mkdir(parents=True, exist_ok=True)
    for split, items in (("train", train), ("validation", val)):
        records = [example({"image/class/label": label[w], "image/class/synset": w.encode(),
                            "image/format": b"JPEG", "image/encoded": p.read_bytes(),
                            "image/filename":
                                (p.name if split == "train" else val_name(k)).encode()})
                   for k, (w, p) in enumerate(items)]
        random.Random(seed).shuffle(records)
        write_sharded(out, split, records, per_shard)


def write_all(src, out, seed=0, per_shard=1000):
    """Writes every form under ``out``; returns (wnids, ilsvrc ids by wnid)."""
    out = Path(out)
    wnids, train, val = read_source(src)
    ids = ilsvrc_ids(wnids, seed)
    write_downloads(out / "downloads", wnids, train, val, ids)
    write_extracted(out / "extracted", train, val, ids)
    write_parquet(out / "parquet", wnids, train, val, seed)
    write_wds(out / "wds", wnids, train, val, seed, per_shard)
    write_hf_tars(out / "hf-tars", wnids, train, val, seed)
    write_kaggle_zip(out / "kaggle-zip", wnids, train, val)
    write_tree_tar(out / "tree-tar", train, val)
    write_blurred(out / "blurred", train, val)
    write_tfds(out / "tfds" / "imagenet2012" / "5.1.0", wnids, train, val, seed, per_shard)
    write_tpu_tfrecord(out / "tpu-tfrecord", wnids, train, val, seed, per_shard)
    return wnids, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-shard", type=int, default=1000)
    a = ap.parse_args()
    write_all(a.src, a.out, a.seed, a.per_shard)


if __name__ == "__main__":
    main()

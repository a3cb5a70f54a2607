"""ddl.Shards: map-style access to the packed JPEGs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ddl


def test_records_are_the_packed_jpegs_with_their_labels(shards: Path) -> None:
    val = ddl.Shards(shards, split="val")
    assert len(val) == 4 * 7
    labels = [val[i][1] for i in range(len(val))]
    assert sorted(set(labels)) == [0, 1, 2, 3]
    jpeg, label, height, width = val[-1]
    assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9"
    assert 0 < height <= 128 and 0 < width <= 128
    # The JPEG decodes to the size the index records.
    from torchvision.io import decode_jpeg
    image = decode_jpeg(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8))
    assert tuple(image.shape[1:]) == (height, width)
    assert val.verify() == []
    assert len(val.files) == 4 and all(f.endswith(".ddl") for f in val.files)


def test_index_out_of_range_and_missing_split(shards: Path) -> None:
    val = ddl.Shards(shards, split="val")
    with pytest.raises(IndexError, match="28"):
        val[28]
    with pytest.raises(ddl.DdlError):
        ddl.Shards(shards, split="test")

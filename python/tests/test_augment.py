"""ddl.Loader's recipe settings: crop scale and ratio, flip probability, mean/std, the eval
resize ratio, progressive resizing (set_image_size, resumed exactly across the change), and
drop_last=False's short last batch, measured against torch's DataLoader."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import ddl
from test_loader import Batches, batches_of, collect, image_hashes

# Every attempt too wide to fit: RandomResizedCrop's fallback, a centred crop with the ratio
# clamped, the same whatever the draws (scale 1 at the image's own ratio would leave a pixel
# of slack to a random offset in images whose sides round differently).
FIXED_CROP = {"scale": (1.0, 1.0), "ratio": (10.0, 10.0)}


def test_whole_image_crops_without_flips_repeat_every_epoch(shards: Path) -> None:
    """A crop no draw decides, and flip_p 0: each record's pixels are the same in every
    epoch (another order); with the defaults the crops differ."""
    fixed = ddl.Loader(shards, batch_size=8, image_size=32, workers=2, dtype="uint8",
                       flip_p=0.0, **FIXED_CROP)
    first, second = batches_of(fixed), batches_of(fixed)
    assert Counter(image_hashes(first)) == Counter(image_hashes(second))
    assert image_hashes(first) != image_hashes(second)  # another order
    default = ddl.Loader(shards, batch_size=8, image_size=32, workers=2, dtype="uint8")
    assert Counter(image_hashes(batches_of(default))) != Counter(image_hashes(batches_of(default)))


def test_flip_p_0_never_flips_and_1_always_flips(shards: Path) -> None:
    """Against the unflipped decode: p = 1 is its mirror image, batch for batch."""
    def run(p: float) -> Batches:
        return collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=2, seed=3,
                                  dtype="uint8", flip_p=p, **FIXED_CROP), epoch=2)
    never, always = run(0.0), run(1.0)
    assert len(never) == len(always) == 12
    for (x0, y0), (x1, y1) in zip(never, always):
        assert torch.equal(y0, y1)
        assert torch.equal(torch.flip(x0, dims=[3]), x1)  # NCHW (the default layout)
        assert not torch.equal(x0, x1)
    # The default flips about half of the images.
    half = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=2, seed=3,
                              dtype="uint8", **FIXED_CROP), epoch=2)
    flipped = sum(int(not torch.equal(a[i], b[i])) for (a, _), (b, _) in zip(never, half)
                  for i in range(len(a)))
    assert 20 < flipped < 76, flipped


def test_mean_and_std_set_the_float_output(shards: Path) -> None:
    mean, std = (0.1, 0.5, 0.9), (0.5, 1.0, 0.125)
    common: Dict[str, object] = {"batch_size": 8, "image_size": 32, "workers": 1, "seed": 5}
    raw = collect(ddl.Loader(shards, dtype="uint8", layout="NCHW", **common))
    floats = collect(ddl.Loader(shards, mean=mean, std=std, **common))
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    for (x8, _), (xf, _) in zip(raw, floats):
        assert torch.allclose(xf, (x8.float() / 255 - m) / s, atol=1e-5)


def test_eval_resize_ratio_changes_the_center_crop(shards: Path) -> None:
    """resize_ratio 1 is resize = image size (the whole shorter side), not the 8/7 default."""
    def val(**kw: object) -> List[str]:
        return image_hashes(collect(ddl.Loader(shards, split="val", batch_size=8,
                                               image_size=32, workers=1, **kw)))
    assert val(resize_ratio=1.0) == val(resize=32)
    assert val(resize_ratio=1.0) != val()
    assert val(resize_ratio=8 / 7) == val() == val(resize=37)
    assert val(resize_ratio=1.5) == val(resize=48)


@pytest.mark.parametrize("kwargs, name", [
    ({"scale": (0.0, 1.0)}, "scale"),
    ({"scale": (0.5, 1.5)}, "scale"),
    ({"scale": (0.5,)}, "scale"),
    ({"ratio": (2.0, 1.0)}, "ratio"),
    ({"flip_p": 1.5}, "flip_p"),
    ({"std": (0.2, 0.0, 0.2)}, "std"),
    ({"mean": (0.2, float("nan"), 0.2)}, "mean"),
    ({"resize_ratio": 0.5}, "resize_ratio"),
    ({"wrap": True}, "wrap"),
])
def test_bad_recipe_values_name_the_argument(shards: Path, kwargs: Dict[str, object],
                                             name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}:"):
        ddl.Loader(shards, **kwargs)


# Progressive resizing -----------------------------------------------------------------------

def shapes(batches: Batches) -> List[int]:
    return [x.shape[-1] for x, _ in batches]


def test_set_image_size_takes_effect_at_the_epoch_boundary(shards: Path) -> None:
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=2)
    it = iter(loader)
    head = [(x.clone(), y) for x, y in (next(it), next(it))]
    loader.set_image_size(48)
    rest = [(x.clone(), y) for x, y in it]
    assert shapes(head + rest) == [32] * 12  # the epoch under way keeps its size
    second = batches_of(loader)
    assert shapes(second) == [48] * 12 and second[0][0].shape == (8, 3, 48, 48)
    # The same batches as a loader that had 48 from the start, at epoch 1.
    fresh = collect(ddl.Loader(shards, batch_size=8, image_size=48, workers=1), epoch=1)
    assert image_hashes(second) == image_hashes(fresh)
    with pytest.raises(ValueError, match="^image_size:.*below 16"):
        loader.set_image_size(8)


def test_resume_across_the_size_change_is_exact(shards: Path) -> None:
    """state_dict taken mid-epoch after set_image_size: the resumed loader finishes the epoch
    at the old size and runs the next at the new one, bitwise as the uninterrupted run."""
    def loader() -> ddl.Loader:
        return ddl.Loader(shards, batch_size=8, image_size=32, workers=1)

    whole = loader()
    it = iter(whole)
    taken = [(x.clone(), y) for x, y in (next(it) for _ in range(3))]
    whole.set_image_size(48)
    state = whole.state_dict()
    assert (state["epoch"], state["step"], state["image_size"], state["next_image_size"]) \
        == (0, 3, 32, 48)
    uninterrupted = taken + [(x.clone(), y) for x, y in it] + batches_of(whole)
    resumed = loader()
    resumed.load_state_dict(state)
    tail = batches_of(resumed) + batches_of(resumed)
    assert shapes(tail) == [32] * 9 + [48] * 12
    assert image_hashes(tail) == image_hashes(uninterrupted[3:])
    # At the boundary: the next epoch's size alone.
    assert whole.state_dict()["image_size"] == 48


# drop_last=False -----------------------------------------------------------------------------

@pytest.mark.parametrize("ranks, batch", [(1, 10), (2, 10), (5, 8), (1, 100)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_lengths_and_last_batch_match_dataloader(shards: Path, monkeypatch: pytest.MonkeyPatch,
                                                 ranks: int, batch: int, drop_last: bool) -> None:
    """The ranks of one node over the 96 train records, against DataLoader + DistributedSampler
    over 96 samples: len of the loader and the sampler, and the last batch's size."""
    if drop_last and batch * ranks > 96:
        pytest.skip("no full batch: refused (test_absurd_arguments_are_refused_naming_the_limit)")
    samples = list(range(96))
    for rank in range(ranks):
        for k, v in {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": ranks,
                     "OMPI_COMM_WORLD_LOCAL_RANK": rank,
                     "OMPI_COMM_WORLD_LOCAL_SIZE": ranks}.items():
            monkeypatch.setenv(k, str(v))
        ours = ddl.Loader(shards, batch_size=batch, image_size=16, workers=1,
                          drop_last=drop_last)
        sampler = DistributedSampler(samples, num_replicas=ranks, rank=rank)
        theirs = DataLoader(samples, batch_size=batch, sampler=sampler, drop_last=drop_last)
        assert (len(ours), len(ours.sampler)) == (len(theirs), len(theirs.sampler))
        got = [len(y) for _, y in ours]
        assert got == [len(b) for b in theirs], (rank, got)
    # wrap=True keeps every batch full.
    if not drop_last:
        wrapped = ddl.Loader(shards, batch_size=batch, image_size=16, workers=1,
                             drop_last=False, wrap=True)
        assert {len(y) for _, y in wrapped} == {batch}

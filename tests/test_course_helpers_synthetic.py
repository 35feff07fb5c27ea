"""The synthetic stand-in is deterministic, whole, loadable by torchvision and learnable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import transforms
from torchvision.datasets import CIFAR10

import course_helpers as synthetic
from course_helpers import CIFAR10_MEAN, CIFAR10_STD, SmallCNN


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    synthetic.generate_synthetic(root)
    return root


def manifest(root: Path) -> dict:
    folder = root / synthetic.SyntheticCIFAR10.base_folder
    return json.loads((folder / synthetic.MANIFEST).read_text())


def test_generation_is_deterministic(synthetic_root, tmp_path):
    synthetic.generate_synthetic(tmp_path)
    assert manifest(tmp_path) == manifest(synthetic_root)


def test_torchvisions_cifar10_code_loads_it(synthetic_root):
    train = synthetic.SyntheticCIFAR10(synthetic_root, train=True,
                                       transform=transforms.ToTensor())
    test = synthetic.SyntheticCIFAR10(synthetic_root, train=False)
    assert isinstance(train, CIFAR10)
    assert len(train) == synthetic.SYNTHETIC_TRAIN and len(test) == synthetic.SYNTHETIC_TEST
    image, label = train[0]
    assert image.shape == (3, 32, 32) and 0 <= label < 10
    assert train.classes == list(synthetic.SYNTHETIC_CLASSES)
    assert test.data.shape == (synthetic.SYNTHETIC_TEST, 32, 32, 3)
    assert test.data.dtype == np.uint8
    counts = np.bincount(train.targets, minlength=10)
    assert counts.min() > 0.7 * counts.mean()  # every class is well represented


def test_a_damaged_file_fails_integrity_and_is_regenerated(synthetic_root, tmp_path):
    base = synthetic.SyntheticCIFAR10.base_folder
    shutil.copytree(synthetic_root / base, tmp_path / base)
    assert synthetic.synthetic_is_whole(tmp_path)
    for name in ("batches.meta", "data_batch_3"):  # torchvision checks them at different times
        damaged = tmp_path / base / name
        damaged.write_bytes(damaged.read_bytes()[:-10])
        assert not synthetic.synthetic_is_whole(tmp_path)
        with pytest.raises(RuntimeError, match="corrupted"):
            synthetic.SyntheticCIFAR10(tmp_path)
        shutil.copy(synthetic_root / base / name, damaged)
    damaged.write_bytes(b"")
    synthetic.generate_synthetic(tmp_path)
    assert manifest(tmp_path) == manifest(synthetic_root)
    assert synthetic.synthetic_is_whole(tmp_path)


def test_interrupted_generation_leaves_nothing_half_written(tmp_path, monkeypatch):
    real = synthetic._dump
    calls = []

    def dump_then_interrupt(path, obj):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(path, obj)

    monkeypatch.setattr(synthetic, "_dump", dump_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        synthetic.generate_synthetic(tmp_path)
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert leftovers == []
    assert not synthetic.synthetic_is_whole(tmp_path)


def test_loading_before_generating_says_what_to_do(tmp_path):
    with pytest.raises(RuntimeError, match="prepare_cifar10"):
        synthetic.SyntheticCIFAR10(tmp_path)


def test_colour_leans_towards_the_class_hue():
    # Half of the images take their class's hue, the others a random one: the brightest channel
    # of a class's shape is then, most often, its hue's (a random hue's would be a third of them).
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 4, 7], 200)  # hues 0.0 (red), 0.4 (green), 0.7 (blue)
    images = synthetic.synthetic_images(labels, rng).astype(float)
    # The shape's pixels: the value of its colour is 0.6 or more, the background's 0.45 at most.
    shape = images.max(axis=1) > 150
    colour = (images * shape[:, None]).sum(axis=(2, 3)) / shape.sum(axis=(1, 2))[:, None]
    brightest = colour.argmax(axis=1)
    for label, channel in ((0, 0), (4, 1), (7, 2)):
        share = (brightest[labels == label] == channel).mean()
        assert share > 0.55, f"class {label}: channel {channel} brightest in {share:.0%}"


def test_small_cnn_learns_the_synthetic_classes(synthetic_root):
    torch.manual_seed(0)
    normalize = transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)

    def tensors(ds):
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div(255)
        return normalize(x), torch.tensor(ds.targets)

    x, y = tensors(synthetic.SyntheticCIFAR10(synthetic_root, train=True))
    x_test, y_test = tensors(synthetic.SyntheticCIFAR10(synthetic_root, train=False))
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(400):
        idx = torch.randint(0, len(x), (64,))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    assert accuracy > 0.5, f"accuracy {accuracy:.2f} after 400 steps (chance is 0.10)"

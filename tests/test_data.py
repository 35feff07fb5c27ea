"""The data set: the synthetic stand-in is deterministic, whole, loadable and learnable."""

from __future__ import annotations

import json
import multiprocessing as mp
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import transforms
from torchvision.datasets import CIFAR10

from ddp_lib import data
from ddp_lib.models import SmallCNN


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    data.generate_synthetic(root)
    return root


def manifest(root: Path) -> dict:
    return json.loads((root / data.SyntheticCIFAR10.base_folder / "manifest.json").read_text())


def test_generation_is_deterministic(synthetic_root, tmp_path):
    data.generate_synthetic(tmp_path)
    assert manifest(tmp_path) == manifest(synthetic_root)


def test_torchvisions_cifar10_code_loads_it(synthetic_root):
    train = data.SyntheticCIFAR10(synthetic_root, train=True, transform=transforms.ToTensor())
    test = data.SyntheticCIFAR10(synthetic_root, train=False)
    assert isinstance(train, CIFAR10)
    assert len(train) == data.SYNTHETIC_TRAIN and len(test) == data.SYNTHETIC_TEST
    image, label = train[0]
    assert image.shape == (3, 32, 32) and 0 <= label < 10
    assert train.classes == list(data.SYNTHETIC_CLASSES)
    assert test.data.shape == (data.SYNTHETIC_TEST, 32, 32, 3) and test.data.dtype == np.uint8
    counts = np.bincount(train.targets, minlength=10)
    assert counts.min() > 0.7 * counts.mean()  # every class is well represented


def test_corrupted_file_fails_integrity_and_is_regenerated(synthetic_root, tmp_path):
    data.generate_synthetic(tmp_path)
    batch = tmp_path / data.SyntheticCIFAR10.base_folder / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:-10])
    assert data.which(tmp_path, "synthetic") is None
    with pytest.raises(RuntimeError, match="corrupted"):
        data.SyntheticCIFAR10(tmp_path)
    data.generate_synthetic(tmp_path)
    assert manifest(tmp_path) == manifest(synthetic_root)
    assert data.which(tmp_path, "synthetic") == "synthetic"


def test_interrupted_generation_leaves_nothing_half_written(tmp_path, monkeypatch):
    real = data._dump
    calls = []

    def dump_then_interrupt(path, obj):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(path, obj)

    monkeypatch.setattr(data, "_dump", dump_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        data.generate_synthetic(tmp_path)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != ".synthetic.lock"]
    assert leftovers == []
    assert data.which(tmp_path, "synthetic") is None


def _prepare(root: str) -> str:
    return data.prepare_cifar10(root, source="synthetic", verbose=False)


def test_several_processes_preparing_at_once_agree(tmp_path, synthetic_root):
    with mp.get_context("spawn").Pool(3) as pool:
        found = pool.map(_prepare, [str(tmp_path)] * 3)
    assert found == ["synthetic"] * 3
    assert manifest(tmp_path) == manifest(synthetic_root)


def test_offline_auto_falls_back_to_synthetic(tmp_path, monkeypatch, capsys):
    def no_network(self):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(CIFAR10, "download", no_network)
    assert data.prepare_cifar10(tmp_path, source="auto") == "synthetic"
    out = capsys.readouterr().out
    assert "could not be downloaded" in out and "SYNTHETIC" in out
    with pytest.raises(RuntimeError, match="DDP_WORKSHOP_DATASET=synthetic"):
        data.prepare_cifar10(tmp_path, source="cifar10")


def test_loading_before_preparing_says_what_to_do(tmp_path):
    with pytest.raises(RuntimeError, match="prepare_cifar10"):
        data.cifar10(root=tmp_path)


def test_unknown_source_is_refused(monkeypatch):
    monkeypatch.setenv(data.SOURCE_ENV, "imagenet")
    with pytest.raises(ValueError, match="must be one of"):
        data.requested_source()


def test_small_cnn_learns_the_synthetic_classes(synthetic_root):
    torch.manual_seed(0)
    normalize = transforms.Normalize(data.CIFAR10_MEAN, data.CIFAR10_STD)

    def tensors(ds):
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div(255)
        return normalize(x), torch.tensor(ds.targets)

    x, y = tensors(data.SyntheticCIFAR10(synthetic_root, train=True))
    x_test, y_test = tensors(data.SyntheticCIFAR10(synthetic_root, train=False))
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

"""Which data set the lessons get: the real CIFAR-10 where it is whole, else the stand-in."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import urllib.error
from pathlib import Path

import pytest
from torchvision.datasets import CIFAR10

import course_helpers as helpers

REAL_SIZES = (helpers.CIFAR10_TRAIN, helpers.CIFAR10_TEST)


@pytest.fixture
def real_files(tmp_path, monkeypatch) -> Path:
    """Small files standing in for the real CIFAR-10's, with torchvision's checksums made theirs:
    what is recognised is then decided by the checksums ``CIFAR10`` lists, as for the real one."""
    folder = tmp_path / CIFAR10.base_folder
    folder.mkdir()

    def listed(name: str) -> list[str]:
        content = name.encode()
        (folder / name).write_bytes(content)
        return [name, hashlib.md5(content).hexdigest()]

    monkeypatch.setattr(CIFAR10, "train_list", [listed(f"data_batch_{i}") for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [listed("test_batch")])
    name, md5 = listed(CIFAR10.meta["filename"])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5})
    return folder


def test_the_real_data_set_is_found_by_its_checksums(real_files, tmp_path):
    assert helpers.which(tmp_path, "auto") == helpers.which(tmp_path, "cifar10") == "cifar10"
    assert helpers.which(tmp_path, "synthetic") is None
    assert helpers.sample_counts(tmp_path, "auto") == REAL_SIZES
    meta = real_files / CIFAR10.meta["filename"]
    meta.write_bytes(b"damaged")  # torchvision's CIFAR10 would refuse to load it
    assert helpers.which(tmp_path, "cifar10") is None


def test_sample_counts_prepare_nothing(tmp_path):
    # With nothing on disk: the data set that preparing starts with, and nothing written.
    assert helpers.sample_counts(tmp_path, "synthetic") == (helpers.SYNTHETIC_TRAIN,
                                                         helpers.SYNTHETIC_TEST)
    assert helpers.sample_counts(tmp_path, "auto") == REAL_SIZES
    assert helpers.sample_counts(tmp_path, "cifar10") == REAL_SIZES
    assert list(tmp_path.iterdir()) == []


def test_sample_counts_are_those_of_the_stand_in_on_disk(tmp_path, monkeypatch):
    # A stand-in of another size (made by another release, say) is counted, not assumed.
    monkeypatch.setattr(helpers, "SYNTHETIC_TRAIN", 500)
    monkeypatch.setattr(helpers, "SYNTHETIC_TEST", 120)
    helpers.generate_synthetic(tmp_path)
    assert helpers.sample_counts(tmp_path, "auto") == helpers.sample_counts(tmp_path, "synthetic")
    assert helpers.sample_counts(tmp_path, "synthetic") == (500, 120)
    assert helpers.sample_counts(tmp_path, "cifar10") == REAL_SIZES


def _prepare(root: str) -> str:
    return helpers.prepare_cifar10(root, source="synthetic", verbose=False)


def test_several_processes_preparing_at_once_agree(tmp_path):
    with mp.get_context("spawn").Pool(3) as pool:
        found = pool.map(_prepare, [str(tmp_path)] * 3)
    assert found == ["synthetic"] * 3
    assert helpers.synthetic_is_whole(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".prepare.lock", helpers.SyntheticCIFAR10.base_folder]


def test_offline_auto_falls_back_to_synthetic(tmp_path, monkeypatch, capsys):
    def no_network(self):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(CIFAR10, "download", no_network)
    monkeypatch.setattr(helpers, "SYNTHETIC_TRAIN", 500)  # small: quick to generate
    assert helpers.prepare_cifar10(tmp_path, source="auto") == "synthetic"
    out = capsys.readouterr().out
    assert "could not be downloaded" in out and "SYNTHETIC" in out
    monkeypatch.setenv(helpers.SOURCE_ENV, "auto")
    assert isinstance(helpers.cifar10(root=tmp_path), helpers.SyntheticCIFAR10)
    with pytest.raises(RuntimeError, match="DDP_WORKSHOP_DATASET=synthetic"):
        helpers.prepare_cifar10(tmp_path, source="cifar10")


def test_loading_before_preparing_says_what_to_do(tmp_path):
    with pytest.raises(RuntimeError, match="prepare_cifar10"):
        helpers.cifar10(root=tmp_path)


def test_unknown_source_is_refused(monkeypatch):
    monkeypatch.setenv(helpers.SOURCE_ENV, "imagenet")
    with pytest.raises(ValueError, match="must be one of"):
        helpers.requested_source()

"""workshop.compat: the supported torch range, and the torchvision built for each torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workshop import compat

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version, expected", [
    ("2.4.1", (2, 4, 1)),
    ("2.11.0+cu130", (2, 11, 0)),
    ("2.6.0a0+ecf3bae40a.nv25.01", (2, 6, 0)),
    ("2.5.0.dev20240801+cpu", (2, 5, 0)),
    ("0.26", (0, 26, 0)),
])
def test_release_reads_the_numbers_before_any_build_suffix(version, expected):
    assert compat.release(version) == expected


def test_release_refuses_what_is_not_a_version():
    with pytest.raises(ValueError, match="not a version"):
        compat.release("latest")


def test_table_covers_every_minor_release_of_the_supported_range():
    oldest, newest = (compat.release(v)[:2] for v in compat.SUPPORTED_TORCH)
    minors = {compat.release(t)[:2] for t in compat.TORCHVISION_FOR}
    assert minors == {(2, m) for m in range(oldest[1], newest[1] + 1)}


def test_each_torchvision_is_the_series_of_its_torch():
    # torchvision 0.(N+15) is built for torch 2.N across the range: a typo breaks the pattern.
    for torch_version, vision in compat.TORCHVISION_FOR.items():
        assert compat.release(vision)[1] == compat.release(torch_version)[1] + 15, torch_version


def test_the_pinned_torch_is_the_newest_tested_and_the_table_gives_the_pinned_torchvision():
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert compat.release(pins["torch"])[:2] == compat.release(compat.SUPPORTED_TORCH[1])[:2]
    assert compat.torchvision_for(pins["torch"]) == pins["torchvision"]


def test_torchvision_for_accepts_a_build_suffix_and_refuses_an_unknown_release():
    assert compat.torchvision_for("2.11.0+cu130") == "0.26.0"
    with pytest.raises(ValueError, match="no torchvision known for torch 2.3.1"):
        compat.torchvision_for("2.3.1")


@pytest.mark.parametrize("torch_version, vision", [
    ("2.4.1", "0.19.1"),
    ("2.11.0+cu130", "0.26.0+cu130"),
    ("2.6.0a0+ecf3bae40a.nv25.01", "0.21.0a0"),
    ("2.14.1", "0.29.2"),
])
def test_supported_pairs_pass(torch_version, vision):
    assert compat.check(torch_version, vision) == ([], [])


def test_an_older_torch_is_refused_with_what_was_found_and_what_to_do():
    problems, warnings = compat.check("2.3.1+cu121", "0.18.1")
    assert warnings == [] and len(problems) == 1
    assert "torch 2.3.1+cu121 is older" in problems[0]
    assert "torch 2.4 to 2.14" in problems[0] and "make setup" in problems[0]


def test_a_newer_torch_is_only_a_warning():
    problems, warnings = compat.check("2.15.0", "0.29.2")
    assert problems == []
    assert len(warnings) == 1 and "newer than the newest tested" in warnings[0]


def test_a_torchvision_built_for_another_torch_is_refused():
    problems, _ = compat.check("2.11.0", "0.25.0")
    assert len(problems) == 1 and "needs torchvision 0.26.x" in problems[0]


def test_a_missing_torchvision_is_refused():
    problems, _ = compat.check("2.11.0", None)
    assert len(problems) == 1 and "torchvision is not installed" in problems[0]


def test_check_installed_accepts_this_environment(capsys):
    assert compat.check_installed() == 0
    assert f"torch {torch.__version__}" in capsys.readouterr().out


def test_the_makefile_runs_it_as_a_script_without_importing_torch():
    script = ROOT / "workshop" / "compat.py"
    found = subprocess.run([sys.executable, "-S", str(script), "torchvision-for", "2.4.1"],
                           capture_output=True, text=True, check=True)
    assert found.stdout == "0.19.1\n"
    unknown = subprocess.run([sys.executable, "-S", str(script), "torchvision-for", "2.3.0"],
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "no torchvision known" in unknown.stderr


def test_the_oldest_release_is_the_last_patch_of_the_oldest_minor():
    assert compat.oldest_release() == "2.4.1"

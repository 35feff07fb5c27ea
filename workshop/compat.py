"""Which torch releases the course supports, and the torchvision release built for each.

A cluster runs the torch of its module or container, often a year or more behind the newest, so
the course supports a range rather than one version. ``make setup TORCH=system`` checks the torch
it finds against that range, and ``make compat TORCH=2.4.1`` builds an environment with an older
torch (and the torchvision built for it) to run the notebooks and the launch tests there.

This file imports nothing outside the standard library at module level, so the Makefile can run
it as a script with any Python: ``python workshop/compat.py torchvision-for 2.4.1``.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version

# Oldest and newest minor release the course is tested with (make compat, docs/compatibility.md).
SUPPORTED_TORCH = ("2.4", "2.14")

# Each torchvision release requires one torch release (its wheel's Requires-Dist: torch==X), so an
# environment with another torch needs this table. Read from the registry's wheel metadata;
# 0.29.1 and 0.29.2 ask for torch>=2.14.0, and 0.29.2 is the one requirements.txt pins.
TORCHVISION_FOR = {
    "2.4.0": "0.19.0",
    "2.4.1": "0.19.1",
    "2.5.0": "0.20.0",
    "2.5.1": "0.20.1",
    "2.6.0": "0.21.0",
    "2.7.0": "0.22.0",
    "2.7.1": "0.22.1",
    "2.8.0": "0.23.0",
    "2.9.0": "0.24.0",
    "2.9.1": "0.24.1",
    "2.10.0": "0.25.0",
    "2.11.0": "0.26.0",
    "2.12.0": "0.27.0",
    "2.12.1": "0.27.1",
    "2.13.0": "0.28.0",
    "2.14.0": "0.29.0",
    "2.14.1": "0.29.2",
}


def release(version: str) -> tuple[int, int, int]:
    """The numeric release of a version string, as (major, minor, patch).

    Builds add suffixes that say nothing about the API: ``2.11.0+cu130`` (a wheel's CUDA),
    ``2.6.0a0+ecf3bae40a.nv25.01`` (a vendor's container), ``2.5.0.dev20240801``. Only the leading
    numbers decide which features torch has.
    """
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _minor(version: str) -> tuple[int, int]:
    return release(version)[:2]


def torchvision_for(torch_version: str) -> str:
    """The torchvision release to install beside torch ``torch_version`` (an exact release)."""
    key = "{}.{}.{}".format(*release(torch_version))
    if key not in TORCHVISION_FOR:
        known = ", ".join(TORCHVISION_FOR)
        raise ValueError(f"no torchvision known for torch {torch_version}; known: {known}")
    return TORCHVISION_FOR[key]


def check(torch_version: str, torchvision_version: str | None) -> tuple[list[str], list[str]]:
    """Compare the torch and torchvision found with the supported range.

    Returns (problems, warnings): a problem stops the set-up, a warning is printed. A torch newer
    than the newest tested is only a warning: the course detects torch's features rather than
    reading version strings, so it is expected to work, but nobody has run it there yet.
    """
    oldest, newest = SUPPORTED_TORCH
    supported = f"torch {oldest} to {newest}"
    problems: list[str] = []
    warnings: list[str] = []
    found = _minor(torch_version)
    if found < _minor(oldest):
        problems.append(
            f"torch {torch_version} is older than the course supports ({supported}). Load a newer "
            f"PyTorch module or container, or run `make setup` without TORCH=system to install "
            f"the torch of requirements.txt into the environment.")
    elif found > _minor(newest):
        warnings.append(
            f"torch {torch_version} is newer than the newest tested ({supported}); it should "
            f"work. `make compat TORCH=<version>` runs the notebooks and launch tests with it.")
    if torchvision_version is None:
        problems.append(
            f"torchvision is not installed beside torch {torch_version}. Install the release "
            f"built for that torch (pip install torchvision==<0.x>, see "
            f"workshop/compat.py), or use a module or container that has both.")
        return problems, warnings
    expected = {_minor(t): _minor(v) for t, v in TORCHVISION_FOR.items()}.get(found)
    if expected is not None and _minor(torchvision_version) != expected:
        wanted = "{}.{}".format(*expected)
        problems.append(
            f"torchvision {torchvision_version} was not built for torch {torch_version}: that "
            f"torch needs torchvision {wanted}.x. Install it (pip install "
            f"'torchvision=={wanted}.*'), or use a module or container that has both.")
    return problems, warnings


def check_installed() -> int:
    """Check the torch and torchvision this Python imports; print what was found. Exit status."""
    try:
        import torch
    except ImportError as error:
        print(f"torch cannot be imported ({error}). With TORCH=system, load the cluster's "
              f"PyTorch module or start its container first, or run `make setup` without "
              f"TORCH=system to install torch.", file=sys.stderr)
        return 1
    broken = ""
    try:
        import torchvision
        vision: str | None = torchvision.__version__
    except ImportError:
        vision = None
    except Exception as error:  # a torchvision built for another torch fails here
        broken = f"{type(error).__name__}: {error}"
        try:
            vision = version("torchvision")
        except PackageNotFoundError:
            vision = "(version unknown)"
    print(f"torch {torch.__version__} and torchvision {vision} from {torch.__file__}")
    problems, warnings = check(torch.__version__, vision)
    try:
        import numpy

        torch.from_numpy(numpy.zeros(1))
    except Exception as error:  # e.g. a torch built against NumPy 1 beside NumPy 2
        problems.append(
            f"torch {torch.__version__} cannot exchange arrays with the NumPy installed "
            f"({type(error).__name__}: {error}). Install the NumPy the torch was built with, "
            f"or a torch built for this NumPy.")
    if broken and not problems:
        problems.append(
            f"torchvision {vision} is installed but fails to import beside torch "
            f"{torch.__version__} ({broken}). It was built for another build of torch (CUDA or "
            f"CPU-only, another release): install the torchvision of the same build as torch.")
    for warning in warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    for problem in problems:
        print(f"Error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def oldest_release() -> str:
    """The newest patch release of the oldest supported torch, e.g. ``2.4.1``: what CI runs."""
    return max((t for t in TORCHVISION_FOR if _minor(t) == _minor(SUPPORTED_TORCH[0])),
               key=release)


def main(argv: list[str]) -> int:
    """``check``: check the installed torch; ``torchvision-for VERSION``: print the release;
    ``oldest``: print the oldest supported torch release."""
    if argv == ["check"]:
        return check_installed()
    if argv == ["oldest"]:
        print(oldest_release())
        return 0
    if len(argv) == 2 and argv[0] == "torchvision-for":
        try:
            print(torchvision_for(argv[1]))
        except ValueError as error:
            print(f"Error: {error}", file=sys.stderr)
            return 2
        return 0
    print("usage: compat.py check | oldest | torchvision-for TORCH_VERSION", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

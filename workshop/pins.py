"""The one list of pins, ``requirements.txt``, and the two lists written from it.

``pyproject.toml`` gets the pins above the line ``DEV`` as the project's dependencies and those
below it as its ``dev`` extra; ``environment.yml`` gets them all, then the project itself.
``python -m workshop.pins`` (``make pins``) writes both; ``tests/test_project.py`` fails when
either differs from what it would write.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS, PYPROJECT, ENVIRONMENT = (ROOT / name for name in (
    "requirements.txt", "pyproject.toml", "environment.yml"))
DEV = "# For contributors and the tests (pyproject.toml's dev extra):"
ENVIRONMENT_HEAD = """\
# conda env create -f environment.yml && conda activate ddp-workshop
# Written by `make pins` from requirements.txt, the one list of pins. The last line installs the
# project itself, editable (conda runs pip in this file's folder), so that scripts, job files
# and terminals import ddp_lib without PYTHONPATH.
name: ddp-workshop
channels:
  - conda-forge
dependencies:
  - python=3.11
  - pip
  - pip:
"""


def pins() -> tuple[list[str], list[str]]:
    """The course's pins and the contributors', each ``name==version`` with its comment."""
    text = REQUIREMENTS.read_text(encoding="utf-8")
    course, _, dev = text.partition(DEV + "\n")
    def lines(part): return [line for line in part.splitlines() if "==" in line]
    return lines(course), lines(dev)


def pyproject_text(current: str) -> str:
    """``current`` with its two lists of pins written from ``requirements.txt``."""
    for key, listed in zip(("dependencies", "dev"), pins(), strict=True):
        items = "".join(f'    "{line.split("#")[0].strip()}",'
                        + (f"  #{line.split('#', 1)[1]}" if "#" in line else "") + "\n"
                        for line in listed)
        current, found = re.subn(rf"^{key} = \[\n.*?^\]", f"{key} = [\n{items}]", current,
                                 count=1, flags=re.MULTILINE | re.DOTALL)
        if not found:
            raise ValueError(f"pyproject.toml has no list {key} = [...]")
    return current


def environment_text() -> str:
    course, dev = pins()
    return ENVIRONMENT_HEAD + "".join(f"      - {line.split('#')[0].strip()}\n"
                                      for line in course + dev) + "      - -e .\n"


def main() -> int:
    PYPROJECT.write_text(pyproject_text(PYPROJECT.read_text(encoding="utf-8")), encoding="utf-8")
    ENVIRONMENT.write_text(environment_text(), encoding="utf-8")
    print(f"wrote {PYPROJECT.name} and {ENVIRONMENT.name} from {REQUIREMENTS.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A lesson's training script, written from a notebook cell (``%%write_script NAME.py``) into the
git-ignored ``scripts/`` folder, for ``torchrun``: atomically, once the text compiles."""

from __future__ import annotations

import difflib
import importlib.util
import os
import textwrap
from pathlib import Path
from types import ModuleType

from ddp_lib.files import atomic_write_text

SCRIPTS_DIR = Path("scripts")
COURSE = Path(__file__).resolve().parents[1] / "notebooks"  # the lessons, beside this package


def write_script(name: str | os.PathLike, source: str, *,
                 directory: str | os.PathLike = SCRIPTS_DIR, quiet: bool = False) -> Path:
    """Write ``source`` (common indentation removed) to ``directory/name`` (``scripts/``, unless
    ``name`` has folders) and return the path; print nothing if ``quiet``.

    Raises:
        SyntaxError: the text is not valid Python (nothing is written).
    """
    path = Path(name)
    if not path.is_absolute() and path.parent == Path("."):
        path = Path(directory) / path
    text = normalised(source)
    compile(text, str(path), "exec")  # fail here, not in every rank at launch time
    current = path.exists() and path.read_text(encoding="utf-8") == text
    if not current:
        atomic_write_text(path, text)
    if not quiet:
        print("Kept, up to date:" if current else "Wrote", path, f"({text.count(chr(10))} lines).")
    return path


def normalised(source: str) -> str:
    """A script's text as written: common indentation removed, one newline at the end."""
    return textwrap.dedent(source).strip("\n") + "\n"


def from_notebook(notebook: str | os.PathLike, name: str, *,
                  directory: str | os.PathLike = SCRIPTS_DIR, quiet: bool = False) -> Path:
    """Write the script of ``notebook``'s ``%%write_script name`` cell: no drift from it."""
    return write_script(name, cell_text(notebook, name), directory=directory, quiet=quiet)


def cell_text(notebook: str | os.PathLike, name: str) -> str:
    """The text ``notebook``'s ``%%write_script name`` cell writes (a code cell, or raw in a
    track's edition). A lesson named bare is read from the course's own folder: a learner's edit
    in an edition never reaches a later lesson."""
    import nbformat  # Jupyter's; a script written from a notebook has Jupyter there

    if Path(notebook).name == str(notebook) and (COURSE / notebook).exists():
        notebook = COURSE / notebook
    for cell in nbformat.read(notebook, as_version=4).cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type in ("code", "raw") and first.split() == ["%%write_script", name]:
            return body
    raise LookupError(f"{notebook} has no '%%write_script {name}' cell")


def diff(old: str | os.PathLike, new: str | os.PathLike, context: int = 3) -> str:
    """The unified diff (as ``diff -u`` prints it) from one script file to another."""
    old, new = Path(old), Path(new)
    return "".join(difflib.unified_diff(
        old.read_text(encoding="utf-8").splitlines(keepends=True),
        new.read_text(encoding="utf-8").splitlines(keepends=True),
        fromfile=str(old), tofile=str(new), n=context))


def load_module(path: str | os.PathLike) -> ModuleType:
    """Import a lesson script as a module (its ``main()`` does not run): a notebook's checks."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def diff_size(old: str | os.PathLike, new: str | os.PathLike) -> int:
    """How many lines ``diff`` shows as changed: the ``-`` and ``+`` lines, without its headers."""
    body = diff(old, new).splitlines()[2:]  # after the two file-name lines
    return sum(1 for line in body if line.startswith(("+", "-")))


def write_script_magic(line: str, cell: str) -> None:
    """``%%write_script NAME``: write the cell's text to ``scripts/NAME``."""
    name = line.strip()
    if not name:
        raise ValueError("Usage: %%write_script NAME.py (then the script's text)")
    write_script(name, cell)

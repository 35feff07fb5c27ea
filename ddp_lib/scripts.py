"""A lesson's training script, written from a notebook cell into the git-ignored ``scripts/``
folder, for ``torchrun``: atomically, once the text compiles.

A cell writes a script in one of two forms. ``%%write_script NAME.py`` holds the whole text.
``%%write_script NAME.py --from PARENT.py`` holds a change to another script of the course, as
``diff -u`` prints it (its ``@@`` hunks; the two files are named on the first line): the script
a later step adds to is written once, and what the step adds is all its cell shows.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import textwrap
from pathlib import Path
from types import ModuleType

from ddp_lib.files import atomic_write_text

SCRIPTS_DIR = Path("scripts")
COURSE = Path(__file__).resolve().parents[1] / "notebooks"  # the lessons, beside this package
MAGIC = "%%write_script"
HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


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


def header(first_line: str) -> tuple[str, str | None] | None:
    """``(name, parent)`` of a ``%%write_script NAME [--from PARENT]`` line (``parent`` is
    ``None`` for a whole script), or ``None`` for any other line."""
    words = first_line.split()
    if words[:1] != [MAGIC] or len(words) not in (2, 4) or (len(words) == 4
                                                          and words[2] != "--from"):
        return None
    return words[1], (words[3] if len(words) == 4 else None)


def from_notebook(notebook: str | os.PathLike, name: str, *,
                  directory: str | os.PathLike = SCRIPTS_DIR, quiet: bool = False) -> Path:
    """Write the script of ``notebook``'s ``%%write_script name`` cell: no drift from it."""
    return write_script(name, cell_text(notebook, name), directory=directory, quiet=quiet)


def cell_text(notebook: str | os.PathLike, name: str) -> str:
    """The text ``notebook``'s ``%%write_script name`` cell writes (a code cell, or raw in a
    track's edition), its change applied to its parent if it has one. A lesson named bare is
    read from the course's own folder, and a parent always is: a learner's edit in an edition
    never reaches a later lesson."""
    if Path(notebook).name == str(notebook) and (COURSE / notebook).exists():
        notebook = COURSE / notebook
    for first, body in _script_cells(Path(notebook)):
        found = header(first)
        if found and found[0] == name:
            return script_of(first, body)
    raise LookupError(f"{notebook} has no '{MAGIC} {name}' cell")


def script_of(first_line: str, body: str, _through: tuple[str, ...] = ()) -> str:
    """The text a ``%%write_script`` cell writes, given its first line and the rest."""
    name, parent = header(first_line)
    if parent is None:
        return normalised(body)
    if parent in (*_through, name):
        raise ValueError(f"{' -> '.join((*_through, name, parent))}: a script cannot come from "
                         "itself")
    return apply_change(course_script(parent, (*_through, name)), body,
                        what=f"{name} --from {parent}")


def course_script(name: str, _through: tuple[str, ...] = ()) -> str:
    """The text of the course's one ``%%write_script name`` cell, in whichever lesson it is."""
    cells = [(path, first, body) for path in sorted(COURSE.glob("[0-9][0-9]_*.ipynb"))
             for first, body in _script_cells(path) if (header(first) or ("",))[0] == name]
    if len(cells) != 1:
        where = ", ".join(path.stem for path, _, _ in cells) or "no lesson"
        raise LookupError(f"'{MAGIC} {name}' is written by {where}: a parent needs exactly one")
    _, first, body = cells[0]
    return script_of(first, body, _through)


_CELLS: dict[Path, tuple[int, list[tuple[str, str]]]] = {}


def _script_cells(path: Path) -> list[tuple[str, str]]:
    """``(first line, rest)`` of each code or raw cell of a notebook that writes a script; read
    once per version of the file (a lesson resolves its chain of parents from them)."""
    import nbformat  # Jupyter's; a script written from a notebook has Jupyter there

    stamp = path.stat().st_mtime_ns
    if _CELLS.get(path, (None,))[0] != stamp:
        cells = nbformat.read(path, as_version=4).cells
        _CELLS[path] = (stamp, [tuple(cell.source.partition("\n")[::2]) for cell in cells
                                if cell.cell_type in ("code", "raw")
                                and cell.source.startswith(MAGIC)])
    return _CELLS[path][1]


def change(old_text: str, new_text: str) -> str:
    """The change from one script's text to another's, as a ``--from`` cell holds it: the hunks
    ``diff -u`` prints (three lines of context), without the two file names."""
    lines = difflib.unified_diff(normalised(old_text).splitlines(),
                                 normalised(new_text).splitlines(), lineterm="", n=3)
    return "\n".join(line.rstrip() for line in list(lines)[2:]) + "\n"


def apply_change(text: str, change_text: str, *, what: str = "the change") -> str:
    """``text`` with ``change_text`` (hunks as ``change`` writes them) applied.

    Each hunk's old lines (context and ``-``) must be in ``text``, in order: as ``patch`` does,
    a hunk is looked for at its stated line first, then at the nearest place after the last.
    A blank line in a hunk is a blank line of context (an editor may strip the lone space).

    Raises:
        ValueError: a hunk's old lines are not in ``text``, or a line is not part of a hunk.
    """
    lines, out, cursor = normalised(text).splitlines(), [], 0
    for head, body in _hunks(change_text, what):
        old = [line[1:] for line in body if line[:1] in (" ", "-", "")]
        new = [line[1:] for line in body if line[:1] in (" ", "+", "")]
        stated = int(HUNK_HEADER.match(head)[1]) - (1 if old else 0)
        fits = [at for at in range(cursor, len(lines) - len(old) + 1)
                if lines[at:at + len(old)] == old]
        if not fits:
            missing = [line for line in old if line not in lines[cursor:]]
            shown = "\n".join(f"    {line}" for line in (missing or old)[:4])
            raise ValueError(f"{what}: the hunk '{head}' does not fit the parent, which lacks "
                             + ("these of its lines:" if missing else "its lines in this order:")
                             + f"\n{shown}")
        at = min(fits, key=lambda start: abs(start - stated))
        out += lines[cursor:at] + new
        cursor = at + len(old)
    return "\n".join(out + lines[cursor:]) + "\n"


def changed_lines(change_text: str) -> list[str]:
    """The ``-`` and ``+`` lines of a change, signs kept: what a step removes and adds."""
    return [line for line in change_text.splitlines() if line[:1] in ("+", "-")]


def _hunks(change_text: str, what: str) -> list[tuple[str, list[str]]]:
    hunks: list[tuple[str, list[str]]] = []
    for number, line in enumerate(normalised(change_text).splitlines(), 1):
        if HUNK_HEADER.match(line):
            hunks.append((line, []))
        elif hunks and line[:1] in (" ", "-", "+", ""):
            hunks[-1][1].append(line)
        else:
            raise ValueError(f"{what}: line {number} is not part of a hunk (each starts with "
                             f"'@@ -a,b +c,d @@'; its lines with ' ', '-' or '+'): {line!r}")
    return hunks


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
    """``%%write_script NAME [--from PARENT]``: write the cell's text, or PARENT (as the course
    writes it) with the cell's change applied, to ``scripts/NAME``."""
    first = f"{MAGIC} {line}"
    found = header(first)
    if found is None:
        raise ValueError(f"Usage: {MAGIC} NAME.py (then the script's text), or {MAGIC} NAME.py "
                         "--from PARENT.py (then the change, as diff -u prints it)")
    name, parent = found
    if parent is None:
        write_script(name, cell)
        return
    text = script_of(first, cell)
    path = write_script(name, text, quiet=True)
    print(f"{path} ({text.count(chr(10))} lines): {parent} as its lesson writes it, with the "
          f"{len(changed_lines(cell))} changed lines above.")

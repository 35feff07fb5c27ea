"""The project's own files agree with each other."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pins(lines) -> dict[str, str]:
    found = {}
    for line in lines:
        match = re.fullmatch(r"\s*(?:-\s+)?([A-Za-z0-9_.-]+)==([^\s#]+)\s*(#.*)?", line)
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


def test_pyproject_and_conda_pins_are_written_from_requirements():
    """requirements.txt is the one list; make pins writes the other two from it."""
    from workshop import pins as pin_lists

    assert pin_lists.pyproject_text(pin_lists.PYPROJECT.read_text()) == \
        pin_lists.PYPROJECT.read_text(), "pyproject.toml's pins are stale: run make pins"
    assert pin_lists.environment_text() == pin_lists.ENVIRONMENT.read_text(), \
        "environment.yml's pins are stale: run make pins"
    requirements = pins((ROOT / "requirements.txt").read_text().splitlines())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pins(project["dependencies"] + project["optional-dependencies"]["dev"]) == \
        requirements == pins((ROOT / "environment.yml").read_text().splitlines())
    assert requirements["torch"].split(".")[:2] == ["2", "14"]
    assert requirements["torchvision"].startswith("0.29.")  # the release built for torch 2.14


def test_both_environments_install_the_project_itself():
    """So that scripts, job files and terminals import ddp_lib without PYTHONPATH (make: into the
    clone's own .venv); make builds it with the environment's own setuptools, the one
    pyproject.toml asks for."""
    makefile = (ROOT / "Makefile").read_text()
    (requirement,) = re.findall(r"^BUILD_REQUIREMENT := (\S+)$", makefile, flags=re.MULTILINE)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["build-system"]["requires"] == [requirement]
    assert "--no-build-isolation --editable ." in makefile
    conda = (ROOT / "environment.yml").read_text().splitlines()
    assert conda[-1].strip() == "- -e ."  # conda runs pip in this file's folder, the clone


def test_the_package_holds_every_file_of_ddp_lib():
    """A file left out would be missing from an install that is not editable."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools.get("package-data", {})
    library = ROOT / "ddp_lib"
    files = [p for p in library.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert any(p.suffix != ".py" for p in files)  # the job files' templates
    for path in sorted(files):
        package = ".".join(path.relative_to(ROOT).parent.parts)
        held_as_data = any(
            fnmatch(str(path.relative_to(ROOT / owner.replace(".", "/"))), pattern)
            for owner, patterns in data.items() if package.startswith(owner)
            for pattern in patterns)
        assert (path.suffix == ".py" and package in setuptools["packages"]) or held_as_data, path


def test_ci_runs_the_readmes_test_commands():
    readme = (ROOT / "README.md").read_text()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert [line.strip() for line in ci[-2:]] == ["make test", "make test-browser"]
    assert "make test " in readme and "make test-browser" in readme


def documented_targets() -> list[str]:
    """Every ``make TARGET [VAR=value]`` the README tells a reader to type."""
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"`?make ([a-z][a-z-]*(?: [A-Z]+=[\w.]+)*)", text)
    return sorted({command for command in found if command.split()[0] != "target"})


@pytest.mark.parametrize("command", documented_targets())
def test_every_documented_target_runs_in_its_dry_form(command):
    """``make -n``: each target exists and its recipe expands (what it would run is printed)."""
    done = subprocess.run(["make", "-n", *command.split()], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_benchmarks_find_torchrun_by_name_as_a_person_does():
    """They run the printed torchrun command, which the clone's environment puts on PATH."""
    done = subprocess.run(["make", "-n", "-p", "bench"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert re.search(rf"^bench: PATH := {re.escape(str(ROOT))}/\.venv/bin:", done.stdout,
                     re.MULTILINE), "make bench must put the clone's environment on PATH"


def test_readme_lists_every_notebook():
    readme = (ROOT / "README.md").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert notebook.name in readme, f"README does not mention {notebook.name}"


def _own_ddp_lib(clone: Path) -> str:
    """Where the clone's environment imports ddp_lib from, as a terminal would (no PYTHONPATH)."""
    done = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-I", "-c",
                           "import ddp_lib; print(ddp_lib.__file__)"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not (Path(sys.prefix) / ".ready").is_file(),
                    reason="needs the course's shared environment, made by `make setup`")
def test_two_clones_each_import_their_own_ddp_lib(tmp_path):
    """Two clones share the packages, never the project: each clone's make installs it into the
    clone's own .venv, and deleting one clone leaves the other whole."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAKEFLAGS", "MFLAGS")}
    clones = [tmp_path / "first", tmp_path / "second"]
    for clone in clones:
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
        subprocess.run(["make", "--no-print-directory", "setup", f"VENV={sys.prefix}"], cwd=clone,
                       env=env, check=True, capture_output=True, timeout=300)
    for clone in clones:
        assert _own_ddp_lib(clone) == str(clone / "ddp_lib" / "__init__.py")
    shutil.rmtree(clones[1])
    assert _own_ddp_lib(clones[0]) == str(clones[0] / "ddp_lib" / "__init__.py")
    torchrun = subprocess.run(  # a terminal's torchrun: its workers see this clone too
        [str(clones[0] / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node=1",
         "--no-python", "python", "-I", "-c", "import ddp_lib; print(ddp_lib.__file__)"],
        env={**env, "PATH": f"{clones[0] / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"},
        capture_output=True, text=True, timeout=120)
    assert torchrun.stdout.strip() == str(clones[0] / "ddp_lib" / "__init__.py"), torchrun.stderr
    mpi4py = subprocess.run(  # lesson 10's mpi4py script, from a terminal: MPICH's libmpi found
        [str(clones[0] / ".venv" / "bin" / "python"), "-c",
         "from mpi4py import MPI; print(MPI.Get_library_version().split()[0])"],
        env=env, capture_output=True, text=True, timeout=120)
    assert mpi4py.stdout.strip() == "MPICH", mpi4py.stderr


LIBRARY_FILES = sorted((ROOT / "ddp_lib").rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ddp_lib_imports() -> dict[str, set[str]]:
    """module -> the ddp_lib modules it imports anywhere (under ``TYPE_CHECKING`` too)."""
    import ast

    modules = {module_name(path) for path in LIBRARY_FILES}
    graph = {}
    for path in LIBRARY_FILES:
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddp_lib"):
                for alias in node.names:  # a module of the package, or a name in the module
                    whole = f"{node.module}.{alias.name}"
                    names.add(whole if whole in modules else node.module)
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names if alias.name.startswith("ddp_lib.")}
        graph[module_name(path)] = names
    return graph


def test_ddp_lib_stays_small_enough_to_read():
    """The whole library at most 3,820 lines, a module at most 400: a newcomer can hold it.
    (120 of them apply a cell's change to a script, which took 2,000 lines out of the lessons;
    the failure report's list of every rank's end, by time and in the last attempt only, took
    110, and the start-up hook's error files gave back 45.)"""
    lengths = {module_name(p): len(p.read_text().splitlines()) for p in LIBRARY_FILES}
    assert sum(lengths.values()) <= 3820, sorted(lengths.items(), key=lambda kv: -kv[1])[:5]
    assert max(lengths.values()) <= 400, max(lengths.items(), key=lambda kv: kv[1])


def test_ddp_lib_has_no_import_circle():
    graph = ddp_lib_imports()
    modules = set(graph)

    def circle_from(start: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for name in sorted(graph.get(start, set()) & modules):
            if name in seen:
                return (*seen[seen.index(name):], name)
            found = circle_from(name, (*seen, name))
            if found:
                return found
        return None

    circles = [circle for module in sorted(modules)
               if (circle := circle_from(module, (module,))) and module != "ddp_lib"]
    assert not circles, " -> ".join(circles[0])


def scripts_the_tests_write() -> list[tuple[str, str]]:
    """Every multi-line string constant in tests/ and benchmarks/ that parses as a Python program
    with imports: the workers the tests launch. Named ``file:line``."""
    found = []
    for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if not isinstance(text, str) or "\n" not in text or "import " not in text:
                continue
            text = textwrap.dedent(text)
            try:
                ast.parse(text)
            except SyntaxError:
                continue
            found.append((f"{path.relative_to(ROOT)}:{node.lineno}", text))
    return found


def test_the_scripts_the_tests_launch_name_nothing_undefined(tmp_path):
    """A worker script lives in a string, out of the linter's sight; a name it forgot to import
    fails only when a sweep launches it (an ``import time`` missed once cost a whole CI run)."""
    scripts = scripts_the_tests_write()
    assert len(scripts) > 30, "the scan found too few scripts to be looking in the right place"
    for index, (_, text) in enumerate(scripts):
        (tmp_path / f"script_{index}.py").write_text(text)
    ruff = Path(sys.executable).with_name("ruff")
    checked = subprocess.run([str(ruff), "check", "--isolated", "--no-cache", "--select", "F821",
                              "--output-format", "concise", str(tmp_path)],
                             capture_output=True, text=True)
    named = checked.stdout
    for index, (where, _) in enumerate(scripts):
        named = named.replace(str(tmp_path / f"script_{index}.py"), where)
    assert checked.returncode == 0, named


def test_the_lessons_scripts_say_each_part_once():
    """The cells that write the lessons' scripts hold at most 3,400 lines of code, and no function
    but ``main`` is defined in more than 8 of them: a later script is its parent's change
    (``%%write_script NEW --from OLD``), so a fix to a shared part is one edit. Of a change, its
    ``+`` and ``-`` lines count and a ``def`` on a ``+`` line defines."""
    import collections

    import nbformat

    from ddp_lib import scripts

    code_lines, defined_in = 0, collections.Counter()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            first, _, body = cell.source.partition("\n")
            if cell.cell_type != "code" or not scripts.header(first):
                continue
            lines = body.splitlines()
            if scripts.header(first)[1]:  # a change: what it adds and removes
                lines = [line[1:] for line in scripts.changed_lines(body)]
            code = [line for line in lines if line.strip() and not line.strip().startswith("#")]
            code_lines += len(code)
            defined_in.update({m[1] for line in code if (m := re.match(r"(?:def|class) (\w+)",
                                                                        line))})
    assert code_lines <= 3400
    shared = {name: n for name, n in defined_in.items() if n > 8 and name != "main"}
    assert not shared, f"defined in more than 8 scripts: {shared}"

"""The clone's own environment, ``.venv``: the shared packages, and this clone's ``ddp_lib``.

The course's packages (torch, JupyterLab, MPICH: 5 GB) are installed once, in a shared
environment outside the clone (the Makefile's ``VENV``), which every clone with the same pins
reuses. The project itself is not installed there: an editable install points at one clone
only, so a second clone's ``make`` would take it over, and deleting that clone would leave the
first without ``ddp_lib``. Instead each clone gets a small environment of its own, ``.venv``,
which sees the shared packages through a ``.pth`` file and has this clone installed, editable.
``source .venv/bin/activate`` in a terminal then gives ``python``, ``torchrun``, ``mpiexec``
and ``jupyter`` with this clone's ``ddp_lib``, whichever clone ran ``make`` last.

Usage (the Makefile's ``setup``): ``SHARED_PYTHON workshop/clone_env.py .venv``, run by the
shared environment's Python. It builds ``.venv`` anew when it is missing or was made for another
shared environment, and leaves it alone otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

MARKER = "ddp-workshop-shared"  # .venv/<MARKER>: the shared environment it was made for
PTH = "_ddp_workshop_shared.pth"


def shared_site_packages() -> Path:
    """The running (shared) environment's site-packages."""
    return Path(sysconfig.get_paths()["purelib"])


def sees_system_packages() -> bool:
    """Whether the running environment was made with ``--system-site-packages``."""
    config = Path(sys.prefix) / "pyvenv.cfg"
    return config.is_file() and any(
        line.replace(" ", "").lower() == "include-system-site-packages=true"
        for line in config.read_text().splitlines())


def is_current(target: Path) -> bool:
    """Whether ``target`` was made for the running environment and is whole."""
    marker = target / MARKER
    return marker.is_file() and marker.read_text().strip() == sys.prefix and (
        target / "bin" / "python").exists() and all(
        (target / "lib" / library.name).exists() for library in _shared_libraries())


def _shared_libraries() -> list[Path]:
    """What the shared environment's ``lib/`` holds besides Python's own folder: the native
    libraries that packages look for under ``sys.prefix``, such as MPICH's ``libmpi.so``, which
    mpi4py loads from ``sys.prefix/lib`` and nowhere else in a venv."""
    lib = Path(sys.prefix) / "lib"
    if not lib.is_dir():
        return []
    return sorted(p for p in lib.iterdir() if not p.name.startswith("python"))


def build(target: Path) -> None:
    """Make ``target`` a venv of this Python that sees the running environment's packages."""
    if target.exists():
        shutil.rmtree(target)
    # TORCH=system: the shared environment sees the system's torch, and so does this one.
    venv.EnvBuilder(with_pip=False, symlinks=True,
                    system_site_packages=sees_system_packages()).create(target)
    purelib = Path(sysconfig.get_paths(vars={"base": str(target), "platbase": str(target)})
                   ["purelib"])
    # addsitedir, not a bare path: the shared folder's own .pth files are read too.
    (purelib / PTH).write_text(f"import site; site.addsitedir({str(shared_site_packages())!r})\n")
    _link_programs(Path(sys.prefix) / "bin", target / "bin")
    for library in _shared_libraries():
        (target / "lib" / library.name).symlink_to(library)
    share = Path(sys.prefix) / "share" / "jupyter"
    if share.is_dir():  # JupyterLab's application, extensions and kernels
        (target / "share").mkdir(exist_ok=True)
        (target / "share" / "jupyter").symlink_to(share)
    (target / MARKER).write_text(sys.prefix + "\n")  # last: a half-built .venv is built again


def _link_programs(shared_bin: Path, own_bin: Path) -> None:
    """The shared environment's programs, in ``own_bin``: a Python script with its first line
    pointing at this environment's Python (so it sees this clone), any other program linked."""
    shared_python = str(shared_bin / "python")
    for program in sorted(shared_bin.iterdir()):
        own = own_bin / program.name
        if own.exists() or own.is_symlink() or program.name.startswith(("python", "activate",
                                                                          "Activate")):
            continue
        with program.open("rb") as f:
            first_line = f.readline()
        if first_line.startswith(b"#!") and shared_python.encode() in first_line:
            text = program.read_bytes().replace(first_line, f"#!{own_bin / 'python'}\n".encode(),
                                                1)
            own.write_bytes(text)
            own.chmod(0o755)
        else:
            own.symlink_to(program)


def forget_a_shared_install() -> None:
    """Uninstall the project from the shared environment, where an older set-up installed it:
    that install points at one clone, and would shadow every other clone's own."""
    if any(shared_site_packages().glob("__editable__.ddp_workshop*")):
        print(f"Uninstalling the project from the shared {sys.prefix}: each clone has its own")
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes",
                        "ddp-workshop"], check=True)


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv").absolute()
    forget_a_shared_install()
    if is_current(target):
        return
    print(f"Creating {target}: the shared packages of {sys.prefix}, and this clone's ddp_lib")
    build(target)


if __name__ == "__main__":
    main()

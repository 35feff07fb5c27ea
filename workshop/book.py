"""Build the course as a static site, for people who study alone: every lesson with its outputs
and figures in place, the schedule, the measured figures, and on each page how to run it.

``python -m workshop.book`` (``make book``) does three things:

1. **Executed notebooks**, in ``build/notebooks/``, as ``make run`` writes them. A lesson whose
   executed copy holds the course's current cells is reused (CI's browser sweep saves each lesson
   it runs there, so the course is not executed twice); any other is executed, headless. Only
   the code counts: the prose of each page comes from the course itself.
2. **The site's sources**, in ``build/book-src/``: each lesson as a reader should see it
   (solutions and instructor notes folded, a traceback cut to its last line, no machine paths in
   the outputs, how to run the lesson at the top), and the reference pages from ``docs/``.
3. **The site**, in ``build/book/`` (open ``index.html``): Sphinx with MyST-NB and the book theme
   (``book/conf.py``), with navigation by lesson and section, and search.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from workshop import sections

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
SOURCES = ROOT / "build" / "book-src"
SITE = ROOT / "build" / "book"
CONFIG = ROOT / "book"
DOCS = ("schedule.md", "benchmarks.md", "how-it-works.md", "troubleshooting.md",
        "compatibility.md")  # the reference a reader needs; instructors and contributors read git
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
RANK_PREFIX = re.compile(r"(\[\w+\] )?(.*)", re.S)  # ddp_lib's "[rank1] " before a rank's line
FRAME = re.compile(r'\s+File "([^"]+)", line \d+')  # a frame of a traceback, or of faulthandler
LEFT_OUT = "(frames inside the installed packages left out)"
WIDGET = "application/vnd.jupyter.widget-view+json"  # a view of a kernel's widget: none here
WIDGET_REPR = re.compile(r"[A-Z]\w*\(")  # ipywidgets' text form: VBox(children=(...


def code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def is_current(executed: Path, course: Path) -> bool:
    """Whether ``executed`` is a run of the course's notebook as its code is now. The prose
    does not change what a run printed: the site takes it from the course itself."""
    if not executed.exists():
        return False
    ran, now = (code_cells(nbformat.read(p, as_version=4)) for p in (executed, course))
    return [c.source for c in ran] == [c.source for c in now]


def with_outputs(course: Path, executed: Path) -> nbformat.NotebookNode:
    """The course's notebook, each code cell with what it printed in the executed run."""
    notebook = nbformat.read(course, as_version=4)
    ran = code_cells(nbformat.read(executed, as_version=4))
    for cell, run in zip(code_cells(notebook), ran, strict=True):
        cell.outputs, cell.execution_count = run.outputs, run.execution_count
    return notebook


def execute(stale: list[Path]) -> None:
    """Run each notebook headless, as ``make run`` does, into ``build/notebooks/``."""
    for number, path in enumerate(stale, 1):
        print(f"[{number}/{len(stale)}] executing {path.name} ...", flush=True)
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook",
                        "--execute", "--ExecutePreprocessor.timeout=1800", "--log-level=WARN",
                        "--output-dir", str(EXECUTED), str(path)], check=True)
        print(f"[{number}/{len(stale)}] {path.name}: {time.monotonic() - started:.0f} s",
              flush=True)


def scrubbed(text: str, machine: dict[str, str]) -> str:
    """``text`` without this machine's paths and name."""
    for found, shown in machine.items():
        text = text.replace(found, shown)
    text = re.sub(r"[^\s\"']*/ddp-workshop/venv-[\w-]+", "<environment>", text)  # the shared one
    # A lesson's own files, wherever the lesson ran (a copy in a test's folder): as it names them
    text = re.sub(r"[^\s\"']*/notebooks/(scripts|runs|checkpoints|data)/", r"\1/", text)
    host = socket.gethostname()
    if len(host) > 3:  # a name that short is a word too
        text = re.sub(rf"\b{re.escape(host)}\b", "<host>", text)
    return re.sub(r"/tmp/[^\s'\"/]+", "/tmp/…", text)


def machine_details() -> dict[str, str]:
    """This machine's folders an output may show, and what the site shows in their place:
    longest first, so that the clone's path goes before the home folder that holds it."""
    found = {str(ROOT): "ddp-workshop", sys.prefix: "<environment>", str(Path.home()): "~"}
    return dict(sorted(found.items(), key=lambda item: -len(item[0])))


def site_links(text: str, page: str) -> str:
    """Markdown links that lead outside the site become plain text: a file of the repository is
    named, not linked. ``page`` is the page's folder in the site (``docs`` or ``notebooks``)."""
    def keep(match: re.Match) -> str:
        label, target = match[1], match[2]
        path = target.split("#", 1)[0]
        if not path or "://" in target or target.startswith("mailto:"):
            return match[0]
        inside = os.path.normpath(os.path.join(page, path))
        if inside.startswith("docs/") and inside.removeprefix("docs/") in DOCS or \
                re.fullmatch(r"notebooks/\d\d_\w+\.ipynb", inside):
            return match[0]
        return label if label.startswith("`") else f"{label} (`{inside}`)"
    return LINK.sub(keep, text)


def short_tracebacks(text: str) -> str:
    """A failing rank's traceback with its own script's frames only: the frames inside the
    installed packages (torch's, mostly) go, one line says so, and so do the ``^^^`` lines."""
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        prefix, rest = RANK_PREFIX.match(line).groups()
        frame = FRAME.match(rest)
        if frame:
            skipping = "site-packages" in frame[1] or frame[1].startswith("<environment>")
            if skipping and not kept[-1:] == [f"{prefix}  {LEFT_OUT}\n"]:
                kept.append(f"{prefix}  {LEFT_OUT}\n")
            if skipping:
                continue
        elif skipping and rest.startswith("    "):  # the library's line of code
            continue
        else:
            skipping = False
        if not set(rest.strip()) <= {"^", "~"} or not rest.strip():
            kept.append(line)
    return "".join(kept)


def is_progress_bar(output: nbformat.NotebookNode) -> bool:
    """A launch's progress bar (a tqdm widget): the page keeps what the ranks printed, and a
    bar's text, written when the bar appeared, says "0 lines" of a run that went on to finish."""
    data = output.get("data", {})
    return WIDGET in data and not WIDGET_REPR.match(data.get("text/plain", ""))


def folded(text: str, summary: str) -> str:
    """Markdown behind a ``<details>`` fold, its heading left outside."""
    heading, _, body = text.partition("\n") if text.startswith("#") else ("", "", text)
    return (f"{heading}\n\n" if heading else "") + (
        f"<details><summary>{summary}</summary>\n\n{body.strip()}\n\n</details>")


def for_reading(notebook: nbformat.NotebookNode, course: Path, run: str,
                machine: dict[str, str]) -> nbformat.NotebookNode:
    """An executed lesson as the site shows it."""
    page = copy.deepcopy(notebook)
    instructor = False
    for cell in page.cells:
        meta = cell.metadata
        first = cell.source.split("\n", 1)[0]
        if cell.cell_type == "markdown" and sections.HEADING.fullmatch(first):
            instructor = meta.get(sections.KEY, {}).get("tier") == "instructor"
        if cell.cell_type == "markdown":
            cell.source = site_links(cell.source, "notebooks")
            if instructor:
                cell.source = folded(cell.source, "Notes for instructors")
            continue
        tags = meta.setdefault("tags", [])
        if "solution" in tags or instructor:
            tags.append("hide-cell")
            what = "solution" if "solution" in tags else "instructor's cell"
            meta["mystnb"] = {"code_prompt_show": f"Show the {what}",
                              "code_prompt_hide": f"Hide the {what}"}
        elif meta.get("jupyter", {}).get("source_hidden"):
            tags.append("hide-input")
        cell.outputs = [output for output in cell.get("outputs", []) if not is_progress_bar(output)]
        for output in cell.outputs:
            if output.output_type == "stream":
                output.text = short_tracebacks(scrubbed(output.text, machine))
            elif output.output_type == "error":  # its last line says what went wrong
                output.evalue = scrubbed(output.evalue, machine)
                output.traceback = [f"{output.ename}: {output.evalue}"]
            else:
                data = output.get("data", {})
                if data.pop(WIDGET, None):  # an ipywidget, as its text: VBox(children=(...
                    output.data = {"text/markdown": "*An interactive widget: it needs a live "
                                   "kernel. Run the lesson to use it.*"}
                    continue
                for kind in ("text/plain", "text/html", "text/markdown"):
                    if kind in data:
                        data[kind] = scrubbed(data[kind], machine)
    page.metadata.pop("widgets", None)
    lesson = course.name
    page.cells.insert(1, nbformat.v4.new_markdown_cell(
        f"> **Run this lesson yourself.** In a clone of the course, `make lab LESSON={lesson}` "
        "opens it in JupyterLab (the first `make` installs everything, a few minutes); "
        "`make run` runs every lesson headless. What follows is one run of it, " + run + ". "
        "On GPUs the lessons use them, and their figures are in "
        "[the benchmarks](../docs/benchmarks.md).", id="book-run-it"))
    return page


def index_page(lessons: list[tuple[str, str]], run: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    intro = readme.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    toc = "\n".join(f"notebooks/{name}" for name, _ in lessons)
    docs = "\n".join(f"docs/{name.removesuffix('.md')}" for name in DOCS)
    return f"""# ddp-workshop

{intro}

Every lesson below is shown with its outputs and figures, from one run of the course on
{run}. Each lesson says which data it trained on.

## Run it yourself

In a clone of the course (Linux or macOS, Python 3.11 or newer, `make`, about 6 GB of disk):

```bash
make lab                      # the first time installs everything, then opens JupyterLab
make lab LESSON=05_ddp.ipynb  # JupyterLab, with one lesson open
```

`make run` executes every lesson headless. `make lab-exercises` opens the learners' edition,
where you write the code yourself and a check names each mistake; here, the solutions are folded
under each exercise.

```{{toctree}}
:caption: Lessons
:maxdepth: 1

{toc}
```

```{{toctree}}
:caption: Reference
:maxdepth: 1

{docs}
```
"""


def machine_words() -> str:
    """The machine the lessons ran on, in words: the builder's (a lesson that ran elsewhere is
    not current here, and runs again)."""
    import torch  # to count the GPUs the lessons used

    gpus = torch.cuda.device_count()
    cores = f"{os.cpu_count()} CPU cores"
    return f"{gpus} GPU{'s' if gpus > 1 else ''} and {cores}" if gpus else f"{cores}, no GPU"


def commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                           capture_output=True).stdout.strip()
    return found or "an unknown commit"


def write_sources() -> list[Path]:
    """The site's sources from the executed notebooks and docs/; returns the lessons written."""
    machine, words, at = machine_details(), machine_words(), commit()
    (SOURCES / "notebooks").mkdir(parents=True, exist_ok=True)
    (SOURCES / "docs").mkdir(exist_ok=True)
    written, lessons = [], []
    for course in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        executed = EXECUTED / course.name
        day = datetime.date.fromtimestamp(executed.stat().st_mtime).isoformat()
        page = for_reading(with_outputs(course, executed), course,
                           f"on {words}, {day}, at commit {at}", machine)
        target = SOURCES / "notebooks" / course.name
        nbformat.write(page, target)
        written.append(target)
        lessons.append((course.stem, page.cells[0].source.split("\n", 1)[0]))
    for name in DOCS:
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        (SOURCES / "docs" / name).write_text(site_links(text, "docs"), encoding="utf-8")
    (SOURCES / "index.md").write_text(index_page(lessons, f"{words}, at commit {at}"),
                                      encoding="utf-8")
    return written


def build(execute_stale: bool = True) -> Path:
    """Executed notebooks, the site's sources, then the site; returns its index page."""
    EXECUTED.mkdir(parents=True, exist_ok=True)
    courses = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    stale = [c for c in courses if not is_current(EXECUTED / c.name, c)]
    if stale and not execute_stale:
        raise FileNotFoundError(f"no current executed copy of {', '.join(c.name for c in stale)} "
                                f"in {EXECUTED}")
    print(f"{len(courses) - len(stale)} lessons already executed, {len(stale)} to run")
    execute(stale)
    started = time.monotonic()
    shutil.rmtree(SOURCES, ignore_errors=True)
    write_sources()
    # Into a folder of its own, then in place of the last site: a failed build leaves the last
    # whole site, not half of a new one.
    partial = SITE.with_name(f"{SITE.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
                    "-c", str(CONFIG), str(SOURCES), str(partial)], check=True)
    shutil.rmtree(SITE, ignore_errors=True)
    partial.rename(SITE)
    print(f"site built in {time.monotonic() - started:.0f} s: {SITE / 'index.html'}")
    return SITE / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-execute", action="store_true",
                        help="fail, rather than execute, when a lesson has no current run")
    args = parser.parse_args(argv)
    build(execute_stale=not args.no_execute)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Writing scripts from cells, and metrics from scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell

import course_helpers
from ddp_lib import measurements, scripts, write_script
from ddp_lib.files import atomic_write_text
from ddp_lib.launching import metrics
from workshop import exercises


def test_write_script_dedents_and_reports(workdir, capsys):
    path = write_script("train.py", """
        import torch
        print(torch.__version__)
    """)
    assert path == workdir.joinpath("scripts", "train.py").relative_to(workdir)
    assert path.read_text() == "import torch\nprint(torch.__version__)\n"
    assert "Wrote scripts/train.py (2 lines)" in capsys.readouterr().out


def test_rewriting_the_same_text_is_quiet_and_keeps_the_file(workdir, capsys):
    path = write_script("same.py", "x = 1\n")
    before = path.stat().st_mtime_ns
    capsys.readouterr()
    write_script("same.py", "x = 1\n")
    assert "up to date" in capsys.readouterr().out
    assert path.stat().st_mtime_ns == before
    write_script("same.py", "x = 2\n", quiet=True)
    assert path.read_text() == "x = 2\n" and capsys.readouterr().out == ""
    assert [p.name for p in path.parent.iterdir()] == ["same.py"]  # no temporary files left


def test_a_syntax_error_writes_nothing(workdir):
    write_script("keep.py", "x = 1\n", quiet=True)
    with pytest.raises(SyntaxError):
        write_script("keep.py", "def broken(:\n")
    assert (workdir / "scripts" / "keep.py").read_text() == "x = 1\n"


def test_cell_magic_writes_the_cell(workdir):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ddp_lib")
    shell.run_cell_magic("write_script", "magic.py", "print('from a cell')\n")
    assert (workdir / "scripts" / "magic.py").read_text() == "print('from a cell')\n"
    with pytest.raises(ValueError, match="Usage"):
        shell.run_cell_magic("write_script", "  ", "x = 1\n")


PARENT = "import os\n\n\ndef main():\n    x = 1\n    y = 2\n    print(x + y)\n"
CHILD = "import os\nimport sys\n\n\ndef main():\n    x = 1\n    y = 3\n    print(x + y)\n"


def course(folder: Path, *cells: str) -> Path:
    """A course of one lesson, ``00_lesson.ipynb``, whose code cells are ``cells``."""
    folder.mkdir(exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]),
                   folder / "00_lesson.ipynb")
    return folder


def test_a_change_is_what_diff_u_prints_and_applies_back():
    change = scripts.change(PARENT, CHILD)
    assert change.startswith("@@ -1,7 +1,8 @@\n import os\n+import sys\n")
    assert "\n-    y = 2\n+    y = 3\n" in change and "\n \n" not in change  # no lone spaces
    assert scripts.apply_change(PARENT, change) == CHILD


def test_a_change_fits_where_the_parent_moved_and_names_a_hunk_that_does_not():
    moved = "# a comment\n# and another\n" + PARENT
    assert scripts.apply_change(moved, scripts.change(PARENT, CHILD)) == \
        "# a comment\n# and another\n" + CHILD
    with pytest.raises(ValueError, match=r"hunk '@@ -1,7 \+1,8 @@' does not fit the parent, "
                       r"which lacks these of its lines:\n        y = 2$"):
        scripts.apply_change(PARENT.replace("y = 2", "y = 4"), scripts.change(PARENT, CHILD))
    with pytest.raises(ValueError, match="line 1 is not part of a hunk"):
        scripts.apply_change(PARENT, "import sys\n")


def test_a_cell_from_another_lessons_script_writes_the_parent_with_its_change(
        workdir, monkeypatch, capsys):
    """``--from`` reads the parent from the course, through a chain of parents, whichever lesson
    writes it; the file written is whole, and the magic counts the changed lines."""
    grandchild = CHILD.replace("print(x + y)", "print(x * y)")
    monkeypatch.setattr(scripts, "COURSE", course(
        workdir / "course", f"%%write_script parent.py\n{PARENT}",
        f"%%write_script child.py --from parent.py\n{scripts.change(PARENT, CHILD)}"))
    assert scripts.course_script("child.py") == CHILD
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "ddp_lib")
    shell.run_cell_magic("write_script", "grandchild.py --from child.py",
                         scripts.change(CHILD, grandchild))
    assert (workdir / "scripts" / "grandchild.py").read_text() == grandchild
    assert "(8 lines): child.py as its lesson writes it, with the 2 changed lines above" in \
        capsys.readouterr().out
    assert scripts.cell_text("00_lesson.ipynb", "child.py") == CHILD
    with pytest.raises(LookupError, match="'%%write_script nowhere.py' is written by no lesson"):
        shell.run_cell_magic("write_script", "x.py --from nowhere.py", "@@ -1 +1 @@\n")
    with pytest.raises(ValueError, match="Usage"):
        shell.run_cell_magic("write_script", "x.py from child.py", "@@ -1 +1 @@\n")


def test_a_script_that_comes_from_itself_is_refused(workdir, monkeypatch):
    monkeypatch.setattr(scripts, "COURSE", course(workdir / "course",
                                                  "%%write_script a.py --from b.py\n",
                                                  "%%write_script b.py --from a.py\n"))
    with pytest.raises(ValueError, match="a.py -> b.py -> a.py: a script cannot come from itself"):
        scripts.course_script("a.py")


def test_report_appends_json_lines_under_launch(tmp_path, monkeypatch):
    target = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(metrics.ENV_VAR, str(target))
    monkeypatch.setenv("RANK", "3")
    course_helpers.report("loss", 0.5, step=1)
    course_helpers.report("accuracy", 0.9, epoch=2)
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(r["rank"], r["name"], r["value"], r["step"]) for r in lines] == [
        (3, "loss", 0.5, 1), (3, "accuracy", 0.9, None)]
    assert lines[1]["epoch"] == 2
    assert metrics.read(target) == lines


def test_report_is_quiet_under_plain_torchrun(workdir, monkeypatch, capsys):
    monkeypatch.delenv(metrics.ENV_VAR, raising=False)
    course_helpers.report("loss", 0.25, step=7)
    course_helpers.report_weights(pytest.importorskip("torch").nn.Linear(2, 2))
    assert capsys.readouterr() == ("", "")
    assert list(workdir.iterdir()) == []


def test_the_writer_and_the_reader_name_the_same_variable():
    assert course_helpers.METRICS_ENV == metrics.ENV_VAR


def test_reading_a_missing_metrics_file_gives_nothing(tmp_path):
    assert metrics.read(tmp_path / "none.jsonl") == []


def test_from_notebook_writes_the_cell_of_another_lesson(workdir):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("%%write_script a.py\nnot code"),
        nbformat.v4.new_code_cell("%%write_script other.py\nx = 0\n"),
        nbformat.v4.new_code_cell("%%write_script a.py\nx = 1\nprint(x)\n"),
    ])
    nbformat.write(nb, workdir / "lesson.ipynb")
    path = scripts.from_notebook(workdir / "lesson.ipynb", "a.py", quiet=True)
    assert path.read_text() == "x = 1\nprint(x)\n"
    with pytest.raises(LookupError, match="no '%%write_script b.py' cell"):
        scripts.from_notebook(workdir / "lesson.ipynb", "b.py")


def test_from_notebook_reads_a_script_a_tracks_edition_made_raw(workdir):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_raw_cell("%%write_script a.py\nx = 2\n")])
    nbformat.write(nb, workdir / "lesson.ipynb")
    assert scripts.from_notebook(workdir / "lesson.ipynb", "a.py", quiet=True).read_text() == \
        "x = 2\n"


def test_diff_is_a_unified_diff_of_the_files(workdir):
    old = write_script("old.py", "a = 1\nb = 2\n", quiet=True)
    new = write_script("new.py", "a = 1\nb = 3\n", quiet=True)
    text = scripts.diff(old, new)
    assert text.splitlines()[:2] == ["--- scripts/old.py", "+++ scripts/new.py"]
    assert "-b = 2" in text and "+b = 3" in text and " a = 1" in text


def test_diff_size_counts_the_changed_lines_not_the_headers(workdir):
    old = write_script("old.py", "x = 0\n--x\ny = 1\n", quiet=True)
    new = write_script("new.py", "x = 0\ny = 2\n", quiet=True)
    assert scripts.diff_size(old, new) == 3  # "---x" is a removed line, not a header
    assert scripts.diff_size(old, old) == 0


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
DDP_ESSENTIALS = ("dist.init_process_group(backend)", "DistributedSampler(train_set",
                  "sampler.set_epoch(epoch)", "Subset(test_set, range(rank,", "model = DDP(",
                  "if rank == 0:", "dist.barrier()", "dist.all_reduce(",
                  "dist.destroy_process_group()")
# Not DDP: a workaround (ddp_lib's worker start-up carries it), a measurement the notebook makes
# from outside, and the padded test split that counted samples twice.
NOT_DDP = ("import torch.distributed.nn", "sampler_indices", "DistributedSampler(test_set")


def diff_problems(single: Path, ddp: Path) -> list[str]:
    """What is wrong with the diff from ``single`` to ``ddp`` as lesson 05's: empty if nothing."""
    text = scripts.diff(single, ddp)
    added = [line[1:] for line in text.splitlines()[2:] if line.startswith("+")]
    problems = [f"missing: {e}" for e in DDP_ESSENTIALS if not any(e in line for line in added)]
    problems += [f"not DDP: {e}" for e in NOT_DDP if any(e in line for line in added)]
    if scripts.diff_size(single, ddp) > 60:
        problems.append(f"{scripts.diff_size(single, ddp)} changed lines, more than 60")
    return problems


def test_lesson_05_teaches_ddp_in_at_most_60_changed_lines(workdir):
    """The diff lesson 05's cell holds, from lesson 01's script to its DDP script, checked.

    The DDP essentials must be among the added lines, so that the count stays small by keeping
    the lesson small, not by moving DDP elsewhere; and nothing that is not DDP may be added.
    """
    single = scripts.from_notebook(NOTEBOOKS / "01_single_device.ipynb", "train_single.py",
                                   quiet=True)
    ddp = scripts.from_notebook(NOTEBOOKS / "05_ddp.ipynb", "train_ddp.py", quiet=True)
    assert script_cells()["train_ddp.py"][1] == "train_single.py", "lesson 05 shows the change"
    assert diff_problems(single, ddp) == [], scripts.diff(single, ddp)


def script_cells() -> dict[str, tuple[str, str | None, str]]:
    """Every script the course's cells write: name -> (lesson, parent or None, the cell's body)."""
    found: dict[str, tuple[str, str | None, str]] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            first, _, body = cell.source.partition("\n")
            if cell.cell_type == "code" and scripts.header(first):
                name, parent = scripts.header(first)
                assert name not in found, f"{name}: written by {found[name][0]} and {path.stem}"
                found[name] = (path.stem, parent, body)
    return found


# The most lines (- and +) a step may change: one idea each. Lesson 08's other steps: 15.
STEP_SIZES = {"train_ddp.py": 60, "train_amp.py": 30, "train_amp_speed.py": 60,
              "train_profiled.py": 35, "train_anywhere.py": 43, "train_fsdp.py": 55}


def test_a_cell_that_changes_a_script_holds_exactly_diff_u_of_it_and_stays_one_idea():
    """A ``--from`` cell is what ``diff -u`` prints from its parent to the script it writes, so
    its hunk headers say where each change goes; a lesson's step stays the size of its idea."""
    changes = {name: (lesson, parent, body) for name, (lesson, parent, body)
               in script_cells().items() if parent}
    assert len(changes) >= 20
    for name, (lesson, parent, body) in changes.items():
        written = scripts.course_script(name)
        expected = scripts.change(scripts.course_script(parent), written)
        assert body.rstrip("\n") == expected.rstrip("\n"), (  # a cell ends on its last text
            f"{lesson}'s {name}: not diff -u's output; it should read\n{expected}")
        compile(written, name, "exec")
        if lesson == "08_scaling" or name in STEP_SIZES:
            changed = len(scripts.changed_lines(body))
            assert changed <= STEP_SIZES.get(name, 15), f"{name}: {changed} changed lines"


def test_the_lesson_05_diff_check_finds_what_is_wrong(workdir):
    """The check above fails on a DDP script without set_epoch, with a workaround added, or
    longer than 60 changed lines."""
    single = scripts.from_notebook(NOTEBOOKS / "01_single_device.ipynb", "train_single.py",
                                   quiet=True)
    ddp = scripts.from_notebook(NOTEBOOKS / "05_ddp.ipynb", "train_ddp.py", quiet=True).read_text()
    forgetful = write_script("forgetful.py", ddp.replace("sampler.set_epoch(epoch)", "pass"),
                             quiet=True)
    assert diff_problems(single, forgetful) == ["missing: sampler.set_epoch(epoch)"]
    workaround = ddp.replace("import torch.distributed as dist\n",
                             "import torch.distributed as dist\nimport torch.distributed.nn\n")
    assert "not DDP: import torch.distributed.nn" in diff_problems(  # and it counts one more
        single, write_script("workaround.py", workaround, quiet=True))
    longer = ddp.replace("import time\n", "import time\n" + "x = 0\n" * 10)
    [problem] = diff_problems(single, write_script("longer.py", longer, quiet=True))
    assert problem.endswith("more than 60")


AMP_ESSENTIALS = ("torch.autocast(device.type", "torch.amp.GradScaler(device.type",
                  "scaler.scale(", "scaler.step(optimizer)", "scaler.update()", '"scaler":')


def test_lesson_07_first_step_adds_mixed_precision_and_nothing_else(workdir):
    """Lesson 07's first diff holds autocast and the scaler; the speed knobs are its second step."""
    resume = scripts.from_notebook(NOTEBOOKS / "05_ddp.ipynb", "train_ddp_resume.py", quiet=True)
    amp = scripts.from_notebook(NOTEBOOKS / "07_mixed_precision.ipynb", "train_amp.py",
                                quiet=True)
    speed = scripts.from_notebook(NOTEBOOKS / "07_mixed_precision.ipynb", "train_amp_speed.py",
                                  quiet=True)
    text = scripts.diff(resume, amp)
    added = [line[1:] for line in text.splitlines()[2:] if line.startswith("+")]
    missing = [e for e in AMP_ESSENTIALS if not any(e in line for line in added)]
    assert not missing, f"mixed precision essentials not in lesson 07's first diff: {missing}"
    assert scripts.diff_size(resume, amp) <= 30, text
    assert "resnet18" not in amp.read_text() and "--measure-steps" in speed.read_text()


def test_load_module_imports_a_script_without_running_main(workdir):
    path = write_script("lesson.py", """
        def double(x):
            return 2 * x

        if __name__ == "__main__":
            raise SystemExit("main ran")
    """, quiet=True)
    assert scripts.load_module(path).double(21) == 42


def test_report_weights_fingerprints_equal_and_different_weights(workdir, monkeypatch):
    torch = pytest.importorskip("torch")
    from ddp_lib.launching.result import LaunchResult

    monkeypatch.setenv(metrics.ENV_VAR, str(workdir / "m.jsonl"))
    for rank, seed in enumerate([0, 0, 1]):
        monkeypatch.setenv("RANK", str(rank))
        torch.manual_seed(seed)
        course_helpers.report_weights(torch.nn.Linear(4, 3))
    result = LaunchResult(script=Path("x.py"), command=[], run_dir=workdir,
                          metrics=metrics.read(workdir / "m.jsonl"))
    prints = result.fingerprints()
    assert sorted(prints) == [0, 1, 2] and prints[0] == prints[1] != prints[2]


def test_results_round_trip_and_missing_lesson(workdir):
    assert measurements.load("01_single_device") is None
    measurements.save("01_single_device", {"images_per_s": 1234.5})
    assert measurements.load("01_single_device") == {"images_per_s": 1234.5}
    assert [p.name for p in (workdir / "results").iterdir()] == ["01_single_device.json"]


def test_interrupted_atomic_write_keeps_the_old_file(workdir, monkeypatch):
    target = atomic_write_text(workdir / "f.txt", "old")

    def fail(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and [p.name for p in workdir.iterdir()] == ["f.txt"]


def test_a_learners_edit_of_lesson_05_never_reaches_a_later_lesson(tmp_path, monkeypatch):
    """In the learners' edition a learner deletes ``sampler.set_epoch`` from 05's script (an
    exercise asks for it; JupyterLab autosaves). The scripts lessons 06 to 11 build from 05 and
    01, from the edition's folder as those lessons do, are still the course's."""
    exercises.build(tmp_path)
    edition = tmp_path / "notebooks"
    lesson = nbformat.read(edition / "05_ddp.ipynb", as_version=4)
    [cell] = [c for c in lesson.cells if c.source.startswith("%%write_script train_ddp.py ")]
    assert "sampler.set_epoch(epoch)" in cell.source
    cell.source = cell.source.replace("sampler.set_epoch(epoch)", "pass  # deleted")
    nbformat.write(lesson, edition / "05_ddp.ipynb")
    monkeypatch.chdir(edition)
    calls = set()
    for later in sorted(edition.glob("[0-9][0-9]_*.ipynb")):
        if later.name >= "06":
            text = "\n".join(c.source for c in nbformat.read(later, as_version=4).cells)
            calls |= set(re.findall(r'from_notebook\("([^"]+)", "([^"]+)"', text))
    assert ("05_ddp.ipynb", "train_ddp.py") in calls and len(calls) >= 2, calls
    for notebook, name in sorted(calls):
        written = scripts.from_notebook(notebook, name, quiet=True)
        assert written.read_text() == scripts.course_script(name), name
    assert "sampler.set_epoch(epoch)" in scripts.course_script("train_ddp.py")

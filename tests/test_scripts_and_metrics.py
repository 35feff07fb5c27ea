"""Writing scripts from cells, and metrics from scripts."""

from __future__ import annotations

import json

import pytest
from IPython.core.interactiveshell import InteractiveShell

from ddp_lib import metrics, write_script


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


def test_report_appends_json_lines_under_launch(tmp_path, monkeypatch):
    target = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(metrics.ENV_VAR, str(target))
    monkeypatch.setenv("RANK", "3")
    metrics.report("loss", 0.5, step=1)
    metrics.report("accuracy", 0.9, epoch=2)
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(r["rank"], r["name"], r["value"], r["step"]) for r in lines] == [
        (3, "loss", 0.5, 1), (3, "accuracy", 0.9, None)]
    assert lines[1]["epoch"] == 2
    assert metrics.read(target) == lines


def test_report_prints_under_plain_torchrun(monkeypatch, capsys):
    monkeypatch.delenv(metrics.ENV_VAR, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    metrics.report("loss", 0.25, step=7)
    assert capsys.readouterr().out == "[metric] rank=0 step=7 loss=0.25\n"


def test_reading_a_missing_metrics_file_gives_nothing(tmp_path):
    assert metrics.read(tmp_path / "none.jsonl") == []

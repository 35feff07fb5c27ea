"""The exercise checks against the mistakes learners really make: each wrong version of lesson
05's conversion is caught with its own sentence, and the right one passes. Real launches, on Gloo.

Each wrong version is lesson 05's ``train_ddp.py`` (the right conversion, from the course's own
notebook) with one edit a learner makes; the edit must still apply, or the test says so. Three of
them run in ``make test``; the others, like the right version's second launch, in the sweep.
"""

from __future__ import annotations

import pytest

from ddp_lib import scripts
from workshop import checks

SAMPLER = "    sampler = DistributedSampler(train_set)"
LOADER = "DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)"
SET_EPOCH = "sampler.set_epoch(epoch)"
WRAP = "model = DDP(SmallCNN().to(device))"
ONE_WRITER = "    if rank == 0:  # one writer"
SAVE = "        save_checkpoint(model.module, args.checkpoint)"
LOSS_SUM = "dist.all_reduce(totals)"
ACCURACY_SUM = "dist.all_reduce(counts)"
DESTROY = "dist.destroy_process_group()"
OPTIMISER = "lr=args.lr, momentum=0.9)"

# name -> (the edits: (old, new) replaced, or (old, None): every line with old removed; and
# what the check must say)
WRONG = {
    "no DistributedSampler": (
        [(SAMPLER, None), (LOADER, "DataLoader(train_set, batch_size=args.batch_size, "
                                   "shuffle=True)"),
         (SET_EPOCH, None), ("len(sampler)", "len(train_set)")],
        ["Every rank trained on the same samples", "give the training DataLoader a "
         "DistributedSampler"]),
    "no set_epoch": ([(SET_EPOCH, None)], ["call sampler.set_epoch(epoch)"]),
    "no DDP wrapper": (
        [(WRAP, "model = SmallCNN().to(device)"), ("model.module", "model")],
        ["The ranks ended with different weights", "wrap the model in DistributedDataParallel"]),
    "every rank saves": (  # two ranks renaming one .tmp file: one of them fails
        [(ONE_WRITER, None), (SAVE, SAVE[4:])],
        ["each wrote the checkpoint", "save on rank 0 only"]),
    "loss not reduced, no destroy": (
        [(LOSS_SUM, None), (DESTROY, None)],
        ["reported a training loss of", "exited with its process group still open"]),
    "the wrapper's state_dict": (
        [("model.module, args.checkpoint", "model, args.checkpoint")],
        ["The checkpoint's keys start with 'module.'", "model.module.state_dict()"]),
    "accuracy not reduced": ([(ACCURACY_SUM, None)], ["reported a test accuracy of"]),
    "learning rate scaled by the world size": (
        [(OPTIMISER, "lr=args.lr * dist.get_world_size(), momentum=0.9)")],
        ["did not train like one process with batch 64"]),
    "shuffle and a sampler": (
        [("sampler=sampler)", "sampler=sampler, shuffle=True)")],
        ["exited with code 1", "line", "ValueError: sampler option is mutually exclusive with "
         "shuffle"]),
}
IN_MAKE_TEST = ("no DistributedSampler", "no set_epoch", "no DDP wrapper")


@pytest.fixture(scope="module")
def right(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripts")
    return scripts.from_notebook("05_ddp.ipynb", "train_ddp.py", directory=folder, quiet=True)


def wrong_version(right, folder, edits):
    text = right.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, f"lesson 05's train_ddp.py no longer has {old!r}: update this test"
        if new is None:
            text = "".join(line for line in text.splitlines(keepends=True) if old not in line)
        else:
            text = text.replace(old, new)
    return scripts.write_script("my_train_ddp.py", text, directory=folder, quiet=True)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in IN_MAKE_TEST else pytest.mark.sweep) for name in WRONG])
def test_the_check_names_each_mistake(name, right, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    edits, said = WRONG[name]
    with pytest.raises(checks.ExerciseNotDone) as raised:
        checks.ddp_conversion(wrong_version(right, tmp_path, edits))
    message = str(raised.value)
    for words in said:
        assert words in message, f"{name}: {words!r} not in\n{message}"
    if name in ("no set_epoch", "no DDP wrapper"):  # one mistake: one sentence, nothing else
        assert len(raised.value.mistakes) == 1, message


@pytest.mark.sweep
def test_the_right_conversion_passes(right, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    checks.ddp_conversion(right)
    shown = capsys.readouterr().out
    assert "✗" not in shown and shown.count("✓") == 6, shown
    run = next((tmp_path / "runs").glob("check-*/several/metrics.jsonl")).read_text()
    for watched in ("check_drawn", "check_saved"):  # the observer ran: nothing passed unseen
        assert f'"name": "{watched}"' in run, f"no {watched} record in the right version's run"


def test_a_script_not_written_yet_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the exercise's script cell"):
        checks.ddp_conversion(tmp_path / "my_train_ddp.py")

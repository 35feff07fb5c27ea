"""The exercise checks against the mistakes learners really make: each wrong version of lesson
05's conversion, and each wrong answer of the other core exercises, is caught with its own
sentence, and the right one passes. Real launches, on Gloo.

Each wrong version is lesson 05's ``train_ddp.py`` (the right conversion, from the course's own
notebook) with one edit a learner makes; the edit must still apply, or the test says so. Their
launches, and the right version's, run in the sweep (``make test-browser``, which also runs
lesson 05's own check cell in JupyterLab), about 15 s each on 2 cores. ``make test`` runs the
answer checks, which launch nothing but in lessons 00 and 07 (those tests are in the sweep too).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import ddp_lib
from ddp_lib import scripts
from ddp_lib.launching.result import LaunchResult, Line
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
EVALUATE = "accuracy = evaluate(model, test_loader, device)"
REPORT_WEIGHTS = "report_weights(model)"
TEST_SHARD = "test_shard = Subset(test_set"
TEST_LOADER = "test_loader = DataLoader(test_shard, batch_size=256)"

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
    "no shuffle": (
        [("DistributedSampler(train_set)", "DistributedSampler(train_set, shuffle=False)")],
        ["in the data set's order", "leave DistributedSampler's shuffle on"]),
    "no DDP wrapper": (
        [(WRAP, "model = SmallCNN().to(device)"), ("model.module", "model")],
        ["trained without a DistributedDataParallel wrapper",
         "wrap the model in DistributedDataParallel"]),
    # Judged from every rank, never from whichever ranks reported (lesson 01's report_weights
    # moved under if rank == 0:).
    "no DDP wrapper, weights reported by rank 0 only": (
        [(WRAP, "model = SmallCNN().to(device)"), ("model.module", "model"),
         (REPORT_WEIGHTS, "report_weights(model) if rank == 0 else None")],
        ["Ranks 0, 1 trained without a DistributedDataParallel wrapper",
         "wrap the model in DistributedDataParallel"]),
    "weights reported by rank 0 only": (
        [(REPORT_WEIGHTS, "report_weights(model) if rank == 0 else None")],
        ["Only rank 0 reported its weights", "on every rank"]),
    # An odd test set: a DistributedSampler on it pads, and one sample counts twice.
    "a padded test sampler": (
        [(TEST_SHARD, None), (TEST_LOADER, "test_loader = DataLoader(test_set, batch_size=256, "
                                           "sampler=DistributedSampler(test_set))")],
        ["The ranks evaluated 256 test samples where there are 255", "Subset(test_set"]),
    "a padded test sampler, unshuffled": (
        [(TEST_SHARD, None), (TEST_LOADER, "test_loader = DataLoader(test_set, batch_size=256, "
                                           "sampler=DistributedSampler(test_set, shuffle=False))")],
        ["The ranks evaluated 256 test samples where there are 255", "counted twice"]),
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
    # The most common DDP bug, twice: a collective that only rank 0 calls, named in one
    # sentence, from the ranks' own calls, within a minute, whether Gloo crashes or waits.
    "evaluation on rank 0 only": (
        [(EVALUATE, EVALUATE + " if rank == 0 else 0.0")],
        ["Rank 0 called dist.all_reduce at line", "(in evaluate)", "only some ranks call"]),
    "the loss reduced on rank 0 only": (
        [(LOSS_SUM, LOSS_SUM + " if rank == 0 else None")],
        ["Rank 0 called dist.all_reduce at line", "only some ranks call"]),
    # A second wrong version of each mistake above.
    "a sampler made but not given to the loader": (
        [(LOADER, "DataLoader(train_set, batch_size=args.batch_size, shuffle=True)")],
        ["Every rank trained on the same samples", "DistributedSampler"]),
    "set_epoch with a constant": (
        [(SET_EPOCH, "sampler.set_epoch(0)")],
        ["in the same order in every epoch", "call sampler.set_epoch(epoch)"]),
    "every rank saves, under a condition always true": (
        [(ONE_WRITER, "    if rank >= 0:  # one writer")],
        ["each wrote the checkpoint", "save on rank 0 only"]),
    "the loss not reduced": (
        [(LOSS_SUM, None)], ["reported a training loss of"]),
    "the batch divided by the world size": (
        [(LOADER, "DataLoader(train_set, batch_size=args.batch_size // dist.get_world_size(), "
                  "sampler=sampler)")],
        ["did not train like one process with batch 64"]),
    "shuffle and a sampler": (
        [("sampler=sampler)", "sampler=sampler, shuffle=True)")],
        ["line", "ValueError: sampler option is mutually exclusive with shuffle"]),
}


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


@pytest.mark.sweep
@pytest.mark.parametrize("name", WRONG)
def test_the_check_names_each_mistake(name, right, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    edits, said = WRONG[name]
    with pytest.raises(checks.ExerciseNotDone) as raised:
        checks.ddp_conversion(wrong_version(right, tmp_path, edits))
    message = str(raised.value)
    if name == "shuffle and a sampler":  # both ranks raise: which is named, and how, is a race
        assert re.search(r"Rank [01] (exited with code 1|raised an exception, and torchrun "
                         r"stopped it before it exited)", message), message
    for words in said:
        assert words in message, f"{name}: {words!r} not in\n{message}"
    if name in ("no set_epoch", "no DDP wrapper"):  # one mistake: one sentence, nothing else
        assert len(raised.value.mistakes) == 1, message
    # The sentence that names the mistake comes first, before any rank's traceback.
    assert said[0] in raised.value.mistakes[0], message
    if raised.value.mistakes[-1].startswith("What followed"):  # the crash it caused, in a line
        assert "\n" not in raised.value.mistakes[-1] and "check_site" not in message, message


@pytest.mark.sweep
def test_the_right_conversion_passes(right, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    checks.ddp_conversion(right)
    shown = capsys.readouterr().out
    assert "✗" not in shown and shown.count("✓") == 6, shown
    assert re.search(r"\(checked in \d+ s: 2 processes, then 1\)", shown), shown
    run = next((tmp_path / "runs").glob("check-*/several/metrics.jsonl")).read_text()
    for watched in ("check_drawn", "check_saved", "check_wrapped", "check_collective"):
        # the observer ran: nothing passed unseen
        assert f'"name": "{watched}"' in run, f"no {watched} record in the right version's run"


def test_lesson_01s_script_untouched_is_told_where_to_start(tmp_path):
    """The stub as the learners' edition writes it: lesson 01's script with the steps as TODO
    comments, one of which names init_process_group; a comment is not a call."""
    import nbformat

    from workshop import exercises

    notebook = nbformat.read(scripts.COURSE / "05_ddp.ipynb", as_version=4)
    [index] = [i for i, c in enumerate(notebook.cells) if exercises.is_solution(c)
               and c.source.startswith("%%write_script my_train_ddp.py")]
    stub = exercises.stub(notebook.cells[index], notebook.cells[index - 1])["source"]
    assert "# TODO 1:" in stub and "init_process_group" in stub
    single = tmp_path / "my_train_ddp.py"
    single.write_text(stub.partition("\n")[2])
    check_says(checks.ddp_conversion, single, said="never calls dist.init_process_group")
    assert not (tmp_path / "runs").exists(), "nothing to launch yet"


def test_a_script_not_written_yet_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the exercise's script cell"):
        checks.ddp_conversion(tmp_path / "my_train_ddp.py")


STUCK = """
import time

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()  # rank 1 is elsewhere for a minute: rank 0 waits here
else:
    time.sleep(60)
    dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.sweep
def test_a_rank_stuck_in_a_collective_says_where_and_ends_the_checks_run(tmp_path):
    """The check's site ends a rank that waits too long in one of the script's collectives,
    naming it and its line, so that a hang ends long before the check's timeout."""
    script = scripts.write_script("stuck.py", STUCK, directory=tmp_path, quiet=True)
    result = ddp_lib.launch(script, nproc_per_node=2, backend="gloo", stream=False, check=False,
                            timeout=50, run_dir=tmp_path / "run",
                            env={"PYTHONPATH": str(checks.CHECK_SITE),
                                 "DDP_WORKSHOP_CHECK_STALL_S": "3"})
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1)
                if "rank 0 waits here" in text)
    assert result.returncode != 0
    (stuck,) = result.records("check_stuck")
    assert (stuck["rank"], stuck["op"], stuck["line"]) == (0, "barrier", line), stuck
    assert f"waited 3 s in dist.barrier at line {line}" in result.output(0, stream="stderr")
    # Ended while rank 1 still slept: it never reached its barrier (not the launch's timeout).
    assert not result.records("check_collective", 1)


# --- The answer checks: each core exercise whose answer is a value, against the usual mistakes --

def check_says(check, *args, said: str, **kwargs) -> None:
    with pytest.raises(checks.ExerciseNotDone) as raised:
        check(*args, **kwargs)
    assert said in str(raised.value), f"{said!r} not in\n{raised.value}"


@pytest.mark.parametrize(("ring_bytes", "root_bytes", "said"), [
    (39.375e6, 315e6, "one of the ring's two passes"),
    (630e6, 315e6, "counts whole copies"),
    (78.75e6, 360e6, "not to itself"),
    (78.75e6, 630e6, "count what it sends"),
    (78.75, 315, "looks like megabytes"),
    (..., 315e6, "in place of the ... of ring_bytes"),
])
def test_lesson_03s_check_names_each_wrong_traffic(ring_bytes, root_bytes, said):
    check_says(checks.ring_traffic, ring_bytes, root_bytes, said=said)


def test_lesson_03s_check_takes_the_right_traffic(capsys):
    checks.ring_traffic(2 * 7 / 8 * 45e6, 7 * 45e6)
    checks.ring_traffic(78.8e6, 315e6)  # rounded as the solution prints it
    assert "✓ root: 315 MB, 4 times as much" in capsys.readouterr().out


WHERE_04 = {"nodes": 3, "per_node": 4, "node": 2, "gpu": 1}  # lesson 04's exercise 1: 12, 9, 1


@pytest.mark.parametrize(("answer", "said"), [
    ((4, 9, 1), "counts the processes of every node"),
    ((12, 1, 1), "RANK is global"),
    ((12, 13, 1), "Nodes count from 0"),
    ((12, 9, 9), "LOCAL_RANK is the process's number on its own node"),
    ((12, 9, ...), "in place of the ... of local_rank"),
])
def test_the_process_numbers_check_names_each_mistake(answer, said):
    check_says(checks.process_numbers, *answer, said=said, **WHERE_04)


def test_the_process_numbers_check_takes_both_lessons_answers():
    checks.process_numbers(12, 9, 1, **WHERE_04)
    checks.process_numbers(32, 21, 5, nodes=4, per_node=8, node=2, gpu=5)  # lesson 06's


RIGHT_10 = dict(environment=dict(checks.SRUN_PMI2), launcher="Slurm", numbers=[1, 2, 0, 1],
                missing="MPI_LOCALRANKID")


@pytest.mark.parametrize(("wrong", "said"), [
    ({"launcher": "MPICH"}, "PMI_RANK and PMI_SIZE alone name no launcher"),
    ({"numbers": [1, 2, 1, 2]}, "from Slurm's four"),
    ({"missing": "PMI_SIZE"}, "which of MPICH's four names is not in the environment"),
    ({"environment": {**checks.SRUN_PMI2, "SLURM_LOCALID": "1"}}, "SLURM_LOCALID differ"),
])
def test_lesson_10s_check_names_each_mistake(wrong, said):
    check_says(checks.srun_pmi2, **{**RIGHT_10, **wrong}, said=said)


def test_lesson_10s_check_takes_either_missing_name():
    checks.srun_pmi2(**RIGHT_10)
    checks.srun_pmi2(**{**RIGHT_10, "missing": "MPI_LOCALNRANKS"})


@pytest.mark.parametrize(("fsdp_gpus", "ddp_gpus", "said"), [
    (1, None, "over the 40 GB budget"),  # the weights alone, 4 bytes per parameter
    (2, None, "over the 40 GB budget"),  # 16 bytes, but filling each 80-GB GPU
    (3, 2, "DDP holds everything on every GPU"),
    (0, None, "find the least N for 40 GB"),
])
def test_lesson_11s_check_names_each_mistake(fsdp_gpus, ddp_gpus, said):
    check_says(checks.fsdp_gpus, fsdp_gpus, ddp_gpus, said=said)


def test_lesson_11s_check_takes_the_right_count(capsys):
    checks.fsdp_gpus(3, None)
    assert "✓ FSDP: 3 GPUs, 34.4 GB each" in capsys.readouterr().out


@pytest.fixture(scope="module")
def lesson_00(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson00")
    for name in ("hello_allreduce.py", "threads_demo.py"):
        scripts.from_notebook("00_setup.ipynb", name, directory=folder, quiet=True)
    return folder


def launched(script, nproc, tmp_path, args=()):
    return ddp_lib.launch(script, nproc_per_node=nproc, backend="gloo", stream=False, args=args,
                          run_dir=tmp_path / f"{script.stem}-{nproc}", timeout=240)


@pytest.mark.sweep
def test_lesson_00s_check_names_each_mistake_of_real_launches(lesson_00, tmp_path):
    three = launched(lesson_00 / "hello_allreduce.py", 3, tmp_path)
    checks.three_processes(three, 6)
    check_says(checks.three_processes, three, 3, said="ranks count from 0")
    two = launched(lesson_00 / "hello_allreduce.py", 2, tmp_path)
    check_says(checks.three_processes, two, 6, said="three ran 2 processes")
    with pytest.raises(checks.ExerciseNotDone) as raised:  # 6 is right for 3: not blamed
        checks.three_processes(two, 6)
    assert len(raised.value.mistakes) == 1, raised.value
    check_says(checks.three_processes, launched(lesson_00 / "threads_demo.py", 3, tmp_path), 6,
               said="launch scripts/hello_allreduce.py")
    check_says(checks.three_processes, three.output(), 6, said="keep what ddp_lib.launch(...)")


@pytest.mark.sweep
def test_lesson_07s_check_names_each_mistake_of_real_launches(tmp_path):
    script = scripts.from_notebook("07_mixed_precision.ipynb", "train_amp.py",
                                   directory=tmp_path, quiet=True)
    common = ["--epochs", 1, "--batch-size", 32, "--train-samples", 256, "--test-samples", 128,
              "--checkpoint", tmp_path / "amp.pt"]
    fp16 = launched(script, 2, tmp_path, [*common, "--precision", "fp16"])
    scales = [2.0**16] + [v for _, v in fp16.metric("loss_scale")]
    skipped = sum(b < a for a, b in zip(scales, scales[1:], strict=False))
    checks.fp16_on_cpu(fp16, skipped, scales[-1])
    check_says(checks.fp16_on_cpu, fp16, skipped + 1, scales[-1], said="count the falls")
    check_says(checks.fp16_on_cpu, fp16, skipped, 1.0, said="the last 'loss_scale'")
    bf16 = launched(script, 2, tmp_path, [*common, "--precision", "bf16"])
    check_says(checks.fp16_on_cpu, bf16, 0, 1.0, said="with --precision bf16: launch")


def lesson_script_and_copy(tmp_path, lesson: str, original: str, copy: str, edit=None):
    """A lesson's script, from the course's own notebook, and a learner's copy of it made by
    ``edit`` (no copy at all when ``edit`` is None)."""
    start = scripts.write_script(original, scripts.cell_text(lesson, original), directory=tmp_path)
    if edit is not None:
        (tmp_path / copy).write_text(edit(start.read_text()))
    return start, tmp_path / copy


def without_set_epoch(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if SET_EPOCH not in line)


@pytest.mark.parametrize(("edit", "said"), [
    (None, "There is no"),
    (lambda text: text, "still has set_epoch( in `sampler.set_epoch(epoch)"),
    (lambda text: without_set_epoch(text).replace("momentum=0.9", "momentum=0.8"),
     "changes more than the code with set_epoch( (`optimizer = "),
    (lambda text: without_set_epoch(text) + "print('done')\n", "changes more than"),
])
def test_a_homework_copy_that_changes_too_little_or_too_much_is_named(tmp_path, edit, said):
    original, copy = lesson_script_and_copy(tmp_path, "05_ddp.ipynb", "train_ddp.py",
                                            "train_ddp_no_set_epoch.py", edit)
    check_says(checks.copy_without, copy, original, "set_epoch(", exercise="Exercise 3",
               said=said)


@pytest.mark.parametrize("edit", [
    without_set_epoch,
    lambda text: text.replace(f"        {SET_EPOCH}", f"        # {SET_EPOCH}"),  # commented out
])
def test_a_homework_copy_without_the_line_passes(tmp_path, capsys, edit):
    original, copy = lesson_script_and_copy(tmp_path, "05_ddp.ipynb", "train_ddp.py",
                                            "train_ddp_no_set_epoch.py", edit)
    checks.copy_without(copy, original, "set_epoch(", exercise="Exercise 3")
    assert "✓ train_ddp_no_set_epoch.py is train_ddp.py without its set_epoch(" in (
        capsys.readouterr().out)


@pytest.mark.parametrize(("check", "lesson", "original", "copy", "code", "stub_said"), [
    (checks.copy_without, "01_single_device.ipynb", "train_single.py",
     "train_single_one_thread.py", "set_num_threads(", "still has"),
    (checks.copy_without, "05_ddp.ipynb", "train_ddp.py", "train_ddp_no_set_epoch.py",
     "set_epoch(", "still has"),
    (checks.copy_without, "05_ddp.ipynb", "train_ddp_resume.py",
     "train_ddp_resume_no_optimizer.py", '"optimizer"', "still has"),
    (checks.copy_without, "00_setup.ipynb", "hello_allreduce.py", "hello_allreduce_max.py",
     "ReduceOp.SUM", "still has"),
    (checks.copy_adding, "07_mixed_precision.ipynb", "train_amp.py", "train_amp_overflow.py",
     "1e5", "has no code"),
    (checks.copy_adding, "08_scaling.ipynb", "train_scaling.py", "train_powersgd.py",
     "powersgd", "has no code"),
], ids=lambda value: value if isinstance(value, str) and value.endswith(".py") else None)
def test_the_courses_homework_copies_pass_their_checks(tmp_path, check, lesson, original, copy,
                                                      code, stub_said):
    """The solutions the course runs pass the checks that stay in the learners' edition, and
    the stub (the lesson's script, unchanged) does not."""
    start = scripts.write_script(original, scripts.cell_text(lesson, original), directory=tmp_path)
    solved = scripts.write_script(copy, scripts.cell_text(lesson, copy), directory=tmp_path)
    check(solved, start, code, exercise="Exercise")
    stub = scripts.write_script(copy, start.read_text(), directory=tmp_path)
    check_says(check, stub, start, code, exercise="Exercise", said=stub_said)


def test_lesson_04s_copy_may_make_rank_1_late_and_nothing_else(tmp_path):
    start = scripts.write_script("store_demo.py", scripts.cell_text(
        "04_init_methods.ipynb", "store_demo.py"), directory=tmp_path)
    solved = scripts.write_script("store_demo_early_exit.py", scripts.cell_text(
        "04_init_methods.ipynb", "store_demo_early_exit.py"), directory=tmp_path)
    late = ("if rank == 1", "time.sleep(")
    gone = 'while store.add("done", 0)'
    checks.copy_without(solved, start, gone, exercise="Exercise 4", allowed=late)
    check_says(checks.copy_without, solved, start, gone, exercise="Exercise 4",
               said="changes more than", allowed=())
    solved.write_text(solved.read_text().replace("seconds=30", "seconds=5"))
    check_says(checks.copy_without, solved, start, gone, exercise="Exercise 4",
               said="changes more than", allowed=late)


OVERFLOW = "        if rank == 1 and step == 5:\n            images[0, 0, 0, 0] = 1e5\n"


@pytest.mark.parametrize(("edit", "said"), [
    (None, "There is no"),
    (lambda text: text, "has no code with 1e5 yet"),
    (lambda text: text + "# images[0, 0, 0, 0] = 1e5\n", "has no code with 1e5 yet"),
    (lambda text: text.replace("import time\n", "") + OVERFLOW, "takes out `import time`"),
])
def test_a_homework_copy_that_adds_nothing_or_takes_out_code_is_named(tmp_path, edit, said):
    original, copy = lesson_script_and_copy(tmp_path, "07_mixed_precision.ipynb", "train_amp.py",
                                            "train_amp_overflow.py", edit)
    check_says(checks.copy_adding, copy, original, "1e5", exercise="Exercise 3", said=said)


# --- The optional exercises' checks: two or more wrong answers each, and the right one ---------
# A launch's answer is judged from its LaunchResult: here a result as a launch leaves it (the
# script, the command, each rank's lines and records), without the launch; the course's own run
# of each notebook runs every check cell on its real launch.

def finished_launch(script: str, args: list, lines: dict[int, str] = {},  # noqa: B006
                    metrics: tuple = (), ranks: int = 2) -> LaunchResult:
    """A LaunchResult as ddp_lib.launch returns it for ``scripts/<script> args``."""
    printed = [Line(f"rank{rank}", "stdout", lines.get(rank, "")) for rank in range(ranks)]
    return LaunchResult(Path("scripts") / script,
                        ["torchrun", f"--nproc-per-node={ranks}", f"scripts/{script}",
                         *map(str, args)], Path("runs"), returncode=0, lines=printed,
                        metrics=[{"name": n, "rank": r, "step": s, "value": v}
                                 for n, r, s, v in metrics])


TERMINAL = "rank 0: all_reduce gave 3\nrank 1: all_reduce gave 3\n"


@pytest.mark.parametrize(("output", "shown", "said"), [
    (TERMINAL, True, "only ddp_lib.launch sets"),
    (TERMINAL + "rank 2: all_reduce gave 6\n", False, "the command starts 2"),
    ("", False, "has no 'rank 0: all_reduce gave ...' line"),
    (finished_launch("hello_allreduce.py", []), False, "is what ddp_lib.launch returned"),
])
def test_lesson_00s_terminal_check_names_each_mistake(output, shown, said):
    check_says(checks.terminal_run, output, shown, said=said)


TIMINGS = {"PIL, 0 workers": {"batch_wait_ms": 64.0}, "PIL, 2 workers": {"batch_wait_ms": 40.0},
           "tensor indexing": {"batch_wait_ms": 6.4}}  # at batch 64: 1 and 0.1 ms per image


@pytest.mark.parametrize(("at_256", "gains_most", "said"), [
    ({"PIL, 0 workers": 0.9, "tensor indexing": 0.03}, "PIL, 0 workers", "per-batch overhead"),
    ({"PIL, 0 workers": 0.9}, "tensor indexing", "must hold the wait per image"),
    ({"PIL, 0 workers": 0.9, "tensor indexing": 0.03}, "PIL, 2 workers", "per-batch overhead"),
])
def test_lesson_01s_check_names_each_mistake(at_256, gains_most, said):
    check_says(checks.bigger_batches, at_256, gains_most, TIMINGS, 64, said=said)
    checks.bigger_batches({"PIL, 0 workers": 0.9, "tensor indexing": 0.03}, "tensor indexing",
                          TIMINGS, 64)


@pytest.mark.parametrize(("batches_4", "batches_8", "said"), [
    ([7.5] * 4, [4] * 7 + [2], "has a fraction"),
    ([8, 8, 7, 7], [4] * 7 + [2], "DataParallel cuts with torch.chunk"),
    ([6, 8, 8, 8], [4] * 7 + [2], "in another order"),
    ([8, 8, 8, 6], [4] * 8, "adds up to 32"),
])
def test_lesson_02s_slices_check_names_each_mistake(batches_4, batches_8, said):
    check_says(checks.dp_slices, batches_4, batches_8, said=said)
    checks.dp_slices([8, 8, 8, 6], [4] * 7 + [2])


def test_lesson_02s_state_check_names_each_mistake():
    from course_helpers import SmallCNN
    dp_model = torch.nn.DataParallel(SmallCNN())
    state = dp_model.state_dict()
    check_says(checks.plain_state, state, dp_model, said="still has the module. prefix")
    check_says(checks.plain_state, SmallCNN().state_dict(), dp_model,
               said="does not hold dp_model's weights")
    check_says(checks.plain_state, {k.replace("module.", "m."): v for k, v in state.items()},
               dp_model, said="keys are not the plain model's")
    checks.plain_state({k.removeprefix("module."): v for k, v in state.items()}, dp_model)


@pytest.mark.parametrize(("finished", "said"), [
    ({r: r for r in range(5)}, "the one it sends first"),
    ({r: (r - 1) % 5 for r in range(5)}, "the one rank r receives first"),
    ({r: (r + 2) % 5 for r in range(5)}, "holds all 5 contributions"),
])
def test_lesson_03s_chunk_check_names_each_mistake(finished, said):
    check_says(checks.finished_chunks, finished, said=said)
    checks.finished_chunks({r: (r + 1) % 5 for r in range(5)})


ENV_ONLY = finished_launch("init_methods.py", ["--init-method", "env://", "--world-size", 3])


@pytest.mark.parametrize(("env_only", "used", "said"), [
    (ENV_ONLY, 3, "env:// takes the world size from WORLD_SIZE"),
    (ENV_ONLY, 4, "how many processes met"),
    (finished_launch("init_methods.py", ["--init-method", "tcp://"]), 2, "--world-size 3"),
    (ENV_ONLY.output(), 2, "keep what ddp_lib.launch(...) returns"),
])
def test_lesson_04s_world_size_check_names_each_mistake(env_only, used, said):
    check_says(checks.env_world_size, env_only, used, said=said)
    checks.env_world_size(ENV_ONLY, 2)


FOUR = finished_launch("train_ddp.py", ["--batch-size", 16, "--train-samples", 510], ranks=4)


@pytest.mark.parametrize(("four", "batch", "last", "said"), [
    (FOUR, 16, False, "--batch-size is per process"),
    (FOUR, 64, True, "pads to 512"),
    (FOUR, 32, False, "N processes × batch B"),
    (finished_launch("train_ddp.py", ["--batch-size", 16, "--train-samples", 510]), 64, False,
     "with 4 processes"),
])
def test_lesson_05s_four_processes_check_names_each_mistake(four, batch, last, said):
    check_says(checks.four_by_sixteen, four, batch, last, said=said)
    checks.four_by_sixteen(FOUR, 64, False)


def rank_failed(message: str, rank: int = 0, exitcode: int = 1) -> ddp_lib.RankFailed:
    return ddp_lib.RankFailed(message, finished_launch("train_ddp.py", []), rank, exitcode)


@pytest.mark.parametrize(("failure", "seconds", "said"), [
    (None, 30.0, "the launch succeeded"),
    ("Gloo: no address for nonexistent0", 2.0, "keep the ddp_lib.RankFailed"),
    (rank_failed("Rank 0 failed: address already in use"), 2.0, "another reason"),
    (rank_failed("Gloo: no address for nonexistent0"), "2 s", "time the launch"),
])
def test_lesson_06s_interface_check_names_each_mistake(failure, seconds, said):
    check_says(checks.no_interface, failure, seconds, said=said)
    checks.no_interface(rank_failed("Gloo: no address for nonexistent0"), 2.5)
    checks.no_interface(rank_failed("Gloo: no address for nonexistent0"), 300.0)  # a slow one


@pytest.mark.parametrize(("failure", "epochs", "said"), [
    (rank_failed("rank 1 killed", 1, -9), [0, 1], "that run resumed"),
    (rank_failed("rank 0 failed", 0, 1), [0, 0, 1], "rank 1 is killed"),
    (None, [0, 0, 1], "raises ddp_lib.RankFailed"),
    (rank_failed("rank 1 killed", 1, -9), [0, 0], "the epochs of the 'train_loss' reports"),
])
def test_lesson_06s_restart_check_names_each_mistake(failure, epochs, said):
    check_says(checks.restarts, failure, epochs, said=said)
    checks.restarts(rank_failed("rank 1 killed", 1, -9), [0, 0, 1])


@pytest.mark.parametrize(("a_plain", "a_detail", "warned", "said"), [
    ([2.0] * 3, [101.0] * 3, False, "each rank's a met the other rank's b"),
    ([101.0] * 3, [101.0] * 3, True, "no tool knows what the tensors mean"),
    ([101.0] * 3, [100.0] * 3, False, "read rank 0's 'a = ...' line"),
])
def test_lesson_09s_swapped_check_names_each_mistake(a_plain, a_detail, warned, said):
    check_says(checks.swapped_order, a_plain, a_detail, warned, said=said)
    checks.swapped_order([101.0] * 3, [101.0] * 3, False)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson09")
    return scripts.from_notebook("09_hangs.ipynb", "uneven.py", directory=folder, quiet=True)


JOINED = finished_launch("uneven_join.py", ["--fix", "join"],
                         {0: "epoch 1: loss 1.402 over 91 samples"})


@pytest.mark.parametrize(("edit", "joined", "said"), [
    (lambda text: text, JOINED, "where uneven.py has it"),
    (lambda text: text.replace("lr=0.1", "lr=0.2"), JOINED, "changes more than"),
    (lambda text: text.replace("        dist.all_reduce(totals)", "dist.all_reduce(totals)"),
     JOINED, "4 spaces, after the with block"),
    (lambda text: text.replace("        dist.all_reduce(totals)", "    dist.all_reduce(totals)"),
     finished_launch("uneven_join.py", ["--fix", "none"]), "with --fix join"),
])
def test_lesson_09s_join_check_names_each_mistake(uneven, edit, joined, said):
    copy = uneven.with_name("uneven_join.py")
    copy.write_text(edit(uneven.read_text()))
    check_says(checks.join_then_reduce, joined, original=uneven, copy=copy, said=said)
    copy.write_text(uneven.read_text().replace("        dist.all_reduce(totals)",
                                               "    dist.all_reduce(totals)"))
    checks.join_then_reduce(JOINED, original=uneven, copy=copy)


@pytest.mark.parametrize(("numbers", "slurm_first", "said"), [
    ([1, 2, 0, 1], [1, 2, 0, 1], "rank3_numbers are Slurm's"),
    ([3, 4, 1, 2], [3, 4, 1, 2], "rank3_slurm_first are MPICH's"),
    ([4, 4, 2, 2], [1, 2, 0, 1], "from MPICH's PMI_RANK"),
    ([3, 4, 1, 2], [2, 2, 1, 1], "from SLURM_PROCID"),
])
def test_lesson_10s_second_check_names_each_mistake(numbers, slurm_first, said):
    check_says(checks.mpiexec_in_slurm, numbers, slurm_first, said=said)
    checks.mpiexec_in_slurm([3, 4, 1, 2], [1, 2, 0, 1])


def test_lesson_11s_rows_check_names_each_mistake():
    from course_helpers import SmallCNN
    model = SmallCNN()
    right = {}
    for rank in range(4):
        held = 0
        for p in model.parameters():
            rows = -(-len(p) // 4)
            held += max(0, min((rank + 1) * rows, len(p)) - rank * rows) * p[0].numel()
        right[rank] = 12 * held
    total = sum(right.values())
    check_says(checks.fsdp_rows, dict.fromkeys(range(4), total // 4), model,
               said="gives every rank the same")
    check_says(checks.fsdp_rows, {r: v // 3 for r, v in right.items()}, model,
               said="counts the weights alone")
    check_says(checks.fsdp_rows, {0: right[1], 1: right[0], 2: right[2], 3: right[3]} | {
        0: right[0] + 4, 1: right[1] - 4}, model, said="the right total")
    checks.fsdp_rows(right, model)


# --- The homework's checks ----------------------------------------------------------------------

def test_lesson_01s_flip_check_names_each_mistake():
    batch = torch.randn(8, 3, 32, 32)
    flip = torch.tensor([True, False] * 4)
    right = batch.clone()
    right[flip] = right[flip].flip(-1)
    upside_down = batch.clone()
    upside_down[flip] = upside_down[flip].flip(-2)
    everything = batch.flip(-1)
    check_says(checks.flips, batch.clone(), batch, flip, said="assign the flipped images back")
    check_says(checks.flips, upside_down, batch, flip, said="the width is the last axis")
    check_says(checks.flips, everything, batch, flip, said="and the others as they were")
    check_says(checks.flips, right, batch, torch.rand(8), said="one coin per image")
    checks.flips(right, batch, flip)


ROOT = finished_launch("all_to_root.py", [], ranks=4, metrics=[
    ("all_to_root_s", rank, None, 0.010 + rank / 1000) for rank in range(4)])


@pytest.mark.parametrize(("root", "root_s", "said"), [
    (ROOT, 0.010, "take the max over the ranks"),
    (ROOT, 13.0, "looks like milliseconds"),
    (finished_launch("all_to_root.py", [], metrics=[("all_to_root_s", r, None, 0.01)
                                                    for r in range(2)]), 0.01, "ran 2 ranks"),
    (finished_launch("ring_allreduce.py", [], ranks=4), 0.013, "launch scripts/all_to_root.py"),
])
def test_lesson_03s_root_check_names_each_mistake(root, root_s, said):
    check_says(checks.all_to_root, root, root_s, said=said)
    checks.all_to_root(ROOT, 0.013)


def test_lesson_04s_pickling_check_names_each_mistake():
    import pickle
    child = "AttributeError: Can't get attribute 'worker' on <module '__main__' (built-in)>"
    error = pickle.PicklingError("Can't pickle <function <lambda>>")
    check_says(checks.spawn_pickling, None, child, said="pickle.dumps of a lambda fails")
    check_says(checks.spawn_pickling, ValueError("x"), child, said="keep the exception")
    check_says(checks.spawn_pickling, error, "", said="Can't get attribute 'worker'")
    checks.spawn_pickling(error, child)
    checks.spawn_pickling(AttributeError("Can't pickle local object"), child)


@pytest.mark.parametrize(("error", "step", "said"), [
    (None, 1, "leave out scaler.update() alone"),
    (RuntimeError("step() has already been called since the last update()."), 0,
     "the first step goes through"),
    (ValueError("x"), 1, "keep the RuntimeError"),
])
def test_lesson_07s_update_check_names_each_mistake(error, step, said):
    check_says(checks.no_update, error, step, said=said)
    checks.no_update(RuntimeError("step() has already been called since the last update()."), 1)


def test_lesson_07s_resume_check_names_each_mistake():
    saved = {"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
             "growth_interval": 2000, "_growth_tracker": 29}
    empty = RuntimeError("The source state dict is empty, possibly because it was saved from a "
                         "disabled instance of GradScaler.")
    check_says(checks.scaler_resume, 65536.0, 65536.0, empty, saved=saved,
               said="the saved scale, 32768")
    check_says(checks.scaler_resume, 32768.0, 32768.0, empty, saved=saved,
               said="starts at 2**16")
    check_says(checks.scaler_resume, 32768.0, 65536.0, None, saved=saved,
               said="the empty state a disabled one saved")
    checks.scaler_resume(32768.0, 65536.0, empty, saved=saved)


def scaling_run(*args, ranks=2) -> LaunchResult:
    return finished_launch("train_scaling.py", ["--model", "resnet18", *args], ranks=ranks)


@pytest.mark.parametrize(("run", "said"), [
    (scaling_run("--batch-size", 8, "--profile", "runs/traces/x"), "as the weak-scaling runs"),
    (scaling_run("--batch-size", 3, "--profile", "runs/traces/x"), "resnet_batch // max_n"),
    (scaling_run("--batch-size", 4), "has no --profile"),
    (scaling_run("--batch-size", 8, "--profile", "t", ranks=1), "ran 1 processes"),
])
def test_lesson_08s_strong_scaling_check_names_each_mistake(run, said):
    check_says(checks.strong_scaling, run, 2, 8, said=said)
    checks.strong_scaling(scaling_run("--batch-size", 4, "--profile", "runs/traces/x"), 2, 8)


@pytest.mark.parametrize(("run", "said"), [
    (scaling_run("--profile", "t"), "has no --comm-hook"),
    (scaling_run("--comm-hook", "fp16", "--profile", "t"), "compresses with fp16"),
    (scaling_run("--comm-hook", "bf16"), "no timeline to draw"),
    (scaling_run("--comm-hook", "bf16", "--profile", "t", ranks=1), "compare at max_n"),
])
def test_lesson_08s_compression_check_names_each_mistake(run, said):
    check_says(checks.compressed_run, run, 2, said=said)
    checks.compressed_run(scaling_run("--comm-hook", "bf16", "--profile", "t"), 2)


def lr_run(*args) -> LaunchResult:
    return finished_launch("train_scaling.py", ["--lr", 0.05, *args])


@pytest.mark.parametrize(("hot", "said"), [
    ({"a": lr_run("--lr", 0.2), "b": lr_run("--lr", 0.2, "--warmup-epochs", 0.5)},
     "has no --scale-lr"),
    ({"a": lr_run("--scale-lr"), "b": lr_run("--scale-lr", "--warmup-epochs", 0.5)},
     "η = 0.2"),
    ({"a": lr_run("--lr", 0.2, "--scale-lr"), "b": lr_run("--lr", 0.2, "--scale-lr")},
     "one run warms up"),
    ({"a": lr_run("--lr", 0.2, "--scale-lr")}, "must hold the two launches"),
])
def test_lesson_08s_hot_check_names_each_mistake(hot, said):
    check_says(checks.hot_runs, hot, said=said)
    checks.hot_runs({"a": lr_run("--lr", 0.2, "--scale-lr"),
                     "b": lr_run("--lr", 0.2, "--scale-lr", "--warmup-epochs", 0.5)})


def test_lesson_09s_flight_recorder_check_says_what_a_machine_without_two_gpus_shows(capsys):
    if torch.cuda.device_count() >= 2:
        check_says(checks.flight_recorder, finished_launch("hang.py", []), [], said="succeeded")
    else:
        checks.flight_recorder(None, None)
        assert "needs two GPUs" in capsys.readouterr().out


@pytest.mark.parametrize(("numbers", "refusal", "said"), [
    ([3, 4, 1, 2], "... not mpiexec -pmi-port", "old_numbers are MPICH's"),
    ([1, 2, 1, 2], "... not mpiexec -pmi-port", "Slurm's four"),
    ([1, 2, 0, 1], "KeyError: 'PMI_RANK'", "names mpiexec -pmi-port"),
])
def test_lesson_10s_old_rule_check_names_each_mistake(numbers, refusal, said):
    check_says(checks.old_rule, numbers, refusal, said=said)
    checks.old_rule([1, 2, 0, 1], "RuntimeError: ... not mpiexec -pmi-port")


COPY_11 = 32 * 2**20  # one fp32 copy of wide_mlp(1024, depth=8): 32 MiB
LEAST = {"ddp": None, "zero1": None, "zero2": 4, "zero3": 4}


@pytest.mark.parametrize(("wrong", "said"), [
    ({"zero1": 8}, "weights and gradients whole"),
    ({"ddp": 16}, "4C on every rank"),
    ({"zero3": 3}, "4C/3 = 42.7 MiB, over 40"),
    ({"zero2": 8}, "all cut in N"),
])
def test_lesson_11s_ladder_check_names_each_mistake(wrong, said):
    check_says(checks.zero_ladder, {**LEAST, **wrong}, COPY_11, said=said)
    checks.zero_ladder(LEAST, COPY_11)

"""Exercise checks: launch a learner's script under torchrun and say, one sentence each, what is
wrong with it. A check is not a solution: it stays in the learners' edition, and reads only what
the learner's own run did.

A check launches the script with ``ddp_lib.launch``, as the course launches its own, and with
one addition, in the ranks' environment: ``check_site/`` on their ``PYTHONPATH``, whose
``sitecustomize`` records which samples each batch drew, who saved which file, and whether the
process group was still open at exit. It changes nothing the ranks compute. The rest comes from
what lesson 01's script already reports (``report``, ``report_weights``) and from its checkpoint.

``ddp_conversion`` checks lesson 05's exercise: lesson 01's script made into DDP. The answer
checks read an answer the learner puts in named variables (the stub leaves them ``...``), and
name the usual wrong answers; what is right is in the check's code, as an answer key.
``copy_without`` checks the first step of a homework that changes a lesson's script in a copy.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import ddp_lib
from ddp_lib import scripts
from ddp_lib.launching import messages
from ddp_lib.launching.result import LaunchError, LaunchResult

CHECK_SITE = Path(__file__).resolve().parent / "check_site"
LOSS_TOLERANCE = 1e-4  # relative: the same sums in another order
WEIGHT_TOLERANCE = 1e-4  # lesson 05 section 4 measures about 1e-6 after 16 steps
# What a rank raises when a peer's process went away first: a consequence, not its own mistake.
PEER_GONE = re.compile(r"Connection (closed|reset) by peer", re.IGNORECASE)
# A rank that waits this long in one of the script's collectives is stuck: the check's runs wait
# less than a second in any, once the data is there (the check prepares it before launching).
STALL_S = 45


class ExerciseNotDone(AssertionError):
    """What a check found wrong, one sentence per mistake; shown without the check's frames, which
    are not where the mistake is."""

    def __init__(self, subject: str | Path, mistakes: list[str]):
        self.mistakes = mistakes
        listed = "\n".join(f"  ✗ {m}" for m in mistakes)
        super().__init__(f"{subject} is not right yet:\n{listed}")

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def _verdict(subject: str, mistakes: list[str], held: list[str]) -> None:
    """Raise with the mistakes, or print what held."""
    if mistakes:
        raise ExerciseNotDone(subject, mistakes)
    print("\n".join(f"  ✓ {line}" for line in held))


def _unanswered(**answers) -> list[str]:
    """A sentence for the answers still ``...``, as the exercise's stub leaves them."""
    missing = [name for name, value in answers.items() if value is Ellipsis]
    return [f"Write your answer in place of the ... of {', '.join(missing)}, then run this cell "
            "again."] if missing else []


def _near(value, expected: float) -> bool:
    return isinstance(value, (int, float)) and abs(value - expected) <= 1e-3 * abs(expected)


@dataclass(frozen=True)
class Setting:
    """The small run a check makes: ``nproc`` processes, each with batch ``batch_size``."""

    nproc: int = 2
    batch_size: int = 32
    epochs: int = 2
    train_samples: int = 512  # a multiple of nproc x batch_size: no padding, no short batch
    # Odd, so that a DistributedSampler on the test set pads it (one sample counted twice), and
    # not train_samples, so that the two loaders are told apart by length.
    test_samples: int = 255

    def args(self, nproc: int, checkpoint: Path) -> list:
        batch = self.batch_size * self.nproc // nproc  # the same total batch on every run
        return ["--epochs", self.epochs, "--batch-size", batch, "--train-samples",
                self.train_samples, "--test-samples", self.test_samples,
                "--checkpoint", checkpoint]


def ddp_conversion(script: str | os.PathLike, setting: Setting = Setting(),
                   timeout: float = 300.0) -> None:
    """Check that ``script`` is lesson 01's ``train_single.py`` made into DDP; print what held.

    Launches it with ``setting.nproc`` processes on Gloo, then (only if nothing else is wrong) with
    one process and the same total batch, which a right conversion matches up to rounding. A
    script with no ``init_process_group`` at all (lesson 01's, untouched) is not launched.

    Raises:
        ExerciseNotDone: one sentence per mistake found.
        FileNotFoundError: there is no such script yet.
    """
    script = Path(script)
    if not script.exists():
        raise FileNotFoundError(f"{script} does not exist yet: run the exercise's script cell "
                                "(%%write_script ...) first.")
    if not _code_with(script, "init_process_group"):  # no need to launch it (a TODO may name it)
        raise ExerciseNotDone(script, [
            "It never calls dist.init_process_group(...): without a process group, each process "
            "trains alone. Start there; the key points list what else a DDP script needs."])
    folder = Path(tempfile.mkdtemp(prefix="check-", dir=_runs()))
    started = time.monotonic()
    from course_helpers import prepare_cifar10  # here: it imports torchvision, 3 s on 2 cores

    # Downloaded or generated here, not by a rank while the others wait at its barrier, which
    # could outlast STALL_S and be taken for a hang.
    prepare_cifar10(verbose=False)

    def checked() -> str:  # what a learner waited for, said with the verdict
        return f"{script} (checked in {time.monotonic() - started:.0f} s)"

    several, failure = _launch(script, setting, setting.nproc, folder, timeout)
    if failure:  # what the ranks did before it may say why, first: before any traceback
        named = [*_saver_mistakes(several), *_collective_mistakes(several, script)]
        if named:  # the failure followed from it: how it ended, without the crash's dump
            failure = f"What followed: {failure.splitlines()[0]}"
        raise ExerciseNotDone(checked(), [*named, failure])
    mistakes = _mistakes(several, setting, folder / "several.pt")
    if mistakes:
        raise ExerciseNotDone(checked(), mistakes)
    _, failure = _launch(script, setting, 1, folder, timeout)
    if failure:
        raise ExerciseNotDone(checked(), [f"With one process: {failure}"])
    gap = _weight_gap(folder / "several.pt", folder / "one.pt")
    if gap > WEIGHT_TOLERANCE:
        raise ExerciseNotDone(checked(), [
            f"{setting.nproc} processes with batch {setting.batch_size} did not train like one "
            f"process with batch {setting.nproc * setting.batch_size}: their final weights "
            f"differ by up to {gap:.1e} (rounding stays below {WEIGHT_TOLERANCE:.0e}); does the "
            "script change the learning rate, the loss or the batch size with the number of "
            "processes?"])
    held = [f"each of the {setting.nproc} ranks trained on its own share of the samples, "
            "reshuffled every epoch",
            "every rank ended with the same weights",
            "rank 0 alone saved the checkpoint, which SmallCNN loads as it is",
            "the reported loss and accuracy are those of all ranks together",
            "every rank closed its process group",
            f"{setting.nproc} processes with batch {setting.batch_size} trained like one process "
            f"with batch {setting.nproc * setting.batch_size} (weights within {gap:.0e})"]
    _verdict(str(script), [], held)
    print(f"  (checked in {time.monotonic() - started:.0f} s: {setting.nproc} processes, then 1)")


def _runs() -> Path:
    runs = Path("runs")
    runs.mkdir(exist_ok=True)
    return runs


def _launch(script: Path, setting: Setting, nproc: int, folder: Path,
            timeout: float) -> tuple[LaunchResult, str | None]:
    """One launch of the learner's script, and what went wrong if it failed: the launch's own
    message (the rank, its error and the line), without the pointer to the full output."""
    name = "several" if nproc > 1 else "one"
    try:
        return ddp_lib.launch(script, nproc_per_node=nproc, backend="gloo", stream=False,
                              args=setting.args(nproc, folder / f"{name}.pt"), timeout=timeout,
                              run_dir=folder / name, env={"PYTHONPATH": str(CHECK_SITE),
                                                          "DDP_WORKSHOP_CHECK_STALL_S":
                                                          str(STALL_S)}), None
    except LaunchError as error:
        said = [line for line in str(error).strip().splitlines()  # not the check's own frames
                if not line.startswith("All output") and str(CHECK_SITE) not in line]
        return error.result, "\n    ".join(said)


def _mistakes(result: LaunchResult, setting: Setting, checkpoint: Path) -> list[str]:
    """The mistakes one run of ``setting.nproc`` processes shows, each as one sentence."""
    missing = [name for name in ("step_loss", "train_loss", "test_accuracy", "weights_sum")
               if not result.records(name)]
    if missing:
        return [f"The script reports no {', '.join(missing)}: keep lesson 01's report(...) and "
                "report_weights(...) lines, which this check reads."]
    drifted = _weight_mistakes(result, setting.nproc)
    return [*_data_mistakes(result, setting), *drifted,
            *_checkpoint_mistakes(result, setting, checkpoint, not drifted),
            *_loss_mistakes(result, setting), *_exit_mistakes(result)]


def _epochs_drawn(result: LaunchResult, rank: int, size: int) -> list[list[int]]:
    """The indices ``rank`` drew in each pass over a data set of ``size`` samples, in order."""
    passes: dict[int, list[int]] = {}
    for record in result.records("check_drawn", rank):
        if record["size"] == size:
            passes.setdefault(record["value"], []).extend(record["indices"])
    return [passes[p] for p in sorted(passes)]


def _data_mistakes(result: LaunchResult, setting: Setting) -> list[str]:
    n = setting.train_samples
    drawn = {rank: _epochs_drawn(result, rank, n) for rank in range(setting.nproc)}
    if any(len(epochs) != setting.epochs for epochs in drawn.values()):
        return [f"The check saw no {setting.epochs} passes over the {n} training samples on "
                "every rank: keep lesson 01's loop, one pass over train_loader per epoch."]
    first = [set(epochs[0]) for epochs in drawn.values()]
    shared = set.intersection(*first)
    if shared:
        return [f"Every rank trained on the same samples ({len(shared)} of {n} in epoch 0 on all "
                f"{setting.nproc} ranks), so {setting.nproc} processes did one process's work "
                f"{setting.nproc} times: give the training DataLoader a DistributedSampler "
                "(sampler=..., and no shuffle=True)."]
    mistakes = []
    covered = len(set.union(*first))
    if covered < n:
        mistakes.append(f"Epoch 0 trained on {covered} of the {n} training samples: each must go "
                        "to exactly one rank, as DistributedSampler does.")
    mistakes += _test_set_mistakes(result, setting)
    in_order = [rank for rank, epochs in drawn.items() if epochs[0] == sorted(epochs[0])]
    same = [rank for rank, epochs in drawn.items() if epochs[1] == epochs[0]]
    if in_order:
        mistakes.append(f"Rank {in_order[0]} drew its samples in the data set's order: leave "
                        "DistributedSampler's shuffle on (its default), and call "
                        "sampler.set_epoch(epoch) every epoch for a new order.")
    elif same:
        mistakes.append(f"Rank {same[0]} drew its samples in the same order in every epoch: call "
                        "sampler.set_epoch(epoch) at the start of each epoch, since "
                        "DistributedSampler shuffles with its seed + epoch.")
    return mistakes


def _test_set_mistakes(result: LaunchResult, setting: Setting) -> list[str]:
    """Where the ranks drew from the whole test set (a sampler on it, not a Subset each), the
    first evaluation must count every sample once."""
    n = setting.test_samples
    first = [epochs[0] for epochs in (_epochs_drawn(result, rank, n)
                                      for rank in range(setting.nproc)) if epochs]
    if len(first) < setting.nproc:  # each rank had a Subset of its own, as section 3's
        return []
    drawn, distinct = sum(map(len, first)), len(set().union(*first))
    if drawn > distinct:
        return [f"The ranks evaluated {drawn} test samples where there are {n}: "
                f"DistributedSampler pads the test set to a multiple of {setting.nproc}, so "
                f"{drawn - distinct} of them counted twice; give each rank its own share with "
                "Subset(test_set, range(rank, len(test_set), world_size)), as lesson 05 does."]
    if distinct < n:
        return [f"The ranks evaluated {distinct} of the {n} test samples: each must be "
                "evaluated by exactly one rank."]
    return []


def _weight_mistakes(result: LaunchResult, nproc: int) -> list[str]:
    """Judged from every rank: whether each made a DDP wrapper, and each rank's own weights."""
    prints = result.fingerprints()
    wrapped = {r["rank"] for r in result.records("check_wrapped")}
    advice = ("wrap the model in DistributedDataParallel and call the wrapped model in the "
              "training loop, so that every step averages the gradients of all ranks.")
    if len(wrapped) < nproc:
        unwrapped = sorted(set(range(nproc)) - wrapped)
        return [f"Rank{'s' * (len(unwrapped) > 1)} {', '.join(map(str, unwrapped))} trained "
                f"without a DistributedDataParallel wrapper: {advice}"]
    if set(prints) != set(range(nproc)):
        return [f"Only rank{'s' * (len(prints) > 1)} {', '.join(map(str, sorted(prints)))} "
                "reported its weights: call report_weights(model) on every rank, not under "
                "if rank == 0:, so that the check compares every rank's copy."]
    if len(set(prints.values())) == 1:
        return []
    shown = ", ".join(f"rank {rank} {sha[:8]}" for rank, sha in sorted(prints.items()))
    return [f"The ranks ended with different weights ({shown}): {advice}"]


def _checkpoint_mistakes(result: LaunchResult, setting: Setting,
                         checkpoint: Path, same_weights: bool) -> list[str]:
    """Who saved, what, and (where every rank holds the saved model) whether the reported
    accuracy is the saved model's."""
    mistakes = _saver_mistakes(result)
    if not checkpoint.exists():
        return [*mistakes, f"No checkpoint at {checkpoint}: keep lesson 01's "
                "save_checkpoint(..., args.checkpoint)."]
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if any(key.startswith("module.") for key in state):
        return [*mistakes, "The checkpoint's keys start with 'module.', the DDP wrapper's: save "
                "model.module.state_dict(), which lesson 01's SmallCNN loads as it is."]
    from course_helpers import SmallCNN  # here: it imports torchvision, 3 s on 2 cores

    model = SmallCNN()
    model.load_state_dict(state)
    if not same_weights:
        return mistakes
    reported = result.metric("test_accuracy", 0)[-1][1]
    scored = _accuracy(model, setting.test_samples)
    # One sample of slack: a GPU rank's argmax may break a near tie otherwise than this CPU's.
    if abs(reported - scored) > 1.5 / setting.test_samples:
        mistakes.append(f"Rank 0 reported a test accuracy of {reported:.4f} after the last "
                        f"epoch, but the saved model scores {scored:.4f} on the "
                        f"{setting.test_samples} test samples: add up the correct answers and "
                        "the totals of all ranks (dist.all_reduce) before dividing.")
    return mistakes


def _saver_mistakes(result: LaunchResult) -> list[str]:
    savers = sorted({r["rank"] for r in result.records("check_saved")})
    if len(savers) < 2:
        return []
    return [f"Ranks {', '.join(map(str, savers))} each wrote the checkpoint: on a shared file "
            "system they write one file at the same time; save on rank 0 only (if rank == 0:)."]


def _collective_mistakes(result: LaunchResult, script: Path) -> list[str]:
    """The first collective that one rank called and another did not (it called another one
    there, or went on without it), as lesson 09 names it."""
    calls: dict[int, list[dict]] = {}
    for record in result.records("check_collective"):
        calls.setdefault(record["rank"], []).append(record)
    if len(calls) < 2:
        return []
    for index in range(max(map(len, calls.values()))):
        seen = {rank: (made[index] if index < len(made) else None)
                for rank, made in calls.items()}
        if len({(c["op"], c["line"]) if c else None for c in seen.values()}) == 1:
            continue
        caller, call = next((r, c) for r, c in sorted(seen.items()) if c)
        for other, instead in sorted(seen.items()):
            if instead is None:
                # It went on from its last collective, and did not fail of its own accord.
                since = calls[other][index - 1]["time"] if index else 0.0
                went_on = any(r["time"] > since for r in result.records("check_drawn", other))
                error = messages.last_error(result, other)
                if not went_on or (error and not PEER_GONE.search(error)):
                    continue
                what = "went on without calling it"
            elif (instead["op"], instead["line"]) != (call["op"], call["line"]):
                what = f"called dist.{instead['op']} at line {instead['line']} instead"
            else:
                continue
            where = f" (in {call['function']})" if call["function"] != "<module>" else ""
            return [f"Rank {caller} called dist.{call['op']} at line {call['line']}{where} of "
                    f"{script.name}, and rank {other} {what}: a collective that only some ranks "
                    "call (often one under if rank == 0:) waits for the others, or is paired "
                    "with a different one; every rank must call each collective, in the same "
                    "order (lesson 09)."]
        return []
    return []


def _accuracy(model: torch.nn.Module, samples: int) -> float:
    """The model's accuracy on the test samples, prepared by lesson 01's own ``as_tensors``: the
    course's copy, run with no ``__main__``, since the learner's file may run code when imported."""
    from course_helpers import cifar10

    lesson_01: dict = {"__name__": "train_single"}
    text = scripts.cell_text("01_single_device.ipynb", "train_single.py")
    exec(compile(text, "train_single.py", "exec"), lesson_01)  # noqa: S102 - the course's own text
    images, labels = lesson_01["as_tensors"](cifar10(train=False), samples).tensors
    with torch.no_grad():
        return (model.eval()(images).argmax(1) == labels).float().mean().item()


def _loss_mistakes(result: LaunchResult, setting: Setting) -> list[str]:
    """Rank 0's reported loss of each epoch against the mean of every rank's batch losses."""
    per_rank = [[v for _, v in result.metric("step_loss", rank)] for rank in range(setting.nproc)]
    steps = len(per_rank[0]) // setting.epochs
    for epoch, (_, reported) in enumerate(result.metric("train_loss", 0)):
        losses = [v for values in per_rank for v in values[epoch * steps:(epoch + 1) * steps]]
        mean = sum(losses) / len(losses)
        if abs(reported - mean) > LOSS_TOLERANCE * abs(mean):
            return [f"Rank 0 reported a training loss of {reported:.4f} for epoch {epoch}, but "
                    f"the mean of all ranks' batch losses is {mean:.4f}: add up the loss totals "
                    "and sample counts of all ranks (dist.all_reduce) before dividing."]
    return []


def _exit_mistakes(result: LaunchResult) -> list[str]:
    open_ = sorted({r["rank"] for r in result.records("check_group_open_at_exit")})
    if not open_:
        return []
    return [f"Rank {', '.join(map(str, open_))} exited with its process group still open: call "
            "dist.destroy_process_group() at the end of main(), after a last dist.barrier()."]


def _weight_gap(a: Path, b: Path) -> float:
    first = torch.load(a, map_location="cpu", weights_only=True)
    second = torch.load(b, map_location="cpu", weights_only=True)
    return max((first[k] - second[k]).abs().max().item() for k in first)


# --- Answers ----------------------------------------------------------------------------------

def three_processes(three, expected_sum) -> None:
    """Lesson 00, exercise 1: ``hello_allreduce.py`` launched with 3 processes, and its sum."""
    mistakes = _unanswered(three=three, expected_sum=expected_sum)
    if not mistakes and not isinstance(three, LaunchResult):
        mistakes.append(f"three is a {type(three).__name__}: keep what ddp_lib.launch(...) "
                        "returns in it.")
    if not mistakes:
        if three.script.name != "hello_allreduce.py":
            mistakes.append(f"three ran {three.script.name}: launch scripts/hello_allreduce.py.")
        if len(three.ranks()) != 3:  # its sum is another launch's: not judged
            mistakes.append(f"three ran {len(three.ranks())} processes: nproc_per_node=3.")
        sums = {v for rank in three.ranks() for _, v in three.metric("all_reduce_sum", rank)}
        if sums and expected_sum not in sums and len(three.ranks()) == 3:
            mistakes.append(f"expected_sum is {expected_sum!r}, but the ranks got "
                            f"{', '.join(f'{v:g}' for v in sorted(sums))}: each rank adds its rank "
                            "+ 1, and ranks count from 0.")
    _verdict("Exercise 1", mistakes, ["3 processes ran hello_allreduce.py",
                                      f"every rank got {expected_sum}, as you expected"])


def ring_traffic(ring_bytes, root_bytes, ranks: int = 8, size: float = 45e6) -> None:
    """Lesson 03, exercise 1: bytes each rank sends in a ring all-reduce, and the root of an
    all-to-root scheme."""
    n, mistakes = ranks, _unanswered(ring_bytes=ring_bytes, root_bytes=root_bytes)
    ring, root = 2 * (n - 1) / n * size, (n - 1) * size
    if not mistakes:
        for name, value, right in (("ring_bytes", ring_bytes, ring), ("root_bytes", root_bytes,
                                                                     root)):
            if _near(value, right / 1e6):
                mistakes.append(f"{name} looks like megabytes: the exercise asks for bytes.")
        if _near(ring_bytes, (n - 1) / n * size):
            mistakes.append("ring_bytes counts one of the ring's two passes: reduce-scatter, then "
                            "all-gather, each sending (N - 1)/N of the data.")
        elif _near(ring_bytes, 2 * (n - 1) * size) or _near(ring_bytes, (n - 1) * size):
            mistakes.append("ring_bytes counts whole copies: in each of the N - 1 steps of a pass, "
                            "a rank sends one chunk, 1/N of the data.")
        elif not _near(ring_bytes, ring) and not _near(ring_bytes, ring / 1e6):
            mistakes.append("ring_bytes is not what a rank sends: count the chunks of both passes.")
        if _near(root_bytes, n * size):
            mistakes.append("root_bytes counts N copies: the root sends the result to the N - 1 "
                            "others, not to itself.")
        elif _near(root_bytes, 2 * (n - 1) * size):
            mistakes.append("root_bytes adds what the root receives: count what it sends.")
        elif not _near(root_bytes, root) and not _near(root_bytes, root / 1e6):
            mistakes.append("root_bytes is not what the root sends: one full copy to each other "
                            "rank.")
    _verdict("Exercise 1", mistakes, [f"ring: {ring / 1e6:.2f} MB per rank",
                                      f"root: {root / 1e6:.0f} MB, {root / ring:g} times as much"])


def process_numbers(world_size, rank, local_rank, *, nodes: int, per_node: int, node: int,
                    gpu: int) -> None:
    """Lessons 04 and 06, exercise 1: one process's numbers, given where it runs."""
    mistakes = _unanswered(world_size=world_size, rank=rank, local_rank=local_rank)
    if not mistakes:
        if world_size == per_node:
            mistakes.append("WORLD_SIZE counts the processes of every node, not of one.")
        elif world_size != nodes * per_node:
            mistakes.append("WORLD_SIZE is the number of processes in the whole job.")
        if local_rank != gpu:
            mistakes.append("LOCAL_RANK is the process's number on its own node, which is also "
                            "the GPU it uses.")
        if rank == gpu and node > 0:
            mistakes.append("RANK is global, counted over all nodes; the number on one node is "
                            "LOCAL_RANK.")
        elif rank in ((node + 1) * per_node + gpu, (node - 1) * per_node + gpu):
            mistakes.append("Nodes count from 0, as ranks do: node k has k nodes before it.")
        elif rank != node * per_node + gpu:
            mistakes.append("RANK is the processes of the nodes before this one, plus LOCAL_RANK.")
    _verdict("Exercise 1", mistakes, [f"WORLD_SIZE={world_size}, RANK={rank}, "
                                      f"LOCAL_RANK={local_rank}"])


def fp16_on_cpu(fp16_cpu, skipped_steps, final_scale) -> None:
    """Lesson 07, exercise 1: ``train_amp.py --precision fp16`` on the CPU, and its GradScaler."""
    mistakes = _unanswered(fp16_cpu=fp16_cpu, skipped_steps=skipped_steps,
                           final_scale=final_scale)
    if not mistakes and not isinstance(fp16_cpu, LaunchResult):
        mistakes.append(f"fp16_cpu is a {type(fp16_cpu).__name__}: keep what ddp_lib.launch(...) "
                        "returns in it.")
    if mistakes:
        _verdict("Exercise 1", mistakes, [])
    words = [str(word) for word in fp16_cpu.command]
    chosen = words[words.index("--precision") + 1] if "--precision" in words else "fp32"
    scales = [2.0**16] + [v for _, v in fp16_cpu.metric("loss_scale")]
    skipped = sum(after < before for before, after in itertools.pairwise(scales))
    if fp16_cpu.script.name != "train_amp.py" or chosen != "fp16":
        mistakes.append(f"fp16_cpu ran {fp16_cpu.script.name} with --precision {chosen}: launch "
                        "scripts/train_amp.py with --precision fp16.")
    else:
        if skipped_steps != skipped:
            mistakes.append(f"skipped_steps is {skipped_steps!r}: a skipped step is one after "
                            "which the scale fell; count the falls in fp16_cpu.metric"
                            "('loss_scale').")
        if final_scale != scales[-1]:
            mistakes.append(f"final_scale is {final_scale!r}: it is the last 'loss_scale' the "
                            "run reported.")
    _verdict("Exercise 1", mistakes, [f"fp16 on the CPU: {skipped} skipped steps, final scale "
                                      f"{scales[-1]:g}"])


SRUN_PMI2 = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "PMI_RANK": "1", "PMI_SIZE": "2"}
MPICH_UNSET = ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")  # MPICH's own two, which srun never sets


def srun_pmi2(environment, launcher, numbers, missing) -> None:
    """Lesson 10, exercise 1: what ``set_torchrun_variables`` makes of ``srun --mpi=pmi2``'s
    environment, and what a function that trusts ``PMI_RANK`` alone fails on."""
    mistakes = _unanswered(environment=environment, launcher=launcher, numbers=numbers,
                           missing=missing)
    if not mistakes:
        if environment != SRUN_PMI2:
            differ = sorted(set(environment.items()) ^ set(SRUN_PMI2.items()))
            mistakes.append(f"environment is not the exercise's: {', '.join(k for k, _ in differ)} "
                            "differ.")
        if launcher != "Slurm":
            mistakes.append(f"launcher is {launcher!r}: PMI_RANK and PMI_SIZE alone name no "
                            "launcher (every PMI launcher sets them), so the function goes on to "
                            "the next whose variables are all set.")
        if list(numbers) != [1, 2, 0, 1]:
            mistakes.append(f"numbers is {numbers!r}: RANK, WORLD_SIZE, LOCAL_RANK and "
                            "LOCAL_WORLD_SIZE, from Slurm's four.")
        if missing not in MPICH_UNSET:
            mistakes.append(f"missing is {missing!r}: which of MPICH's four names is not in "
                            "the environment?")
    _verdict("Exercise 1", mistakes, ["Slurm's variables decide: rank 1 of 2, local rank 0 of 1",
                                      f"trusting PMI_RANK alone fails on {missing}"])


def fsdp_gpus(fsdp_gpus, ddp_gpus, parameters: int = 24 * (16384 * 16384 + 16384)) -> None:
    """Lesson 11, exercise 1: 80-GB GPUs for ``wide_mlp(16384)`` with AdamW in fp32, at most
    40 GB each of weights, gradients and optimizer state."""
    mistakes = _unanswered(fsdp_gpus=fsdp_gpus, ddp_gpus=ddp_gpus)
    total = 16 * parameters  # weights, gradients and AdamW's two moments, 4 bytes each
    right = math.ceil(total / 40e9)
    if not mistakes and fsdp_gpus != right:
        if isinstance(fsdp_gpus, int) and fsdp_gpus > 0 and total / fsdp_gpus > 40e9:
            each = total / fsdp_gpus / 1e9
            mistakes.append(f"fsdp_gpus is {fsdp_gpus}: each would hold {each:.0f} GB, over the "
                            "40 GB budget. Count 16 bytes per parameter: weights, gradients and "
                            "AdamW's two moments, 4 bytes each.")
        else:
            mistakes.append(f"fsdp_gpus is {fsdp_gpus!r}: FSDP over N GPUs holds 1/N of the 16 "
                            "bytes per parameter on each; find the least N for 40 GB.")
    if not _unanswered(ddp_gpus=ddp_gpus) and ddp_gpus is not None:
        mistakes.append(f"ddp_gpus is {ddp_gpus!r}: DDP holds everything on every GPU, whatever "
                        "their number; None says that no number is enough.")
    _verdict("Exercise 1", mistakes, [f"FSDP: {right} GPUs, {total / right / 1e9:.1f} GB each",
                                      f"DDP: {total / 1e9:.0f} GB on every GPU, no number of "
                                      "them is enough"])


# --- The optional exercises: each answer in named variables, each usual mistake named ---


def _launched(name: str, value, script: str) -> list[str]:
    """A sentence if ``value`` is not what ``ddp_lib.launch`` returned for ``script``."""
    if not isinstance(value, LaunchResult):
        return [f"{name} is a {type(value).__name__}: keep what ddp_lib.launch(...) returns in "
                "it."]
    if value.script.name != script:
        return [f"{name} ran {value.script.name}: launch scripts/{script}."]
    return []


def _option(result: LaunchResult, flag: str) -> str | None:
    """The value the launch gave ``flag`` on the script's command line, as a string: its last,
    which is the one argparse keeps."""
    words = [str(word) for word in result.command]
    at = [i for i, word in enumerate(words[:-1]) if word == flag]
    return words[at[-1] + 1] if at else None


def terminal_run(terminal_output, metrics_shown) -> None:
    """Lesson 00, exercise 2: the torchrun command from a terminal, and where the metrics go."""
    mistakes = _unanswered(terminal_output=terminal_output, metrics_shown=metrics_shown)
    if not mistakes:
        if isinstance(terminal_output, LaunchResult):
            mistakes.append("terminal_output is what ddp_lib.launch returned: run the torchrun "
                            "command in a terminal, and keep what it printed.")
        elif not isinstance(terminal_output, str):
            mistakes.append(f"terminal_output is a {type(terminal_output).__name__}: keep the "
                            "text the command printed.")
        else:
            said = dict(re.findall(r"rank (\d+): all_reduce gave (\d+)", terminal_output))
            if not said:
                mistakes.append("terminal_output has no 'rank 0: all_reduce gave ...' line: keep "
                                "what the command printed.")
            elif set(said) != {"0", "1"}:
                mistakes.append(f"{len(said)} ranks printed: the command starts 2 "
                                "(--nproc-per-node=2).")
        if metrics_shown is not False:
            mistakes.append(f"metrics_shown is {metrics_shown!r}: report() writes only to the "
                            "file DDP_LIB_METRICS_FILE names, which only ddp_lib.launch sets; in "
                            "a terminal the metrics go nowhere.")
    _verdict("Exercise 2", mistakes, ["2 ranks printed their sum in the terminal",
                                      "no metrics: report() is quiet outside ddp_lib.launch"])


def bigger_batches(at_256, gains_most, timings, batch_size: int,
                   feeds: tuple[str, ...] = ("PIL, 0 workers", "tensor indexing")) -> None:
    """Lesson 01, exercise 1: two feeds timed again with batches of 256, and which one gains the
    most per image."""
    mistakes = _unanswered(at_256=at_256, gains_most=gains_most)
    if not mistakes and (not isinstance(at_256, dict) or set(at_256) != set(feeds)):
        mistakes.append(f"at_256 must hold the wait per image, in ms, of {' and '.join(feeds)}: "
                        "time each again with batch_size=256.")
    if mistakes:
        _verdict("Exercise 1", mistakes, [])
    ratio = {feed: at_256[feed] / (timings[feed]["batch_wait_ms"] / batch_size) for feed in feeds}
    right = min(ratio, key=ratio.get)
    if gains_most != right:
        other = f" ({gains_most}: ×{ratio[gains_most]:.2f})" if gains_most in ratio else ""
        mistakes.append(f"gains_most is {gains_most!r}, but {right}'s wait per image fell to "
                        f"×{ratio[right]:.2f} of what it was{other}: the feed whose time is mostly "
                        "per-batch overhead gains the most; per-image work (PIL's decoding) "
                        "stays.")
    _verdict("Exercise 1", mistakes, [f"{feed}: wait per image ×{ratio[feed]:.2f} at batch 256"
                                      for feed in feeds])


def dp_slices(batches_4, batches_8, samples: int = 30) -> None:
    """Lesson 02, exercise 1: the slices DataParallel cuts a batch of 30 into, on 4 and 8
    GPUs."""
    mistakes = _unanswered(batches_4=batches_4, batches_8=batches_8)
    if mistakes:
        _verdict("Exercise 1", mistakes, [])
    for name, value, gpus in (("batches_4", batches_4, 4), ("batches_8", batches_8, 8)):
        right = [len(s) for s in torch.arange(samples).chunk(gpus)]
        value = list(value)
        if value == right:
            continue
        if any(isinstance(v, float) and not v.is_integer() for v in value):
            mistakes.append(f"{name} has a fraction: a replica gets whole samples.")
        elif sum(value) != samples:
            mistakes.append(f"{name} adds up to {sum(value)}: the slices hold all {samples} "
                            "samples, each once.")
        elif sorted(value) == sorted(right):
            mistakes.append(f"{name} is in another order: the larger slices come first, the "
                            "smaller last.")
        else:
            mistakes.append(f"{name} is {value}: DataParallel cuts with torch.chunk, slices of "
                            f"ceil({samples}/{gpus}) = {right[0]} samples and a smaller last "
                            "one, not as evenly as it could.")
    _verdict("Exercise 1", mistakes, [f"4 GPUs: {list(batches_4)}", f"8 GPUs: {list(batches_8)}"])


def plain_state(state, dp_model) -> None:
    """Lesson 02, exercise 3: a DataParallel model's ``state_dict`` made loadable by the plain
    model."""
    mistakes = _unanswered(state=state)
    if not mistakes:
        inner = dp_model.module.state_dict()
        prefixed = [key for key in state if key.startswith("module.")]
        if prefixed:
            mistakes.append(f"state still has the module. prefix ({prefixed[0]}): take it off "
                            "every key, e.g. with consume_prefix_in_state_dict_if_present.")
        elif set(state) != set(inner):
            odd = sorted(set(state) ^ set(inner))
            mistakes.append(f"state's keys are not the plain model's ({odd[0]}): take off the "
                            "prefix 'module.' alone.")
        elif any(not torch.equal(state[key].cpu(), inner[key].cpu()) for key in inner):
            mistakes.append("state does not hold dp_model's weights: start from "
                            "dp_model.state_dict().")
        else:
            type(dp_model.module)().load_state_dict(state)
    _verdict("Exercise 3", mistakes, ["the plain model loads dp_model's weights"])


def finished_chunks(finished, ranks: int = 5) -> None:
    """Lesson 03, exercise 2: which chunk each rank holds finished after the scatter-reduce."""
    mistakes = _unanswered(finished=finished)
    right = {r: (r + 1) % ranks for r in range(ranks)}
    if not mistakes and dict(finished) != right:
        if dict(finished) == {r: r for r in range(ranks)}:
            mistakes.append("finished is each rank's own chunk r: that is the one it sends "
                            "first, with its contribution alone.")
        elif dict(finished) == {r: (r - 1) % ranks for r in range(ranks)}:
            mistakes.append("finished is chunk (r - 1) mod N, the one rank r receives first: "
                            "at step s it receives chunk (r - s - 1) mod N; take the last step.")
        else:
            mistakes.append(f"finished is not it: in ring.simulate({ranks})[{ranks - 1}], the "
                            f"finished chunk of a rank holds all {ranks} contributions.")
    _verdict("Exercise 2", mistakes, ["after the scatter-reduce, rank r holds chunk (r + 1) mod "
                                      "N finished"])


def env_world_size(env_only, world_size_used) -> None:
    """Lesson 04, exercise 2: ``env://`` launched with ``--world-size 3`` on 2 processes."""
    mistakes = _unanswered(env_only=env_only, world_size_used=world_size_used)
    if not mistakes:
        mistakes = _launched("env_only", env_only, "init_methods.py")
    if not mistakes:
        if _option(env_only, "--init-method") != "env://" or _option(env_only,
                                                                     "--world-size") != "3":
            mistakes.append("env_only must run init_methods.py with --init-method env:// and "
                            "--world-size 3.")
        if world_size_used == 3:
            mistakes.append("world_size_used is 3: env:// takes the world size from WORLD_SIZE, "
                            "which torchrun set to 2; the script passes --world-size only to "
                            "tcp:// and file://.")
        elif world_size_used != len(env_only.ranks()):
            mistakes.append(f"world_size_used is {world_size_used!r}: how many processes met in "
                            "the group?")
    _verdict("Exercise 2", mistakes, ["env:// read WORLD_SIZE=2; --world-size 3 went unused"])


def four_by_sixteen(four, matched_batch, last_step_matches) -> None:
    """Lesson 05, exercise 4: 4 processes × batch 16 on 510 samples against one process."""
    mistakes = _unanswered(four=four, matched_batch=matched_batch,
                           last_step_matches=last_step_matches)
    if not mistakes:
        mistakes = _launched("four", four, "train_ddp.py")
    if not mistakes:
        if len(four.ranks()) != 4 or _option(four, "--batch-size") != "16" or _option(
                four, "--train-samples") != "510":
            mistakes.append("four must run train_ddp.py with 4 processes, --batch-size 16 and "
                            "--train-samples 510.")
        if matched_batch == 16:
            mistakes.append("matched_batch is 16: --batch-size is per process, and 4 processes "
                            "take 4 × 16 samples a step.")
        elif matched_batch != 64:
            mistakes.append(f"matched_batch is {matched_batch!r}: N processes × batch B train "
                            "like one process with batch N·B.")
        if last_step_matches is not False:
            mistakes.append("last_step_matches is not False: 510 does not divide by 4, so the "
                            "sampler pads to 512, and the last step trains two samples twice "
                            "where one process has a last batch of 62.")
    _verdict("Exercise 4", mistakes, ["4 × 16 matches one process with batch 64",
                                      "but not on the padded last step"])


def no_interface(failure, seconds) -> None:
    """Lesson 06, exercise 2: the two-node launch with a network interface that does not
    exist."""
    mistakes = _unanswered(failure=failure, seconds=seconds)
    if not mistakes:
        if failure is None:
            mistakes.append("failure is None: the launch succeeded; give it env="
                            "{\"GLOO_SOCKET_IFNAME\": \"nonexistent0\"}.")
        elif not isinstance(failure, ddp_lib.RankFailed):
            mistakes.append(f"failure is a {type(failure).__name__}: keep the ddp_lib.RankFailed "
                            "the launch raised (except ddp_lib.RankFailed as failure).")
        elif "nonexistent0" not in str(failure):
            mistakes.append("failure does not name nonexistent0: it failed for another reason; "
                            "launch with env={\"GLOO_SOCKET_IFNAME\": \"nonexistent0\"}.")
        if not isinstance(seconds, (int, float)):
            mistakes.append(f"seconds is a {type(seconds).__name__}: time the launch, from the "
                            "call to the failure.")
    if mistakes:
        _verdict("Exercise 2", mistakes, [])
    # How long is not judged: the machine sets it. A launch that waited for its timeout raises
    # LaunchTimeout, not RankFailed, and is named above.
    _verdict("Exercise 2", mistakes, [f"every process failed in init_process_group, naming the "
                                      f"interface, after {seconds:.1f} s"])


def restarts(no_restart, epochs_reported) -> None:
    """Lesson 06, exercise 4: section 7's killed rank without restarts, then restarted without
    ``--resume``."""
    mistakes = _unanswered(no_restart=no_restart, epochs_reported=epochs_reported)
    if not mistakes:
        if not isinstance(no_restart, ddp_lib.RankFailed):
            mistakes.append(f"no_restart is a {type(no_restart).__name__}: with max_restarts=0 "
                            "the launch raises ddp_lib.RankFailed; keep it.")
        elif (no_restart.rank, no_restart.exitcode) != (1, -9):
            mistakes.append(f"no_restart says rank {no_restart.rank}, exit code "
                            f"{no_restart.exitcode}: the run must be section 7's, where rank 1 is "
                            "killed (SIGKILL, -9).")
        if list(epochs_reported) == [0, 1]:
            mistakes.append("epochs_reported is [0, 1]: that run resumed; leave out --resume and "
                            "the restarted group trains epoch 0 again.")
        elif list(epochs_reported) != [0, 0, 1]:
            mistakes.append(f"epochs_reported is {epochs_reported!r}: the epochs of the "
                            "'train_loss' reports of the run restarted without --resume.")
    _verdict("Exercise 4", mistakes, ["without restarts the job fails with the killed rank",
                                      "without --resume the restart trains epoch 0 twice"])


def swapped_order(a_plain, a_detail, warned) -> None:
    """Lesson 09, exercise 1: two all-reduces of the same size, in a different order on the two
    ranks, without and with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``."""
    mistakes = _unanswered(a_plain=a_plain, a_detail=a_detail, warned=warned)
    if not mistakes:
        for name, value in (("a_plain", a_plain), ("a_detail", a_detail)):
            if list(value) == [2.0] * 3:
                mistakes.append(f"{name} is [2.0, 2.0, 2.0], the right sum, which neither run "
                                "gives: each rank's a met the other rank's b, 1 + 100.")
            elif list(value) != [101.0] * 3:
                mistakes.append(f"{name} is {value!r}: read rank 0's 'a = ...' line.")
        if warned is not False:
            mistakes.append("warned is not False: DETAIL compares each collective's operation, "
                            "shape and type, and they match; no tool knows what the tensors "
                            "mean.")
    _verdict("Exercise 1", mistakes, ["both runs give a = [101.0, 101.0, 101.0], with no "
                                      "warning"])


def _code_lines(path: Path) -> list[str]:
    """The lines of a script that hold code, without their comments, the docstring left out."""
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [code.rstrip() for line in lines if (code := line.partition("#")[0]).strip()]


def join_then_reduce(joined_after, original: str = "scripts/uneven.py",
                     copy: str = "scripts/uneven_join.py") -> None:
    """Lesson 09, exercise 2: ``uneven.py`` with the totals' all-reduce moved below the
    ``join()`` block, in a copy, run with ``--fix join``."""
    mistakes = _unanswered(joined_after=joined_after)
    original, copy = Path(original), Path(copy)
    if not copy.exists():
        mistakes.append(f"There is no {copy}: run the cell that writes it first.")
    if mistakes:
        _verdict("Exercise 2", mistakes, [])
    ours, theirs = _code_lines(original), _code_lines(copy)
    reduce_line = [line for line in theirs if "dist.all_reduce(totals)" in line]
    if sorted(line.strip() for line in ours) != sorted(line.strip() for line in theirs):
        mistakes.append(f"{copy.name} changes more than where dist.all_reduce(totals) is: keep "
                        f"the rest of {original.name} as it is.")
    elif theirs == ours:
        mistakes.append(f"{copy.name} has dist.all_reduce(totals) where {original.name} has it: "
                        "move it below the with block.")
    elif reduce_line and not reduce_line[0].startswith("    dist.all_reduce"):
        mistakes.append("dist.all_reduce(totals) is not one level below the for loop over the "
                        "epochs: 4 spaces, after the with block.")
    mistakes += _launched("joined_after", joined_after, copy.name)
    if not mistakes:
        if _option(joined_after, "--fix") != "join":
            mistakes.append(f"joined_after must run {copy.name} with --fix join.")
        elif "over 91 samples" not in joined_after.output(0):
            mistakes.append("rank 0's loss line does not say 'over 91 samples': read "
                            "joined_after.output(0).")
    _verdict("Exercise 2", mistakes, ["after join(), both ranks meet at the totals' "
                                      "all_reduce: 91 samples, each once"])


def mpiexec_in_slurm(rank3_numbers, rank3_slurm_first) -> None:
    """Lesson 10, exercise 2: rank 3 of ``mpiexec -n 4`` in a two-node Slurm job, under the
    lesson's order of launchers and with Slurm's first."""
    mistakes = _unanswered(rank3_numbers=rank3_numbers, rank3_slurm_first=rank3_slurm_first)
    mpich, slurm = [3, 4, 1, 2], [1, 2, 0, 1]
    if not mistakes:
        if list(rank3_numbers) == slurm:
            mistakes.append("rank3_numbers are Slurm's: in the lesson's order MPICH's variables "
                            "come before Slurm's, and they are all set.")
        elif list(rank3_numbers) != mpich:
            mistakes.append(f"rank3_numbers is {rank3_numbers!r}: RANK, WORLD_SIZE, LOCAL_RANK "
                            "and LOCAL_WORLD_SIZE from MPICH's PMI_RANK, PMI_SIZE, "
                            "MPI_LOCALRANKID and MPI_LOCALNRANKS.")
        if list(rank3_slurm_first) == mpich:
            mistakes.append("rank3_slurm_first are MPICH's: with Slurm's entry first, its "
                            "four variables, all set, decide.")
        elif list(rank3_slurm_first) != slurm:
            mistakes.append(f"rank3_slurm_first is {rank3_slurm_first!r}: from SLURM_PROCID, "
                            "SLURM_NTASKS, SLURM_LOCALID and the tasks per node.")
    _verdict("Exercise 2", mistakes, ["the lesson's order: rank 3 of 4, local rank 1 of 2",
                                      "Slurm first: rank 1 of 2, the job's task, not the rank"])


def fsdp_rows(prediction, model: torch.nn.Module, nproc: int = 4, copies: int = 3,
              element_bytes: int = 4) -> None:
    """Lesson 11, exercise 2: the bytes each rank holds under FSDP2, every tensor cut into
    pieces of ceil(rows/N) rows, for the weights, their gradients and the momentum."""
    mistakes = _unanswered(prediction=prediction)
    held = dict.fromkeys(range(nproc), 0)
    for p in model.parameters():
        rows = math.ceil(len(p) / nproc)
        for rank in held:
            held[rank] += max(0, min((rank + 1) * rows, len(p)) - rank * rows) * p[0].numel()
    right = {rank: copies * element_bytes * n for rank, n in held.items()}
    if not mistakes and dict(prediction) != right:
        got = dict(prediction)
        total = sum(right.values())
        if len(set(got.values())) == 1:
            mistakes.append("prediction gives every rank the same: the pieces are ceil(rows/N) "
                            "rows, so the last rank takes what is left, less where rows do not "
                            "divide by N.")
        elif got == {rank: value // copies for rank, value in right.items()}:
            mistakes.append("prediction counts the weights alone: each rank holds its piece "
                            f"{copies} times (weights, gradients, momentum).")
        elif sum(got.values()) == total:
            mistakes.append("prediction has the right total but not each rank's share: rank r "
                            "holds rows r·c to (r+1)·c - 1 of each tensor, c = ceil(rows/N).")
        else:
            mistakes.append(f"prediction is not it: {copies} × {element_bytes} bytes for each "
                            "element of the rows a rank holds.")
    _verdict("Exercise 2", mistakes, [f"rank {rank}: {value:,} bytes"
                                      for rank, value in right.items()])


# --- The homework: the same, for the exercises done after the day ---


def flips(flip_batch, unflipped, flip) -> None:
    """Lesson 01, exercise 3: random horizontal flips on a batch of tensors."""
    mistakes = _unanswered(flip_batch=flip_batch, unflipped=unflipped, flip=flip)
    if mistakes:
        _verdict("Exercise 3", mistakes, [])
    if not (isinstance(flip, torch.Tensor) and flip.dtype == torch.bool
            and flip.shape == flip_batch.shape[:1]):
        mistakes.append("flip must be one coin per image: a bool tensor of the batch's length "
                        "(torch.rand(len(batch)) < 0.5).")
    elif torch.equal(flip_batch, unflipped):
        mistakes.append("flip_batch is unflipped: assign the flipped images back, "
                        "batch[flip] = batch[flip].flip(-1).")
    elif torch.equal(flip_batch[flip], unflipped[flip].flip(-2)):
        mistakes.append("the images are flipped upside down: the width is the last axis, "
                        "flip(-1).")
    elif not torch.equal(flip_batch[flip], unflipped[flip].flip(-1)) or not torch.equal(
            flip_batch[~flip], unflipped[~flip]):
        mistakes.append("flip_batch is not unflipped with the images that drew heads flipped "
                        "along the width, and the others as they were.")
    _verdict("Exercise 3", mistakes, ["the images that drew heads are flipped left to right, "
                                      "the others untouched"])


def all_to_root(root, root_s) -> None:
    """Lesson 03, exercise 4: the all-to-root scheme on four ranks, and its time."""
    mistakes = _unanswered(root=root, root_s=root_s) or _launched("root", root, "all_to_root.py")
    if not mistakes:
        times = {rank: root.metric("all_to_root_s", rank)[0][1] for rank in root.ranks()
                 if root.metric("all_to_root_s", rank)}
        if len(times) != 4:
            mistakes.append(f"root ran {len(times)} ranks: launch it with nproc_per_node=4.")
        elif _near(root_s, 1e3 * max(times.values())):
            mistakes.append("root_s looks like milliseconds: keep seconds, as the ring's.")
        elif not math.isclose(root_s, max(times.values()), rel_tol=1e-6):
            mistakes.append("root_s is not the slowest rank's time: an all-reduce ends when its "
                            "last rank has the sum, so take the max over the ranks.")
    _verdict("Exercise 4", mistakes, ["all-to-root on 4 ranks, timed by its slowest rank"])


def spawn_pickling(lambda_error, child_error) -> None:
    """Lesson 04, exercise 3: what ``mp.spawn`` must do with the function it is given."""
    import pickle

    mistakes = _unanswered(lambda_error=lambda_error, child_error=child_error)
    if not mistakes:
        if lambda_error is None:
            mistakes.append("lambda_error is None: pickle.dumps of a lambda fails; keep the "
                            "exception it raises.")
        elif not isinstance(lambda_error, (pickle.PicklingError, AttributeError)):
            mistakes.append(f"lambda_error is a {type(lambda_error).__name__}: keep the "
                            "exception that pickle.dumps(lambda ...) raises.")
        if "Can't get attribute 'worker'" not in str(child_error):
            mistakes.append("child_error does not say \"Can't get attribute 'worker'\": a "
                            "function defined in the notebook pickles by name, __main__.worker, "
                            "and fails where a fresh interpreter unpickles it; keep what that "
                            "child printed.")
    _verdict("Exercise 3", mistakes, ["a lambda does not pickle: mp.spawn fails before any "
                                      "worker starts",
                                      "a notebook's function fails in each child"])


def no_update(no_update_error, no_update_step) -> None:
    """Lesson 07, exercise 2: two steps of a GradScaler without ``update()``."""
    mistakes = _unanswered(no_update_error=no_update_error, no_update_step=no_update_step)
    if not mistakes:
        if no_update_error is None:
            mistakes.append("no_update_error is None: leave out scaler.update() alone, and run "
                            "two steps.")
        elif not isinstance(no_update_error, RuntimeError) or "update()" not in str(
                no_update_error):
            mistakes.append(f"no_update_error is {no_update_error!r}: keep the RuntimeError "
                            "that scaler.step raises.")
        if no_update_step == 0:
            mistakes.append("no_update_step is 0: the first step goes through; the second "
                            "finds the state of the first, which only update() resets.")
        elif no_update_step != 1:
            mistakes.append(f"no_update_step is {no_update_step!r}: the step (counted from 0) "
                            "at which scaler.step raised.")
    _verdict("Exercise 2", mistakes, ["the second scaler.step raises: update() resets the "
                                      "scaler's per-step state"])


def scaler_resume(resumed_scale, restarted_scale, fp32_error, saved: dict) -> None:
    """Lesson 07, exercise 4: a GradScaler resumed with and without its saved state, and from
    an fp32 run's."""
    mistakes = _unanswered(resumed_scale=resumed_scale, restarted_scale=restarted_scale,
                           fp32_error=fp32_error)
    if not mistakes:
        if resumed_scale != saved["scale"]:
            mistakes.append(f"resumed_scale is {resumed_scale!r}: load_state_dict gives the "
                            f"scaler the saved scale, {saved['scale']:g}.")
        if restarted_scale != 2.0**16:
            mistakes.append(f"restarted_scale is {restarted_scale!r}: a GradScaler made afresh "
                            "starts at 2**16, 65536.")
        if not isinstance(fp32_error, RuntimeError) or "empty" not in str(fp32_error):
            mistakes.append("fp32_error is not the RuntimeError of an enabled scaler loading "
                            "the empty state a disabled one saved.")
    _verdict("Exercise 4", mistakes, [f"resumed: S = {saved['scale']:g}; afresh: 65536",
                                      "an fp32 run's scaler state is empty, and refused"])


def strong_scaling(strong_run, max_n: int, resnet_batch: int) -> None:
    """Lesson 08, exercise 1: the N = 1 run's global batch split over ``max_n`` processes."""
    mistakes = _unanswered(strong_run=strong_run) or _launched("strong_run", strong_run,
                                                               "train_scaling.py")
    if not mistakes:
        per_process = max(1, resnet_batch // max_n)
        batch = _option(strong_run, "--batch-size")
        if len(strong_run.ranks()) != max_n:
            mistakes.append(f"strong_run ran {len(strong_run.ranks())} processes: the largest "
                            f"N, {max_n}.")
        if batch == str(resnet_batch) and max_n > 1:
            mistakes.append(f"strong_run takes {resnet_batch} images per process, as the weak-"
                            f"scaling runs did: strong scaling splits them, {per_process} each.")
        elif batch != str(per_process):
            mistakes.append(f"strong_run takes --batch-size {batch}: resnet_batch // max_n = "
                            f"{per_process} per process.")
        if _option(strong_run, "--profile") is None:
            mistakes.append("strong_run has no --profile: launch it with trace=True, so that "
                            "its step is broken down like the others.")
    _verdict("Exercise 1", mistakes, ["the same global batch, split over the largest N"])


def compressed_run(bf16_run, max_n: int) -> None:
    """Lesson 08, exercise 2: ResNet-18 at ``max_n`` with ``--comm-hook bf16``, traced."""
    mistakes = _unanswered(bf16_run=bf16_run) or _launched("bf16_run", bf16_run,
                                                           "train_scaling.py")
    if not mistakes:
        hook = _option(bf16_run, "--comm-hook")
        if hook is None:
            mistakes.append("bf16_run has no --comm-hook: DDP's own all-reduce sends fp32; add "
                            "--comm-hook bf16.")
        elif hook != "bf16":
            mistakes.append(f"bf16_run compresses with {hook}: the exercise asks for bf16, "
                            "which keeps fp32's range.")
        if len(bf16_run.ranks()) != max_n:
            mistakes.append(f"bf16_run ran {len(bf16_run.ranks())} processes: compare at "
                            f"max_n = {max_n}, as the default run.")
        if _option(bf16_run, "--profile") is None:
            mistakes.append("bf16_run has no --profile: launch it with trace=True, or there is "
                            "no timeline to draw.")
    _verdict("Exercise 2", mistakes, [f"bf16 gradients on the wire, {max_n} processes, traced"])


def hot_runs(hot) -> None:
    """Lesson 08, exercise 3: η = 0.2 scaled to 0.4, with and without warm-up."""
    mistakes = _unanswered(hot=hot)
    if not mistakes and (not isinstance(hot, dict) or len(hot) != 2 or not all(
            isinstance(run, LaunchResult) for run in hot.values())):
        mistakes.append("hot must hold the two launches, without and with warm-up.")
    if not mistakes:
        runs = list(hot.values())
        rates = [_option(run, "--lr") for run in runs]
        if any(rate is None or float(rate) != 0.2 for rate in rates):
            mistakes.append(f"the runs take --lr {', '.join(map(str, rates))}: η = 0.2, scaled "
                            "by the 2 processes to 0.4.")
        if not all("--scale-lr" in map(str, run.command) for run in runs):
            mistakes.append("a run has no --scale-lr: the peak rate must be 0.4 in both.")
        if sum(_option(run, "--warmup-epochs") is not None for run in runs) != 1:
            mistakes.append("one run warms up (--warmup-epochs), the other does not: compare "
                            "the two.")
    _verdict("Exercise 3", mistakes, ["peak rate 0.4, one run with warm-up, one without"])


def flight_recorder(recorded, found) -> None:
    """Lesson 09, exercise 3: the Flight Recorder's dumps of an NCCL hang, where two GPUs are."""
    if torch.cuda.device_count() < 2:
        _verdict("Exercise 3", [], [f"{torch.cuda.device_count()} GPU(s) here: the Flight "
                                    "Recorder is NCCL's, and this exercise needs two GPUs"])
        return
    mistakes = _unanswered(recorded=recorded, found=found)
    if not mistakes and not isinstance(recorded, LaunchResult):
        mistakes.append("recorded must be what ddp_lib.launch returned for section 7's hang.")
    if not mistakes and recorded.ok:
        mistakes.append("recorded succeeded: run case 1's hang with --backend nccl and a short "
                        "--pg-timeout, so that the watchdog fires.")
    if mistakes:
        _verdict("Exercise 3", mistakes, [])
    # The dumps are not judged: some releases abort the rank before they are written.
    _verdict("Exercise 3", mistakes, [
        "the watchdog stopped the hung NCCL collective",
        f"{len(found or [])} dump file(s): each rank writes one, where its release writes them "
        "before aborting (none: set TORCH_NCCL_DUMP_ON_TIMEOUT=1 and "
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE)"])


def old_rule(old_numbers, refusal) -> None:
    """Lesson 10, exercise 3: ``mpiexec -pmi-port`` in a Slurm job, under the old rule and the
    lesson's."""
    mistakes = _unanswered(old_numbers=old_numbers, refusal=refusal)
    if not mistakes:
        if list(old_numbers) == [3, 4, 1, 2]:
            mistakes.append("old_numbers are MPICH's: under -pmi-port PMI_RANK and PMI_SIZE are "
                            "not set, so the old rule passed over MPICH's entry to Slurm's.")
        elif list(old_numbers) != [1, 2, 0, 1]:
            mistakes.append(f"old_numbers is {old_numbers!r}: Slurm's four, those of the "
                            "helper Hydra started on the node.")
        if "-pmi-port" not in str(refusal):
            mistakes.append("refusal is not the lesson's error: it names mpiexec -pmi-port, "
                            "the launch it stops.")
    _verdict("Exercise 3", mistakes, ["the old rule: rank 1 of 2 on every rank of the node",
                                      "the lesson's function stops, naming -pmi-port"])


def zero_ladder(least_n, copy_bytes: float, budget: float = 40 * 2**20) -> None:
    """Lesson 11, exercise 3: from how many processes each stage of the ZeRO ladder stores
    under 40 MiB per rank between steps (``None``: never)."""
    mistakes = _unanswered(least_n=least_n)
    c = copy_bytes
    stored = {"ddp": lambda n: 4 * c, "zero1": lambda n: 2 * c + 2 * c / n,
              "zero2": lambda n: 4 * c / n, "zero3": lambda n: 4 * c / n}
    right = {stage: next((n for n in range(1, 1025) if size(n) <= budget), None)
             for stage, size in stored.items()}
    if not mistakes and (not isinstance(least_n, dict) or set(least_n) != set(right)):
        mistakes.append(f"least_n must have one entry per stage: {', '.join(right)}.")
    if not mistakes:
        for stage in ("ddp", "zero1"):
            if least_n[stage] is not None:
                kept = "4C on every rank" if stage == "ddp" else "weights and gradients whole, 2C"
                mistakes.append(f"least_n[{stage!r}] is {least_n[stage]!r}: {stage} keeps "
                                f"{kept}, {stored[stage](10**9) / 2**20:.0f} MiB or more "
                                "whatever N; None.")
        for stage in ("zero2", "zero3"):
            if least_n[stage] == right[stage] - 1:
                n = least_n[stage]
                mistakes.append(f"least_n[{stage!r}] is {n}: 4C/{n} = "
                                f"{stored[stage](n) / 2**20:.1f} MiB, over 40.")
            elif least_n[stage] != right[stage]:
                mistakes.append(f"least_n[{stage!r}] is {least_n[stage]!r}: weights, gradients "
                                "and AdamW's two moments, all cut in N.")
    _verdict("Exercise 3", mistakes, [f"{stage}: {n or 'never'}" for stage, n in right.items()])


def _changes(original: Path, copy: Path, exercise: str) -> list[tuple[list[str], list[str]]]:
    """Each change from a lesson's script to a learner's copy of it, as the lines it takes out
    and the lines it puts in, stripped; an ``ExerciseNotDone`` if there is no copy yet."""
    if not copy.exists():
        raise ExerciseNotDone(exercise, [f"There is no {copy}: run the cell that writes it "
                                         f"(%%write_script {copy.name}) first."])
    hunks = re.split(r"^@@.*\n", scripts.diff(original, copy, context=0), flags=re.M)[1:]
    return [tuple([line[1:].strip() for line in hunk.splitlines() if line.startswith(sign)]
                  for sign in "-+") for hunk in hunks]


def _code_with(path: Path, text: str) -> list[str]:
    """The lines of ``path`` that hold ``text`` in code (not in a comment after it)."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if text in line.partition("#")[0]]


def copy_without(copy: str | os.PathLike, original: str | os.PathLike, gone: str, *,
                 exercise: str, allowed: tuple[str, ...] = ()) -> None:
    """A homework's first step: a copy of a lesson's script, under a name of its own, without the
    code that holds ``gone`` and with nothing else changed, so that the run after it shows what
    that code alone does. A line with ``gone`` may stay as a comment, the lines of its block go
    with it, lines may take its place, and lines with one of ``allowed`` may be added."""
    copy, original = Path(copy), Path(original)
    changes = _changes(original, copy, exercise)
    mistakes = [f"{copy.name} still has {gone} in `{line}`: take it out."
                for line in _code_with(copy, gone)]
    others = []  # a change that takes out `gone` is the exercise's
    for removed, added in changes:
        added = [line for line in added if not any(text in line for text in allowed)]
        if not any(gone in line for line in removed):
            others += [line for line in removed if line] + added
    if others:
        mistakes.append(f"{copy.name} changes more than the code with {gone} (`{others[0]}`): "
                        f"keep the rest of {original.name} as it is, so that the run compares "
                        "that change alone.")
    _verdict(exercise, mistakes, [f"{copy.name} is {original.name} without its {gone}"])


def copy_adding(copy: str | os.PathLike, original: str | os.PathLike, added: str, *,
                exercise: str) -> None:
    """A homework's first step: a copy of a lesson's script, under a name of its own, with code
    that holds ``added`` and nothing of the original taken out (lines may change)."""
    copy, original = Path(copy), Path(original)
    changes = _changes(original, copy, exercise)
    mistakes = [] if _code_with(copy, added) else [
        f"{copy.name} has no code with {added} yet: add it."]
    taken_out = [removed[0] for removed, put_in in changes if removed and not put_in]
    if taken_out:
        mistakes.append(f"{copy.name} takes out `{taken_out[0]}`: the exercise adds to "
                        f"{original.name}, and keeps what it has.")
    _verdict(exercise, mistakes, [f"{copy.name} is {original.name} with {added}"])

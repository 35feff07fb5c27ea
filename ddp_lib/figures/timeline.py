"""Per-rank timelines of DDP steps, read from the Chrome traces that ``torch.profiler`` writes (one
per rank: ``rank0.json``, ...), to draw (``plots.timelines``) and add up (``step_breakdown``). It
reads ``ProfilerStep#k``, the script's ``forward`` and ``backward``, PyTorch's ``Optimizer.step#``
and ``enumerate(DataLoader)#``, DDP's collectives (``gloo:`` spans, NCCL kernels), gradient
computations (``autograd::engine::evaluate_function``) and ``c10d::`` ops (what was asked for).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

STEP = "step"
COMPUTE = "compute"
COMMUNICATION = "communication"
KINDS = ("data", "forward", "backward", "waiting", "optimizer", "all-reduce", "broadcast",
         "all-gather")


@dataclass(frozen=True)
class Span:
    """One interval of one rank's timeline, in milliseconds from the first recorded step."""

    rank: int
    lane: str  # STEP, COMPUTE (the training loop) or COMMUNICATION (DDP's collectives)
    kind: str  # "step" or one of KINDS
    start: float
    end: float
    step: int  # which recorded step (0, 1, ...) it belongs to

    @property
    def duration(self) -> float:
        return self.end - self.start


def _events(trace: dict) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _compute_kind(name: str) -> str | None:
    if name in ("forward", "backward"):
        return name
    if name.startswith("Optimizer.step#"):
        return "optimizer"
    if name.startswith("enumerate(DataLoader)#"):
        return "data"
    return None


def _communication_kind(event: dict, on_gpu: bool) -> str | None:
    name = event["name"].lower()
    if on_gpu:  # the NCCL kernels on the GPU's communication stream
        if event.get("cat") != "kernel" or "nccl" not in name:
            return None
    elif not name.startswith(("gloo:", "nccl:", "mpi:")):
        return None
    if "allreduce" in name.replace("_", ""):
        return "all-reduce"
    if "broadcast" in name:
        return "broadcast"
    if "allgather" in name.replace("_", ""):
        return "all-gather"
    return None


def read_trace(trace: dict | str | os.PathLike, rank: int) -> tuple[list[Span], float]:
    """One rank's spans, in ms from its first recorded step, and that step's absolute time (µs).
    CPU: backward is split where its last gradient was computed (then it waits). GPU: communication
    is the NCCL kernels, backward the kernels between forward and optimizer (autograd's thread)."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text(encoding="utf-8"))
    events = _events(trace)
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")
                    and e.get("cat") != "gpu_user_annotation"), key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"rank {rank}'s trace has no ProfilerStep: was profiler.step() called "
                         "after every training step, and did the run reach the active steps?")
    on_gpu = any(e.get("cat") == "kernel" for e in events)
    main_thread = steps[0]["tid"]
    origin = steps[0]["ts"]
    bounds = [(s["ts"], s["ts"] + s["dur"]) for s in steps]

    def step_of(ts: float) -> int | None:
        for i, (start, end) in enumerate(bounds):
            if start <= ts < end:
                return i
        return None

    spans = [Span(rank, STEP, STEP, start, end, i) for i, (start, end) in enumerate(bounds)]
    gradients = defaultdict(float)  # CPU: step -> end of its last gradient computation
    kernels = defaultdict(list)  # GPU: step -> its computing kernels
    for e in events:
        step = step_of(e["ts"])
        if step is None or e["name"].startswith("ProfilerStep#"):
            continue
        start, end, category = e["ts"], e["ts"] + e["dur"], e.get("cat")
        kind = _communication_kind(e, on_gpu)
        if kind is not None:
            spans.append(Span(rank, COMMUNICATION, kind, start, end, step))
            continue
        kind = _compute_kind(e["name"])
        on_main = e["tid"] == main_thread and category == "user_annotation"
        if kind == "data" and on_main:
            spans.append(Span(rank, COMPUTE, kind, start, end, step))
        elif on_gpu and category == "kernel":
            kernels[step].append((start, end))
        elif on_gpu and kind in ("forward", "optimizer") and category == "gpu_user_annotation":
            spans.append(Span(rank, COMPUTE, kind, start, end, step))
        elif not on_gpu and kind is not None and on_main:
            spans.append(Span(rank, COMPUTE, kind, start, end, step))
        elif (not on_gpu and e["tid"] == main_thread
              and e["name"].startswith("autograd::engine::evaluate_function")):
            gradients[step] = max(gradients[step], end)
    for step, mine in kernels.items():  # GPU: backward is what runs after forward, before step()
        forward_end = max((s.end for s in spans if s.step == step and s.kind == "forward"),
                          default=None)
        optimizer_start = min((s.start for s in spans
                               if s.step == step and s.kind == "optimizer"), default=math.inf)
        if forward_end is not None:
            spans += [Span(rank, COMPUTE, "backward", start, end, step) for start, end in mine
                      if start >= forward_end and end <= optimizer_start]
    for span in [s for s in spans if s.kind == "backward" and not on_gpu]:
        done = gradients.get(span.step)
        if done is not None and span.start < done < span.end:  # split: computing, then waiting
            spans.remove(span)
            spans.append(Span(rank, COMPUTE, "backward", span.start, done, span.step))
            spans.append(Span(rank, COMPUTE, "waiting", done, span.end, span.step))
    spans = [Span(s.rank, s.lane, s.kind, (s.start - origin) / 1e3, (s.end - origin) / 1e3,
                  s.step) for s in spans]
    return sorted(spans, key=lambda s: (s.lane, s.start)), origin


def _events_and_steps(trace: dict | str | os.PathLike) -> tuple[list[dict], list[tuple]]:
    """A trace's events, and the (start, end) of each recorded ProfilerStep."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text(encoding="utf-8"))
    events = _events(trace)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        raise ValueError("the trace has no ProfilerStep: was profiler.step() called after every "
                         "training step, and did the run reach the active steps?")
    return events, steps


def collective_counts(trace: dict | str | os.PathLike) -> dict[str, float]:
    """How many of each collective one rank ran per recorded step (mean), by name. ``c10d::`` ops
    are what the program asked for; ``gloo:`` spans what Gloo ran, which may differ: torch's Gloo
    has no reduce-scatter and runs an all-reduce for each."""
    events, steps = _events_and_steps(trace)
    counts: dict[str, float] = defaultdict(float)
    for e in events:
        if e["name"].startswith(("c10d::", "gloo:")) and any(
                start <= e["ts"] < end for start, end in steps):
            counts[e["name"]] += 1 / len(steps)
    return dict(sorted(counts.items()))


# Bytes per element of the types that ``record_shapes=True`` writes into a trace
ITEM_BYTES = {"double": 8, "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8,
              "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1}


def collective_bytes(trace: dict | str | os.PathLike) -> dict[str, float]:
    """Bytes per recorded step (mean) of each ``c10d::`` collective's buffer, its largest tensor
    (needs ``record_shapes=True``); a tensor-list op's element type is read from the next backend
    span of that shape. These are bytes asked for: a ring all-reduce sends each about twice."""
    events, steps = _events_and_steps(trace)
    backend = sorted((e for e in events if e["name"].startswith(("gloo:", "nccl:", "mpi:"))),
                     key=lambda e: e["ts"])
    total: dict[str, float] = defaultdict(float)
    for e in events:
        if not e["name"].startswith("c10d::") or not any(
                start <= e["ts"] < end for start, end in steps):
            continue
        args = e.get("args", {})
        if "Input Dims" not in args:
            raise ValueError(f"{e['name']} has no shapes: record the trace with "
                             "torch.profiler.profile(..., record_shapes=True)")
        tensors = []  # (shape, type or None where the trace does not say)
        for dims, kind in zip(args["Input Dims"], args["Input type"], strict=True):
            if kind == "TensorList":
                tensors += [(shape, None) for shape in dims]
            elif kind in ITEM_BYTES:
                tensors.append((dims, kind))
        if not tensors:
            continue
        shape, kind = max(tensors, key=lambda t: math.prod(t[0]))
        if kind is None:
            kind = next((b["args"]["Input type"][0] for b in backend
                         if b["ts"] >= e["ts"] and b.get("args", {}).get("Input Dims") == [shape]),
                        None)
            if kind not in ITEM_BYTES:
                raise ValueError(f"no backend span with the shape {shape} of {e['name']} tells "
                                 "its element type")
        total[e["name"]] += math.prod(shape) * ITEM_BYTES[kind] / len(steps)
    return dict(sorted(total.items()))


def read_traces(directory: str | os.PathLike) -> list[Span]:
    """All ranks' spans from ``directory/rank*.json`` on one clock (aligned within one machine)."""
    paths = sorted(Path(directory).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    if not paths:
        raise FileNotFoundError(f"no rank*.json traces in {directory}")
    per_rank = [read_trace(p, int(p.stem[4:])) for p in paths]
    first = min(origin for _, origin in per_rank)
    shifted = []
    for spans, origin in per_rank:
        offset = (origin - first) / 1e3
        shifted += [Span(s.rank, s.lane, s.kind, s.start + offset, s.end + offset, s.step)
                    for s in spans]
    return shifted


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of (union of a) ∩ (union of b)."""
    both = [(max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if min(e1, e2) > max(s1, s2)]
    return _union_length(both)


def step_breakdown(spans: list[Span]) -> dict[int, dict[str, float]]:
    """Per rank, mean ms per step of every kind of span, plus ``step`` (its duration),
    ``communication`` (any collective running) and ``hidden`` (that part overlapping backward)."""
    by_rank: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        by_rank[s.rank].append(s)
    out = {}
    for rank, mine in sorted(by_rank.items()):
        steps = sorted({s.step for s in mine})
        totals = dict.fromkeys(KINDS, 0.0)
        totals.update(step=0.0, communication=0.0, hidden=0.0)
        for step in steps:
            here = [s for s in mine if s.step == step]
            for s in here:
                totals[s.kind] += s.duration
            comm = [(s.start, s.end) for s in here if s.lane == COMMUNICATION]
            grads = [(s.start, s.end) for s in here if s.kind == "backward"]
            totals["communication"] += _union_length(comm)
            totals["hidden"] += _overlap(comm, grads)
        out[rank] = {k: v / len(steps) for k, v in totals.items()}
    return out


def transfer_ms(spans: list[Span]) -> float:
    """Milliseconds per step the collectives took once every rank had reached them (0 for one rank).
    A rank that arrives first waits for the others, which on a busy machine varies more than the
    bytes; so the k-th collective of a step (DDP runs the same buckets in the same order on every
    rank) counts from its last rank's start to that rank's end. Ranks must share a clock."""
    by_step: dict[int, dict[int, list[Span]]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        if s.lane == COMMUNICATION:
            by_step[s.step][s.rank].append(s)
    ranks = {s.rank for s in spans}
    steps = {s.step for s in spans}
    if len(ranks) < 2 or not steps:
        return 0.0
    total = 0.0
    for step in steps:
        per_rank = [sorted(by_step[step][rank], key=lambda s: s.start) for rank in sorted(ranks)]
        if len({len(mine) for mine in per_rank}) != 1:
            raise ValueError(f"step {step}: the ranks ran different numbers of collectives "
                             f"({[len(mine) for mine in per_rank]}): not one DDP run's traces?")
        last_arrivals = [max(same, key=lambda s: s.start) for same in zip(*per_rank, strict=True)]
        total += _union_length([(s.start, s.end) for s in last_arrivals])
    return total / len(steps)


def first_all_reduce_ms(spans: list[Span]) -> float:
    """Milliseconds from backward's start to its first all-reduce (mean of the steps with one, or
    ``nan``): DDP all-reduces a bucket once its gradients are ready, and the first bucket holds
    backward's first gradients, so the smaller it is, the sooner communication begins."""
    gaps = []
    for rank, step in sorted({(s.rank, s.step) for s in spans}):
        here = [s for s in spans if s.rank == rank and s.step == step]
        backward = min((s.start for s in here if s.kind == "backward"), default=None)
        if backward is None:
            continue
        first = min((s.start for s in here if s.kind == "all-reduce" and s.start >= backward),
                    default=None)
        if first is not None:
            gaps.append(first - backward)
    return sum(gaps) / len(gaps) if gaps else math.nan

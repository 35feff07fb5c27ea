"""Timelines from torch.profiler traces: a hand-made trace with known answers, and a real one."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before init_process_group: see the README
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from ddp_lib.figures import timeline

MAIN, GLOO = 100, 200


def event(name, ts, dur, tid=MAIN, cat="user_annotation"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat}


def one_step(t0):
    """A step of 100 µs: forward 20, backward 60 (gradients done at +70), optimizer 10.

    Two buckets are all-reduced: 40-60 while gradients are still computed (hidden) and 65-85,
    which runs 5 µs past the last gradient and then keeps backward waiting.
    """
    return [
        event("ProfilerStep#7", t0, 100),
        event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, 5),
        event("forward", t0 + 5, 20),
        event("backward", t0 + 25, 60),
        event("autograd::engine::evaluate_function: ConvolutionBackward0", t0 + 30, 40,
              cat="cpu_op"),
        event("gloo:all_reduce", t0 + 40, 20, tid=GLOO),
        event("gloo:all_reduce", t0 + 65, 20, tid=GLOO),
        event("Optimizer.step#SGD.step", t0 + 88, 10),
    ]


def write(path, events):
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")


def test_a_hand_made_trace_gives_its_spans_and_breakdown(tmp_path):
    write(tmp_path / "rank0.json", one_step(1_000) + one_step(1_100))
    write(tmp_path / "rank1.json", one_step(1_010))  # starts 10 µs later: same clock
    spans = timeline.read_traces(tmp_path)
    rank0 = [s for s in spans if s.rank == 0 and s.step == 0]
    kinds = {s.kind: (round(s.start * 1e3), round(s.end * 1e3)) for s in rank0
             if s.kind != "all-reduce"}
    assert kinds == {"step": (0, 100), "data": (0, 5), "forward": (5, 25), "backward": (25, 70),
                     "waiting": (70, 85), "optimizer": (88, 98)}
    assert min(s.start for s in spans if s.rank == 1) == pytest.approx(0.010)
    breakdown = timeline.step_breakdown(spans)
    assert breakdown[0]["step"] == pytest.approx(0.100)
    assert breakdown[0]["communication"] == pytest.approx(0.040)
    assert breakdown[0]["hidden"] == pytest.approx(0.025)  # 40-60 and 65-70
    assert breakdown[1] == pytest.approx(breakdown[0])
    assert timeline.first_all_reduce_ms(spans) == pytest.approx(0.015)  # backward 25, bucket 40
    assert math.isnan(timeline.first_all_reduce_ms([s for s in spans if s.kind != "all-reduce"]))


def test_transfer_leaves_out_the_wait_for_a_late_rank(tmp_path):
    write(tmp_path / "rank0.json", one_step(1_000))
    late = one_step(1_000)  # rank 1 reaches the first all-reduce 15 µs later, the second on time
    late[5] = event("gloo:all_reduce", 1_055, 5, tid=GLOO)
    write(tmp_path / "rank1.json", late)
    spans = timeline.read_traces(tmp_path)
    assert timeline.step_breakdown(spans)[0]["communication"] == pytest.approx(0.040)
    assert timeline.transfer_ms(spans) == pytest.approx(0.005 + 0.020)  # from the last arrival
    assert timeline.transfer_ms([s for s in spans if s.rank == 0]) == 0.0
    write(tmp_path / "rank1.json", late[:5] + late[6:])  # a collective missing on one rank
    with pytest.raises(ValueError, match="different numbers of collectives"):
        timeline.transfer_ms(timeline.read_traces(tmp_path))


def test_on_a_gpu_backward_is_the_kernels_between_forward_and_the_optimizer(tmp_path):
    gpu = {"tid": 7, "pid": 0}
    events = [
        event("ProfilerStep#3", 0, 100),
        event("forward", 5, 20, cat="gpu_user_annotation") | gpu,
        event("backward", 25, 2, cat="gpu_user_annotation") | gpu,  # autograd's thread: tiny
        *(event("sgemm", start, dur, cat="kernel") | gpu
          for start, dur in ((10, 10), (30, 10), (45, 15), (62, 8), (82, 6))),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 50, 25, tid=9,
              cat="kernel"),
        event("Optimizer.step#SGD.step", 80, 10, cat="gpu_user_annotation") | gpu,
    ]
    write(tmp_path / "rank0.json", events)
    spans = timeline.read_traces(tmp_path)
    backward = [(round(s.start * 1e3), round(s.end * 1e3)) for s in spans if s.kind == "backward"]
    assert backward == [(30, 40), (45, 60), (62, 70)]  # not forward's, not the optimizer's
    assert [s.kind for s in spans if s.lane == timeline.COMMUNICATION] == ["all-reduce"]
    breakdown = timeline.step_breakdown(spans)[0]
    assert breakdown["communication"] == pytest.approx(0.025)
    assert breakdown["hidden"] == pytest.approx(0.018)  # 50-60 and 62-70 overlap kernels


def test_collectives_are_counted_per_step_as_asked_and_as_run(tmp_path):
    # Two steps of an FSDP-like trace: each asks for 2 all-gathers and 1 reduce-scatter, which
    # Gloo runs as an all-reduce; one collective before the first step is not counted.
    events = [event("c10d::allreduce_", 0, 5, cat="cpu_op")]
    for t0 in (100, 300):
        events += [event("ProfilerStep#3", t0, 100),
                   event("c10d::_allgather_base_", t0 + 10, 5, cat="cpu_op"),
                   event("gloo:all_gather", t0 + 11, 5, tid=GLOO),
                   event("c10d::_allgather_base_", t0 + 40, 5, cat="cpu_op"),
                   event("gloo:all_gather", t0 + 41, 5, tid=GLOO),
                   event("c10d::_reduce_scatter_base_", t0 + 70, 5, cat="cpu_op"),
                   event("gloo:all_reduce", t0 + 71, 5, tid=GLOO)]
    write(tmp_path / "rank0.json", events)
    assert timeline.collective_counts(tmp_path / "rank0.json") == {
        "c10d::_allgather_base_": 2, "c10d::_reduce_scatter_base_": 1, "gloo:all_gather": 2,
        "gloo:all_reduce": 1}
    spans = timeline.read_traces(tmp_path)
    assert [s.kind for s in spans if s.step == 0 and s.lane == timeline.COMMUNICATION] == [
        "all-gather", "all-gather", "all-reduce"]
    write(tmp_path / "rank0.json", [event("forward", 0, 10)])
    with pytest.raises(ValueError, match="profiler.step"):
        timeline.collective_counts(tmp_path / "rank0.json")


def test_collective_bytes_are_each_buffer_as_the_trace_records_it(tmp_path):
    # Per step: an all-gather of 2 x 100 fp32 elements (output 200), a bf16 reduce-scatter of
    # 200 elements (input), and an all-reduce of a list of one tensor, whose type is the one of
    # the Gloo span with its shape that follows it (not the earlier one with another shape).
    def shapes(dims, types):
        return {"Input Dims": dims, "Input type": types}

    events = []
    for t0 in (100, 300):
        events += [
            event("ProfilerStep#3", t0, 100),
            event("c10d::_allgather_base_", t0 + 10, 5, cat="cpu_op")
            | {"args": shapes([[200], [100], [], []], ["float", "float", "", "Scalar"])},
            event("c10d::_reduce_scatter_base_", t0 + 20, 5, cat="cpu_op")
            | {"args": shapes([[100], [200], [], []],
                              ["c10::BFloat16", "c10::BFloat16", "", "Scalar"])},
            event("gloo:all_reduce", t0 + 25, 5, tid=GLOO)
            | {"args": shapes([[50]], ["c10::Half"])},
            event("c10d::allreduce_", t0 + 30, 5, cat="cpu_op")
            | {"args": shapes([[[300]], [], []], ["TensorList", "", "Scalar"])},
            event("gloo:all_reduce", t0 + 31, 5, tid=GLOO)
            | {"args": shapes([[300]], ["double"])},
        ]
    write(tmp_path / "rank0.json", events)
    assert timeline.collective_bytes(tmp_path / "rank0.json") == {
        "c10d::_allgather_base_": 800, "c10d::_reduce_scatter_base_": 400,
        "c10d::allreduce_": 2400}
    write(tmp_path / "rank0.json", [e for e in events if e["name"] != "gloo:all_reduce"])
    with pytest.raises(ValueError, match="element type"):
        timeline.collective_bytes(tmp_path / "rank0.json")
    write(tmp_path / "rank0.json", [event("ProfilerStep#3", 0, 100),
                                    event("c10d::allreduce_", 10, 5, cat="cpu_op")])
    with pytest.raises(ValueError, match="record_shapes=True"):
        timeline.collective_bytes(tmp_path / "rank0.json")


def test_a_trace_without_steps_says_what_to_check(tmp_path):
    write(tmp_path / "rank0.json", [event("forward", 0, 10)])
    with pytest.raises(ValueError, match="profiler.step"):
        timeline.read_traces(tmp_path)
    with pytest.raises(FileNotFoundError):
        timeline.read_traces(tmp_path / "missing")


def test_a_real_ddp_trace_shows_forward_backward_and_one_all_reduce_per_bucket(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        layers = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(),
                                     torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                     torch.nn.Linear(256, 2))
        model = DDP(layers, bucket_cap_mb=0.2)  # 330 KB of gradients: several buckets
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
        trace = tmp_path / "traces" / "rank0.json"
        trace.parent.mkdir()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as profiler:
            for _ in range(4):
                with record_function("forward"):
                    loss = F.cross_entropy(model(x), y)
                with record_function("backward"):
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                profiler.step()
        # The buckets DDP rebuilt as the second step began (its log has them from the third on)
        buckets = model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")
    finally:
        time.sleep(0.2)  # torch 2.4-2.7 can hang in destroy: pytorch/pytorch#154976
        dist.destroy_process_group()
    spans = timeline.read_traces(trace.parent)
    assert len(buckets) >= 2
    for step in (0, 1):
        kinds = [s.kind for s in spans if s.step == step]
        assert {"step", "forward", "backward", "optimizer"} <= set(kinds)
        assert kinds.count("all-reduce") == len(buckets), "one all-reduce per bucket"
    assert all(s.lane == timeline.COMMUNICATION for s in spans if s.kind == "all-reduce")
    assert timeline.step_breakdown(spans)[0]["communication"] > 0
    gradient_bytes = sum(p.nbytes for p in layers.parameters())
    assert timeline.collective_bytes(trace) == {"c10d::allreduce_": gradient_bytes}

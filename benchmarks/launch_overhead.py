"""Launch overhead: what starting a trivial distributed job costs, by three launchers.

The job (``workers/trivial_allreduce.py``: init, one all-reduce, destroy) does almost nothing,
so its cost is the launcher's plus Python's and ``import torch``'s in every process. Variants,
interleaved in every round:

* ``import torch``: one ``python -c "import torch"``, the floor every process pays;
* ``torchrun``: plain ``torchrun --standalone``, as a user types it;
* ``ddp_lib.launch``: the notebooks' launcher, called from this process as a notebook cell
  calls it (output collected and echoed into a buffer, metrics file, process watcher);
* ``ddp_lib.launch stream=False``: the same without echoing, to see what streaming costs
  (for the larger process count only, to keep the run short);
* ``ddp_lib's torchrun command``: the exact command ``ddp_lib.launch`` builds, run as a plain
  subprocess: the difference to ``torchrun`` is the cost of its flags (``--tee``, log folder,
  rendezvous on 127.0.0.1), the difference to ``ddp_lib.launch`` the Python around it;
* ``mp.spawn``: ``torch.multiprocessing.spawn`` from a fresh Python process.

Each is measured in wall time and in CPU time (this process and every child it waited for): on
a shared machine the wall time follows the neighbours' load, the CPU time follows the work.
``launching process CPU`` is what ``ddp_lib.launch`` itself spent in the calling process
(reader threads, process-tree polling), the overhead a notebook kernel pays.
"""

from __future__ import annotations

import contextlib
import io
import resource
import sys

from benchmarks.common import (
    Cost,
    Table,
    bench_env,
    build_dir,
    interleaved,
    measured,
    median,
    run_command,
    worker,
)

GOAL = 1.05  # ddp_lib.launch / torchrun, wall time
LAUNCHERS = ("torchrun", "ddp_lib.launch", "ddp_lib.launch stream=False",
             "ddp_lib's torchrun command", "mp.spawn")


def run(quick: bool = False) -> Table:
    import ddp_lib

    repeats = 3 if quick else 4
    nprocs = (2,) if quick else (1, 2)
    script = worker("trivial_allreduce.py")
    runs = build_dir("launch_overhead")
    env = bench_env()
    own_cpu: dict[int, list[float]] = {n: [] for n in nprocs}

    def torchrun(n: int) -> Cost:
        return run_command([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={n}", str(script)], env=env)

    def via_launch(n: int, stream: bool) -> Cost:
        costs: list[Cost] = []
        sink = io.StringIO()  # echoing is part of the cost; the lines are not part of the table
        before = resource.getrusage(resource.RUSAGE_SELF)
        with measured(costs), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            ddp_lib.launch(script, nproc_per_node=n, run_dir=runs / f"launch-{n}", stream=stream)
        after = resource.getrusage(resource.RUSAGE_SELF)
        if stream:
            own_cpu[n].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return costs[0]

    commands = {n: ddp_lib.launch(script, nproc_per_node=n, run_dir=runs / f"command-{n}",
                                  stream=False).command for n in nprocs}

    variants = {("import torch", 1): lambda: run_command([sys.executable, "-c", "import torch"],
                                                         env=env)}
    for n in nprocs:
        variants[("torchrun", n)] = lambda n=n: torchrun(n)
        variants[("ddp_lib.launch", n)] = lambda n=n: via_launch(n, stream=True)
        if n == max(nprocs):
            variants[("ddp_lib.launch stream=False", n)] = lambda n=n: via_launch(n, False)
        variants[("ddp_lib's torchrun command", n)] = lambda n=n: run_command(commands[n],
                                                                              env=env)
        variants[("mp.spawn", n)] = lambda n=n: run_command(
            [sys.executable, str(worker("spawn_allreduce.py")), str(n)], env=env)
    costs = interleaved(variants, repeats)

    import_torch = costs[("import torch", 1)]
    rows = [["import torch", "1", f"{median([c.wall for c in import_torch]):.2f}", "",
             f"{median([c.cpu for c in import_torch]):.2f}", ""]]
    notes, ratios = [], {}
    for n in nprocs:
        base = costs[("torchrun", n)]
        for name in LAUNCHERS:
            if (name, n) not in costs:
                continue
            own = costs[(name, n)]
            # ratio per round, then the median: the load of one round cancels out
            wall_x = median([a.wall / b.wall for a, b in zip(own, base, strict=True)])
            cpu_x = median([a.cpu / b.cpu for a, b in zip(own, base, strict=True)])
            ratios[f"{name} [{n}]"] = {"wall": wall_x, "cpu": cpu_x}
            rows.append([name, str(n), f"{median([c.wall for c in own]):.2f}", f"{wall_x:.2f}",
                         f"{median([c.cpu for c in own]):.2f}", f"{cpu_x:.2f}"])
        rows.append(["ddp_lib.launch: launching process CPU", str(n), "",
                     "", f"{median(own_cpu[n]):.2f}", ""])
        wall_x = ratios[f"ddp_lib.launch [{n}]"]["wall"]
        verdict = "meets" if wall_x <= GOAL else "MISSES"
        notes.append(f"{n} process(es): ddp_lib.launch / torchrun = {wall_x:.2f} wall, "
                     f"{ratios[f'ddp_lib.launch [{n}]']['cpu']:.2f} CPU "
                     f"({verdict} the goal <= {GOAL} on wall time)")
    return Table(
        title=f"Launch overhead of a trivial job (median of {repeats} interleaved rounds)",
        headers=["launcher", "processes", "wall s", "wall x torchrun", "CPU s", "CPU x torchrun"],
        rows=rows, notes=notes,
        data={"repeats": repeats, "ratios": ratios, "launching_process_cpu_s": own_cpu,
              "costs": {f"{k[0]} [{k[1]}]": [vars(c) for c in v] for k, v in costs.items()}},
    )

"""The lessons' figures: a few matplotlib helpers, so that notebook cells stay about the lesson.

Each helper draws with pyplot (so the figure appears under the cell) and returns the Figure, which
a notebook assigns (``fig = ...``) rather than leaving as the cell's value, to show it once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def image_grid(images: np.ndarray, labels: Sequence[str], ncols: int = 8,
               title: str | None = None) -> Figure:
    """Images (N, 32, 32, 3) uint8 with their labels, in a grid."""
    n = len(images)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.3 * ncols, 1.5 * nrows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, label in zip(axes.flat, images, labels, strict=False):
        ax.imshow(image)
        ax.set_title(label, fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def bar_chart(values: Mapping[str, float], *, ylabel: str, title: str | None = None,
              annotate: str = "{:.2f}") -> Figure:
    """One bar per entry, each labelled with its value."""
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(values), 3.2))
    bars = ax.bar(list(values), list(values.values()), color="tab:blue")
    ax.bar_label(bars, labels=[annotate.format(v) for v in values.values()])
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def bar_panels(rows: Mapping[str, Mapping[str, float]], panels: Mapping[str, tuple[str, str]],
               *, colours: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """Runs side by side, one panel per measure: ``panels`` maps a key of each row to the panel's
    title and the format of its bar labels (``"%.3f"``)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    labels = list(rows)
    for ax, (key, (panel_title, fmt)) in zip(axes.flat, panels.items(), strict=True):
        bars = ax.bar(labels, [rows[label][key] for label in labels], color=colours)
        ax.bar_label(bars, fmt=fmt)
        ax.set_title(panel_title, fontsize=10)
        ax.margins(y=0.15)
        ax.tick_params(axis="x", labelsize=8)
    if title:
        fig.suptitle(title, fontsize=9, wrap=True)
    fig.tight_layout()
    return fig


def curves(series: Mapping[str, Sequence[tuple[float, float]]], *, xlabel: str, ylabel: str,
           title: str | None = None) -> Figure:
    """One line per entry, each a sequence of ``(x, y)`` points."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, points in series.items():
        xs, ys = zip(*points, strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o" if len(points) < 30 else None, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def data_parallel_step(n_devices: int = 2) -> Figure:
    """One training step of ``nn.DataParallel`` over ``n_devices``: who does what, where.

    Columns are the stages of the step, rows the devices; arrows show what moves between
    devices (everything passes through device 0).
    """
    stages = ["1. scatter\nbatch", "2. replicate\nmodel", "3. forward\n(one thread each)",
              "4. gather\noutputs, loss", "5. backward:\ngrads summed"]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * n_devices))
    ax.set_xlim(-0.6, len(stages) - 0.4)
    ax.set_ylim(n_devices - 0.4, -1.1)
    ax.axis("off")
    for x, name in enumerate(stages):
        ax.text(x, -0.85, name, ha="center", va="center", fontsize=9, fontweight="bold")
    cells = {
        0: lambda d: f"batch[{d}/{n_devices}]",
        1: lambda d: "model" if d == 0 else "replica",
        2: lambda d: f"out[{d}]",
        3: lambda d: "cat(out)\nloss" if d == 0 else None,
        4: lambda d: "grads of\nall replicas" if d == 0 else "grads",
    }
    for x, label in cells.items():
        for d in range(n_devices):
            text = label(d)
            if text is None:
                continue
            colour = "tab:orange" if d == 0 else "tab:blue"
            ax.text(x, d, text, ha="center", va="center", fontsize=8,
                    bbox={"boxstyle": "round", "facecolor": colour, "alpha": 0.25})
    arrow = {"arrowstyle": "->", "color": "0.35"}
    for d in range(1, n_devices):
        for x in (0, 1):  # device 0 sends each device its slice and a copy of the model
            ax.annotate("", xy=(x + 0.15, d - 0.2), xytext=(x - 0.15, 0.2), arrowprops=arrow)
        ax.annotate("", xy=(3 - 0.3, 0.2), xytext=(2 + 0.3, d - 0.2), arrowprops=arrow)
        ax.annotate("", xy=(4 - 0.3, 0.2), xytext=(4 - 0.3, d - 0.2),
                    arrowprops={**arrow, "connectionstyle": "arc3,rad=-0.3"})
    for d in range(n_devices):
        ax.text(-0.55, d, f"cuda:{d}", ha="left", va="center", fontsize=9)
    ax.set_title(f"nn.DataParallel, one step on {n_devices} devices: every arrow goes "
                 "through device 0, every step", fontsize=10)
    fig.tight_layout()
    return fig


def draw_ring_step(ax, world_size: int, step: int, *, detail: bool = False) -> None:
    """Draw what every rank holds after ``step`` steps of a ring all-reduce (0: the start).

    Rows are ranks, columns chunks. A cell's shade grows with the number of ranks summed into
    it; "Σ" marks a fully reduced chunk. Orange edges: the chunk each rank sent in this step;
    green: the chunk it received (added in the scatter-reduce, copied in the all-gather).
    """
    from ddp_lib import ring

    n = world_size
    steps = ring.schedule(n)
    state = ring.simulate(n)[step]
    cmap = plt.get_cmap("Blues")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=7)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    done = steps[step - 1] if step > 0 else None
    for r in range(n):
        for c in range(n):
            held = state[r][c]
            share = len(held) / n
            edge, width = "white", 1.0
            if done is not None and done.send[r] == c:
                edge, width = "tab:orange", 3.0
            if done is not None and done.recv[r] == c:
                edge, width = "tab:green", 3.0
            ax.add_patch(plt.Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, facecolor=cmap(
                0.15 + 0.75 * share), edgecolor=edge, linewidth=width))
            if len(held) == n:
                label = "Σ"
            elif n <= 4 or len(held) == 1:
                label = "+".join(str(i) for i in sorted(held))
            else:
                label = f"{len(held)}/{n}"
            ax.text(c, r, label, ha="center", va="center", fontsize=8 if n <= 4 else 6,
                    color="white" if share > 0.6 else "black")
    if done is None:
        title = "start: each rank has its own"
    else:
        title = f"step {step}/{len(steps)}: {done.phase}"
    ax.set_title(title, fontsize=8)
    if detail and done is not None:
        lines = [f"rank {r} → rank {ring.right(r, n)}: c{done.send[r]}" for r in range(n)]
        ax.text(n - 0.3, -0.45, "\n".join(lines), ha="left", va="top", fontsize=7,
                family="monospace")


def ring_steps(world_size: int = 4, ncols: int = 4) -> Figure:
    """Small multiples: the start and every step of a ring all-reduce over ``world_size`` ranks."""
    n_panels = 2 * (world_size - 1) + 1
    nrows = -(-n_panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.4 * ncols, 2.4 * nrows), squeeze=False)
    for ax in axes.flat[n_panels:]:
        ax.axis("off")
    for step, ax in enumerate(axes.flat[:n_panels]):
        draw_ring_step(ax, world_size, step)
    fig.suptitle(f"Ring all-reduce over {world_size} ranks. Cell text: whose chunks are summed "
                 "in (Σ = all); orange edge: sent right, green: received from the left",
                 fontsize=9)
    fig.tight_layout()
    return fig


def ring_widget(world_size: int = 4, max_world_size: int = 8):
    """An interactive stepper: sliders (and a play button) for N ranks and the step.

    Returns the ipywidgets box; displaying it in a notebook shows the controls and the figure.
    """
    import ipywidgets as widgets
    from IPython.display import display

    ranks = widgets.IntSlider(value=world_size, min=2, max=max_world_size, description="ranks N")
    step = widgets.IntSlider(value=0, min=0, max=2 * (world_size - 1), description="step")
    play = widgets.Play(value=0, min=0, max=step.max, interval=1200, description="play")
    widgets.jslink((play, "value"), (step, "value"))
    out = widgets.Output()

    def redraw(_=None) -> None:
        last = 2 * (ranks.value - 1)
        step.max = play.max = last
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(4.2 + 0.35 * ranks.value, 0.9 + 0.45 * ranks.value))
            draw_ring_step(ax, ranks.value, min(step.value, last), detail=True)
            fig.tight_layout()
            display(fig)
            plt.close(fig)

    ranks.observe(redraw, names="value")
    step.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([ranks, play, step]), out])


def step_bars(steps: Mapping[str, Mapping[str, float]], kinds: Sequence[str], *,
              xlabel: str = "ms per step") -> Figure:
    """One horizontal bar per run (top to bottom), split into ``kinds`` in the timelines' colours.

    ``steps`` maps a run's name to its milliseconds per step of each kind.
    """
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.5 * len(steps)))
    left = np.zeros(len(steps))
    for kind in kinds:
        widths = np.array([parts[kind] for parts in steps.values()])
        ax.barh(list(steps), widths, left=left, label=kind, color=TIMELINE_COLOURS[kind],
                edgecolor="black", linewidth=0.3)
        left += widths
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(ncol=len(kinds), fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    fig.tight_layout()
    return fig


def scaling(measured: Mapping[int, float], models: Mapping[str, Callable[[int], float]], *,
            up_to: int, title: str | None = None) -> Figure:
    """Speed-up (left) and efficiency, speed-up ÷ N (right), against the number of processes N.

    ``measured`` maps N to a measured speed-up (dots); each of ``models`` is a curve, a function
    of N drawn from 1 to ``up_to``; the dotted line is the ideal.
    """
    grid = list(range(1, up_to + 1))  # plain ints: a model may check that N is one
    counts = sorted(measured)
    fig, (speed, efficiency) = plt.subplots(1, 2, figsize=(11, 3.6))
    speed.plot(grid, grid, "k:", label="ideal")
    efficiency.axhline(1.0, color="k", linestyle=":", label="ideal")
    for (name, model), style in zip(models.items(), ["-", "--", "-."], strict=False):
        values = np.array([model(n) for n in grid])
        speed.plot(grid, values, style, label=name)
        efficiency.plot(grid, values / np.array(grid), style, label=name)
    speed.plot(counts, [measured[n] for n in counts], "o", color="black", label="measured")
    efficiency.plot(counts, [measured[n] / n for n in counts], "o", color="black",
                    label="measured")
    speed.set_ylabel("speed-up (images/s ÷ one process's)")
    efficiency.set_ylabel("efficiency (speed-up ÷ N)")
    efficiency.set_ylim(0, 1.1)
    for ax in (speed, efficiency):
        ax.set_xlabel("processes N")
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


TIMELINE_COLOURS = {"data": "0.6", "forward": "tab:blue", "backward": "tab:orange",
                    "waiting": "mistyrose", "optimizer": "tab:green", "all-reduce": "tab:red",
                    "broadcast": "tab:purple"}


def timelines(panels: Mapping[str, Sequence], *, title: str | None = None) -> Figure:
    """Gantt charts of DDP steps: one panel per run, two rows per rank (compute, communication).

    ``panels`` maps a run's name to its spans (``ddp_lib.timeline.Span``, from ``read_traces``).
    Dotted lines mark the steps; bars overlapping in time on a rank's two rows are communication
    hidden behind computation.
    """
    from matplotlib.patches import Patch

    from ddp_lib.timeline import COMMUNICATION, COMPUTE, STEP

    ranks_per_panel = [sorted({s.rank for s in spans}) for spans in panels.values()]
    heights = [0.6 + 0.55 * 2 * len(ranks) for ranks in ranks_per_panel]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 0.6 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (name, spans), ranks in zip(axes[:, 0], panels.items(), ranks_per_panel, strict=True):
        rows = [(rank, lane) for rank in ranks for lane in (COMPUTE, COMMUNICATION)]
        for y, (rank, lane) in enumerate(rows):
            for kind, colour in TIMELINE_COLOURS.items():
                bars = [(s.start, s.duration) for s in spans
                        if s.rank == rank and s.lane == lane and s.kind == kind]
                if bars:
                    ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=colour,
                                   edgecolors="black", linewidth=0.3)
        for s in spans:
            if s.lane == STEP and s.rank == ranks[0]:
                ax.axvline(s.start, color="0.4", linestyle=":", linewidth=0.8)
        ax.set_yticks(range(len(rows)),
                      [f"rank {rank} {'compute' if lane == COMPUTE else 'comm.'}"
                       for rank, lane in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("ms")
    handles = [Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=k)
               for k, c in TIMELINE_COLOURS.items()]
    top = 0.97 if title else 1.0
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, top), frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, y=1.0)
    fig.tight_layout(rect=(0, 0, 1, top - 0.04))
    return fig

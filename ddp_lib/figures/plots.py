"""Charts of the lessons' data and measurements (mechanisms are drawn in ``diagrams``). Each helper
draws with pyplot and returns the Figure, which a notebook assigns (``fig = ...``) to show once.
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


def step_bars(steps: Mapping[str, Mapping[str, float]], kinds: Sequence[str], *,
              xlabel: str = "ms per step") -> Figure:
    """One horizontal bar per run, top to bottom: ``steps`` maps a run's name to its ms per step of
    each of ``kinds``, stacked in the timelines' colours."""
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
    """Speed-up (left) and efficiency, speed-up ÷ N (right), against the number of processes N:
    ``measured`` (N -> speed-up) as dots, each of ``models`` as a curve from 1 to ``up_to``."""
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
    efficiency.plot(counts, [measured[n] / n for n in counts], "o", color="black", label="measured")
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
                    "broadcast": "tab:purple", "all-gather": "tab:cyan"}


def timelines(panels: Mapping[str, Sequence], *, title: str | None = None) -> Figure:
    """Gantt charts of DDP steps, one panel per run (name -> its ``read_traces`` spans), two rows
    per rank; bars overlapping on a rank's two rows are communication hidden behind computation."""
    from matplotlib.patches import Patch

    from ddp_lib.figures.timeline import COMMUNICATION, COMPUTE, STEP

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

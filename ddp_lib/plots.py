"""The lessons' figures: a few matplotlib helpers, so that notebook cells stay about the lesson.

Each helper draws with pyplot (so the figure appears under the cell) and returns the Figure, which
a notebook assigns (``fig = ...``) rather than leaving as the cell's value, to show it once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

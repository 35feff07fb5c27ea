"""Diagrams of mechanisms, drawn from their rules rather than measured: ``nn.DataParallel``'s step
(lesson 02) and the ring all-reduce (lesson 03). Each helper returns the Figure, as in ``plots``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ddp_lib.figures import ring


def data_parallel_step(n_devices: int = 2) -> Figure:
    """One ``nn.DataParallel`` step over ``n_devices``: stages in columns, devices in rows, arrows
    for what moves between devices (everything passes through device 0)."""
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
    Rows are ranks, columns chunks; the shade grows with the ranks summed in ("Σ": all). Orange
    edge: the chunk each rank sent in this step; green: the one it received (added, or copied)."""
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
    """An interactive stepper (sliders and a play button for N and the step): an ipywidgets box."""
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

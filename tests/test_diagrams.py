"""The diagrams follow the mechanisms' rules: DataParallel's step, the ring all-reduce."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from ddp_lib.figures import diagrams, ring  # noqa: E402


def test_data_parallel_step_shows_one_row_per_device():
    fig = diagrams.data_parallel_step(3)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t.startswith("cuda:")] == ["cuda:0", "cuda:1", "cuda:2"]
    assert sum(t.startswith("batch[") for t in texts) == 3


def test_ring_steps_draws_the_start_and_every_step():
    fig = diagrams.ring_steps(4, ncols=4)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 7 and titles[0].startswith("start")
    assert titles[-1] == "step 6/6: all-gather"
    last = fig.axes[6]
    assert [t.get_text() for t in last.texts] == ["Σ"] * 16
    first = fig.axes[0]
    assert [t.get_text() for t in first.texts] == [str(r) for r in range(4) for _ in range(4)]


def test_ring_step_edges_mark_what_was_sent_and_received():
    fig, ax = plt.subplots()
    diagrams.draw_ring_step(ax, 3, 1)
    step = ring.schedule(3)[0]
    edges = {}
    for patch in ax.patches:
        x, y = patch.get_xy()
        edges[(round(y + 0.45), round(x + 0.45))] = patch.get_edgecolor()
    orange = matplotlib.colors.to_rgba("tab:orange")
    green = matplotlib.colors.to_rgba("tab:green")
    for r in range(3):
        assert edges[(r, step.send[r])] == orange
        assert edges[(r, step.recv[r])] == green
    plt.close(fig)


def test_ring_widget_follows_the_number_of_ranks():
    box = diagrams.ring_widget(4)
    ranks, play, step = box.children[0].children
    assert step.max == play.max == 6
    ranks.value = 8
    assert step.max == play.max == 14
    step.value = 14
    ranks.value = 2
    assert step.max == 2

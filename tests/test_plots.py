"""The figure helpers draw what they are given."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from ddp_lib import plots  # noqa: E402


def test_image_grid_has_one_titled_panel_per_image():
    images = np.zeros((10, 32, 32, 3), dtype=np.uint8)
    fig = plots.image_grid(images, [f"c{i}" for i in range(10)], ncols=4)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titled == [f"c{i}" for i in range(10)] and len(fig.axes) == 12


def test_bar_chart_labels_every_bar_with_its_value():
    fig = plots.bar_chart({"a": 1.0, "b": 2.5}, ylabel="s", annotate="{:.1f}")
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == [1.0, 2.5]
    assert [t.get_text() for t in ax.texts] == ["1.0", "2.5"]


def test_curves_draws_one_line_per_series():
    fig = plots.curves({"x": [(0, 1.0), (1, 0.5)], "y": [(0, 2.0)]}, xlabel="step", ylabel="loss")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["x", "y"]
    assert list(lines[0].get_ydata()) == [1.0, 0.5]

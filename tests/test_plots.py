"""The figure helpers draw what they are given."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from ddp_lib.figures import plots, ring  # noqa: E402


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


def test_bar_panels_draw_one_panel_per_measure_with_every_run():
    rows = {"fp32": {"speed": 10.0, "accuracy": 0.5}, "bf16": {"speed": 12.0, "accuracy": 0.25}}
    fig = plots.bar_panels(rows, {"speed": ("images/s", "%.0f"), "accuracy": ("acc", "%.2f")})
    assert [ax.get_title() for ax in fig.axes] == ["images/s", "acc"]
    assert [p.get_height() for p in fig.axes[1].patches] == [0.5, 0.25]
    assert [t.get_text() for t in fig.axes[0].texts] == ["10", "12"]


def test_curves_draws_one_line_per_series():
    fig = plots.curves({"x": [(0, 1.0), (1, 0.5)], "y": [(0, 2.0)]}, xlabel="step", ylabel="loss")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["x", "y"]
    assert list(lines[0].get_ydata()) == [1.0, 0.5]


def test_timelines_draw_two_rows_per_rank_and_a_bar_per_span():
    from ddp_lib.figures.timeline import COMMUNICATION, COMPUTE, STEP, Span

    spans = [Span(r, lane, kind, start, end, 0) for r in (0, 1) for lane, kind, start, end in (
        (STEP, "step", 0, 10), (COMPUTE, "forward", 0, 3), (COMPUTE, "backward", 3, 8),
        (COMMUNICATION, "all-reduce", 5, 7), (COMMUNICATION, "all-reduce", 7.5, 9))]
    fig = plots.timelines({"a": spans, "b": [s for s in spans if s.rank == 0]})
    first, second = fig.axes
    assert [t.get_text() for t in first.get_yticklabels()] == [
        "rank 0 compute", "rank 0 comm.", "rank 1 compute", "rank 1 comm."]
    assert len(second.get_yticklabels()) == 2
    bars = [bar for collection in first.collections for bar in collection.get_paths()]
    assert len(bars) == 8  # forward, backward and two all-reduces on each rank
    assert first.get_title() == "a"


def test_step_bars_stack_the_kinds_of_each_run_in_order():
    fig = plots.step_bars({"N = 1": {"forward": 2.0, "backward": 3.0},
                           "N = 2": {"forward": 2.5, "backward": 4.0}}, ["forward", "backward"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["N = 1", "N = 2"]
    ends = sorted(round(bar.get_x() + bar.get_width(), 6) for bar in ax.patches)
    assert ends == [2.0, 2.5, 5.0, 6.5]  # backward starts where forward ends
    assert ax.yaxis_inverted()  # the first run on top


def test_scaling_draws_speed_up_and_efficiency_of_each_model_and_the_measurements():
    fig = plots.scaling({1: 1.0, 2: 1.6}, {"weak": lambda n: 0.9 * n}, up_to=8, title="t")
    speed, efficiency = fig.axes
    lines = {line.get_label(): line for line in efficiency.get_lines()}
    assert set(lines) == {"ideal", "weak", "measured"}
    assert np.allclose(lines["weak"].get_ydata(), 0.9)
    assert np.allclose(lines["measured"].get_ydata(), [1.0, 0.8])
    assert len(speed.get_lines()[0].get_xdata()) == 8


def test_scaling_passes_plain_ints_to_the_models():
    fig = plots.scaling({1: 1.0}, {"ring": lambda n: 1 + 0 * ring.bytes_sent_ring(n, 1.0)}, up_to=3)
    assert len(fig.axes[0].get_lines()) == 3

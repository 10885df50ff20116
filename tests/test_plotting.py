"""The figures a newcomer reads at a glance: no panel with more than :data:`approxlab.plotting.MAX_LINES` method
lines, no colour twice in a panel, no "(exact)" on an approximation, one name for the budget on every axis of it,
the main Figure 1 on its own y-limits, and a per-depth view of pass-key retrieval."""

from __future__ import annotations

import types

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from approxlab import plotting
from approxlab.methods import available, get
from approxlab.studies.perplexity import figures as perplexity_figures
from approxlab.studies.perplexity import long_report

BUDGETS = [16, 32, 64, 128, 256]


@pytest.fixture
def captured(monkeypatch):
    """The figures a study draws, kept open instead of written (``plotting.save_figure`` replaced)."""
    kept = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kwargs: kept.append(fig) or [])
    yield kept
    for fig in kept:
        plt.close(fig)


def _check_panels(fig):
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        lines = plotting.panel_lines(ax)
        labels = {str(line.get_label()) for line in lines}
        assert len(labels) <= plotting.MAX_LINES, (ax.get_title(), sorted(labels))
        colours = {}
        for line in lines:
            colour = line.get_color() if hasattr(line, "get_color") and not hasattr(line, "get_offsets") \
                else tuple(np.round(line.get_facecolor()[0], 3))
            colours.setdefault(str(colour), set()).add(str(line.get_label()))
        assert all(len(names) == 1 for names in colours.values()), (ax.get_title(), colours)


def _decoder_methods():
    return [m for m in available() if get(m).causal in (True, "only", "mask-renormalise") and m != "exact"]


def _delta_table(methods, settings=(("whole", "layer 0"), ("whole", "all"), ("kv-cache", "all"))):
    rows = []
    for setting, layers in settings:
        for index, method in enumerate(["exact", *methods]):
            for d in BUDGETS:
                value = 1e-3 * (index + 1) / d
                rows.append({"setting": setting, "layers": layers, "method": method, "num_features": d,
                             "delta": value, "delta_low": value / 2, "delta_high": value * 2,
                             "spectral_median": 0.1 * (index + 1) / d, "frobenius_median": 0.1,
                             "worst_query_median": 0.2, "windows": 3, "failures": 0})
    return pd.DataFrame(rows)


def _saved(methods, tmp_path, **tables):
    config = {"control": "exact", "methods": methods, "num_features": BUDGETS, "windows": 3, "n": 512,
              "context": 384, "continuation": 128, "checkpoint": "tiny", "long_n": [96]}
    frames = {"delta.csv": _delta_table(methods), **tables}
    return types.SimpleNamespace(config=config, out=tmp_path, product=lambda name: frames[name],
                                 table=lambda name: frames[name])


def test_the_perplexity_curves_have_at_most_ten_lines_and_no_colour_twice_in_a_panel(captured, tmp_path):
    """Every causal method of the registry (the perplexity study's default grid: 30-odd of them): formerly the
    KV-cache figure drew them all in one panel, 29 lines with repeated colours."""
    methods = _decoder_methods()
    assert len(methods) > 2 * plotting.MAX_LINES
    saved = _saved(methods, tmp_path)
    perplexity_figures.draw_kv(saved)
    perplexity_figures.draw_d(saved)
    assert len(captured) == 2
    for fig in captured:
        _check_panels(fig)
        drawn = {str(line.get_label()) for ax in fig.axes for line in plotting.panel_lines(ax)}
        assert {plotting.method_label(m) for m in methods} <= {label.split(" (no d)")[0] for label in drawn}


def test_the_budget_has_one_name_on_every_axis_of_it(captured, tmp_path):
    """Formerly "budget b" in one perplexity figure, "budget d" in another and "d" in a third."""
    methods = ["performer", "h2o", "topk"]
    saved = _saved(methods, tmp_path)
    perplexity_figures.draw_kv(saved)
    perplexity_figures.draw_d(saved)
    for fig in captured:
        bottom = [ax for ax in fig.axes if ax.get_xlabel()]
        assert bottom and {ax.get_xlabel() for ax in bottom} == {plotting.BUDGET_LABEL}


def test_panel_groups_split_a_family_larger_than_the_limit():
    panels = plotting.panel_groups(_decoder_methods())
    assert all(len(chosen) <= plotting.MAX_LINES for chosen in panels.values())
    assert sorted(m for chosen in panels.values() for m in chosen) == sorted(_decoder_methods())
    split = plotting.panel_groups(["h2o", "snapkv", "tova"], limit=2)
    assert list(split) == ["cache: attention scores (1 of 2)", "cache: attention scores (2 of 2)"]
    with pytest.raises(ValueError, match="`limit` must be an integer >= 1; got 0"):
        plotting.panel_groups(["h2o"], limit=0)


def test_every_panel_of_built_ins_has_distinct_colours_with_the_control():
    """The control (exact) is drawn in every panel: no built-in of a panel shares a colour with it or with another
    (formerly CAP and the control were both black)."""
    for name, chosen in plotting.panel_groups([m for m in available() if m != "exact"]).items():
        colours = [plotting.method_style(m)["color"].lower() for m in ["exact", *chosen]]
        assert len(set(colours)) == len(colours), (name, list(zip(["exact", *chosen], colours)))


def test_no_approximation_is_labelled_exact():
    """A legend read "Kernelized (exact)" for a method that loses 10 nats per token."""
    for method in available():
        if method != "exact":
            assert "exact" not in plotting.method_label(method).lower(), method


def test_pass_key_retrieval_is_shown_per_depth(captured, tmp_path):
    """Policies that keep recent tokens retrieve a key late in the sequence and miss an early one: an accuracy of
    0.5 over both depths; the figure shows each depth apart."""
    rows = []
    for method, hits in (("unpatched", (1.0, 1.0)), ("h2o", (0.0, 1.0)), ("performer", (0.0, 0.0))):
        for depth, hit in zip((0.25, 0.75), hits):
            for window in range(2):
                rows.append({"setting": "long-kv", "long_n": 96, "method": method,
                             "num_features": 0 if method == "unpatched" else 64, "window": window, "depth": depth,
                             "nll": 3.0 + (1 - hit), "answer_logprob": -0.1 - 5 * (1 - hit), "correct": hit,
                             "status": "ok", "spectral_median": np.nan if method == "unpatched" else 0.3})
    long = pd.DataFrame(rows)
    config = {"control": "exact", "methods": ["exact", "h2o", "performer"]}
    found = long_report.depth_table(long, config)[("long-kv", 96)]
    assert list(found["accuracy"].columns) == ["d = 64, depth 25%", "d = 64, depth 75%"]
    assert found["accuracy"].loc["h2o"].tolist() == [0.0, 1.0]
    assert found["accuracy"].loc["unpatched"].tolist() == [1.0, 1.0]
    saved = types.SimpleNamespace(config={**config, "long_n": [96]}, out=tmp_path, table=lambda name: long)
    long_report.draw_long(saved)
    (fig,) = captured
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["d=64\n25%", "d=64\n75%"]


def test_figure1_keeps_its_own_y_limits_and_its_companion_covers_them(captured, tmp_path):
    """figure1.png took the union of its y-limits with figure1-extra.png's: curves near 10 on an axis reaching the
    companion's 1,000, about 40% of the figure blank. Now the main figure fits its own curves; the companion's
    panels cover both."""
    from approxlab.studies.figure1 import figures as figure1_figures

    panel = pd.DataFrame([{"condition": "pretrained", "n": 512, "method": method, "num_features": d,
                           "dtype": "float64", "median": level / d ** 0.1, "q25": 0.9 * level / d ** 0.1,
                           "q75": 1.1 * level / d ** 0.1}
                          for method, level in (("performer", 10.0), ("yoso", 1000.0)) for d in BUDGETS])
    config = {"methods": ["performer", "yoso"], "conditions": ["pretrained"], "n": [512], "num_features": BUDGETS,
              "positions": "interpolate"}
    saved = types.SimpleNamespace(config=config, out=tmp_path, table=lambda name: pd.DataFrame({"error_heads": []}),
                                  product=lambda name: panel)
    figure1_figures.plot(saved)
    main, extra = (fig.axes[0] for fig in captured)
    assert main.get_ylim()[1] < 100 < 1000 / 2 ** 0.8 < extra.get_ylim()[1]
    assert extra.get_ylim()[0] <= main.get_ylim()[0]


def test_the_bench_figure_keeps_every_panel_to_ten_lines_and_one_colour_per_method(captured):
    """The committed bench run drew 17 causal policies in one panel and 14 sparse methods in another (vAttention
    and YOSO-E in the same pale blue): each group now runs over as many panels as keep it to
    :data:`~approxlab.plotting.MAX_LINES` lines, the exact baselines (black, told apart by their markers) included."""
    import pathlib

    from approxlab.studies.bench import report

    results = pd.read_csv(pathlib.Path(__file__).parents[1] / "figures" / "bench" / "results.csv")
    report.plot(results, "unused", machine="a test machine")
    (fig,) = captured
    for ax in fig.axes:
        lines = plotting.panel_lines(ax)
        assert len({str(line.get_label()) for line in lines}) <= plotting.MAX_LINES, ax.get_title()
        colours = [line.get_color() for line in lines if line.get_color() != "#000000"]
        assert len(colours) == len(set(colours)), (ax.get_title(), colours)
    titles = [ax.get_title() for ax in fig.axes]
    causal = [title for title in titles if title.startswith("forward, causal: KV-cache policies (")]
    assert len(causal) >= 2 and causal[0].startswith("forward, causal: KV-cache policies (1 of ")
    assert plotting.method_style("vattention")["color"] != plotting.method_style("yoso-e")["color"]

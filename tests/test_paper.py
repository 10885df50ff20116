"""The digitised curves of Skyformer's Figure 1 shipped with approxlab (approxlab.studies.paper)."""

import pytest

from approxlab.methods import available
from approxlab.studies.paper import SKYFORMER_FIGURE1_COLUMNS, skyformer_figure1

# Read by eye from the same figure at d = 16 and 256 (reading error about 5 %), independent of the
# digitisation: (condition, n, method, d) -> value.
EYE_READINGS = {
    ("initialized", 512, "skyformer-softmax", 256): 0.36,
    ("initialized", 2048, "performer", 16): 4.48,
    ("initialized", 4096, "informer", 256): 4.43,
    ("pretrained", 512, "informer", 16): 1.15,
    ("pretrained", 1024, "performer", 256): 1.36,
    ("pretrained", 4096, "skyformer-softmax", 16): 3.80,
    ("pretrained", 2048, "nystromformer", 256): 1.72,
}


def test_table_covers_every_panel_method_and_d_once():
    table = skyformer_figure1()
    assert tuple(table.columns) == SKYFORMER_FIGURE1_COLUMNS
    assert len(table) == 2 * 4 * 4 * 5
    keys = table[["condition", "n", "method", "num_features"]]
    assert not keys.duplicated().any()
    assert set(table["condition"]) == {"initialized", "pretrained"}
    assert set(table["n"]) == {512, 1024, 2048, 4096}
    assert set(table["num_features"]) == {16, 32, 64, 128, 256}
    assert set(table["method"]) == {"skyformer-softmax", "nystromformer", "performer", "informer"}
    assert set(table["method"]) <= set(available())
    assert set(table["marker"]) <= {"visible", "partly hidden", "hidden"}
    assert (table["error"] > 0).all() and (table["reading_error"] > 0).all()
    assert (table["reading_error"] < 0.1 * table["error"]).all()


def test_loader_returns_a_fresh_copy():
    first = skyformer_figure1()
    first.loc[0, "error"] = -1.0
    assert skyformer_figure1().loc[0, "error"] > 0


@pytest.mark.parametrize("key,eye", EYE_READINGS.items())
def test_digitised_values_agree_with_readings_by_eye(key, eye):
    row = skyformer_figure1().set_index(["condition", "n", "method", "num_features"]).loc[key]
    assert abs(row["error"] - eye) <= 0.05 * eye + row["reading_error"], (key, row["error"], eye)


def test_a_visible_marker_matches_its_eye_reading_within_the_reading_error():
    row = skyformer_figure1().set_index(["condition", "n", "method", "num_features"]).loc[
        ("pretrained", 1024, "performer", 256)]
    assert row["marker"] == "visible"
    assert abs(row["error"] - 1.36) <= row["reading_error"]


def test_the_papers_orderings_are_in_the_table():
    """What the paper's figure shows: Skyformer the highest of the four at d = 16 on the pretrained
    model, the lowest at d = 256 everywhere."""
    table = skyformer_figure1()
    wide = table.pivot_table(index=["condition", "n", "num_features"], columns="method", values="error")
    d16 = wide.xs(16, level="num_features").xs("pretrained", level="condition")
    assert (d16.idxmax(axis=1) == "skyformer-softmax").all()
    d256 = wide.xs(256, level="num_features")
    assert (d256.idxmin(axis=1) == "skyformer-softmax").all()

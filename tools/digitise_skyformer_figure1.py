"""Digitise Figure 1 of Skyformer (Chen et al., NeurIPS 2021) from the camera-ready PDF.

Writes ``approxlab/studies/paper/skyformer_figure1.csv`` (see the README beside it). Not part of
the package: it needs the PDF from the authors' repository and PyMuPDF, neither shipped here::

    git clone https://github.com/pkuzengqi/Skyformer            # or any copy of the PDF
    python3 -m pip install pymupdf
    python3 tools/digitise_skyformer_figure1.py Skyformer/doc/Skyformer_camera_ready.pdf

Method. Figure 1 is a raster image inside the PDF (page 8, 8428 x 4412 pixels, drawn by
matplotlib in pure colours: red Skyformer, blue dashed Nystromformer with dots, black dashed
Performer with dots, blue Informer with down-triangles; drawn in that order). The image is
extracted at its native resolution (no re-rendering). Each panel's axes are calibrated on its
grid lines (pixel rows of the y ticks, whose labels are listed in ``Y_TICKS``; x grid at d = 50,
..., 250), by a least-squares line (residual below 1e-12 in every panel). Each data point lies on
the column of its d; along that column the marker is located by template matching with the
marker shapes measured on the legend (dot: radius 14 px; triangle: 62 px wide and high):

* Informer (drawn last, never covered): the rows where the whole triangle is blue.
* dots: the rows where the whole disk is ink of its colour or of a colour drawn after it
  (``INK``), and, among those, the rows whose disk holds the most pixels of the method's pure
  colour outside Informer's triangle. A dot with fewer than 100 such pixels is *hidden* (under
  another marker): its value is the middle of the rows where a hidden disk fits.

``reading_error`` is half the range of rows that fit (at least 3 px) plus 1 px, in data units,
plus the calibration residual: the true plotted value lies within it.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "approxlab" / "studies" / "paper" / "skyformer_figure1.csv"
PAGE, IMAGE_SIZE = 7, (8428, 4412)  # 0-based page 8; the figure's pixel size
CONDITIONS, NS, DS = ("initialized", "pretrained"), (512, 1024, 2048, 4096), (16, 32, 64, 128, 256)
X_TICKS = (50.0, 100.0, 150.0, 200.0, 250.0)
Y_TICKS = {  # tick labels of each panel, top to bottom, read from the figure
    ("initialized", 512): (1.8, 1.6, 1.4, 1.2, 1.0, 0.8, 0.6, 0.4),
    ("initialized", 1024): (2.5, 2.25, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5),
    ("initialized", 2048): (4.5, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0),
    ("initialized", 4096): (4.5, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5),
    ("pretrained", 512): (2.25, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5),
    ("pretrained", 1024): (2.5, 2.0, 1.5, 1.0),
    ("pretrained", 2048): (3.0, 2.5, 2.0, 1.5, 1.0),
    ("pretrained", 4096): (3.5, 3.0, 2.5, 2.0, 1.5),
}
DOTS = ("performer", "nystromformer", "skyformer-softmax")
MIN_VISIBLE = 100  # pure-colour pixels a dot needs to count as seen (the disk has 613)
DOT = [(dy, dx) for dy in range(-15, 16) for dx in range(-15, 16) if dy * dy + dx * dx <= 14.0 ** 2]
TRIANGLE = [(dy, dx) for dy in range(-29, 34) for dx in range(-31, 32) if abs(dx) <= (62 - (dy + 29)) / 2 - 1]


def extract_image(pdf: pathlib.Path) -> np.ndarray:
    """The figure's embedded raster, ``(height, width, 3)`` int, at its native resolution."""
    import pymupdf  # only this script needs it

    document = pymupdf.open(pdf)
    for xref, *_ in document[PAGE].get_images(full=True):
        pixmap = pymupdf.Pixmap(document, xref)
        if (pixmap.width, pixmap.height) == IMAGE_SIZE:
            rgb = np.frombuffer(pixmap.samples, dtype=np.uint8).reshape(pixmap.height, pixmap.width, pixmap.n)
            return rgb[..., :3].astype(int)
    raise SystemExit(f"no {IMAGE_SIZE[0]} x {IMAGE_SIZE[1]} image on page {PAGE + 1} of {pdf}")


def runs(values: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers in the sorted ``values``, as ``(first, last)``."""
    if len(values) == 0:
        return []
    return [(int(r[0]), int(r[-1])) for r in np.split(values, np.where(np.diff(values) > 1)[0] + 1)]


def frames(image: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Column spans and row spans (centres of the black frame lines) of the 4 x 2 axes."""
    black = image.sum(-1) == 0
    cols = runs(np.where(black.mean(0) > 0.3)[0])  # frame columns: black over most of the height
    rows = runs(np.where(black.mean(1) > 0.6)[0])  # frame rows: black over most of the width
    centre = [(a + b) / 2 for a, b in cols]
    centre_rows = [(a + b) / 2 for a, b in rows]
    return ([(int(centre[i]), int(centre[i + 1])) for i in range(0, 8, 2)],
            [(int(centre_rows[i]), int(centre_rows[i + 1])) for i in range(0, 4, 2)])


def grid_lines(image, x_span, y_span, axis):
    """Centres of the grey (176, 176, 176) grid lines inside one panel, along ``axis``."""
    grey = (image == 176).all(-1)[y_span[0] + 6:y_span[1] - 5, x_span[0] + 6:x_span[1] - 5]
    start = x_span[0] + 6 if axis == "x" else y_span[0] + 6
    profile = grey.mean(0 if axis == "x" else 1)
    return [start + (a + b) / 2 for a, b in runs(np.where(profile > 0.3)[0])]


def calibrate(pixels, values):
    """Least-squares line ``value = slope * pixel + intercept`` and its largest residual."""
    slope, intercept = np.polyfit(np.asarray(pixels, float), np.asarray(values, float), 1)
    residual = float(np.abs(np.polyval([slope, intercept], pixels) - np.asarray(values)).max())
    return slope, intercept, residual


def cover(mask, x, rows, template):
    """Fraction of the template's pixels inside ``mask`` with the template centred at (row, x)."""
    dy, dx = np.array(template).T
    return np.array([mask[y + dy, x + dx].mean() for y in rows])


def locate_triangle(ink, x, rows):
    """Informer: the run of rows where the whole triangle is blue ink (best fit)."""
    fit = cover(ink, x, rows, TRIANGLE)
    good = rows[fit >= fit.max() - 0.005]
    best = rows[int(np.argmax(fit))]
    first, last = next((a, b) for a, b in runs(good) if a <= best <= b)
    return first, last, "visible"


def locate_dot(ink, pure, x, rows, triangle_row):
    """A dot: rows where the disk fits in ``ink``; the run that shows the most ``pure`` pixels."""
    dy, dx = np.array(DOT).T
    fits = runs(rows[cover(ink, x, rows, DOT) >= 0.995])
    seen = [(int(pure[(a + b) // 2 + dy, x + dx].sum()), a, b) for a, b in fits]
    visible = [s for s in seen if s[0] >= MIN_VISIBLE]
    if not visible:  # hidden: the widest-fitting run nearest Informer's triangle
        wide = [s for s in seen if s[2] - s[1] >= 6] or seen
        _, first, last = min(wide, key=lambda s: abs((s[1] + s[2]) / 2 - triangle_row))
        return first, last, "hidden"
    count, first, last = max(visible)
    span = np.arange(first, last + 1)
    counts = np.array([int(pure[y + dy, x + dx].sum()) for y in span])
    keep = span[counts >= counts.max() - max(3, 0.02 * counts.max())]
    return int(keep.min()), int(keep.max()), "visible" if counts.max() >= 600 else "partly hidden"


def masks(image):
    """Per method: the ink a marker may be made of (its colour or later ones) and its pure colour."""
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    dark_or_blue = (r < 60) & (g < 60)
    ink = {"skyformer-softmax": g < 60, "nystromformer": dark_or_blue, "performer": dark_or_blue,
           "informer": dark_or_blue & (b > 195)}
    pure = {"skyformer-softmax": (r > 230) & (g < 30) & (b < 30), "nystromformer": (r < 30) & (g < 30) & (b > 230),
            "performer": (r < 30) & (g < 30) & (b < 30)}
    return ink, pure


def digitise(image: np.ndarray) -> pd.DataFrame:
    """All 160 points: condition, n, method, num_features, error, reading_error, marker."""
    x_spans, y_spans = frames(image)
    ink, pure = masks(image)
    tri_dy, tri_dx = np.array(TRIANGLE).T
    records = []
    for (condition, n), ticks in Y_TICKS.items():
        x_span, y_span = x_spans[NS.index(n)], y_spans[CONDITIONS.index(condition)]
        slope, intercept, res_y = calibrate(grid_lines(image, x_span, y_span, "y"), ticks)
        x_slope, x_intercept, _ = calibrate(grid_lines(image, x_span, y_span, "x"), X_TICKS)
        rows = np.arange(y_span[0] + 35, y_span[1] - 35)
        for d in DS:
            x = int(round((d - x_intercept) / x_slope))
            found = {"informer": locate_triangle(ink["informer"], x, rows)}
            triangle_row = int(round(sum(found["informer"][:2]) / 2))
            under_triangle = np.zeros(image.shape[:2], bool)
            under_triangle[triangle_row + tri_dy, x + tri_dx] = True
            for method in DOTS:
                found[method] = locate_dot(ink[method], pure[method] & ~under_triangle, x, rows, triangle_row)
            for method, (first, last, marker) in found.items():
                half = max((last - first) / 2, 3.0) + 1.0
                records.append({"condition": condition, "n": n, "method": method, "num_features": d,
                                "error": slope * (first + last) / 2 + intercept,
                                "reading_error": abs(slope) * half + res_y, "marker": marker})
    return pd.DataFrame.from_records(records)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pdf", type=pathlib.Path, help="Skyformer_camera_ready.pdf")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    table = digitise(extract_image(args.pdf))
    order = {m: i for i, m in enumerate(("skyformer-softmax", "nystromformer", "performer", "informer"))}
    table = table.sort_values(["condition", "n", "method", "num_features"], key=lambda s: s.map(order)
                              if s.name == "method" else s).reset_index(drop=True)
    table["error"] = table["error"].round(3)
    table["reading_error"] = np.ceil(table["reading_error"] * 1000) / 1000
    args.out.write_text(table.to_csv(index=False, lineterminator="\n"))
    print(f"wrote {len(table)} points to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Pictures of a model and of its tuning: spectrum, explained variance, Spearman heat maps and k curves,
and, for a model tuned for retrieval (``tune --queries ...``), the frontier it was chosen from.

matplotlib (the ``[report]`` extra) is imported where it draws, through the ``Figure`` API on the Agg
canvas, never ``pyplot``: reports render headless and never change a program's backend. Outputs:
``report.html`` (one page, PNGs inline), ``report.png`` (every panel) or a directory (a PNG per figure).
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .. import __version__
from .._durable import check_replaceable, link_or_kind, write_file_atomic
from ..core.model import WhiteningModel, components_for_variance
from ..errors import BadInputError
from .evaluate import PairSet
from .select import Selection
from .tune import DEFAULT_VARIANCES, PairGrid, PairRow, TuneResult, default_ks, grid_search

#: Files written when the output is a directory.
FIGURE_FILES = {
    "spectrum": "spectrum.png",
    "variance": "variance.png",
    "k_curve": "k_curve.png",
    "heatmaps": "heatmaps.png",
    "frontier": "frontier.png",
}
SEED_SETTINGS = ((1.0, "beta=gamma=1", "#c0392b"), (0.0, "beta=gamma=0", "#2471a3"))
#: The colour that marks the setting highest on the validation data where the rule chose another.
HIGHEST_COLOR = "#d35400"
#: What every report file records as its maker (the HTML page's generator, the PNG's ``Software`` text):
#: how an existing report is recognised as one of ours, which ``--overwrite`` may replace.
GENERATOR = "streamwhiten"
#: Eigenvalues below this fraction of the largest are drawn as absent (float64 rounding noise).
NUMERICAL_ZERO = 1e-12


@dataclass
class ReportData:
    """Everything the pictures show, computed once."""

    model: WhiteningModel
    k_marks: list  # (label, k) at the model's beta: the k ladder and the variance thresholds
    grid: TuneResult | None = None
    curves: dict | None = None  # beta (= gamma) -> list of (k, score) for the seed settings
    metric: str = "spearman"

    @property
    def tuned(self) -> dict | None:
        """The record of a retrieval tuning the model holds (its frontier), or None."""
        return retrieval_record(self.model)

    @property
    def raw(self) -> float | None:
        return None if self.grid is None else self.grid.raw[self.metric]

    def k_labels(self) -> list[str]:
        """The k choices of the grid's maps (not the raw vectors' row), in order: one heat map each."""
        assert self.grid is not None  # asked with pairs only
        return list(dict.fromkeys(row.k_label for row in self.grid.table if row.vectors != "raw"))


def retrieval_record(model: WhiteningModel) -> dict | None:
    """``model.info["tuned"]`` when it records a retrieval tuning with a frontier, else None."""
    record = model.info.get("tuned")
    found = isinstance(record, dict) and record.get("mode") == "retrieval" and record.get("frontier")
    return record if found else None


def collect(
    model: WhiteningModel,
    pairs: PairSet | None = None,
    grid: PairGrid | None = None,
    *,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReportData:
    """Compute what the report shows; with ``pairs``, score the tuning ``grid`` and the seed k curves
    (``progress`` is told the phases of both grids: `grid_search`)."""
    grid = PairGrid() if grid is None else grid
    d, metric = model.n_features, grid.metric
    ladder = default_ks(d) if grid.ks is None else list(grid.ks)
    fractions = list(DEFAULT_VARIANCES if grid.variances is None else grid.variances)
    k_marks = [(f"k={k}", int(k)) for k in ladder]
    k_marks += [(f"{v:.0%}", components_for_variance(model.eigvals, float(v))) for v in fractions]
    data = ReportData(model, k_marks, metric=metric)
    if pairs is None:
        return data
    data.grid = grid_search(model, pairs, grid, block_rows=block_rows, progress=progress)
    dense = sorted({int(round(k)) for k in np.geomspace(1, d, min(d, 40))} | {int(k) for k in ladder})
    seeds = PairGrid((0.0, 1.0), (0.0, 1.0), tuple(dense), (), metric)
    curve = grid_search(model, pairs, seeds, block_rows=block_rows, progress=progress)
    data.curves = {
        beta: [(row.k, row.score(metric)) for row in curve.table if row.beta == beta and row.gamma == beta]
        for beta, _, _ in SEED_SETTINGS
    }
    return data


# ------------------------------------------------------------------------------------------- drawing


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BadInputError("reports need matplotlib: pip install 'streamwhiten[report]'") from exc
    return Figure


def _metric_name(data: ReportData) -> str:
    return f"{data.metric.capitalize()} x100"


#: How a point's label is written beside it.
_NOTE = dict(textcoords="offset points", fontsize=7, color="#1b4f72")


def _finish(ax: Any, legend: str, *labels: str) -> None:
    """The ``labels`` (title, x, y), a light grid and the legend at ``legend``: how every plot ends."""
    ax.set(**dict(zip(("title", "xlabel", "ylabel"), labels, strict=False)))
    ax.grid(True, alpha=0.3)
    ax.legend(loc=legend, fontsize=8)


def draw_spectrum(ax: Any, data: ReportData) -> None:
    """Eigenvalues of Sigma_beta on a log scale, the eps floor and D_eff."""
    model = data.model
    eigvals = model.eigvals
    index = np.arange(1, eigvals.size + 1)
    # Below this, an eigenvalue is rounding noise of the float64 eigensolver: counted, not drawn.
    positive = eigvals > NUMERICAL_ZERO * (eigvals[0] if eigvals.size and eigvals[0] > 0 else 1.0)
    ax.semilogy(index[positive], eigvals[positive], color="#1f4e79", lw=1.6, label="eigenvalue $\\lambda_i$")
    if model.eps_value > 0:
        label = f"eps floor {model.eps_value:.2g} (added before the power)"
        ax.axhline(model.eps_value, color="#7f7f7f", ls=":", lw=1.2, label=label)
    _mark_effective_dimension(ax, model)
    zeros = int((~positive).sum())
    title = f"Eigenvalue spectrum of $\\Sigma_\\beta$ ($\\beta$={model.beta:g}, d={model.n_features})"
    title += f"\n{zeros} eigenvalue(s) numerically zero (< {NUMERICAL_ZERO:g} x largest), not drawn" if zeros else ""
    _finish(ax, "upper right", title, "component i (descending eigenvalue)", "eigenvalue (log scale)")
    ax.set_xlim(0.5, eigvals.size + 0.5)


def _mark_effective_dimension(ax: Any, model: WhiteningModel) -> None:
    """D_eff as a dashed vertical line."""
    dimension = model.effective_dimension
    ax.axvline(dimension, color="#8e44ad", ls="--", lw=1.2, label=f"D_eff = {dimension:.1f}")


def draw_variance(ax: Any, data: ReportData) -> None:
    """Cumulative explained variance against k, with the k choices marked."""
    model = data.model
    ratio = np.cumsum(model.explained_variance_ratio)
    k_axis = np.arange(1, ratio.size + 1)
    ax.plot(k_axis, ratio, color="#1f4e79", lw=1.6, label="explained variance of the first k")
    ladder = sorted({k for label, k in data.k_marks if not label.endswith("%")})
    for k in ladder:  # fixed k: a dot, labelled above-left (the curve rises to the right); k=d is 100%
        ax.plot(k, ratio[k - 1], "o", ms=5, color="#2e86c1", zorder=3)
        if k == model.n_features:
            continue
        ax.annotate(f"k={k}: {ratio[k - 1]:.1%}", (k, ratio[k - 1]), xytext=(-4, 5), ha="right", **_NOTE)
    fractions = [(label, k) for label, k in data.k_marks if label.endswith("%")]
    for label, k in fractions:  # a variance threshold: a dotted guide from the left edge to its k
        level = float(label.rstrip("%")) / 100.0
        named = "explained-variance thresholds" if (label, k) == fractions[0] else None
        ax.plot([1, k], [level, level], ls=":", lw=1.0, color="#e67e22", label=named)
        ax.plot([k, k], [0, ratio[k - 1]], ls=":", lw=1.0, color="#e67e22")
        ax.plot(k, ratio[k - 1], "o", ms=5, color="#e67e22", zorder=3)
        ax.text(1.1, level, f"{label} → k={k}", fontsize=7, color="#a04000", va="bottom")
    k = model.n_components
    ax.plot(k, ratio[k - 1], "*", ms=13, color="#c0392b", zorder=4, label=f"model's k = {k}")
    _mark_effective_dimension(ax, model)
    ax.set_xscale("log", base=2)
    ax.set_xlim(1, model.n_features * 1.15)
    ax.set_ylim(0, 1.08)
    title = "Cumulative explained variance, with the k choices"
    _finish(ax, "lower right", title, "kept components k (log scale)", "fraction of the variance explained")


def draw_k_curve(ax: Any, data: ReportData) -> None:
    """Score against k for the seed settings beta=gamma=1 and beta=gamma=0, with the raw baseline."""
    name = _metric_name(data)
    assert data.grid is not None and data.curves is not None and data.raw is not None  # drawn with pairs only
    for beta, label, color in SEED_SETTINGS:
        points = data.curves[beta]
        ax.plot([k for k, _ in points], [s for _, s in points], "o-", ms=3, lw=1.5, color=color, label=label)
    ax.axhline(data.raw, color="black", ls="--", lw=1.2, label=f"raw vectors: {data.raw:.2f}")
    best, highest, metric = data.grid.best, data.grid.highest, data.metric
    apart = highest is not best
    chosen = f"chosen by the rule{'' if apart else ', and highest'}: {_setting(best)}: {best.score(metric):.2f}"
    top = f"highest on these pairs: {_setting(highest)}: {highest.score(metric):.2f}"
    point = (highest.k, highest.score(metric)) if apart else None
    _mark_choice(ax, (best.k, best.score(metric)), chosen, point, top, (14, 8))
    ax.set_xscale("log", base=2)
    everything = [s for points in data.curves.values() for _, s in points if np.isfinite(s)] + [data.raw]
    top = max(everything + [best.score(metric), highest.score(metric)])
    low = max(min(everything), top - 25.0)  # keep the interesting band readable; lower points fall off
    ax.set_ylim(low - 0.5, top + 0.5)
    title = f"{name} against k for the seed settings"
    _finish(ax, "lower right", title, "kept components k (log scale)", f"{name} on the pairs")


def draw_heatmaps(figure: Any, data: ReportData) -> None:
    """One heat map of the score over (beta, gamma) per k choice; white is the raw score."""
    from matplotlib.colors import TwoSlopeNorm

    grid, metric = data.grid, data.metric
    assert grid is not None and data.raw is not None  # drawn with pairs only
    labels = data.k_labels()
    values = np.array([row.score(metric) for row in grid.table], dtype=np.float64)
    finite = values[np.isfinite(values)]
    raw = data.raw
    norm = TwoSlopeNorm(vcenter=raw, vmin=min(finite.min(), raw - 0.05), vmax=max(finite.max(), raw + 0.05))
    axes = np.atleast_1d(figure.subplots(*_heat_layout(len(labels))[::-1], squeeze=False)).ravel()
    image = None
    for ax, label in zip(axes, labels, strict=False):
        image = _draw_heatmap(ax, grid, metric, label, norm)
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    bar = figure.colorbar(image, ax=list(axes[: len(labels)]), shrink=0.9, pad=0.02)
    bar.set_label(f"{_metric_name(data)}  (white = raw {raw:.2f}; blue beats raw, red loses)")
    best, highest = grid.best, grid.highest
    title = (
        f"{_metric_name(data)} over (beta, gamma) for each k (raw {raw:.2f})\ngreen box: chosen by the rule, "
        f"{_setting(best)} ({best.score(metric):.2f})"
    )
    if highest is best:
        title += ", also the highest on these pairs"
    else:
        title += f"; dashed box: highest on these pairs, {_setting(highest)} ({highest.score(metric):.2f})"
    figure.suptitle(title, fontsize=11)


def _heat_layout(n_panels: int) -> tuple[int, int]:
    """``(columns, rows)`` of ``n_panels`` heat maps: five to a row."""
    return min(5, n_panels), -(-n_panels // min(5, n_panels))


def _draw_heatmap(ax: Any, grid: TuneResult, metric: str, label: str, norm: Any) -> Any:
    """The heat map over (beta, gamma) at k choice ``label``: each cell's score, the choices outlined; the image."""
    maps = [row for row in grid.table if row.vectors != "raw"]
    betas = list(dict.fromkeys(row.beta for row in maps))
    gammas = list(dict.fromkeys(row.gamma for row in maps))
    cells = {(row.beta, row.gamma): row for row in grid.table if row.k_label == label}  # raw: the last, its cell
    matrix = np.array([[cells[(b, g)].score(metric) for g in gammas] for b in betas])
    image = ax.imshow(matrix, cmap="RdBu", norm=norm, aspect="auto", origin="lower")
    for i, beta in enumerate(betas):
        for j, gamma in enumerate(gammas):
            row = cells[(beta, gamma)]
            value = row.score(metric)
            shade = norm(value) if np.isfinite(value) else 0.5
            color = "white" if abs(shade - 0.5) > 0.35 else "black"
            weight = "bold" if row is grid.best or row is grid.highest else "normal"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color, fontweight=weight)
            if row is grid.best:
                ax.add_patch(_outline(i, j))
            elif row is grid.highest:
                ax.add_patch(_outline(i, j, HIGHEST_COLOR, "--"))
    ks = sorted({row.k for row in cells.values()})
    span = f"{ks[0]}..{ks[-1]}" if len(ks) > 1 else f"{ks[0]}"
    ax.set_title(f"{label} variance (k = {span})" if label.endswith("%") else f"k = {label}", fontsize=10)
    ax.set_xticks(range(len(gammas)), [f"{g:g}" for g in gammas], fontsize=8)
    ax.set_yticks(range(len(betas)), [f"{b:g}" for b in betas], fontsize=8)
    ax.set_xlabel("gamma", fontsize=8)
    ax.set_ylabel("beta", fontsize=8)
    return image


#: Points (x100) below the reference's score that the frontier's score axis still shows.
FRONTIER_WINDOW = 10.0


def draw_frontier(ax: Any, data: ReportData) -> None:
    """The retrieval frontier a tuned model was chosen from: the best score per bytes per vector (with the 95%
    interval against raw float32), raw float32, the budget and the choice. The score axis spans the reference,
    the choice and the candidates within `FRONTIER_WINDOW` points of the reference, so the differences that
    matter stay visible; cheaper candidates far below are marked on its bottom edge and listed."""
    record = data.tuned
    assert record is not None  # drawn only for a model with a retrieval tuning, as its callers check
    metric, rows = record["metric"], record["frontier"]
    raw, chosen = record["validation"]["raw"], record["validation"]["chosen"]
    reference = _budget_reference(record, raw["bytes_per_vector"])
    view = _FrontierView.of(rows, metric, (raw[metric], chosen[metric]) + ((reference[1],) if reference else ()))
    ax.step(view.x, view.y, where="post", color="#1f4e79", lw=1.2, alpha=0.6)
    star = (float(record["setting"]["bytes_per_vector"]), float(chosen[metric]))
    below = _draw_candidates(ax, rows, view, raw[metric], star)
    _draw_reference(ax, raw, metric, reference)
    _draw_choice(ax, record, star)
    if below:
        listed = "below the view (v):\n" + "\n".join(below)
        ax.text(0.01, 0.98, listed, transform=ax.transAxes, va="top", fontsize=7, color="#1b4f72")
    ax.set_xscale("log", base=2)
    ax.set_ylim(view.low, view.high)
    ax.set(xlabel="bytes per corpus vector read by a search (log scale)", ylabel=f"{metric} x100")
    queries = record["validation"]["n_queries"]
    title = f"Retrieval frontier: the highest {metric} per size\n({queries:,} queries; bars: 95% interval)"
    ax.set_title(title, fontsize=10)
    _finish(ax, "lower right")


@dataclass(frozen=True)
class _FrontierView:
    """The frontier's points (bytes ``x``, score ``y``), those ``inside`` the view, and the view's score range."""

    x: np.ndarray
    y: np.ndarray
    inside: np.ndarray
    low: float
    high: float

    @classmethod
    def of(cls, rows: list, metric: str, shown: tuple) -> _FrontierView:
        """The view: the scores ``shown`` (the reference's first) and every candidate within
        `FRONTIER_WINDOW` points of the reference; the cheap ones far below fall outside."""
        x = np.array([row["bytes_per_vector"] for row in rows], dtype=np.float64)
        y = np.array([row[metric] for row in rows], dtype=np.float64)
        inside = y >= shown[0] - FRONTIER_WINDOW
        scores = np.concatenate([y[inside], shown])
        pad = max(0.12 * float(scores.max() - scores.min()), 0.3)
        return cls(x, y, inside, float(scores.min()) - pad, float(scores.max()) + pad)


def _draw_candidates(ax: Any, rows: list, view: _FrontierView, raw_score: float, star: tuple) -> list[str]:
    """Each frontier point, interval and label (away from the ``star``); those below the view: marked, returned."""
    below = []
    for i, (row, xi, yi) in enumerate(zip(rows, view.x, view.y, strict=True)):
        if row["low"] is not None:  # clipped to the axis: an interval can reach far past the candidates
            ax.plot([xi, xi], [raw_score + row["low"], raw_score + row["high"]], color="#7fb3d5", lw=3, alpha=0.6)
        if not view.inside[i]:
            ax.plot(xi, view.low, "v", ms=6, color="#1f4e79", clip_on=False, zorder=3)
            below.append(f"{row['storage']} k={row['k']} ({xi:g} B): {yi:.1f}")
            continue
        ax.plot(xi, yi, "o", ms=5, color="#1f4e79", zorder=3)
        if (xi, yi) == star:
            continue  # the chosen point is named by the star's legend entry
        near_star = abs(np.log2(xi / star[0])) < 2.0 and abs(yi - star[1]) < 0.25 * (view.high - view.low)
        above = yi > star[1] if near_star else i % 2 == 0  # away from the star, else alternating
        left = near_star and xi < star[0]
        offset, side = (-5 if left else 5, 7 if above else -12), "right" if left else "left"
        text = f"{row['storage']} k={row['k']}"
        ax.annotate(text, (xi, yi), xytext=offset, ha=side, clip_on=True, **_NOTE)
    return below


def _draw_reference(ax: Any, raw: dict, metric: str, reference: tuple[int, float, str] | None) -> None:
    """Raw float32's line and point, and under a budget the reference it was measured against."""
    role = "" if reference else "reference: "
    point = (raw["bytes_per_vector"], raw[metric])
    ax.axhline(point[1], color="black", ls="--", lw=1.2, label=f"{role}raw float32 ({point[0]:,} B): {point[1]:.2f}")
    ax.plot(*point, "s", ms=7, color="black", zorder=3)
    text = "raw float32" + ("" if reference else " (reference)")
    ax.annotate(text, point, textcoords="offset points", xytext=(-6, 7), ha="right", fontsize=8)
    if reference:  # under a budget the reference is the raw vectors in the storage that fits
        (ref_bytes, ref_score, ref_name) = reference
        label = f"reference: {ref_name} ({ref_bytes:,} B): {ref_score:.2f}"
        ax.plot(ref_bytes, ref_score, "s", ms=9, mfc="none", mec="black", mew=1.8, zorder=4, label=label)


def _draw_choice(ax: Any, record: dict, star: tuple) -> None:
    """The budget, the rule's choice (the ``star``) and the setting highest on the queries where it is another."""
    metric, setting = record["metric"], record["setting"]
    if record.get("max_bytes") is not None:
        ax.axvline(record["max_bytes"], color="#e67e22", ls=":", lw=1.5, label=f"budget: {record['max_bytes']:,} bytes")
    highest = highest_apart(record)
    point, text = None, ""
    if highest is not None:
        point = (highest["bytes_per_vector"], highest[metric])
        text = f"highest on these queries: {highest['storage']} {_bgk(highest)}: {highest[metric]:.2f}"
    label = f"chosen by the rule{'' if highest else ', and highest'}: {setting['dtype']} {_bgk(setting)}"
    _mark_choice(ax, star, f"{label}: {star[1]:.2f}", point, text, (15, 10))


def _bgk(row: dict) -> str:
    return f"beta={row['beta']:g} gamma={row['gamma']:g} k={row['k']}"


def _mark_choice(ax: Any, chosen: tuple, label: str, highest: tuple | None, highest_label: str, sizes: tuple) -> None:
    """The rule's choice as a green star and, where it is another, the highest as a hollow diamond."""
    ax.plot(*chosen, "*", ms=sizes[0], color="#27ae60", zorder=4, label=label)
    if highest is not None:
        ax.plot(*highest, "D", ms=sizes[1], mfc="none", mec=HIGHEST_COLOR, mew=2, zorder=4, label=highest_label)


def _budget_reference(record: dict, raw_bytes: int) -> tuple[int, float, str] | None:
    """``(bytes, score, name)`` of the reference a tuning under a budget was measured against where it is not raw
    float32 (drawn anyway); its score is the forecast's: for a setting fixed in advance, its mean over the queries."""
    selection = Selection.from_json(record.get("selection"))
    reference = None if selection is None else selection.reference
    predicted = None if selection is None else (selection.forecast or {}).get("reference")
    if not reference or not predicted or reference["bytes_per_vector"] == raw_bytes:
        return None
    name = f"raw {reference['storage']} k={reference['k']}"
    return int(reference["bytes_per_vector"]), float(predicted["score"]), name


def _outline(i: int, j: int, color: str = "#27ae60", style: str = "-"):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=color, lw=2.5, ls=style)


def _setting(row: PairRow) -> str:
    """A row's setting in a label: ``beta=0 gamma=0 k=384``, or the raw vectors."""
    if row.vectors == "raw":
        return f"raw vectors, k={row.k}"
    return f"beta={row.beta:g} gamma={row.gamma:g} k={row.k}"


def highest_within(record: dict) -> dict:
    """The frontier row of a retrieval tuning's record scoring highest on its queries within its budget (the
    last that fits); the rule chose another where it did not beat the reference beyond the noise."""
    budget, metric = record.get("max_bytes"), record["metric"]
    rows = [row for row in record["frontier"] if budget is None or row["bytes_per_vector"] <= budget]
    return max(rows, key=lambda row: (row[metric], -row["bytes_per_vector"]))


def highest_apart(record: dict) -> dict | None:
    """`highest_within`'s row where it scores above the rule's choice (else None: the choice is the highest)."""
    highest, metric = highest_within(record), record["metric"]
    return highest if highest[metric] > record["validation"]["chosen"][metric] else None


def figures(data: ReportData) -> dict:
    """The report's figures by name (``spectrum``, ``variance``, and with pairs ``k_curve``, ``heatmaps``)."""
    Figure = _matplotlib()
    out = {}
    plots = [("spectrum", draw_spectrum), ("variance", draw_variance)]
    for name, draw in plots + ([("k_curve", draw_k_curve)] if data.grid is not None else []):
        figure = Figure(figsize=(8, 5), layout="constrained")
        draw(figure.add_subplot(), data)
        out[name] = figure
    if data.grid is not None:
        n_cols, n_rows = _heat_layout(len(data.k_labels()))
        figure = Figure(figsize=(3.2 * n_cols + 1.5, 2.9 * n_rows + 0.8), layout="constrained")
        draw_heatmaps(figure, data)
        out["heatmaps"] = figure
    if data.tuned is not None:
        figure = Figure(figsize=(9, 5.5), layout="constrained")
        draw_frontier(figure.add_subplot(), data)
        out["frontier"] = figure
    return out


def dashboard(data: ReportData):
    """Every panel on one figure: spectrum, variance and k curve on top, the heat maps below."""
    Figure = _matplotlib()
    n_cols, heat_rows = _heat_layout(len(data.k_labels())) if data.grid is not None else (0, 0)
    width = max(18.0, 3.2 * n_cols + 1.5) if heat_rows else 13.0
    width += 6.5 if data.tuned is not None else 0.0
    figure = Figure(figsize=(width, 5.2 + 2.9 * heat_rows + (0.8 if heat_rows else 0)), layout="constrained")
    if heat_rows:
        top, bottom = figure.subfigures(2, 1, height_ratios=[5.2, 2.9 * heat_rows + 0.8])
    else:
        top, bottom = figure, None
    panels = 2 + (data.grid is not None) + (data.tuned is not None)
    axes = top.subplots(1, panels)
    draw_spectrum(axes[0], data)
    draw_variance(axes[1], data)
    if data.grid is not None:
        draw_k_curve(axes[2], data)
        draw_heatmaps(bottom, data)
    if data.tuned is not None:
        draw_frontier(axes[-1], data)
    return figure


def png_bytes(figure: Any, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": f"{GENERATOR} {__version__}"})
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------- writing


def output_kind(path: str) -> str:
    """``html``, ``png`` (one image) or ``dir`` (one PNG per figure), from the output path."""
    lower = os.fspath(path).lower()
    if lower.endswith((".html", ".htm")):
        return "html"
    if lower.endswith(".png"):
        return "png"
    if (os.path.splitext(lower.rstrip("/"))[1] or os.path.exists(path)) and not os.path.isdir(path):
        raise BadInputError(f"{path}: a report is .html, .png or a directory")
    return "dir"


def _write_bytes(path: str, payload: bytes) -> None:
    write_file_atomic(path, lambda handle: handle.write(payload), "report")


def planned_files(path: str, with_pairs: bool, with_frontier: bool = False) -> list:
    """The files `write_report` writes for ``path`` (``with_frontier``: the model records a retrieval tuning)."""
    kind = output_kind(path)
    if kind != "dir":
        return [path]
    wanted = {"spectrum", "variance"} | ({"k_curve", "heatmaps"} if with_pairs else set())
    wanted |= {"frontier"} if with_frontier else set()
    return [os.path.join(path, FIGURE_FILES[name]) for name in FIGURE_FILES if name in wanted]


def foreign_report(path: str) -> str | None:
    """None when ``path`` is a report file streamwhiten wrote (an HTML page whose generator, or a PNG
    whose ``Software`` text, is `GENERATOR`), else what it is instead."""
    found = link_or_kind(path, directory=False)
    if found is not None:
        return found
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
    except OSError as exc:
        return f"a file that cannot be read: {exc.strerror or exc}"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return None if _png_software(head).startswith(GENERATOR) else "a PNG image streamwhiten did not write"
    marker = f"<meta name='generator' content='{GENERATOR} ".encode()
    return None if marker in head[:4096] else "a file streamwhiten did not write"


def _png_software(head: bytes) -> str:
    """The ``Software`` text of a PNG from its first bytes (the chunks before the image data), or ''."""
    position = 8
    while position + 8 <= len(head):
        length = int.from_bytes(head[position : position + 4], "big")
        kind = head[position + 4 : position + 8]
        if kind == b"IDAT":
            break
        if kind == b"tEXt":
            keyword, _, text = head[position + 8 : position + 8 + length].partition(b"\x00")
            if keyword == b"Software":
                return text.decode("latin-1")
        position += 12 + length
    return ""


def check_output(path: str, with_pairs: bool, overwrite: bool = False, with_frontier: bool = False) -> None:
    """Raise before any work if the report would replace a file without ``overwrite``, or anything but a
    report streamwhiten wrote even with it (``_durable.check_replaceable``)."""
    parent = os.path.dirname(os.path.abspath(path.rstrip("/"))) if output_kind(path) != "dir" else None
    if parent is not None and not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")
    for target in planned_files(path, with_pairs, with_frontier):
        check_replaceable(target, overwrite, "a report", foreign_report)


def write_report(data: ReportData, path: str, overwrite: bool = False, title: str | None = None) -> list:
    """Write the report to ``path`` (``.html``, ``.png`` or a directory); returns the files written."""
    check_output(path, data.grid is not None, overwrite, data.tuned is not None)
    kind = output_kind(path)
    if kind == "png":
        _write_bytes(path, png_bytes(dashboard(data)))
        return [path]
    drawn = figures(data)
    if kind == "dir":
        os.makedirs(path, exist_ok=True)
        written = [os.path.join(path, FIGURE_FILES[name]) for name in drawn]
        for target, figure in zip(written, drawn.values(), strict=True):
            _write_bytes(target, png_bytes(figure))
        return written
    _write_bytes(path, render_html(data, {name: png_bytes(fig) for name, fig in drawn.items()}, title).encode())
    return [path]


def _table(rows: Sequence[Sequence[str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table class='kv'>{body}</table>"


def _figure(images: dict, name: str, caption: str) -> str:
    """One figure of ``images`` (PNG bytes by name) as an inline base64 image with its caption."""
    encoded = base64.b64encode(images[name]).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{encoded}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _pairs_html(data: ReportData, image: Callable[[str, str], str]) -> list[str]:
    """The section on labelled pairs: the raw, best and seed scores, their figures and the full grid."""
    grid, metric, name = data.grid, data.metric, _metric_name(data)
    assert grid is not None  # drawn only for a report with a grid
    best = grid.best
    seeds = {(row.beta, row.gamma, row.k): row for row in grid.table}
    described = grid.pairs
    pairs = f"{described.n_pairs:,} (A {described.a}, B {described.b}, scores {described.scores})"
    rows = [("pairs", pairs), (f"raw {name}", f"{grid.raw[metric]:.2f}")]
    highest = grid.highest
    roles = [("chosen by the rule", best)] + ([] if highest is best else [("highest on these pairs", highest)])
    for role, picked in roles:
        also = ", and highest on these pairs" if picked is best and highest is best else ""
        score = picked.score(metric)
        rows.append(
            (f"{role} ({name})", f"{score:.2f} at {_setting(picked)} ({score - grid.raw[metric]:+.2f} vs raw){also}")
        )
    for beta, label, _ in SEED_SETTINGS:
        seed = seeds.get((beta, beta, data.model.n_features))
        if seed is not None:
            rows.append((f"{label}, full d", f"{seed.score(metric):.2f}"))
    boxes = "white is the raw score, blue beats it, red loses; the green box marks the setting chosen by the rule"
    boxes += ("" if highest is best else ", the dashed box the highest on these pairs") + "."
    parts = [
        "<h2>Scores on labelled pairs</h2>",
        _table(rows),
        image("k_curve", f"{name} against k for beta=gamma=1 and beta=gamma=0; dashed: the raw vectors."),
        image("heatmaps", f"{name} over (beta, gamma), one map per k; {boxes}"),
    ]
    header = "".join(f"<th>{h}</th>" for h in ("beta", "gamma", "k", "k choice", "Spearman x100", "Pearson x100"))
    body = "".join(
        f"<tr{' class=chosen' if row is best else ' class=highest' if row is highest else ''}>"
        f"<td>{row.beta:g}</td><td>{row.gamma:g}</td>"
        f"<td>{row.k}</td><td>{html.escape(row.k_label)}</td><td>{row.spearman:.2f}</td>"
        f"<td>{row.pearson:.2f}</td></tr>"
        for row in grid.table
    )
    parts.append(
        f"<details><summary>All {len(grid.table)} settings</summary>"
        f"<table class='grid'><tr>{header}</tr>{body}</table></details>"
    )
    return parts


def _forecast_rows(record: dict | None, metric: str) -> list[tuple[str, str]]:
    """The rule a tuning chose by (``record``: its `Selection`'s JSON) and its cross-validated forecast, as rows
    of the summary table."""
    selection = Selection.from_json(record)
    if selection is None:
        return []
    rows = []
    reference = selection.reference
    if reference:
        rows.append(
            ("reference", f"raw vectors as {reference['storage']} at k={reference['k']}, "
             f"{reference['bytes_per_vector']:,} bytes per vector")
        )  # fmt: skip
    if selection.rule == "maxt":
        rows.append(
            ("rule", f"max-t: {selection.n_beating} of {selection.n_compared} settings beat the reference "
             "beyond the noise of all compared" + ("; the reference is kept" if selection.kept_reference else ""))
        )  # fmt: skip
    else:
        rows.append(("rule", "argmax: the best score of all (optimistic)"))
    predicted = selection.forecast
    if predicted:
        text = lambda entry: _interval(entry["score"], entry["low"], entry["high"])  # noqa: E731
        rows.append(
            (f"forecast {metric} on unseen queries",
             f"chosen {text(predicted['chosen'])}, reference {text(predicted['reference'])} "
             f"({predicted['folds']}-fold cross-validation of the rule; 95% intervals)")
        )  # fmt: skip
    return rows


def _frontier_html(data: ReportData, image: Callable[[str, str], str]) -> list[str]:
    """The section on retrieval: the choice tune made, its figure and the frontier it was tuned on."""
    record = data.tuned
    assert record is not None  # drawn only for a model tuned for retrieval
    metric = record["metric"]
    head = "".join(
        f"<th>{h}</th>"
        for h in ("bytes", "storage", "beta", "gamma", "k", f"{metric} x100", "retention", "vs raw [95%]")
    )
    body = "".join(
        f"<tr><td>{row['bytes_per_vector']:,}</td><td>{html.escape(row['storage'])}</td><td>{row['beta']:g}</td>"
        f"<td>{row['gamma']:g}</td><td>{row['k']}</td><td>{row[metric]:.2f}</td>"
        f"<td>{'' if row['retention'] is None else format(row['retention'], '.1f') + '%'}</td>"
        f"<td>{_versus_raw(row)}</td></tr>"
        for row in record["frontier"]
    )
    parts = [
        "<h2>Retrieval: the frontier it was tuned on</h2>",
        _table(_tuning_rows(record)),
        image("frontier", f"The highest {metric} at each number of bytes per vector, the choice and the budget."),
        f"<table class='grid'><tr>{head}</tr>{body}</table>",
    ]
    families = record.get("families")
    if families:  # each storage and code family's best within the budget, best first
        cells = "".join(
            f"<tr><td>{html.escape(row['family'])}</td><td>{html.escape(row['storage'])}</td>"
            f"<td>{row['bytes_per_vector']:,}</td><td>{row[metric]:.2f}</td><td>{_versus_raw(row)}</td></tr>"
            for row in families
        )
        within = "the budget" if record.get("max_bytes") is not None else "the grid"
        parts += [
            f"<h3>The best of each storage and code within {within}</h3>",
            "<table class='grid'><tr><th>family</th><th>storage</th><th>bytes</th>"
            f"<th>{metric} x100</th><th>vs raw [95%]</th></tr>{cells}</table>",
        ]
    return parts


def _interval(value: float, low: float | None, high: float | None, sign: str = "") -> str:
    """``value`` and its interval where it has one, to two decimals (``sign`` "+": signed)."""
    return f"{value:{sign}.2f}" + ("" if low is None else f" [{low:{sign}.2f}, {high:{sign}.2f}]")


def _versus_raw(row: dict) -> str:
    """A row's difference from raw float32, with its interval where it has one."""
    return _interval(row["difference"], row["low"], row["high"], "+")


_ALSO_HIGHEST = " (also the highest on these queries)"


def _tuning_rows(record: dict) -> list[tuple[str, str]]:
    """The retrieval tuning as (name, value) rows: queries, raw, budget, choice, the highest, the forecast."""
    metric, validation, setting = record["metric"], record["validation"], record["setting"]
    raw, budget, highest = validation["raw"], record.get("max_bytes"), highest_apart(record)
    chosen = f"{validation['chosen'][metric]:.2f} at {setting['bytes_per_vector']:,} bytes per vector"
    rows = [
        ("queries", f"{validation['n_queries']:,} with a relevant document"),
        (f"raw float32 {metric}", f"{raw[metric]:.2f} at {raw['bytes_per_vector']:,} bytes per vector"),
        ("budget", "none" if budget is None else f"{budget:,} bytes per vector"),
        ("chosen by the rule", f"{setting['dtype']} {_bgk(setting)}: {chosen}" + ("" if highest else _ALSO_HIGHEST)),
    ]
    if highest is not None:
        score = f"{highest[metric]:.2f} at {highest['bytes_per_vector']:,} bytes per vector (not chosen by the rule)"
        rows.append(("highest on these queries", f"{highest['storage']} {_bgk(highest)}: {score}"))
    return rows + _forecast_rows(record.get("selection"), metric)


def render_html(data: ReportData, images: dict, title: str | None = None) -> str:
    """One self-contained page: summaries, the figures (base64 PNGs), the full grid."""
    model = data.model
    summary = model.to_json()
    title = title or "streamwhiten report"
    setting = f"beta={model.beta:g}, gamma={model.gamma:g}, k={model.n_components}, eps={model.eps:g}"
    entropy = "exp of the entropy of the normalised eigenvalues"
    spectrum_rows = [
        ("fitted on", f"{model.n_rows:,} rows x {model.n_features} features"),
        ("transform", f"{setting} (absolute {model.eps_value:.3g})"),
        ("explained variance by k", f"{summary['explained_variance']:.4f}"),
        ("effective dimension D_eff", f"{model.effective_dimension:.1f} ({entropy})"),
        (
            "k for 90% / 95% / 99% variance",
            " / ".join(str(summary["components_for_variance"][v]) for v in ("0.9", "0.95", "0.99")),
        ),
        ("condition number", f"{summary['condition_number']:.4g}"),
    ]
    parts = [f"<h1>{html.escape(title)}</h1>", "<h2>Model</h2>", _table(spectrum_rows)]
    image = partial(_figure, images)
    decay = "a fast decay means few directions carry most of the variance."
    parts += [
        image("spectrum", f"Eigenvalues of Sigma_beta (log scale): {decay}"),
        image("variance", "Cumulative explained variance: how much each k choice keeps."),
    ]
    if data.grid is not None:
        parts += _pairs_html(data, image)
    if data.tuned is not None:
        parts += _frontier_html(data, image)
    style = (
        "body{font-family:sans-serif;max-width:1400px;margin:2em auto;color:#222}"
        "img{max-width:100%}figure{margin:1.5em 0}figcaption{color:#555;font-size:90%}"
        "table{border-collapse:collapse;margin:0.5em 0}th,td{padding:2px 10px;text-align:left}"
        "table.grid td{text-align:right}tr.chosen{background:#d5f5e3;font-weight:bold}"
        "tr.highest{background:#fae5d3;font-weight:bold}"
        "table.kv th{color:#555;font-weight:normal}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<meta name='generator' content='{GENERATOR} {__version__}'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )


__all__ = [
    "ReportData",
    "collect",
    "figures",
    "dashboard",
    "write_report",
    "render_html",
    "check_output",
    "highest_apart",
    "highest_within",
    "output_kind",
    "planned_files",
]

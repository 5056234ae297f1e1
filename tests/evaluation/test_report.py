"""Reports: the pictures render headless, to HTML, one PNG or a directory, and refuse to overwrite."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO, Phases, needs

pytestmark = needs("matplotlib", reason="reports need matplotlib: pip install 'streamwhiten[report]'")


def imread(*args, **kwargs):
    """matplotlib's ``imread``, imported when a test reads a figure (not when the file is collected)."""
    from matplotlib.image import imread as read

    return read(*args, **kwargs)


from streamwhiten.cli import main  # noqa: E402
from streamwhiten.core.model import finalize, save_model  # noqa: E402
from streamwhiten.engine.fit import fit_sources  # noqa: E402
from streamwhiten.errors import BadInputError, OutputExistsError  # noqa: E402
from streamwhiten.evaluation.evaluate import open_pairs  # noqa: E402
from streamwhiten.evaluation.report import collect, write_report  # noqa: E402
from streamwhiten.evaluation.tune import PairGrid, grid_search  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def setup(tmp_path):
    """A small fitted model and labelled pairs where whitening helps."""
    rng = np.random.default_rng(0)
    n, d = 300, 12
    rho = rng.uniform(0, 1, n)
    za = rng.standard_normal((n, d - 2))
    zb = rho[:, None] * za + np.sqrt(1 - rho[:, None] ** 2) * rng.standard_normal((n, d - 2))
    a = np.hstack([6 * rng.standard_normal((n, 2)), za]) + 3.0
    b = np.hstack([6 * rng.standard_normal((n, 2)), zb]) + 3.0
    path = str(tmp_path / "pairs.h5")
    with h5py.File(path, "w") as handle:
        handle["a"], handle["b"], handle["score"] = a.astype(np.float32), b.astype(np.float32), rho
    specs = (f"{path}:/a", f"{path}:/b", f"{path}:/score")
    model = finalize(fit_sources([specs[0], specs[1]]).state)
    model_path = str(tmp_path / "m.npz")
    save_model(model, model_path)
    return model, model_path, specs


def assert_real_image(payload: bytes, min_side=200):
    """A decodable PNG of a reasonable size that is not one flat colour."""
    assert payload[:8] == PNG_MAGIC
    pixels = imread(io.BytesIO(payload), format="png")
    assert min(pixels.shape[:2]) >= min_side
    assert pixels[..., :3].std() > 0.05


def test_html_report_embeds_every_figure(setup, tmp_path):
    model, _, specs = setup
    told = Phases()
    with open_pairs(*specs) as pairs:
        data = collect(model, pairs, progress=told)
    # both grids, each scored then correlated: the tuning grid, then the k curves'
    assert told.begun == told.ended and len(told.ended) == 4
    assert told.ended[0] == f"score {len(data.grid.table)} settings on 300 pairs"
    assert told.ended[1::2] == ["correlate and choose (maxt rule)"] * 2 and told.ended[2].startswith("score ")
    out = str(tmp_path / "report.html")
    assert write_report(data, out) == [out]
    text = open(out, encoding="utf-8").read()
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)
    assert len(images) == 4
    for encoded in images:
        assert_real_image(base64.b64decode(encoded))
    assert "raw Spearman x100" in text and f"All {len(data.grid.table)} settings" in text


def test_png_dashboard_and_directory(setup, tmp_path):
    model, _, specs = setup
    with open_pairs(*specs) as pairs:
        data = collect(model, pairs, grid=PairGrid(betas=[0, 1], gammas=[0, 0.5, 1], ks=[12, 4], variances=[0.9]))
    png = str(tmp_path / "report.png")
    write_report(data, png)
    assert_real_image(open(png, "rb").read(), min_side=800)
    written = write_report(data, str(tmp_path / "figs"))
    assert sorted(os.path.basename(p) for p in written) == [
        "heatmaps.png",
        "k_curve.png",
        "spectrum.png",
        "variance.png",
    ]
    for path in written:
        assert_real_image(open(path, "rb").read())


def test_curves_are_the_seed_settings_of_the_grid(setup):
    model, _, specs = setup
    with open_pairs(*specs) as pairs:
        data = collect(model, pairs, grid=PairGrid(variances=[]))
        reference = grid_search(model, pairs, grid=PairGrid(betas=[0, 1], gammas=[0, 1], ks=[12, 3], variances=[]))
    for row in reference.table:
        if row.beta == row.gamma:
            assert dict(data.curves[row.beta])[row.k] == pytest.approx(row.spearman, abs=1e-12)
    ks = [k for k, _ in data.curves[1.0]]
    assert ks == sorted(ks) and ks[0] == 1 and ks[-1] == model.n_features


def test_report_without_pairs_draws_the_spectrum_only(setup, tmp_path):
    model, _, _ = setup
    written = write_report(collect(model), str(tmp_path / "figs"))
    assert sorted(os.path.basename(p) for p in written) == ["spectrum.png", "variance.png"]
    png = str(tmp_path / "one.png")
    write_report(collect(model), png)
    assert_real_image(open(png, "rb").read())


def test_report_refuses_to_overwrite_and_odd_suffixes(setup, tmp_path):
    model, _, _ = setup
    out = str(tmp_path / "r.png")
    write_report(collect(model), out)
    with pytest.raises(OutputExistsError, match="already exists"):
        write_report(collect(model), out)
    write_report(collect(model), out, overwrite=True)
    with pytest.raises(BadInputError, match=r"a report is .html, .png or a directory"):
        write_report(collect(model), str(tmp_path / "r.pdf"))


def test_cli_report_runs_headless_without_pyplot(setup, tmp_path):
    """In a fresh interpreter with no display and a GUI backend requested: still renders, never loads pyplot."""
    _, model_path, specs = setup
    out = str(tmp_path / "r.html")
    code = (
        "import sys; from streamwhiten.cli import main; "
        f"rc = main(['report', {model_path!r}, '--pairs-a', {specs[0]!r}, '--pairs-b', {specs[1]!r}, "
        f"'--scores', {specs[2]!r}, '-o', {out!r}, '--json', '--betas', '0,1', '--gammas', '0,1']); "
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'; sys.exit(rc)"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MPLBACKEND"] = "TkAgg"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["files"] == [out] and os.path.getsize(out) > 10_000
    assert summary["best"]["spearman"] >= summary["raw"]["spearman"]


def test_cli_report_errors(setup, tmp_path, capsys):
    _, model_path, specs = setup
    out = str(tmp_path / "r.png")
    assert main(["report", model_path, "--pairs-a", specs[0], "-o", out]) == 2
    assert "give all three of --pairs-a, --pairs-b and --scores, or none" in capsys.readouterr().err
    assert main(["report", model_path, "-o", out, "-q"]) == 0
    capsys.readouterr()
    assert main(["report", model_path, "-o", out]) == 2
    assert "already exists (pass --overwrite" in capsys.readouterr().err


def test_a_model_tuned_for_retrieval_draws_its_frontier(tmp_path, capsys):
    from conftest import write_task

    from streamwhiten.core import stats
    from streamwhiten.evaluation.sweep import SweepGrid, sweep
    from streamwhiten.options import RetrievalOptions

    task = write_task(tmp_path, seed=1, n=400, n_queries=15)
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)))
    tuned, summary = sweep(
        model, task["spec_q"], task["spec_c"], task["qrels"],
        grid=SweepGrid(betas=[0, 1], gammas=[0, 1], ks=[16, 4], variances=[], max_bytes=20),
        options=RetrievalOptions(bootstrap=50),
    ).tuned()  # fmt: skip
    save_model(tuned, str(tmp_path / "tuned.npz"))
    assert main(["report", str(tmp_path / "tuned.npz"), "-o", str(tmp_path / "figures"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(os.path.basename(f) for f in out["files"]) == ["frontier.png", "spectrum.png", "variance.png"]
    assert out["frontier"] == json.loads(json.dumps(tuned.info["tuned"]["frontier"]))
    assert [row["bytes_per_vector"] for row in out["frontier"]] == [r["bytes_per_vector"] for r in summary["frontier"]]
    assert imread(str(tmp_path / "figures" / "frontier.png")).shape[0] > 300
    assert main(["report", str(tmp_path / "tuned.npz"), "-o", str(tmp_path / "r.html")]) == 0
    assert "frontier   " in capsys.readouterr().out
    page = (tmp_path / "r.html").read_text()
    assert "Retrieval: the frontier it was tuned on" in page and "20 bytes per vector" in page
    frontier_is_readable(tuned)
    # the rule and its cross-validated forecast, as the model records them
    predicted = tuned.info["tuned"]["selection"]["forecast"]
    assert "max-t:" in page and f"reference {predicted['reference']['score']:.2f}" in page
    # a model tuned on pairs, or not tuned, has no frontier to draw
    save_model(model, str(tmp_path / "plain.npz"))
    assert main(["report", str(tmp_path / "plain.npz"), "-o", str(tmp_path / "plain"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frontier"] is None


def frontier_is_readable(tuned) -> None:
    """The frontier panel, rendered: its title inside the figure, the score axis zoomed to what is drawn
    (the reference, the choice and the candidates near the reference, not 0-100), the reference named on
    the plot, and no candidate's label over the chosen star."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from streamwhiten.evaluation.report import FRONTIER_WINDOW, figures

    figure = figures(collect(tuned))["frontier"]
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    (ax,) = figure.axes
    record = tuned.info["tuned"]
    metric = record["metric"]
    reference = record["validation"]["raw"][metric]
    drawn = [row[metric] for row in record["frontier"] if row[metric] >= reference - FRONTIER_WINDOW]
    drawn += [reference, record["validation"]["chosen"][metric]]
    # under a budget the reference is the raw vectors in the storage that fits: marked and named apart
    budget_reference = record["selection"]["reference"]
    apart = budget_reference["bytes_per_vector"] != record["validation"]["raw"]["bytes_per_vector"]
    if apart:
        drawn.append(record["selection"]["forecast"]["reference"]["score"])
    low, high = ax.get_ylim()
    assert low <= min(drawn) and max(drawn) <= high and high - low <= 1.6 * (max(drawn) - min(drawn)) + 1.0
    whole = figure.bbox
    title = ax.title.get_window_extent(renderer)
    assert whole.x0 <= title.x0 and title.x1 <= whole.x1 and title.y1 <= whole.y1
    texts = [t for t in ax.texts if t.get_text()]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    if apart:
        name = f"reference: raw {budget_reference['storage']} k={budget_reference['k']}"
        assert any(t.get_text() == "raw float32" for t in texts) and any(e.startswith(name) for e in legend)
        assert not any("reference: raw float32" in e for e in legend)
    else:
        assert any(t.get_text() == "raw float32 (reference)" for t in texts)
    star = ax.transData.transform((record["setting"]["bytes_per_vector"], record["validation"]["chosen"][metric]))
    for text in texts:
        box = text.get_window_extent(renderer).expanded(1.0, 1.0)
        assert not box.contains(*star), f"label {text.get_text()!r} lies over the chosen star"


# ------------------------------------------------- the rule's choice and the highest score, named apart


def noisy_pairs(tmp_path, seed):
    """Pairs whose gold score is minus their distance plus noise: the raw cosines are about as good as any
    whitening, so the max-t rule keeps the raw vectors; with ``seed=2`` a setting scores higher by chance."""
    rng = np.random.default_rng(seed)
    n, d = 200, 8
    a = rng.standard_normal((n, d)) * np.geomspace(3, 0.3, d) + 2
    b = a + rng.standard_normal((n, d)) * rng.uniform(0.2, 2, (n, 1))
    score = -np.linalg.norm(a - b, axis=1) + rng.standard_normal(n) * 0.5
    path = str(tmp_path / f"noisy{seed}.h5")
    with h5py.File(path, "w") as handle:
        handle["a"], handle["b"], handle["score"] = a.astype(np.float32), b.astype(np.float32), score
    specs = (f"{path}:/a", f"{path}:/b", f"{path}:/score")
    model = finalize(fit_sources([specs[0], specs[1]]).state)
    model_path = str(tmp_path / f"noisy{seed}.npz")
    save_model(model, model_path)
    return model, model_path, specs


#: The grid of the label tests (small: 12 settings and the raw vectors).
LABEL_GRID = dict(betas=[0, 1], gammas=[0, 0.5, 1], ks=[8, 4], variances=[])
LABEL_FLAGS = ["--betas", "0,1", "--gammas", "0,0.5,1", "--ks", "8,4", "--variances", ""]


def test_the_report_names_the_rules_choice_and_the_highest_score_apart(tmp_path, capsys):
    """Issue #46: "best Spearman 86.72" boxed while the heat map shows 86.88. The choice of the rule and the
    highest score on these pairs are both shown, each labelled, in the figure, the page, the text and JSON."""
    from matplotlib.patches import Rectangle

    from streamwhiten.evaluation.report import figures

    model, model_path, specs = noisy_pairs(tmp_path, seed=2)
    with open_pairs(*specs) as pairs:
        data = collect(model, pairs, grid=PairGrid(**LABEL_GRID))
    grid = data.grid
    highest, best = grid.highest, grid.best
    assert best.vectors == "raw" and grid.selection.kept_reference  # the rule keeps the raw vectors
    assert highest.spearman == max(row.spearman for row in grid.table) > best.spearman + 0.5
    assert (highest.beta, highest.gamma, highest.k) == (0, 0.5, 8)
    drawn = figures(data)
    title = drawn["heatmaps"]._suptitle.get_text()
    assert f"green box: chosen by the rule, raw vectors, k=8 ({best.spearman:.2f})" in title
    assert f"dashed box: highest on these pairs, beta=0 gamma=0.5 k=8 ({highest.spearman:.2f})" in title
    boxes = [p for ax in drawn["heatmaps"].axes for p in ax.patches if isinstance(p, Rectangle)]
    assert sorted(p.get_linestyle() for p in boxes) == ["-", "--"]  # one box each
    legend = [t.get_text() for t in drawn["k_curve"].axes[0].get_legend().get_texts()]
    assert f"chosen by the rule: raw vectors, k=8: {best.spearman:.2f}" in legend
    assert f"highest on these pairs: beta=0 gamma=0.5 k=8: {highest.spearman:.2f}" in legend
    page = str(tmp_path / "r.html")
    write_report(data, page)
    text = open(page, encoding="utf-8").read()
    assert f"chosen by the rule (Spearman x100)</th><td>{best.spearman:.2f} at raw vectors, k=8" in text
    assert f"highest on these pairs (Spearman x100)</th><td>{highest.spearman:.2f} at beta=0 gamma=0.5" in text
    assert text.count("class=chosen") == 1 and text.count("class=highest") == 1 and "best" not in text.lower()
    args = ["report", model_path, "--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2], *LABEL_FLAGS]
    assert main([*args, "-o", str(tmp_path / "again.png"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "(chosen by the rule)" in out and "highest    Spearman x100  85.83" in out
    assert main([*args, "-o", str(tmp_path / "json.png"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["best"]["vectors"] == "raw" and summary["highest"]["spearman"] == pytest.approx(highest.spearman)


def test_where_the_rule_chose_the_highest_one_label_says_both(tmp_path, capsys):
    model, model_path, specs = noisy_pairs(tmp_path, seed=0)
    with open_pairs(*specs) as pairs:
        data = collect(model, pairs, grid=PairGrid(**LABEL_GRID))
    assert data.grid.highest is data.grid.best  # the rotation ties the raw vectors: a tie is the rule's choice
    from streamwhiten.evaluation.report import figures

    drawn = figures(data)
    assert "also the highest on these pairs" in drawn["heatmaps"]._suptitle.get_text()
    args = ["report", model_path, "--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2], *LABEL_FLAGS]
    assert main([*args, "-o", str(tmp_path / "r.html"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "(chosen by the rule, and highest on these pairs)" in out and "highest    " not in out
    assert "class=highest" not in (tmp_path / "r.html").read_text()


def test_the_heat_maps_are_of_the_grids_k_choices_whatever_the_raw_vectors_row(tmp_path):
    """The raw vectors' row (beta = gamma = 0, k = d) is no k choice of its own: a grid without k = d, or
    without beta = 0, drew a heat map for it with cells the grid does not have (a KeyError)."""
    from streamwhiten.evaluation.report import figures

    model, _, specs = noisy_pairs(tmp_path, seed=0)  # d = 8
    with open_pairs(*specs) as pairs:
        data = collect(model, pairs, grid=PairGrid(betas=[0.5, 1], gammas=[0, 1], ks=[4, 2], variances=[0.9]))
    assert data.k_labels() == ["4", "2", "90%"] and data.grid.table[-1].vectors == "raw"
    maps = [ax for ax in figures(data)["heatmaps"].axes if ax.get_visible() and ax.images]
    assert [ax.get_title() for ax in maps][:2] == ["k = 4", "k = 2"] and len(maps) == 3
    assert all(ax.images[0].get_array().shape == (2, 2) for ax in maps)  # beta 0.5, 1 by gamma 0, 1

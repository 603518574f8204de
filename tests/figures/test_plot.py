"""`plot`: a results folder drawn as panels (heatmap over a sweep, bars per row, loss curves) (SPEC.md §14)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from causalab_ref import cli
from causalab_ref.figures import plot
from causalab_ref.shapes import Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
matplotlib = pytest.importorskip("matplotlib")


def _run(doc: dict, tmp_path: Path, name: str) -> Path:
    path, out = tmp_path / f"{name}.json", tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert cli.main(["run", str(path), "--data-root", str(DATA), "--out", str(out), "--quiet"]) == 0
    return out


def _patching() -> dict:
    return json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tracing(tmp_path_factory):
    """patching.json swept over two layers and three positions (read and write move together: one `as` axis)."""
    doc = _patching()
    doc["sites"]["target"]["layers"] = {"sweep": [[0], [1]]}
    for iv in (doc["interventions"]["patching"]["reads"]["v_cf"], doc["interventions"]["patching"]["writes"]["patch"]):
        iv["pos"] = {"sweep": [-3, -2, -1], "as": "pos"}
    return _run(doc, tmp_path_factory.mktemp("plot"), "tracing")


def _lens(pos_sweep: dict, every: bool) -> dict:
    """documents/layer_sweep.json with its lens read's position swept; its layers "all" when `every`."""
    doc = json.loads((ROOT / "documents" / "layer_sweep.json").read_text(encoding="utf-8"))
    doc["interventions"]["lens"]["reads"]["lens"].update(pos_sweep)
    if every:
        doc["sites"]["resid"] = {"component": "block_output", "layers": "all"}
    return doc


def test_a_table_by_layer_beside_a_sweep_is_its_explicit_layer_sweep_turned(tmp_path):
    """SPEC.md:2444 [FG2] a table by layer (layers "all") beside a position sweep takes its layer as the second
    axis: the heatmap is the same document's with the layers swept, its axes the other way round, cell for cell
    (D34: each layer's rows are the swept point's, value for value)."""
    swept = {"pos": {"sweep": [-1, -2]}}
    explicit = plot.panels(_run(_lens(swept, False), tmp_path, "explicit"))
    layered = plot.panels(_run(_lens(swept, True), tmp_path, "every"))
    assert [p.kind for p in layered] == [p.kind for p in explicit] == ["heatmap", "heatmap"]
    for by_layer, by_sweep in zip(layered, explicit):
        assert (by_sweep.ylabel, by_sweep.xlabel, by_layer.ylabel, by_layer.xlabel) == ("layers", "pos", "pos", "layer")
        assert by_layer.values == tuple(zip(*by_sweep.values)) and by_layer.title == by_sweep.title
        assert by_layer.xticks == ("0", "1") and by_layer.yticks == by_sweep.xticks


def test_a_table_by_layer_beside_two_sweep_axes_is_refused_as_three(tmp_path):
    """SPEC.md:2444 [FG2] beside two sweep axes a table by layer would be a third axis: refused, naming it."""
    out = _run(_lens({"pos": {"sweep": [-1, -2]}, "view": {"sweep": ["logits"]}}, True), tmp_path, "three")
    with pytest.raises(Refusal) as refused:
        plot.panels(out)
    assert (refused.value.stage, refused.value.path) == ("plot", "OUT")
    assert "a sweep over 2 axes and a table by layer, 3 axes in all" in refused.value.message


def _mean(file: Path) -> float:
    rows = [r for r in json.loads(file.read_text(encoding="utf-8")) if r["eligible"]]
    return sum(r["value"] for r in rows) / len(rows)


def test_a_two_axis_sweep_is_a_heatmap_of_each_points_mean(tracing):
    """SPEC.md:2444 [FG2] the first axis down, the second across, each cell the mean over the point's eligible rows
    (recomputed here from each point's own table)."""
    panel = next(p for p in plot.panels(tracing) if p.title.startswith("logit_diff"))
    assert panel.kind == "heatmap" and (panel.ylabel, panel.xlabel) == ("layers", "pos")
    want = tuple(tuple(_mean(tracing / f"layers={layer},pos={pos}" / "logit_diff.json") for pos in (-3, -2, -1))
                 for layer in (0, 1))
    assert [len(row) for row in panel.values] == [3, 3]
    assert [v for row in panel.values for v in row] == pytest.approx([v for row in want for v in row], rel=1e-12)


def test_a_point_without_the_table_is_an_empty_cell(tracing, tmp_path):
    """SPEC.md:2444 [FG2] a point whose folder lacks a table (here the first point's, deleted) is an empty cell of
    that table's heatmap; the other cells keep their means."""
    import shutil

    copy = tmp_path / "tracing"
    shutil.copytree(tracing, copy)
    (copy / "layers=0,pos=-3" / "logit_diff.json").unlink()
    whole = next(p for p in plot.panels(tracing) if p.title.startswith("logit_diff"))
    holed = next(p for p in plot.panels(copy) if p.title.startswith("logit_diff"))
    assert holed.values[0][0] is None and whole.values[0][0] is not None
    assert [v for row in holed.values for v in row][1:] == [v for row in whole.values for v in row][1:]


def _plan(out: Path, capsys) -> list:
    """The run's document compiled again, as `explain --json` prints it."""
    capsys.readouterr()
    assert cli.main(["--json", "explain", str(out / "document.json"), "--data-root", str(DATA)]) == 0
    return json.loads(capsys.readouterr().out)["plan"]


def test_a_position_axis_is_labelled_by_the_decoded_tokens(tracing, capsys):
    """SPEC.md:2453 [FG3] the axis that moves where a write lands names, under each value, the first row's tokens
    there (as explain resolves them; seed 000:141 splits 'If today is Thursday, tomorrow is' as [..., ',', 'tom',
    'orrow', 'is']); the layer axis, which moves no position, names its values alone."""
    panel = next(p for p in plot.panels(tracing, _plan(tracing, capsys)) if p.title.startswith("iia"))
    assert panel.xticks == ("-3\n' tom'", "-2\n'orrow'", "-1\n' is'") and panel.yticks == ("0", "1")
    assert plot.panels(tracing)[0].xticks == ("-3", "-2", "-1")  # without the plan: the values alone


def test_the_drawn_figure_has_the_panels_axes_and_labels(tracing, capsys):
    """SPEC.md:2444 [FG2] SPEC.md:2453 [FG3] the matplotlib figure: one axes per metric table (and a colorbar each), titled, with
    the sweep's axis names and tick labels."""
    fig = plot.figure(tracing, _plan(tracing, capsys))
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(" ")[0] for ax in axes] == ["iia", "logit_diff"]
    assert all(ax.get_xlabel() == "pos" and ax.get_ylabel() == "layers" for ax in axes)
    assert [t.get_text() for t in axes[0].get_xticklabels()][-1] == "-1\n' is'"
    assert len(fig.axes) == 4  # two heatmaps and their colorbars


def test_a_run_with_no_sweep_is_bars_per_row(tmp_path):
    """SPEC.md:2461 [FG4] no sweep: a bar per row (ineligible rows at 0), titled with how many rows were eligible."""
    out = _run(_patching(), tmp_path, "plain")
    panel = next(p for p in plot.panels(out) if p.title.startswith("logit_diff"))
    rows = json.loads((out / "logit_diff.json").read_text(encoding="utf-8"))
    assert panel.kind == "bars" and panel.values == tuple(r["value"] for r in rows)
    assert panel.xticks == tuple(r["example_id"] for r in rows) and f"{len(rows)} of {len(rows)} rows" in panel.title


def test_a_bar_whose_value_is_not_a_number_is_drawn_at_zero(tmp_path):
    """SPEC.md:2461 [FG4] a damaged table whose eligible row holds an object, a string or a boolean (fuzz case
    7610) is drawn, that row's bar at 0, not an internal error in matplotlib."""
    out = _run(_patching(), tmp_path, "plain")
    rows = json.loads((out / "logit_diff.json").read_text(encoding="utf-8"))
    for row, bad in zip(rows, [{"a": 1}, "x", True]):
        row["value"] = bad
    (out / "logit_diff.json").write_text(json.dumps(rows), encoding="utf-8")
    panel = next(p for p in plot.panels(out) if p.title.startswith("logit_diff"))
    assert panel.values[:3] == (None, None, None) and panel.values[3:] == tuple(r["value"] for r in rows[3:])
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "f.svg")]) == 0 and (tmp_path / "f.svg").stat().st_size


def test_one_metric_in_several_tables_is_first_drawn_as_a_bar_per_table(tmp_path):
    """SPEC.md:2471 [FG8] a run with no sweep whose tables hold one metric twice or more: a first panel of that
    metric, a bar per table in path order at its mean over eligible rows (None where no row counts); each
    per-row panel is titled by its table's path; a metric held by one table gets no such panel."""
    out = _run(_patching(), tmp_path, "plain")
    rows = json.loads((out / "iia.json").read_text(encoding="utf-8"))
    control = [dict(r, value=0.0 if k else 1.0) for k, r in enumerate(rows)]
    (out / "control_iia.json").write_text(json.dumps(control), encoding="utf-8")
    (out / "empty_iia.json").write_text(json.dumps([dict(r, eligible=False) for r in rows]), encoding="utf-8")
    found = plot.panels(out)
    first = found[0]
    assert first.kind == "bars" and first.xticks == ("control_iia.json", "empty_iia.json", "iia.json")
    assert first.values == (1 / len(rows), None, _mean(out / "iia.json")) and first.title.startswith("iia")
    assert [p.title.split(":")[0] for p in found[1:]] == ["control_iia.json", "empty_iia.json", "iia.json",
                                                          "logit_diff.json"]
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "f.svg")]) == 0


def test_a_crowded_row_of_bar_ticks_is_turned_on_end(tmp_path):
    """SPEC.md:2471 [FG8] a bar panel whose ticks hold more than 60 characters side by side is turned 90
    degrees; one whose ticks fit is not."""
    out = _run(_patching(), tmp_path, "plain")
    rows = json.loads((out / "iia.json").read_text(encoding="utf-8"))
    long = [dict(r, example_id=f"{k}-" + "x" * 60) for k, r in enumerate(rows)]
    (out / "long_iia.json").write_text(json.dumps(long), encoding="utf-8")
    (out / "iia.json").write_text(json.dumps([dict(r, example_id=str(k)) for k, r in enumerate(rows)]),
                                  encoding="utf-8")
    fig = plot.figure(out)
    turned = {ax.get_title().split(":")[0]: ax.get_xticklabels()[0].get_rotation() for ax in fig.axes}
    assert turned["iia.json"] == 0 and turned["long_iia.json"] == 90


def test_a_fits_loss_curve_is_a_line_over_updates(tmp_path):
    """SPEC.md:2464 [FG5] a save of `<fit>/loss` is drawn as the losses in update order, read from its tensor file."""
    from safetensors.torch import load_file

    out = tmp_path / "das"
    assert cli.main(["run", str(ROOT / "documents" / "das.json"), "--data-root", str(DATA), "--out", str(out),
                     "--quiet"]) == 0
    curve = next(p for p in plot.panels(out) if p.kind == "curve")
    losses = load_file(str(out / "train_loss.safetensors"))["weight"].tolist()
    assert curve.values == tuple(losses) and curve.xlabel == "update" and len(losses) > 1


def test_the_figure_is_written_whole_as_png_or_svg(tracing, tmp_path):
    """SPEC.md:2466 [FG6] the file is PNG or SVG by its suffix, and no staging file is left beside it."""
    png, svg = plot.draw(tracing, tmp_path / "f.png"), plot.draw(tracing, tmp_path / "f.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:2000]
    assert sorted(os.listdir(tmp_path)) == ["f.png", "f.svg"]


def test_plot_refuses_what_it_cannot_draw_in_one_line(tracing, tmp_path, capsys):
    """SPEC.md:2442 [FG1] SPEC.md:2466 [FG6] a folder no run wrote, a suffix that is no figure, an existing file without
    --replace, a link, a name too long for the file system: exit 2, one line, nothing written, the link's target
    unchanged."""
    (tmp_path / "plain").mkdir()
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep")
    os.symlink(victim, tmp_path / "link.png")
    cases = [([str(tmp_path / "plain")], "OUT", "not a folder a run wrote"),
             ([str(tracing), "--out", str(tmp_path / "f.txt")], "--out", "a .png or a .svg"),
             ([str(tracing), "--out", str(victim)], "--out", "already exists"),
             ([str(tracing), "--out", str(tmp_path / "link.png"), "--replace"], "--out", "is a link")]
    cases.append(([str(tracing), "--out", str(tmp_path / ("c" * 300 + ".png"))], "--out",
                  "cannot write the figure"))  # a name the file system will not take (fuzz surface `results`)
    for argv, path, words in cases:
        assert cli.main(["plot", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"plot: {path}: ") and words in err[0]
    assert victim.read_bytes() == b"keep" and sorted(os.listdir(tmp_path)) == ["link.png", "plain", "victim.png"]


def test_a_sweep_over_three_axes_is_refused(tmp_path):
    """SPEC.md:2444 [FG2] a heatmap has two axes: a run swept over three is refused, naming the count."""
    doc = _patching()
    doc["sites"]["target"]["layers"] = {"sweep": [[0], [1]]}
    doc["interventions"]["patching"]["metrics"]["logit_diff"]["a"] = {"sweep": ["cf_answer", "answer"]}
    for iv in (doc["interventions"]["patching"]["reads"]["v_cf"], doc["interventions"]["patching"]["writes"]["patch"]):
        iv["pos"] = {"sweep": [-2, -1], "as": "pos"}
    out = _run(doc, tmp_path, "three")
    with pytest.raises(Refusal, match="a sweep over 3 axes; plot draws at most 2"):
        plot.panels(out)


def test_without_matplotlib_plot_names_the_extra(tracing, monkeypatch):
    """SPEC.md:2470 [FG7] matplotlib is an optional extra: without it, one line naming `causalab_ref[plot]`."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(Refusal) as caught:
        plot.figure(tracing)
    assert caught.value.path == "" and "pip install 'causalab_ref[plot]'" in caught.value.message


def test_what_is_not_a_metric_table_or_a_curve_in_the_folder_is_not_drawn(tmp_path):
    """SPEC.md:1107 [S13] a file that is not JSON (or nested too deep to read), JSON that is not a metric table, a link
    to a table outside, and a
    loss save whose tensor is not 1-D add no panel and raise nothing: the figure is the run's own tables."""
    import shutil

    import torch
    from safetensors.torch import save_file

    out = _run(_patching(), tmp_path, "plain")
    before = plot.panels(out)
    shutil.copy(out / "iia.json", tmp_path / "outside.json")
    (out / "junk.json").write_bytes(b"\xff{not json")
    (out / "list.json").write_text(json.dumps([{"a": 1}]), encoding="utf-8")
    (out / "deep.json").write_text("[" * 5000, encoding="utf-8")  # nested past the JSON reader (fuzz `results`)
    os.symlink(tmp_path / "outside.json", out / "linked.json")
    doc = json.loads((out / "document.json").read_text(encoding="utf-8"))
    doc["steps"]["score"]["saves"].append({"value": "fit/loss", "file_path": "loss.safetensors"})
    (out / "document.json").write_text(json.dumps(doc), encoding="utf-8")
    save_file({"weight": torch.zeros(2, 2)}, str(out / "loss.safetensors"))
    assert plot.panels(out) == before


@pytest.fixture(scope="module")
def weekday_tracing(tmp_path_factory):
    """documents/weekday_tracing.json as shipped (three layers x three positions, two of them JSON objects), run
    with one intra-op thread (the 64-wide model needs no second)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        doc = json.loads((ROOT / "documents" / "weekday_tracing.json").read_text(encoding="utf-8"))
        yield _run(doc, tmp_path_factory.mktemp("weekday"), "tracing")
    finally:
        torch.set_num_threads(before)


def test_a_scoped_positions_tick_is_its_anchor_and_tokens_not_its_json(weekday_tracing, capsys):
    """SPEC.md:2453 [FG3] the weekday tracing heatmap's position ticks, read off the drawn axes: a scoped
    position is its variable and index over the first test row's tokens (the row's entity is Monday, its shared
    word tomorrow, its last token ' is'), `-1` is short enough to stand as itself; no tick holds JSON, and no
    line of a tick is over 16 characters; three short ticks are not turned."""
    fig = plot.figure(weekday_tracing, _plan(weekday_tracing, capsys))
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(" ")[0] for ax in axes] == ["iia", "logit_diff"]
    for ax in axes:
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks == ["entity[-1]\n' Monday'", "shared[-1]\n' tomorrow'", "-1\n' is'"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2"]
        assert all(t.get_rotation() == 0 for t in ax.get_xticklabels())
    assert first_row_of_the_test_table()["entity"] == "Monday"


def first_row_of_the_test_table() -> dict:
    row: dict = json.loads((DATA / "weekday_trained" / "test.json").read_text(encoding="utf-8"))[0]
    return row


def test_a_long_tick_is_shortened_and_a_crowded_row_is_turned(tmp_path):
    """SPEC.md:2453 [FG3] tokens over 16 characters are shortened to 15 and an ellipsis; a value over 6 characters
    with no scope is left out, one with no tokens under it is shortened; twelve such ticks side by side are turned."""
    assert plot.tick("-2", "' a very long stretch of text'") == "-2\n' a very long s\u2026"
    assert plot.tick('{"index":-1,"scope":{"segment":"user"}}', "' hi'") == "user[-1]\n' hi'"
    assert plot.tick('{"span":[1,3]}', "' a b'") == "' a b'"
    panel = plot.Panel("heatmap", "t", ((0.0,) * 12,), xticks=tuple(f"'token number {k}'" for k in range(12)),
                       yticks=("0",))
    fig = matplotlib.figure.Figure()
    plot._draw_panel(fig.add_subplot(), panel)
    assert {t.get_rotation() for t in fig.axes[0].get_xticklabels()} == {30.0}


def _plain_with(tmp_path: Path, rows_of) -> Path:
    """A run with no sweep whose logit_diff.json is replaced by `rows_of(rows)`."""
    out = _run(_patching(), tmp_path, "plain")
    rows = json.loads((out / "logit_diff.json").read_text(encoding="utf-8"))
    (out / "logit_diff.json").write_text(json.dumps(rows_of(rows)), encoding="utf-8")
    return out


def test_a_value_past_a_floats_range_is_drawn_as_not_a_number(tmp_path):
    """SPEC.md:2479 [FG9] an eligible row whose value is a 400-digit integer (valid JSON, S41) is drawn as a value
    that is not a finite number, and a 300-digit one as its float; the figure is written (it was an internal
    error, OverflowError)."""
    out = _plain_with(tmp_path, lambda rows: [dict(rows[0], value=10 ** 400), dict(rows[1], value=10 ** 300),
                                              *rows[2:]])
    panel = next(p for p in plot.panels(out) if p.title.startswith("logit_diff"))
    assert panel.values[:2] == (None, 1e300)
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "f.png")]) == 0 and (tmp_path / "f.png").stat().st_size


def test_a_long_table_draws_its_first_rows_and_says_so(tmp_path):
    """SPEC.md:2479 [FG9] a table of 100,000 rows is drawn as 100 bars and 100 ticks, titled with every row's
    eligible count and `the first 100 drawn` (it drew a bar and a tick per row)."""
    n = 100_000
    out = _plain_with(tmp_path, lambda rows: [dict(rows[k % len(rows)], example_id=str(k), eligible=k % 3 > 0)
                                              for k in range(n)])
    panel = next(p for p in plot.panels(out) if p.title.startswith("logit_diff"))
    eligible = sum(1 for k in range(n) if k % 3 > 0)
    assert len(panel.values) == len(panel.xticks) == plot.MOST_BARS == 100
    assert panel.title.endswith(f"{eligible} of {n} rows eligible; the first 100 drawn")
    fig = plot.figure(out)
    ax = next(a for a in fig.axes if a.get_title().startswith("logit_diff"))
    assert len(ax.patches) == 100 and len(ax.get_xticklabels()) == 100


def test_a_figure_draws_at_most_24_panels_and_says_how_many_it_left(tmp_path):
    """SPEC.md:2479 [FG9] 30 metric tables give 24 panels and a title naming 24 of the panels there are."""
    out = _run(_patching(), tmp_path, "plain")
    rows = json.loads((out / "iia.json").read_text(encoding="utf-8"))
    for k in range(28):
        (out / f"t{k:02d}.json").write_text(json.dumps([dict(r, metric=f"m{k}") for r in rows]), encoding="utf-8")
    total = len(plot.panels(out))
    fig = plot.figure(out)
    assert total == 30 and len(fig.axes) == 24
    assert fig._suptitle.get_text().startswith("the first 24 of 30 panels drawn")


def test_a_readout_table_of_lists_is_not_drawn(tmp_path):
    """SPEC.md:2479 [FG9] a table whose rows hold lists ([token, probability] pairs, a top_k readout) is not
    drawn; the other tables are, and a folder holding only such tables is refused in one line."""
    pairs = [[" Monday", 0.5], [" Tuesday", 0.25]]
    out = _plain_with(tmp_path, lambda rows: [dict(r, metric="top_k", value=pairs, unit="") for r in rows])
    titles = [p.title for p in plot.panels(out)]
    assert titles and not any("logit_diff.json" in t or "top_k" in t for t in titles)
    (out / "iia.json").unlink()
    with pytest.raises(Refusal, match="nothing to draw"):
        plot.panels(out)


def test_a_fraction_is_drawn_on_0_1_and_a_logit_difference_centred_on_0(tracing):
    """SPEC.md:2488 [FG10] read from the drawn figure: the iia heatmap's colour limits are (0, 1) whatever its
    means; the logit_diff heatmap's are (-m, m), m the largest |mean| recomputed from the points' tables, with a
    diverging map."""
    fig = plot.figure(tracing)
    images = {ax.get_title().split(" ")[0]: ax.images[0] for ax in fig.axes if ax.images}
    assert images["iia"].get_clim() == (0.0, 1.0)
    reach = max(abs(_mean(tracing / f"layers={layer},pos={pos}" / "logit_diff.json"))
                for layer in (0, 1) for pos in (-3, -2, -1))
    low, high = images["logit_diff"].get_clim()
    assert (low, high) == pytest.approx((-reach, reach), rel=1e-9) and images["logit_diff"].cmap.name == "RdBu_r"


def test_a_small_fraction_is_not_drawn_in_the_colour_of_one(tmp_path):
    """SPEC.md:2488 [FG10] a heatmap of fractions 0.074 and 0.08 (its range's ends, which the colour scale was
    fit to) draws 0.074 near the colour of 0: the limits are (0, 1), not (0.074, 0.08)."""
    plt = plot._pyplot()
    fig, ax = plt.subplots()
    plot._draw_panel(ax, plot.Panel("heatmap", "iia (fraction)", ((0.074, 0.08),), xticks=("a", "b"),
                                    unit="fraction"))
    image = ax.images[0]
    assert image.get_clim() == (0.0, 1.0)
    assert image.norm(0.074) == pytest.approx(0.074) and image.norm(0.08) == pytest.approx(0.08)
    plt.close(fig)

"""Plot: a run's results folder drawn as a researcher looks at it (SPEC.md §14, FG1-FG8).

A figure has one panel per metric table the run wrote and one per fit's loss curve. A metric over a sweep
is a heatmap of its mean over eligible rows (two sweep axes: the first down, the second across; one axis:
a single row, or, for a table of rows by layer, the layer across); a metric of a run with no sweep is a bar
per row, and one metric held by several tables of such a run (a method beside its controls) is first drawn
as one bar per table, its mean. A sweep axis that moves the positions a table reports is labelled by each
point's decoded tokens as well as its value. Nothing here writes inside the results folder; the figure goes
to its own file, whole or not at all.

    from causalab_ref.figures import plot
    fig = plot.figure(Path("out"))                  # a matplotlib Figure, nothing written
    plot.draw(Path("out"), Path("out.png"))         # written (PNG or SVG by the suffix)

`python -m causalab_ref plot OUT` compiles the run's document again (as `explain` does, no weights) so that a
swept position's ticks say where it lands on the first row; the figure itself needs only the folder.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..documents import sweeps
from ..runs import results
from ..shapes import Refusal, read_json

SUFFIXES = (".png", ".svg")
MOST_AXES = 2
#: a tick names its value only when the value is this short (an index, a layer); a longer one (a position's
#: JSON object) is named by the tokens it lands on alone (FG3)
VALUE_CHARS = 6
#: decoded tokens on a tick are shortened to this many characters, the last one an ellipsis (FG3)
TOKEN_CHARS = 16
#: a heatmap's ticks are turned when their columns hold more characters than this, laid side by side (FG3)
ROW_CHARS = 60
#: a bar panel of at most this many bars writes each bar's value above it (FG8)
LABELLED_BARS = 8
#: a bar panel draws at most this many rows, the first in the table's order, and its title says so (FG9)
MOST_BARS = 100
#: a heatmap writes each cell's mean in it when it has at most this many cells (FG9)
LABELLED_CELLS = 400
#: a heatmap's axis is ticked at most this many times, every k-th value (FG9)
MOST_TICKS = 40
#: a figure draws at most this many panels, in order, and its title says how many it left out (FG9)
MOST_PANELS = 24
#: the units of a share of rows or of a probability: drawn on the fixed colour scale [0, 1] (FG10)
UNIT_SCALE = ("fraction", "probability")
#: the units of a signed number (a logit, a logit difference): drawn on a scale centred on 0 (FG10)
SIGNED = ("logit",)


@dataclass(frozen=True)
class Panel:
    """One panel: a metric over the sweep (`grid`: rows x columns of means, None where no row is eligible),
    a metric per row (`bars`), or a loss curve (`curve`)."""

    kind: str  # "heatmap" | "bars" | "curve"
    title: str
    values: tuple  # heatmap: tuple of rows; bars and curve: a flat tuple
    xlabel: str = ""
    ylabel: str = ""
    xticks: tuple = ()
    yticks: tuple = ()
    unit: str = ""


def _fail(message: str, path: str = "OUT") -> Refusal:
    return Refusal(message, path=path, stage="plot")


# ---------------------------------------------------------------- reading the folder


def _points(out: Path) -> list[tuple[tuple, Path]]:
    """((axis, value) per sweep axis, folder) for each point, in the document's sweep order (D17, D18)."""
    try:
        lowered = sweeps.points(read_json(out / "document.json"))  # None (nothing readable) is refused too
    except (ValueError, RecursionError, Refusal):
        raise _fail(f"{out} holds no document.json a run wrote; plot draws the folder a run wrote "
                    "(its --out)") from None
    if len(lowered) == 1 and not lowered[0][0]:
        return [((), out)]
    found = []
    for label, _doc in lowered:
        axes = tuple(tuple(part.split("=", 1)) for part in _split_label(label))
        found.append((axes, out / label))
    return found


def _split_label(label: str) -> list[str]:
    """`layers=0,pos=[1,2]` -> ['layers=0', 'pos=[1,2]']: each value is compact JSON, whose commas are inside it."""
    parts, rest = [], label
    decoder = json.JSONDecoder()
    while rest:
        name, _eq, tail = rest.partition("=")
        _value, end = decoder.raw_decode(tail)
        parts.append(f"{name}={tail[:end]}")
        rest = tail[end:].removeprefix(",")
    return parts


def _tables(folder: Path) -> dict[str, list[dict]]:
    """The metric tables in one point's folder: {relative path: rows}."""
    tables = {}
    for file in sorted(folder.rglob("*.json")):
        if file.name in ("document.json", "run.json") or file.is_symlink():
            continue
        rows = read_json(file)  # None when not JSON, or nested past what the reader takes
        if isinstance(rows, list) and rows and all(isinstance(r, dict) and "metric" in r and "value" in r
                                                   for r in rows) and not _readout(rows):
            tables[file.relative_to(folder).as_posix()] = rows
    return tables


def _readout(rows: list[dict]) -> bool:
    """A table whose values are lists (a readout such as top_k's tokens and probabilities): no number to draw
    (FG9)."""
    return any(isinstance(r.get("value"), list) for r in rows)


def _curves(folder: Path) -> dict[str, list[float]]:
    """The loss curves one point's fits saved: {save's file: losses}, from its document's saves of `<fit>/loss`."""
    doc = read_json(folder / "document.json")
    steps = doc.get("steps") if isinstance(doc, dict) else None
    curves = {}
    for step in steps.values() if isinstance(steps, dict) else ():
        saves = step.get("saves") if isinstance(step, dict) else None
        for save in saves if isinstance(saves, list) else ():
            value, file = (save.get("value", ""), save.get("file_path", "")) if isinstance(save, dict) else ("", "")
            if isinstance(value, str) and value.endswith("/loss") and str(file).endswith(".safetensors"):
                losses = _tensor_values(folder / file)
                if losses is not None:
                    curves[file] = losses
    return curves


def _tensor_values(file: Path) -> Optional[list[float]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            names = list(handle.keys())
            tensor = handle.get_tensor(names[0]) if len(names) == 1 else None
    except (OSError, SafetensorError, ValueError):
        return None
    return [float(v) for v in tensor.flatten().tolist()] if tensor is not None and tensor.dim() == 1 else None


# ---------------------------------------------------------------- panels


def _number(row: dict) -> Optional[float]:
    """An eligible row's value read as a float when it is a finite one (an integer past a float's range is
    not); None for every other row (FG4, FG9)."""
    value = row.get("value")
    if not row.get("eligible") or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _mean(rows: list[dict]) -> Optional[float]:
    """The mean over eligible rows with a finite value, as the run's summary line gives it (S19); None: no row."""
    values = [v for v in map(_number, rows) if v is not None]
    return sum(values) / len(values) if values else None


def plan_tokens(plan: list[dict]) -> dict[str, list[tuple[tuple, str]]]:
    """{point label: [((step, forward, kind, tap), first row's tokens), ...] in plan order} from the structured
    plan `explain --json` prints (runs/plan.py `plan_json`): where each tap lands on the point's first row."""
    found: dict[str, list[tuple[tuple, str]]] = {}
    for leaf in plan:
        taps = found.setdefault(leaf.get("label", ""), [])
        for step in leaf.get("steps", []):
            for k, forward in enumerate(step.get("forwards", [])):
                for tap in forward.get("taps", []):
                    tokens = tap.get("tokens") or []
                    if tokens and isinstance(tokens[0], str):
                        taps.append(((step.get("name"), k, tap.get("kind"), tap.get("name")), tokens[0]))
    return found


def _axis_ticks(points, axis: int, tap_tokens: dict[str, list[tuple[tuple, str]]]) -> tuple[list[str], tuple[str, ...]]:
    """(the axis's values in sweep order, their tick labels): each value, and under it the first row's tokens at
    the first tap (a write before a read) whose landing moves along the axis (FG3)."""
    values: list[str] = []
    seen: dict[str, dict[tuple, str]] = {}
    for axes, _folder in points:
        value = axes[axis][1]
        if value not in values:
            values.append(value)
            seen[value] = dict(tap_tokens.get(",".join(f"{a}={v}" for a, v in axes), []))
    keys = [key for key, _tokens in next(iter(tap_tokens.values()), [])] if tap_tokens else []
    keys.sort(key=lambda key: key[2] != "write")
    moving = next((key for key in keys if len({seen[v].get(key) for v in values}) > 1
                   and all(key in seen[v] for v in values)), None)
    if moving is None:
        return values, tuple(_shorten(v) for v in values)
    return values, tuple(tick(v, seen[v][moving]) for v in values)


def _shorten(text: str) -> str:
    """`text`, or its first TOKEN_CHARS - 1 characters and an ellipsis."""
    return text if len(text) <= TOKEN_CHARS else text[:TOKEN_CHARS - 1] + "\u2026"


def _short(value: str) -> str:
    """A tick's name for a sweep value: the value when it is short; a scoped position's anchor and index
    (`entity[-1]` for `{"index":-1,"scope":{"variable":"entity"}}`); otherwise nothing (FG3)."""
    if len(value) <= VALUE_CHARS:
        return value
    try:
        pos = json.loads(value)
    except ValueError:
        return ""
    scope = pos.get("scope") if isinstance(pos, dict) else None
    anchor = next((scope[k] for k in ("variable", "segment") if isinstance(scope, dict)
                   and isinstance(scope.get(k), str)), "")
    index = pos.get("index") if anchor else None
    return _shorten(f"{anchor}[{index}]" if isinstance(index, int) else anchor)


def tick(value: str, tokens: str) -> str:
    """A moved position's tick: its short name (if any) over the decoded tokens, shortened to TOKEN_CHARS (FG3)."""
    name = _short(value)
    return f"{name}\n{_shorten(tokens)}" if name else _shorten(tokens)


def _heatmap(points, rows_of: dict, tap_tokens: dict) -> Panel:
    names = [a for a, _v in points[0][0]]
    first = next(rows for rows in rows_of.values() if rows)[0]  # a point may lack the table (FG2)
    title = f"{first['metric']} ({first.get('unit', '')}): mean over eligible rows"
    across, xticks = _axis_ticks(points, len(names) - 1, tap_tokens)
    down, yticks = _axis_ticks(points, 0, tap_tokens) if len(names) == 2 else ([""], ("",))
    grid = []
    for d in down:
        grid.append(tuple(_mean(rows_of.get((d, a) if len(names) == 2 else (a,), [])) for a in across))
    return Panel("heatmap", title, tuple(grid), xlabel=names[-1], ylabel=names[0] if len(names) == 2 else "",
                 xticks=xticks, yticks=yticks if len(names) == 2 else (), unit=str(first.get("unit", "")))


def _layered(rows_of: dict) -> bool:
    """A table of rows by layer (a metric of a read at every layer, D34): every row of every point carries one."""
    return any(rows_of.values()) and all("layer" in r for rows in rows_of.values() for r in rows)


def _by_layer(out: Path, points, rows_of: dict, tap_tokens: dict) -> tuple:
    """(points, rows_of, tap_tokens) with the rows' `layer` as one more axis after the sweep's, in the order the
    layers first come; a cell is then one point's rows at one layer (FG2). Beside two sweep axes it would be
    three, and is refused."""
    if len(points[0][0]) + 1 > MOST_AXES:
        raise _fail(f"{out} is a sweep over {len(points[0][0])} axes and a table by layer, {len(points[0][0]) + 1} "
                    f"axes in all; plot draws at most {MOST_AXES} (a heatmap); sweep fewer fields, or plot each "
                    "point's folder")
    rows_by_layer: dict[tuple, dict[str, list]] = {}  # each point's rows by their layer, spelled as a label spells it
    for values, rows in rows_of.items():
        for r in rows:
            rows_by_layer.setdefault(values, {}).setdefault(json.dumps(r["layer"], separators=(",", ":")), []).append(r)
    layers = list(dict.fromkeys(layer for at_point in rows_by_layer.values() for layer in at_point))
    by_layer, tokens, layered = {}, {}, []
    for axes, folder in points:
        label, values = ",".join(f"{a}={v}" for a, v in axes), tuple(v for _a, v in axes)
        for layer in layers:
            layered.append((axes + (("layer", layer),), folder))
            by_layer[values + (layer,)] = rows_by_layer.get(values, {}).get(layer, [])
            tokens[f"{label},layer={layer}"] = tap_tokens.get(label, [])
    return layered, by_layer, tokens


def _bars(table: str, rows: list[dict]) -> Panel:
    """A bar per row, of the first MOST_BARS rows; the title counts the eligible rows of all (FG4, FG9)."""
    first = rows[0]
    eligible = sum(1 for r in rows if r.get("eligible"))
    title = f"{table}: {first['metric']} ({first.get('unit', '')}): {eligible} of {len(rows)} rows eligible"
    drawn = rows[:MOST_BARS]
    if len(rows) > MOST_BARS:
        title += f"; the first {MOST_BARS} drawn"
    values = tuple(map(_number, drawn))
    layered = all("layer" in r for r in rows)  # a metric of a read at every layer: a bar per (layer, example), D34
    return Panel("bars", title, values, xlabel="layer/example_id" if layered else "example_id",
                 ylabel=str(first.get("unit", "")),
                 xticks=tuple(f"{r['layer']}/{r.get('example_id', k)}" if layered else str(r.get("example_id", k))
                              for k, r in enumerate(drawn)))


def _means(tables: dict[str, list[dict]]) -> list[Panel]:
    """One panel per metric that two or more tables of a run with no sweep hold (the same `metric` and `unit`):
    a bar per table, its mean over eligible rows with a finite value (FG8); a table with no such row is 0."""
    by_metric: dict[tuple[str, str], list[str]] = {}
    for name, rows in tables.items():
        by_metric.setdefault((str(rows[0].get("metric")), str(rows[0].get("unit", ""))), []).append(name)
    return [Panel("bars", f"{metric} ({unit}): the mean of each table", tuple(_mean(tables[n]) for n in names),
                  xlabel="table", ylabel=unit, xticks=tuple(names))
            for (metric, unit), names in by_metric.items() if len(names) > 1]


def check_folder(out: Path) -> None:
    """A folder plot draws is one a run wrote: its run.json names causalab_ref (FG1)."""
    if results.record_of(Path(out)) is None:
        raise _fail(f"{out} is not a folder a run wrote (it holds no run.json of causalab_ref); plot draws the "
                    "folder a run wrote (its --out)")


def panels(out: Path, plan: Optional[list[dict]] = None) -> list[Panel]:
    """Every panel of the figure of the results folder `out` (FG2-FG5); `plan` is the run's document compiled
    again as `explain --json` prints it, which says where each swept position lands (FG3)."""
    out = Path(out)
    check_folder(out)
    points = _points(out)
    if len(points[0][0]) > MOST_AXES:
        raise _fail(f"{out} is a sweep over {len(points[0][0])} axes; plot draws at most {MOST_AXES} (a heatmap); "
                    "sweep fewer fields, or plot each point's folder")
    found: list[Panel] = []
    read = {tuple(v for _a, v in axes): _tables(folder) for axes, folder in points}  # each folder's files read once
    names = sorted({t for tables in read.values() for t in tables})
    if not points[0][0]:
        found.extend(_means(read[()]))
    for table in names:
        rows_of = {values: tables.get(table, []) for values, tables in read.items()}
        if points[0][0] and _layered(rows_of):
            found.append(_heatmap(*_by_layer(out, points, rows_of, plan_tokens(plan or []))))
        elif points[0][0]:
            found.append(_heatmap(points, rows_of, plan_tokens(plan or [])))
        else:
            found.append(_bars(table, rows_of[()]))
    for axes, folder in points:
        label = ",".join(f"{a}={v}" for a, v in axes)
        for file, losses in _curves(folder).items():
            found.append(Panel("curve", f"{file}{' at ' + label if label else ''}: loss per update",
                               tuple(losses), xlabel="update", ylabel="loss"))
    if not found:
        raise _fail(f"{out} holds no metric table of numbers and no loss curve (a table whose value per row is a "
                    "list, top_k's, is not drawn); there is nothing to draw")
    return found


# ---------------------------------------------------------------- drawing


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise _fail("matplotlib is not installed; install the extra: pip install 'causalab_ref[plot]'",
                    path="") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scale(panel: Panel) -> tuple[str, Optional[float], Optional[float]]:
    """(colour map, low, high) of a heatmap by its unit: a fraction or a probability on [0, 1]; a signed unit
    (a logit) centred on 0, out to the largest |mean| (1 when every mean is 0); any other unit its means'
    range (None, None: matplotlib's) (FG10)."""
    if panel.unit in UNIT_SCALE:
        return "viridis", 0.0, 1.0
    if panel.unit in SIGNED:
        reach = max((abs(v) for row in panel.values for v in row if v is not None), default=0.0) or 1.0
        return "RdBu_r", -reach, reach
    return "viridis", None, None


def _every(ticks: tuple) -> list[int]:
    """The tick positions drawn: every one, or every k-th so that at most MOST_TICKS are (FG9)."""
    return list(range(0, len(ticks), max(1, math.ceil(len(ticks) / MOST_TICKS))))


def _draw_panel(ax, panel: Panel) -> None:
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.kind == "heatmap":
        grid = [[math.nan if v is None else v for v in row] for row in panel.values]  # (down, across)
        cmap, low, high = scale(panel)
        image = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=low, vmax=high)
        ax.figure.colorbar(image, ax=ax)
        shown = _every(panel.xticks)
        widest = max((len(line) for t in panel.xticks for line in t.split("\n")), default=0)
        turned = widest * len(shown) > ROW_CHARS
        ax.set_xticks(shown, [panel.xticks[k] for k in shown], fontsize=7, rotation=30 if turned else 0,
                      ha="right" if turned else "center")
        down = _every(panel.yticks or ("",) * len(grid))
        ax.set_yticks(down, [(panel.yticks or ("",) * len(grid))[k] for k in down], fontsize=7)
        if len(grid) * len(grid[0]) <= LABELLED_CELLS:
            for y, row in enumerate(panel.values):
                for x, v in enumerate(row):
                    ax.text(x, y, "-" if v is None else f"{v:.3g}", ha="center", va="center", fontsize=6,
                            color="w")
    elif panel.kind == "bars":
        heights = [0 if v is None else v for v in panel.values]
        ax.bar(range(len(heights)), heights)
        crowded = sum(len(t) for t in panel.xticks) > ROW_CHARS  # FG8: a crowded row stands on end
        ax.set_xticks(range(len(panel.xticks)), panel.xticks, fontsize=5 if crowded else 7,
                      rotation=90 if crowded else 0)
        if len(heights) <= LABELLED_BARS:  # a few bars (FG8's means) carry their numbers
            for x, v in enumerate(panel.values):
                ax.text(x, heights[x], "-" if v is None else f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    else:
        ax.plot(range(len(panel.values)), panel.values, marker="o")


def figure(out: Path, plan: Optional[list[dict]] = None):
    """The matplotlib Figure of the folder `out`, drawn and not written."""
    plt = _pyplot()
    found = panels(out, plan)
    drawn = found[:MOST_PANELS]
    fig, axes = plt.subplots(len(drawn), 1, figsize=(8, 2.6 * len(drawn)), squeeze=False)
    for ax, panel in zip(axes[:, 0], drawn):
        _draw_panel(ax, panel)
    if len(found) > MOST_PANELS:  # FG9: the figure says what it left out
        fig.suptitle(f"the first {MOST_PANELS} of {len(found)} panels drawn; plot a point's folder for the rest",
                     fontsize=9)
    fig.tight_layout()
    return fig


def target_of(out: Path, target: Optional[Path], replace: bool) -> Path:
    """The figure's file: `target`, or `<out>.png` beside the folder; checked (FG6)."""
    return _target(Path(target) if target is not None else Path(out).parent / f"{Path(out).name}.png", replace)


def _target(target: Path, replace: bool) -> Path:
    """A figure's file: .png or .svg, never through a link, an existing file only with --replace (FG5)."""
    if target.suffix.lower() not in SUFFIXES:
        raise _fail(f"--out {target}: a figure is a .png or a .svg file; name one", path="--out")
    try:
        link, exists, is_file = target.is_symlink(), target.exists(), target.is_file()
    except OSError as error:  # a name the file system will not take (too long)
        raise _unwritable(target, error) from None
    if link or (exists and not is_file):
        raise _fail(f"--out {target} is a link or a folder; name a new file", path="--out")
    if exists and not replace:
        raise _fail(f"--out {target} already exists; choose a new file or say --replace", path="--out")
    return target


def _unwritable(target: Path, error: OSError) -> Refusal:
    return _fail(f"cannot write the figure {target}: {error.strerror or type(error).__name__}; name a file "
                 "in a folder that exists and can be written", path="--out")


def draw(out: Path, target: Optional[Path] = None, replace: bool = False, plan: Optional[list[dict]] = None) -> Path:
    """Write the figure of `out` to `target` (default `<out>.png` beside the folder), whole or not at all."""
    out = Path(out)
    target = target_of(out, target, replace)
    fig = figure(out, plan)
    staged = None
    try:
        fd, staged = tempfile.mkstemp(prefix=f".{target.name}.partial-", suffix=target.suffix, dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format=target.suffix.lower().lstrip("."), dpi=120)
        os.replace(staged, target)
    except OSError as error:
        raise _unwritable(target, error) from None
    finally:
        if staged is not None and os.path.exists(staged):
            os.unlink(staged)
    return target

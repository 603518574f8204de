"""The Python API (SPEC.md §16): load a model once, read, compile and run documents on it in memory, one
tidy table of a run's metric rows, and the results saved as the folder `run` writes. The CLI is a shell
over these calls (cli.py).

    model = load("fixture:tiny-llama")
    results = run(read("documents/patching.json"), model)
    results.table()                  # plain records: point, coordinates, file, then each metric row's fields
    results.save("out")              # byte for byte the folder `run --out out` writes
"""
from __future__ import annotations

import csv
import io
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from .documents.validate import Document, own_paths
from .shapes import Refusal

DATA_ROOT = "documents/data"
#: the most bytes `table` reads of one file of a results folder (run.json, a metric table)
MOST_TABLE_BYTES = 1 << 30


# ---------------------------------------------------------------- documents


def read(document: Union[str, os.PathLike, dict]) -> Document:
    """A document from a path or a dict, read, lowered and validated as `validate` reads a file; a refusal
    raises Refusal, the CLI's stage, path and message. A dict is read as the JSON text it would be."""
    from .documents import validate
    return validate.read(document)


# ---------------------------------------------------------------- models and plans


def load(key: str, engine: str = "nnterp", dtype: str = "fp32", device_map: str = "cpu", revision: str = "main",
         attn_implementation: Optional[str] = None):
    """A loaded model (an engine): a fixture key (`fixture:tiny-llama`), a hub key or a checkpoint folder's
    path; `engine` nnterp or hooks; `dtype` fp32 or bf16; `device_map` cpu, cuda, cuda:N or auto. Load it
    once: every document whose model block names it runs on it."""
    from .engines import loading
    from .shapes import Model
    if engine not in ("nnterp", "hooks", "ndif"):
        raise Refusal(f"engine '{engine}' is not one of nnterp, hooks, ndif", path="engine", stage="compile")
    return loading.load(Model(key=key, revision=revision, dtype=dtype, attn_implementation=attn_implementation),
                        kind=engine, weights=True, device_map=device_map)


@dataclass(frozen=True)
class Plan:
    """A document compiled on a model: `text()` is what `explain` prints, `explain()` what `--json explain`
    prints; `plan` is runs.plan's, `coordinates` each point's (label -> coordinates)."""

    document: Document
    model: Any = field(repr=False)
    plan: Any = field(repr=False)

    @property
    def coordinates(self) -> dict:
        return self.plan.coordinates

    def text(self) -> str:
        return self.plan.text()

    def explain(self) -> dict:
        from .runs.plan import plan_json
        return {"text": self.plan.text(),
                "steps": [leaf.label or step.name for leaf in self.plan.leaves() for step in leaf.steps],
                "plan": plan_json(self.plan, self.model)}


def compile(document: Union[Document, str, os.PathLike, dict], model, data_root: Union[str, os.PathLike] = DATA_ROOT,
            memory_budget: Union[int, str, None] = None) -> Plan:
    """The document (read first when a path or a dict) compiled on `model` (from `load`), whose key,
    revision, dtype and attention must be the document's model block's."""
    document = document if isinstance(document, Document) else read(document)
    with own_paths(document):
        if _spec_key(model.spec) != _spec_key(document.model):
            raise Refusal(f"the document's model is {_spec_text(document.model)}, and the model given is "
                          f"{_spec_text(model.spec)}; load the document's model (causalab_ref.load)",
                          path="model", stage="compile")
        return _compile_on(document, model, data_root, memory_budget)


def _spec_key(spec) -> tuple:
    return spec.key, spec.revision, spec.dtype, spec.attn_implementation


def _spec_text(spec) -> str:
    attention = f" attention {spec.attn_implementation}" if spec.attn_implementation else ""
    return f"{spec.key} revision {spec.revision} dtype {spec.dtype}{attention}"


def _compile_on(document: Document, engine, data_root, memory_budget) -> Plan:
    from .runs import compile as compiler
    from .runs import memory
    budget = memory.parse_budget(None if memory_budget is None else str(memory_budget))
    return Plan(document=document, model=engine, plan=compiler.compile_read(document, engine, Path(data_root), budget))


def compiled(document: Document, data_root, memory_budget=None, engine: str = "nnterp", weights: bool = False,
             device_map: str = "cpu") -> Plan:
    """The CLI's compile: the document's model loaded (weightless where the verb needs no weights,
    engines/loading.compiled) and the document compiled on it."""
    from .engines import loading
    from .runs import memory
    memory.parse_budget(None if memory_budget is None else str(memory_budget))  # refused before any load
    with own_paths(document):
        found: dict = {}

        def on(eng):
            found["plan"] = _compile_on(document, eng, data_root, memory_budget)
            return found["plan"]
        _eng, plan = loading.compiled(document.model, on, kind=engine, weights=weights, device_map=device_map)
        return plan


# ---------------------------------------------------------------- running


def run(document: Union[Plan, Document, str, os.PathLike, dict], model, data_root: Union[str, os.PathLike] = DATA_ROOT,
        batch_size: Optional[int] = None, memory_budget: Union[int, str, None] = None,
        progress: Optional[bool] = None) -> "Results":
    """Run a plan, or a document compiled first, on `model`, in memory: nothing is written (`Results.save`
    writes). `progress`: None a bar on stderr when it is a terminal, True always, False never."""
    from .runs import run as runner
    if not any(progress is allowed for allowed in (None, True, False)):
        raise Refusal(f"progress {progress!r} is not None, True or False", path="progress", stage="validation")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size <= 0):
        raise Refusal(f"batch_size {batch_size!r} is not a number of rows", path="batch_size", stage="validation")
    plan = document if isinstance(document, Plan) else compile(document, model, data_root, memory_budget)
    if plan.model is not model:
        raise Refusal("this plan was compiled on another model; run it on the model it was compiled on, or "
                      "compile the document again", path="model", stage="compile")
    with own_paths(plan.document):
        shown = {None: True, True: "always", False: False}[progress]
        computed = runner.compute(plan.plan, model, batch_size, shown)
    return Results(computed)


class Results:
    """A run held in memory: `points`, `table(metric)`, `to_pandas(metric)`, `tensors(name)`, `save(out)`;
    `record` is run.json's, `files` every file `save` writes (relative path -> content)."""

    def __init__(self, computed):
        self._computed = computed
        self.points = list(computed.points)
        self.record = computed.record
        self.files = {file_path: content for file_path, content, _path in computed.files}

    def __repr__(self) -> str:
        return f"<Results: {len(self.points)} point(s), {len(self.metrics())} metric(s)>"

    def metrics(self) -> list[str]:
        """The names of the metrics whose tables the run saved, in first-saved order."""
        return list(dict.fromkeys(row["metric"] for _label, _file, rows in self._tables() for row in rows[:1]))

    def _tables(self) -> list[tuple[str, str, list]]:
        """(point label, file within the point, rows) of each metric table, in write order."""
        found = []
        for point in self.points:
            prefix = "" if point.folder == "." else point.folder + "/"
            found += [(point.label, file_path[len(prefix):], content) for file_path, content in self.files.items()
                      if isinstance(content, list) and file_path.startswith(prefix)]
        return found

    def table(self, metric: Optional[str] = None) -> list[dict]:
        """One tidy table of every metric row of every point (or of `metric`'s): plain records, each the
        point's label, its coordinates as columns, the table's file within the point, then the row."""
        if metric is not None and metric not in self.metrics():
            raise Refusal(f"no metric '{metric}' in these results; they have {', '.join(self.metrics()) or 'none'}",
                          path="metric", stage="table")
        return tidy(self.points, self._tables(), metric)

    def to_pandas(self, metric: Optional[str] = None):
        """`table(metric)` as a pandas DataFrame (pandas is the optional extra `pandas`, imported here)."""
        try:
            import pandas
        except ImportError:
            raise Refusal("to_pandas needs pandas, which is not installed; pip install 'causalab-ref[pandas]', or "
                          "use table(), the same rows as records", path="pandas", stage="table") from None
        return pandas.DataFrame.from_records(self.table(metric), columns=columns_of(self.points, self._tables()))

    def tensors(self, name: str) -> dict:
        """Each point's saved tensor `name` (its file within the point, `.safetensors` optional): {label:
        tensor}, the label "" when the document is not swept."""
        want = name if name.endswith(".safetensors") else name + ".safetensors"
        found = {}
        for point in self.points:
            file_path = want if point.folder == "." else f"{point.folder}/{want}"
            content = self.files.get(file_path)
            if isinstance(content, tuple):
                found[point.label] = content[0]["weight"]
        if not found:
            saved = sorted({w.rpartition("/")[2] if "/" in w else w for w, c in self.files.items()
                            if isinstance(c, tuple)})
            raise Refusal(f"no saved tensor '{name}' in these results; they have {', '.join(saved) or 'none'}",
                          path="name", stage="table")
        return found

    def save(self, out: Union[str, os.PathLike], replace: bool = False) -> list[str]:
        """Write the folder `run --out out` writes, byte for byte (run.json's wall time aside): claimed,
        staged and moved into place whole (SPEC.md S1-S7). The written paths, in write order."""
        from .runs import run as runner
        return runner.write(self._computed, Path(out), replace)


# ---------------------------------------------------------------- the tidy table


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _coordinate_columns(points) -> dict[str, str]:
    """Each axis's name -> its column's name: the axis's own (as the label spells it), unless it is `point` or
    `file` (then `coordinate.<name>`)."""
    names = list(dict.fromkeys(name for point in points for name in point.coordinates))
    return {name: f"coordinate.{name}" if name in ("point", "file") else name for name in names}


def _row_column(name: str, taken) -> str:
    """A metric row's field's column: its own name, or `row.<name>` when a coordinate's column has it."""
    return f"row.{name}" if name in taken else name


def columns_of(points, tables) -> list[str]:
    """The tidy table's columns: point, the coordinates, file, then the rows' fields in first-seen order."""
    named = list(_coordinate_columns(points).values())
    fields = dict.fromkeys(_row_column(k, named) for _label, _file, rows in tables for row in rows for k in row)
    return ["point", *named, "file", *fields]


def tidy(points, tables, metric: Optional[str] = None) -> list[dict]:
    """Records: for each point in run order, its tables by file name, each row with the point's label, its
    coordinates (an axis any of whose values is not a scalar is its values' JSON text, the label's spelling),
    and the file. `tables` is [(point label, file within the point, rows)]."""
    named = _coordinate_columns(points)
    texts = {name for name in named if any(not _scalar(p.coordinates.get(name)) for p in points)}
    by_label = {p.label: p for p in points}
    order = {p.label: k for k, p in enumerate(points)}
    taken = set(named.values())
    out: list[dict] = []
    for label, file, rows in sorted(tables, key=lambda t: (order[t[0]], t[1])):
        at = {}
        for name, column in named.items():
            value = by_label[label].coordinates.get(name)
            at[column] = json.dumps(value, separators=(",", ":")) if name in texts else value
        out.extend({"point": label, **at, "file": file, **{_row_column(k, taken): v for k, v in row.items()}}
                   for row in rows if metric is None or row.get("metric") == metric)
    return out


def as_csv(records: list[dict], columns: list[str]) -> str:
    """The records as CSV: a string cell as it is, null empty, anything else its compact JSON (`true`, `[19]`)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for row in records:
        writer.writerow(["" if row.get(c) is None else row[c] if isinstance(row[c], str)
                         else json.dumps(row[c], separators=(",", ":")) for c in columns])
    return text.getvalue().rstrip("\n")


# ---------------------------------------------------------------- a results folder read back (`table`)


def _fail(message: str) -> Refusal:
    return Refusal(message, path="FOLDER", stage="table")


def _read_file(path: Path, what: str) -> Any:
    """A regular file of the folder as JSON: never through a link, never a pipe or device, at most
    MOST_TABLE_BYTES; anything else is refused naming the file."""
    try:
        info = os.lstat(path)
    except OSError as error:
        raise _fail(f"{path}: cannot read {what} ({error.strerror}); table reads the folder a run wrote") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise _fail(f"{path} is {'a link' if stat.S_ISLNK(info.st_mode) else 'not a regular file'}; a run writes "
                    "regular files only, so this folder is not as a run wrote it")
    if info.st_size > MOST_TABLE_BYTES:
        raise _fail(f"{path} is {info.st_size} bytes; table reads files of at most {MOST_TABLE_BYTES} bytes")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as file:
            data = file.read(MOST_TABLE_BYTES + 1)
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise _fail(f"{path}: {what} is damaged ({type(error).__name__}); run the document again") from None


def _point_of(entry: Any, k: int, root: Path):
    from .runs.run import RunPoint
    ok = (isinstance(entry, dict) and isinstance(entry.get("label"), str)
          and isinstance(entry.get("coordinates"), dict) and isinstance(entry.get("folder"), str)
          and entry["folder"] == (entry["label"] or ".")
          and (entry["label"] == "" or (entry["label"] not in (".", "..") and "/" not in entry["label"]
                                        and "\0" not in entry["label"])))
    if not ok:
        raise _fail(f"{root / 'run.json'}: points[{k}] is not a point (label, coordinates, folder as a run "
                    "writes them); run the document again")
    return RunPoint(entry["label"], entry["coordinates"], entry["folder"])


def read_folder(folder: Union[str, os.PathLike]) -> tuple[list, list]:
    """(points, tables) of a results folder, from its run.json's points and each point's metric tables."""
    root = Path(folder)
    if _kind(root) != "a folder":
        raise _fail(f"{root} is not a folder; name the folder a run wrote (its --out)")
    record = _read_file(root / "run.json", "run.json")
    if not isinstance(record, dict) or not isinstance(record.get("causalab_ref"), str):
        raise _fail(f"{root} is not a folder a run wrote (its run.json names no causalab_ref); table reads the "
                    "folder a run wrote (its --out)")
    if not isinstance(record.get("points"), list) or not record["points"]:
        raise _fail(f"{root / 'run.json'} lists no points (a run of an older causalab_ref); run the document "
                    "again")
    points = [_point_of(entry, k, root) for k, entry in enumerate(record["points"])]
    swept = {p.folder for p in points if p.label}
    tables = []
    for point in points:
        base = root if point.folder == "." else root / point.folder
        kind = "a folder" if point.folder == "." else _kind(base)
        if kind != "a folder":
            raise _fail(f"{base} is {kind}; the point '{point.label}' is a folder a run wrote")
        for file in _json_files(base, skip=swept if point.folder == "." else set()):
            rows = _read_file(file, "a metric table")
            relative = file.relative_to(base).as_posix()
            if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
                raise _fail(f"{file} is not a metric table (a list of rows); run the document again")
            tables.append((point.label, relative, rows))
    return points, tables


def _kind(path: Path) -> str:
    """What stands at `path`, never following a link: `a folder`, `a link`, `missing` (nothing there, or a
    name the file system cannot take, such as one past 255 bytes), or `not a folder`."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):  # ENOENT, ENAMETOOLONG, ENOTDIR, ELOOP; ValueError: an embedded NUL
        return "missing"
    return "a folder" if stat.S_ISDIR(mode) else "a link" if stat.S_ISLNK(mode) else "not a folder"


def _json_files(base: Path, skip: set) -> list[Path]:
    """The .json files under `base` but document.json and run.json, in path order; links are not followed
    (a link is refused when read), and the folders in `skip` (the sweep's points, under the root) not entered."""
    found = []
    for here, folders, files in os.walk(base):
        at = Path(here)
        if at == base:
            folders[:] = [f for f in folders if f not in skip]
        folders.sort()
        for name in files:
            if name.endswith(".json") and not (at == base and name in ("document.json", "run.json")):
                found.append(at / name)
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())

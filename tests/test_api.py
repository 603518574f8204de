"""The Python API (SPEC.md §16) against the CLI it is the core of: the same folders, the same refusals, the
same numbers, one tidy table, and the `table` verb's folder as an input surface (S64)."""
from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import causalab_ref as cr
from causalab_ref import api
from inprocess import REPO, cli

DOCS = REPO / "documents"
DATA = DOCS / "data"
#: the shipped documents whose API run and CLI run are compared byte for byte in every suite run, one of each
#: kind (plan-shaped, a sweep over positions, protocol, steps-first, a tensor save, a decode, eager attention);
#: CAUSALAB_EVERY_DOCUMENT=1 compares every shipped document (the fits take minutes; the lead's full check)
QUICK = ["patching", "minimal_protocol", "pca_harvest", "generated_answer", "attention_knockout",
         "steps_first/pos_sweep", "weekday_tracing"]
EVERY = sorted(str(p.relative_to(DOCS).with_suffix("")) for p in [*DOCS.glob("*.json"), *DOCS.glob("steps_first/*.json")])


@pytest.fixture(scope="module")
def models():
    """One loaded model per model block, loaded when first asked for and kept for the module (PY2)."""
    loaded: dict = {}

    def model_of(document: "cr.Document"):
        spec = document.model
        key = (spec.key, spec.revision, spec.dtype, spec.attn_implementation)
        if key not in loaded:
            loaded[key] = cr.load(spec.key, revision=spec.revision, dtype=spec.dtype,
                                  attn_implementation=spec.attn_implementation)
        return loaded[key]
    return model_of


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by its relative path, run.json without its wall time (R9's reading)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "run.json" and path.parent == folder:
                record = json.loads(data)
                record.pop("wall_seconds")
                data = json.dumps(record, indent=1).encode()
            files[path.relative_to(folder).as_posix()] = data
    return files


def _documents():
    chosen = EVERY if os.environ.get("CAUSALAB_EVERY_DOCUMENT") == "1" else QUICK
    return [pytest.param(name, id=name) for name in chosen]


@pytest.mark.parametrize("name", _documents())
def test_save_writes_the_folder_run_writes_byte_for_byte(name, models, tmp_path):
    """SPEC.md:2695 [PY7] SPEC.md:2675 [PY2] a shipped document run through the API on a model loaded once and saved
    is the folder the CLI's `run` writes, file for file and byte for byte, run.json's wall time aside."""
    path = DOCS / f"{name}.json"
    document = cr.read(path)
    results = cr.run(document, models(document), data_root=DATA, progress=False)
    written = results.save(tmp_path / "api")
    done = cli("run", str(path), "--out", str(tmp_path / "cli"), "--data-root", str(DATA), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [Path(w).relative_to(tmp_path / "api") for w in written] == \
        [Path(w).relative_to(tmp_path / "cli") for w in done.stdout.splitlines() if w.startswith(str(tmp_path))
         and ": " not in w]
    assert _tree(tmp_path / "api") == _tree(tmp_path / "cli")


def test_import_is_light_and_exports_the_api():
    """SPEC.md:2672 [PY1] `import causalab_ref` imports no torch, transformers or nnsight; reading a document
    neither (Q17); __all__ names the API."""
    code = ("import sys, causalab_ref as cr; before = sorted(m for m in ('torch', 'transformers', 'nnsight') "
            "if m in sys.modules); cr.read('documents/patching.json'); print(before, sorted(cr.__all__), "
            "'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["[]", "['Document',", "'Plan',", "'Refusal',", "'Results',", "'compile',",
                                   "'load',", "'read',", "'run']", "False"], done.stderr


def test_a_dict_is_read_as_its_json_text():
    """SPEC.md:2679 [PY3] a dict reads as the file holding its JSON: the same document, format and points."""
    for name in ("weekday_tracing", "minimal_protocol", "steps_first/pos_sweep"):
        path = DOCS / f"{name}.json"
        given = json.loads(path.read_text(encoding="utf-8"))
        from_dict, from_file = cr.read(given), cr.read(path)
        assert (from_dict.raw, from_dict.format, [p.label for p in from_dict.points]) == \
            (from_file.raw, from_file.format, [p.label for p in from_file.points])
        assert from_dict.source == "<dict>" and from_file.source == str(path)


def test_a_dict_holding_what_json_cannot_spell_is_refused_at_its_path(tmp_path):
    """SPEC.md:2679 [PY3] SPEC.md:2684 [PY4] a key that is not a string, a set, an object: one Refusal at the dotted
    path; NaN is refused as the same document's file is, the CLI's line."""
    raw = json.loads((DOCS / "patching.json").read_text(encoding="utf-8"))
    for bad, path in (({**raw, "roles": {1: {"field": "input"}}}, "roles"),
                      ({**raw, "header": {"tags": {"a", "b"}}}, "header.tags"),
                      ({**raw, "steps": [object()]}, "steps.0")):
        with pytest.raises(cr.Refusal) as refused:
            cr.read(bad)
        assert (refused.value.stage, refused.value.path) == ("validation", path)
    nan = {**raw, "header": {"weight": float("nan")}}
    file = tmp_path / "nan.json"
    file.write_text(json.dumps(nan), encoding="utf-8")
    with pytest.raises(cr.Refusal) as refused:
        cr.read(nan)
    assert str(refused.value) == cli("validate", str(file)).stderr.strip()
    with pytest.raises(cr.Refusal) as refused:
        cr.read(42)
    assert (refused.value.stage, refused.value.path) == ("validation", "document")


def _refusal_cases(tmp_path: Path) -> list[tuple[str, list]]:
    """(a document path, the CLI's extra arguments) whose refusal the API must give as the CLI prints it."""
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": ', encoding="utf-8")
    steps_first = json.loads((DOCS / "steps_first" / "pos_sweep.json").read_text(encoding="utf-8"))
    step = next(iter(steps_first["steps"]))
    steps_first["steps"][step]["nonsense"] = 1  # refused in the lowered document, named in its own (SF14)
    (tmp_path / "sf.json").write_text(json.dumps(steps_first), encoding="utf-8")
    protocol = json.loads((DOCS / "minimal_protocol.json").read_text(encoding="utf-8"))
    protocol["nonsense"] = 1
    (tmp_path / "protocol.json").write_text(json.dumps(protocol), encoding="utf-8")
    return [(str(tmp_path / "missing.json"), []), (str(broken), []), (str(tmp_path / "sf.json"), []),
            (str(tmp_path / "protocol.json"), []), (str(DOCS / "patching.json"), ["--data-root", str(tmp_path)])]


def test_api_refusals_are_the_cli_lines(models, tmp_path):
    """SPEC.md:2684 [PY4] the API raises the CLI's stage, path and message: at reading (a missing file, broken
    JSON), in a steps-first or protocol document's own paths (SF14, PR17), and at compile (no data root)."""
    llama = models(cr.read(DOCS / "patching.json"))
    for path, extra in _refusal_cases(tmp_path):
        done = cli("run", path, "--out", str(tmp_path / "out"), "--quiet", *extra)
        assert done.returncode == 2, done.stderr
        data_root = extra[1] if extra else DATA
        with pytest.raises(cr.Refusal) as refused:
            cr.run(path, llama, data_root=data_root, progress=False)
        line = done.stderr.strip().splitlines()[-1]
        assert str(refused.value) == line
        where = f"{refused.value.path}: " if refused.value.path else ""
        assert line == f"{refused.value.stage}: {where}{refused.value.message}"
    assert not (tmp_path / "out").exists()


def test_explain_is_the_plans_explanation(models):
    """SPEC.md:2688 [PY5] `--json explain` (weightless) and the API's plan compiled on weights say the same; the
    plan's text is `explain`'s."""
    for name in ("weekday_tracing", "steps_first/pos_sweep"):
        path = DOCS / f"{name}.json"
        plan = cr.compile(path, models(cr.read(path)), data_root=DATA)
        done = cli("--json", "explain", str(path), "--data-root", str(DATA))
        assert json.loads(done.stdout) == json.loads(json.dumps(plan.explain()))
        assert cli("explain", str(path), "--data-root", str(DATA)).stdout.rstrip("\n") == plan.text()


def test_a_model_that_is_not_the_documents_is_refused(models):
    """SPEC.md:2688 [PY5] SPEC.md:2684 [PY4] the tracing document (the weekday model) on the seeded Llama: refused at
    `model`, stage compile, naming both; bad arguments name the argument."""
    llama = models(cr.read(DOCS / "patching.json"))
    with pytest.raises(cr.Refusal) as refused:
        cr.compile(DOCS / "weekday_tracing.json", llama, data_root=DATA)
    assert (refused.value.stage, refused.value.path) == ("compile", "model")
    assert "fixture:weekday-llama revision trained" in refused.value.message
    for kwargs, path in (({"batch_size": 0}, "batch_size"), ({"batch_size": 1.5}, "batch_size"),
                         ({"progress": "yes"}, "progress")):
        with pytest.raises(cr.Refusal) as refused:
            cr.run(DOCS / "patching.json", llama, data_root=DATA, **kwargs)
        assert refused.value.path == path
    with pytest.raises(cr.Refusal) as refused:
        cr.load("fixture:tiny-llama", engine="pyvene")
    assert refused.value.path == "engine"


def test_run_writes_nothing_and_reads_no_stdin(models, tmp_path, monkeypatch):
    """SPEC.md:2692 [PY6] a run in memory creates no file anywhere it could (the working folder, the data root's
    neighbours) and never touches stdin; `save` is what writes."""
    class NoStdin(io.StringIO):
        def read(self, *args):
            raise AssertionError("stdin was read")
        readline = read

    monkeypatch.setattr(sys, "stdin", NoStdin())
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    path = DOCS / "layer_sweep.json"
    results = cr.run(path, models(cr.read(path)), data_root=DATA, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert results.table()
    results.save("out")
    assert (tmp_path / "out" / "run.json").is_file()


@pytest.fixture(scope="module")
def tracing(models, tmp_path_factory):
    """documents/weekday_tracing.json run once through the API (saved) and once by the CLI."""
    root = tmp_path_factory.mktemp("tracing")
    path = DOCS / "weekday_tracing.json"
    results = cr.run(path, models(cr.read(path)), data_root=DATA, progress=False)
    done = cli("--json", "run", str(path), "--out", str(root / "cli"), "--data-root", str(DATA), "--quiet")
    assert done.returncode == 0, done.stderr
    return results, root / "cli", json.loads(done.stdout)


def test_run_json_lists_the_points_and_run_json_prints_them(tracing):
    """SPEC.md:2709 [PY9] run.json's points are the sweep's, each with its coordinates and its folder, which is
    on disk; `run --json` prints them with the written paths; coordinates are the label's values."""
    results, folder, printed = tracing
    listed = json.loads((folder / "run.json").read_text(encoding="utf-8"))["points"]
    assert listed == printed["points"] == [p.as_json() for p in results.points]
    assert len(listed) == 9 and all((folder / p["folder"]).is_dir() for p in listed)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == sorted(p["folder"] for p in listed)
    for point in listed:  # the label is `name=compact JSON` joined by ",", in axis order (D18)
        assert point["label"] == ",".join(f"{name}={json.dumps(value, separators=(',', ':'))}"
                                          for name, value in point["coordinates"].items())
    assert {p["coordinates"]["layer"] for p in listed} == {0, 1, 2}
    assert printed["written"][1].endswith("run.json")


def test_a_sweeps_tidy_table_has_a_row_per_point_and_metric_row(tracing):
    """SPEC.md:2700 [PY8] one record per (point, metric row), checked against the folders: each point folder's
    tables' rows, in order, with the point's coordinates as `layer` and `position` columns."""
    results, folder, _printed = tracing
    records = results.table()
    expected = []
    for point in json.loads((folder / "run.json").read_text(encoding="utf-8"))["points"]:
        for table in sorted((folder / point["folder"]).glob("*.json")):
            if table.name != "document.json":
                expected += [(point["label"], table.name, row)
                             for row in json.loads(table.read_text(encoding="utf-8"))]
    assert [(r["point"], r["file"], {k: r[k] for k in expected[0][2]}) for r in records] == expected
    assert list(records[0])[:4] == ["point", "layer", "position", "file"]
    for record in records:
        coordinates = next(p.coordinates for p in results.points if p.label == record["point"])
        assert record["layer"] == coordinates["layer"]
        assert json.loads(record["position"]) == coordinates["position"]  # the label's spelling (PY8 reading)
    iia = results.table("iia")
    assert {r["metric"] for r in iia} == {"iia"} and len(iia) == sum(r["metric"] == "iia" for r in records)
    with pytest.raises(cr.Refusal) as refused:
        results.table("nope")
    assert refused.value.path == "metric"


def test_the_table_verb_prints_the_same_rows(tracing):
    """SPEC.md:2713 [PY10] `table` of the CLI's folder: --json's records, --csv's rows and the text's rows are
    Results.table() of the API's run."""
    results, folder, _printed = tracing
    records = results.table()
    done = cli("--json", "table", str(folder))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == json.loads(json.dumps(records))
    columns = api.columns_of(results.points, results._tables())
    read = list(csv.DictReader(io.StringIO(cli("table", str(folder), "--csv").stdout)))
    assert len(read) == len(records) and list(read[0]) == columns
    for got, want in zip(read, records):
        assert got == {c: "" if want.get(c) is None else want[c] if isinstance(want[c], str)
                       else json.dumps(want[c], separators=(",", ":")) for c in columns}
    text = cli("table", str(folder), "--metric", "iia").stdout.splitlines()
    assert text[0].split("\t") == columns and len(text) == 1 + len(results.table("iia"))


def test_tensors_are_the_saved_files(models, tmp_path):
    """SPEC.md:2695 [PY7] `tensors(name)` is each point's tensor of the file `save` writes."""
    from safetensors.torch import load_file
    path = DOCS / "pca_harvest.json"
    results = cr.run(path, models(cr.read(path)), data_root=DATA, progress=False)
    results.save(tmp_path / "out")
    got = results.tensors("pca")
    assert list(got) == [""] and got[""].equal(load_file(tmp_path / "out" / "pca.safetensors")["weight"])
    assert results.tensors("pca.safetensors")[""].equal(got[""])
    with pytest.raises(cr.Refusal) as refused:
        results.tensors("nope")
    assert refused.value.path == "name" and "pca.safetensors" in refused.value.message


def test_to_pandas_is_the_table_or_refused_without_pandas(tracing, monkeypatch):
    """SPEC.md:2700 [PY8] to_pandas is table() as a DataFrame; without pandas, one Refusal at `pandas`."""
    results = tracing[0]
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        frame = results.to_pandas("iia")
        assert frame.to_dict("records") == results.table("iia")
    monkeypatch.setitem(sys.modules, "pandas", None)  # an import of it raises ImportError
    with pytest.raises(cr.Refusal) as refused:
        results.to_pandas()
    assert (refused.value.stage, refused.value.path) == ("table", "pandas")


def test_one_model_serves_two_documents_as_two_fresh_processes(models, tmp_path, monkeypatch):
    """SPEC.md:2675 [PY2] two documents on one loaded model give the numbers two fresh `run` processes give, and
    neither run loads a model (loading and checkpoint reading fail if called)."""
    from causalab_ref.engines import checkpoint, loading
    model = models(cr.read(DOCS / "patching.json"))

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded again")
    names = ("patching", "layer_sweep")
    fresh = {name: subprocess.Popen([sys.executable, "-m", "causalab_ref", "run", str(DOCS / f"{name}.json"),
                                     "--out", str(tmp_path / name), "--data-root", str(DATA), "--quiet"],
                                    cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": str(REPO)})
             for name in names}  # the fresh processes start while this one runs both documents
    for name in names:
        with monkeypatch.context() as patched:
            patched.setattr(loading, "load", no_load)
            patched.setattr(checkpoint, "load", no_load)
            results = cr.run(DOCS / f"{name}.json", model, data_root=DATA, progress=False)
        _out, err = fresh[name].communicate(timeout=300)
        assert fresh[name].returncode == 0, err
        points, tables = api.read_folder(tmp_path / name)
        assert [(r["point"], r["file"], r["example_id"], r["value"]) for r in api.tidy(points, tables)] == \
            [(r["point"], r["file"], r["example_id"], r["value"]) for r in results.table()]


# ---------------------------------------------------------------- the table verb's folder (S64)


def _run_folder(root: Path) -> Path:
    """A small sweep's results folder written by the CLI, to damage."""
    out = root / "run"
    done = cli("run", str(DOCS / "layer_sweep.json"), "--out", str(out), "--data-root", str(DATA), "--quiet")
    assert done.returncode == 0, done.stderr
    return out


def damages(out: Path):
    """(name, how to damage `out`): each a fault S64 names."""
    first = json.loads((out / "run.json").read_text(encoding="utf-8"))["points"][0]["folder"]
    table = next(p for p in (out / first).glob("*.json") if p.name != "document.json")

    def record(change):
        def apply():
            data = json.loads((out / "run.json").read_text(encoding="utf-8"))
            change(data)
            (out / "run.json").write_text(json.dumps(data), encoding="utf-8")
        return apply

    def replace(path: Path, make):
        def apply():
            path.unlink()
            make(path)
        return apply
    return [
        ("missing", lambda: os.rename(out, out.with_name("gone"))),
        ("a file", lambda: (os.rename(out, out.with_name("gone")), out.write_text("x"))),
        ("no run.json", lambda: (out / "run.json").unlink()),
        ("run.json not JSON", lambda: (out / "run.json").write_text("{", encoding="utf-8")),
        ("run.json not ours", record(lambda d: d.pop("causalab_ref"))),
        ("no points", record(lambda d: d.pop("points"))),
        ("a point not a point", record(lambda d: d["points"].__setitem__(0, {"label": "x"}))),
        ("a point outside", record(lambda d: d["points"].__setitem__(0, {"label": "..", "coordinates": {},
                                                                          "folder": ".."}))),
        ("a point folder missing", lambda: os.rename(out / first, out / "elsewhere")),
        ("a point's name past 255 bytes", record(lambda d: d["points"].__setitem__(0, {  # ENAMETOOLONG, not an error
            "label": "c" * 300, "coordinates": {}, "folder": "c" * 300}))),
        ("a point folder a link", lambda: (os.rename(out / first, out.with_name("real")),
                                           os.symlink(out.with_name("real"), out / first))),
        ("a table a link", replace(table, lambda p: os.symlink("/etc/hostname", p))),
        ("a table a pipe", replace(table, lambda p: os.mkfifo(p))),
        ("a table huge", lambda: os.truncate(table, api.MOST_TABLE_BYTES + 1)),
        ("a table not JSON", lambda: table.write_bytes(b"\xff\xfe[")),
        ("a table not rows", lambda: table.write_text("[1, 2]", encoding="utf-8")),
        ("a table nested deep", lambda: table.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")),
    ]


def test_the_table_verb_refuses_a_folder_that_is_not_a_runs(tmp_path):
    """SPEC.md:1329 [S64] each fault of the folder is one refusal at FOLDER, stage table, naming the file, no
    traceback and nothing printed on stdout; nothing is written."""
    pristine = _run_folder(tmp_path / "pristine")
    for k, (name, _apply) in enumerate(damages(pristine)):
        root = tmp_path / f"case{k}"
        root.mkdir()
        subprocess.run(["cp", "-a", str(pristine), str(root / "run")], check=True)
        out = root / "run"
        damages(out)[k][1]()
        before = sorted(str(p) for p in root.rglob("*"))
        started = time.monotonic()
        done = cli("table", str(out))
        assert done.returncode == 2 and done.stdout == "", (name, done)
        assert done.stderr.startswith("table: FOLDER: ") and done.stderr.count("\n") == 1, (name, done.stderr)
        assert sorted(str(p) for p in root.rglob("*")) == before, name
        assert time.monotonic() - started < 30, name
    assert cli("table", str(pristine)).returncode == 0


# ---------------------------------------------------------------- progress on a terminal (PY11, R16)


def _on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run `python -m causalab_ref *argv` with stderr on a pseudo-terminal; (status, what the terminal got)."""
    master, slave = pty.openpty()
    # a terminal 400 columns wide (a fresh pty is 0 x 0, and tqdm truncates its line to the width)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "causalab_ref", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=slave, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
    os.close(slave)
    got = b""
    while True:
        ready, _w, _x = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            got += data
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=300), got.decode("utf-8", "replace")


def test_progress_names_the_point_and_the_fits_epoch_and_loss_on_a_terminal(tmp_path):
    """SPEC.md:2719 [PY11] SPEC.md:605 [R16] on a terminal the bar names each sweep point and a fit's epoch and loss;
    under --quiet the terminal gets nothing."""
    das = json.loads((DOCS / "das.json").read_text(encoding="utf-8"))
    das["steps"]["fit"]["epochs"] = 2
    first = next(iter(das["sites"].values()))
    first["layers"] = {"sweep": [[0], [1]], "as": "layer"}  # two points, each with its fit
    (tmp_path / "das.json").write_text(json.dumps(das), encoding="utf-8")
    argv = ["run", str(tmp_path / "das.json"), "--data-root", str(DATA), "--out"]
    status, shown = _on_a_terminal([*argv, str(tmp_path / "shown")], tmp_path)
    assert status == 0, shown
    assert "point 1/2 layer=0" in shown and "point 2/2 layer=1" in shown, shown
    assert "fit 'fit' epoch 2/2 loss " in shown, shown
    status, quiet = _on_a_terminal([*argv, str(tmp_path / "quiet"), "--quiet"], tmp_path)
    assert status == 0 and "point" not in quiet and "epoch" not in quiet, quiet

"""Conform: run the conformance corpus (tests/conformance/*.json) against an implementation.

`python -m causalab_ref conform [--impl "CMD"] [--fixtures DIR] [--cases DIR]`. A case is a
document, the data tables it reads, the fixture it runs on (key and recipe digest), the verb to
run it with and the expected result (the format: tests/conformance/case.schema.json; SPEC.md §6,
C1-C29). For each case the runner writes the document and a data root holding exactly the case's
tables into a temporary folder, invokes the implementation through the CLI contract and compares
what it printed and wrote with the case's `expect`:

* `run`: exit 0 and every metric table under --out (document.json and run.json aside),
  values within the case's tolerance, everything else (positions, tokens, reasons,
  eligible, key order) exact;
* `explain`: exit 0 and the `plan` of `--json explain` (addresses, widths, positions);
* `model`: exit 0 and the `components` of `--json model KEY`;
* `validate`: exit 0;
* a refusal: exit 2 and the last stderr line `<stage>: <path>: <message>`, the stage and path
  exact and the message matching the case's catalogue template (SPEC.md §13).

Fields a case lists as `informative` (an operation name that depends on the transformers
version) are never compared. An implementation that exits 3 says it does not implement what
the case uses: the case is reported not applicable.

An --impl is a subprocess that needs nothing of causalab_ref: the runner exports the fixtures
as ordinary checkpoint folders (or reuses the ones in --fixtures) and hands their places over in
`$CONFORM_CHECKPOINTS`, a JSON object {model key: folder}. With no --impl the implementation is
a command-line entry point the caller hands in (`main`: argv -> exit status; the CLI passes its
own), called in-process with captured streams so the corpus runs in seconds. This module imports
no cli: the structured plan `explain --json` prints lives in plan.py.
"""
from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from . import catalogue
from ..fixtures import exported

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "conformance"
VERBS = ("run", "explain", "validate", "model")
NOT_APPLICABLE = 3


# ---------------------------------------------------------------- invoking an implementation


class InProcess:
    """An entry point called in this process (`main(argv) -> status`) with captured stdout and stderr."""

    name = "causalab_ref (in-process)"

    def __init__(self, main: Callable[[list[str]], int]):
        self.main = main

    def __call__(self, argv: list[str], cwd: Path) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd):
            try:
                status = self.main(argv)
            except SystemExit as exit_:  # argparse usage errors
                status = exit_.code if isinstance(exit_.code, int) else 1
        return status, out.getvalue(), err.getvalue()


class Subprocess:
    """Another implementation: `CMD <argv>` in a subprocess, told where each checkpoint is (SPEC.md C1, C9)."""

    def __init__(self, command: str, checkpoints: Optional[dict[str, str]] = None):
        self.command = shlex.split(command)
        self.name = command
        self.env = dict(os.environ)
        if checkpoints is not None:
            self.env[exported.MAP_ENV] = json.dumps(checkpoints, sort_keys=True)

    def __call__(self, argv: list[str], cwd: Path) -> tuple[int, str, str]:
        done = subprocess.run(self.command + argv, cwd=cwd, capture_output=True, text=True, env=self.env)
        return done.returncode, done.stdout, done.stderr


# ---------------------------------------------------------------- one case


def load_cases(folder: Path = CASES) -> list[dict]:
    cases = []
    for file in sorted(Path(folder).glob("*.json")):
        if file.name.endswith(".schema.json"):
            continue
        case = json.loads(file.read_text(encoding="utf-8"))
        case["_file"] = str(file)
        cases.append(case)
    return cases


class CaseError(Exception):
    """A case that cannot be set up (a path it names escapes, a file it names is missing): that case fails
    with this one line, and the run goes on."""


def _inside(base: Path, rel: str, what: str) -> Path:
    """`base / rel`, which must resolve strictly inside `base` (no absolute path, no `..` out, no link out)."""
    target = base / rel
    try:
        inside = base.resolve() in target.resolve().parents
    except (OSError, RuntimeError, ValueError):
        inside = False
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts or not inside:
        raise CaseError(f"{what} {rel!r} escapes its folder ({base}); a case names paths inside it (SPEC.md S12)")
    return target


def _write_data(case: dict, data_root: Path) -> None:
    """The case's tables, and nothing else, under the data root: a list is the rows themselves, a
    string names a table file of the corpus (relative to the case's folder) (SPEC.md C10)."""
    corpus = Path(case["_file"]).resolve().parent
    data_root.mkdir(parents=True, exist_ok=True)
    for rel, table in (case.get("data") or {}).items():
        # a key is a path under the data root: `..`, an absolute path or a link out is refused (SPEC.md S8)
        target = _inside(data_root, rel, "data key")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(table, str):
            source = _inside(corpus, table, "data file")
            if not source.is_file():
                raise CaseError(f"data file {table!r} is not in the corpus ({corpus})")
            target.write_bytes(source.read_bytes())
        else:
            target.write_text(json.dumps(table, indent=1, ensure_ascii=False), encoding="utf-8")


def _prepare(case: dict, tmp: Path) -> tuple[list[str], Path]:
    """Write the case's files; return the argv (after CMD) and the --out folder."""
    data_root = tmp / "data"
    _write_data(case, data_root)
    for rel in case.get("files") or ():  # files a document names by relative path (a bundle): the corpus's own
        source = _inside(Path(case["_file"]).resolve().parent / "files", rel, "files entry")
        if not source.is_file():
            raise CaseError(f"files entry {rel!r} is not in the corpus (files/{rel})")
        target = _inside(tmp, rel, "files entry")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    doc = tmp / "document.json"
    out = tmp / "out"
    verb = case["verb"]
    if verb == "model":
        return ["--json", "model", case["fixture"]["key"]], out
    doc.write_text(json.dumps(case["document"], indent=1, ensure_ascii=False), encoding="utf-8")
    if verb == "run":
        return ["run", str(doc), "--out", str(out), "--data-root", str(data_root)], out
    if verb == "explain":
        return ["--json", "explain", str(doc), "--data-root", str(data_root)], out
    return ["validate", str(doc), "--data-root", str(data_root)], out


def _tables(out: Path) -> dict:
    tables: dict[str, Any] = {}
    if not out.is_dir():
        return tables
    for file in sorted(out.rglob("*.json")):
        if file.name in ("document.json", "run.json"):
            continue
        tables[file.relative_to(out).as_posix()] = json.loads(file.read_text(encoding="utf-8"))
    for file in sorted(out.rglob("*.safetensors")):
        tables[file.relative_to(out).as_posix()] = tensor_file(file)
    return tables


def tensor_file(file: Path) -> dict:
    """A saved tensor file as comparable data: each tensor's dtype, shape and values (nested lists), and the
    metadata but `engine`, which names the implementation that wrote it (SPEC.md FZ32)."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        metadata = {k: v for k, v in sorted((handle.metadata() or {}).items()) if k != "engine"}
        tensors = {name: handle.get_tensor(name) for name in sorted(handle.keys())}
    return {"metadata": metadata, "tensors": {name: {"dtype": str(t.dtype).replace("torch.", ""),
                                                     "shape": list(t.shape), "values": t.tolist()}
                                              for name, t in tensors.items()}}


def observe(case: dict, impl, tmp: Path) -> dict:
    """What the implementation did on this case, in the shape of a case's `expect`."""
    argv, out = _prepare(case, tmp)
    status, stdout, stderr = impl(argv, tmp)
    got: dict[str, Any] = {"status": status}
    if status == 2:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        got["refusal"] = catalogue.split_line(lines[-1] if lines else "")
        return got
    if status != 0:
        got["stderr"] = stderr.strip()[-2000:]
        return got
    verb = case["verb"]
    try:
        if verb == "run":
            got["tables"] = _tables(out)
        elif verb == "explain":
            got["plan"] = json.loads(stdout)["plan"]
        elif verb == "model":
            got["components"] = json.loads(stdout)["components"]
    except (ValueError, KeyError, TypeError) as error:
        got["stdout_unreadable"] = f"{type(error).__name__}: {error}"
    return got


def _shown(segs: tuple) -> str:
    text = ""
    for seg in segs:
        text += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if text else str(seg))
    return text or "<result>"


def informative(segs: tuple, patterns) -> bool:
    """True when the field at `segs` matches one of the case's `informative` patterns: dotted names,
    list indices as numbers, `*` for any one step (SPEC.md C16)."""
    parts = [str(s) for s in segs]
    for pattern in patterns:
        steps = pattern.split(".")
        if len(steps) == len(parts) and all(fnmatch.fnmatchcase(p, s) for p, s in zip(parts, steps)):
            return True
    return False


def compare(want: Any, got: Any, tolerance: float, path: str = "", informative_fields=(), segs=None) -> list[str]:
    """Readable differences: `path: expected X, got Y`. A float agrees when |want - got| <=
    tolerance * max(|want|, 0.01) (SPEC.md C6); everything else is exact, and a dict's key order
    counts (a metric table's keys are in a fixed order, SPEC.md R7). Informative fields are skipped."""
    segs = tuple(s for s in path.split(".") if s) if segs is None else segs
    if informative(segs, informative_fields):
        return []
    where = _shown(segs)
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isfinite(want) and abs(want - got) <= tolerance * max(abs(want), 0.01):
            return []
        return [f"{where}: expected {want!r}, got {got!r} (relative tolerance {tolerance})"]
    if isinstance(want, dict) and isinstance(got, dict):
        diffs = [f"{_shown(segs + (k,))}: expected {_short(want[k])}, missing" for k in want if k not in got]
        diffs += [f"{_shown(segs + (k,))}: not expected, got {_short(got[k])}" for k in got if k not in want]
        for key in want:
            if key in got:
                diffs += compare(want[key], got[key], tolerance, informative_fields=informative_fields,
                                 segs=segs + (key,))
        if not diffs and list(want) != list(got):
            diffs.append(f"{where}: keys in order {list(want)}, got {list(got)}")
        return diffs
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: expected {len(want)} items {_short(want)}, got {len(got)} {_short(got)}"]
        diffs = []
        for k, (w, g) in enumerate(zip(want, got)):
            diffs += compare(w, g, tolerance, informative_fields=informative_fields, segs=segs + (k,))
        return diffs
    if type(want) is not type(got) and not (isinstance(want, int) and isinstance(got, float)
                                            and not isinstance(want, bool)):
        return [f"{where}: expected {_short(want)}, got {_short(got)}"]
    return [] if want == got else [f"{where}: expected {_short(want)}, got {_short(got)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."


def compare_refusal(want: dict, got: Any) -> list[str]:
    """A refusal agrees when its stage and path are the case's and its message fits the case's
    catalogue template: the fixed words in order, any text for each placeholder (SPEC.md C13)."""
    if not isinstance(got, dict):
        return [f"refusal: expected {_short(want)}, got {_short(got)}"]
    diffs = [f"refusal.{k}: expected {_short(want[k])}, got {_short(got.get(k))}"
             for k in ("stage", "path") if want.get(k) != got.get(k)]
    if not catalogue.matches(want["message"], got.get("message", "")):
        diffs.append(f"refusal.message: expected the template {_short(want['message'])}, "
                     f"got {_short(got.get('message'))}")
    return diffs


def _fixture_diffs(case: dict, recipes: dict[str, str]) -> list[str]:
    """The case's fixture must be the checkpoint its expectation was recorded on (SPEC.md C11)."""
    key, recipe = case["fixture"]["key"], case["fixture"]["recipe"]
    if key not in recipes:
        return [f"fixture: no checkpoint folder for {key!r} (the exported fixtures are {sorted(recipes)})"]
    if recipes[key] != recipe:
        return [f"fixture: the case was recorded on {key} recipe {recipe[:12]}, the folder is recipe "
                f"{recipes[key][:12]}; re-export the fixtures or re-record the case"]
    return []


def check(case: dict, impl, record: bool = False, recipes: Optional[dict[str, str]] = None
          ) -> tuple[str, list[str], dict]:
    """('pass' | 'fail' | 'n/a', diff lines, observed) for one case."""
    if recipes is not None and not record:
        bad = _fixture_diffs(case, recipes)
        if bad:
            return "fail", bad, {}
    with tempfile.TemporaryDirectory(prefix="conform-") as tmp:
        try:
            got = observe(case, impl, Path(tmp))
        except CaseError as error:
            return "fail", [str(error)], {}
    if got["status"] == NOT_APPLICABLE:
        return "n/a", [], got
    if record:
        return "pass", [], got
    want = case.get("expect")
    if want is None:
        return "fail", ["the case has no `expect` (record it with --record)"], got
    if "refusal" in want and got.get("status") == want.get("status"):
        diffs = compare_refusal(want["refusal"], got.get("refusal"))
        return _verdict(diffs), diffs, got
    diffs = compare(want, got, float(case.get("tolerance", 1e-5)), informative_fields=case.get("informative", ()))
    return _verdict(diffs), diffs, got


def _verdict(diffs: list[str]) -> str:
    return "fail" if diffs else "pass"


# ---------------------------------------------------------------- recording


def recorded(got: dict, entries: list) -> dict:
    """An observation as a case's `expect`: a refusal's message becomes its catalogue template."""
    if "refusal" not in got:
        return got
    entry = catalogue.entry_for(got["refusal"], entries)
    if entry is None:
        raise SystemExit(f"no catalogue entry (SPEC.md §13) states the refusal {got['refusal']}; add one first")
    return {"status": got["status"], "refusal": {"stage": got["refusal"]["stage"], "path": got["refusal"]["path"],
                                                 "message": entry.message}}


ORDER = ("name", "rules", "fixture", "verb", "document", "data", "files", "tolerance", "informative", "confirmed",
         "expect")


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def completed(case: dict) -> dict:
    """A case made ready to record: the fixture as {key, recipe} (a bare key is accepted), every shipped
    table its document names copied into the corpus's data/ and listed in `data`, and the operation
    names marked informative on an explain or model case (SPEC.md C10, C11, C16)."""
    from ..fixtures import builder
    case = dict(case)
    key = case["fixture"] if isinstance(case["fixture"], str) else case["fixture"]["key"]
    case["fixture"] = {"key": key, "recipe": builder.recipe_digest(key)}
    shipped, corpus = ROOT / "documents" / "data", Path(case["_file"]).resolve().parent
    tables = dict(case.get("data") or {})
    for text in _strings(case.get("document", {})):
        rel = text.split("#", 1)[0] + ".json"
        if rel not in tables and "/" in rel and (shipped / rel).is_file():
            (corpus / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
            (corpus / "data" / rel).write_bytes((shipped / rel).read_bytes())
            tables[rel] = f"data/{rel}"
    if tables:
        case["data"] = dict(sorted(tables.items()))
    marks = {"explain": "plan.*.steps.*.forwards.*.taps.*.op", "model": "components.*.op"}
    if case["verb"] in marks and marks[case["verb"]] not in case.get("informative", []):
        case["informative"] = list(case.get("informative", [])) + [marks[case["verb"]]]
    return case


def _record(case: dict, got: dict, entries: list) -> None:
    stored = {k: case[k] for k in ORDER if k in case}
    stored["expect"] = recorded(got, entries)
    Path(case["_file"]).write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- the verb


def checkpoint_folders(cases: list[dict], folder: Path) -> dict[str, str]:
    """The fixture folders the cases need, under `folder`: reused when the manifest there lists the key
    and its files have their digests, exported otherwise (SPEC.md C9)."""
    keys = sorted({c["fixture"]["key"] for c in cases})
    have = exported.verified(folder)
    missing = [k for k in keys if k not in have]
    if missing:
        exported.export(folder, keys=sorted(set(missing) | set(have)))
    return exported.checkpoint_map(folder)


def _report(case: dict, verdict: str, diffs: list[str], seconds: float, quiet: bool, stream) -> None:
    label = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A "}[verdict]
    if verdict != "pass" or not quiet:
        print(f"{label} {case['name']}  [{case['verb']}; {', '.join(case.get('rules', []))}]  {seconds:.1f}s",
              file=stream)
    for line in diffs[:25]:
        print(f"       {line}", file=stream)
    if len(diffs) > 25:
        print(f"       ... and {len(diffs) - 25} more difference(s)", file=stream)


def _implementation(impl_command, main, cases, fixtures_dir, record):
    """(the implementation, {key: recipe digest} the cases are checked against)."""
    if impl_command:
        if record:
            raise SystemExit("--record writes causalab_ref's own results into the cases; it takes no --impl")
        folders = checkpoint_folders(cases, Path(fixtures_dir))
        recipes = {k: e["recipe"] for k, e in exported.verified(Path(fixtures_dir)).items()}
        return Subprocess(impl_command, folders), recipes
    if main is None:
        raise ValueError("conform needs an implementation: a command (impl_command) or an entry point (main)")
    from ..fixtures import builder
    keys = {c["fixture"] if isinstance(c["fixture"], str) else c["fixture"]["key"] for c in cases}
    return InProcess(main), {k: builder.recipe_digest(k) for k in keys}


def conform(impl_command: Optional[str] = None, cases_dir: Optional[str] = None, only: Optional[str] = None,
            fail_fast: bool = False, record: bool = False, quiet: bool = False, stream=None,
            main: Optional[Callable[[list[str]], int]] = None, fixtures_dir: Optional[str] = None) -> dict:
    """Run the corpus against `impl_command` (a subprocess) or, with none, in-process against `main`."""
    stream = stream or sys.stdout
    cases = load_cases(Path(cases_dir) if cases_dir else CASES)
    if only:  # a comma-separated list: the cases whose name contains any of them
        wanted = [w for w in only.split(",") if w]
        cases = [c for c in cases if any(w in c["name"] for w in wanted)]
    with tempfile.TemporaryDirectory(prefix="conform-fixtures-") as scratch:
        impl, recipes = _implementation(impl_command, main, cases, fixtures_dir or scratch, record)
        entries = catalogue.entries((ROOT / "SPEC.md").read_text(encoding="utf-8")) if record else []
        counts = {"pass": 0, "fail": 0, "n/a": 0}
        failed = []
        started = time.time()
        print(f"conform: {len(cases)} case(s) against {impl.name}", file=stream)
        for case in cases:
            case = completed(case) if record else case
            t = time.time()
            verdict, diffs, got = check(case, impl, record=record, recipes=recipes)
            counts[verdict] += 1
            if record:
                _record(case, got, entries)
            _report(case, verdict, diffs, time.time() - t, quiet, stream)
            if verdict == "fail":
                failed.append(case["name"])
                if fail_fast:
                    break
    summary = (f"conform: {counts['pass']} passed, {counts['fail']} failed, {counts['n/a']} not applicable "
               f"({time.time() - started:.0f}s)")
    return {"summary": summary, "passed": counts["pass"], "failed": failed, "not_applicable": counts["n/a"],
            "ok": not failed}

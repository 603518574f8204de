"""Conform: run the conformance corpus (causalab_ref/conformance/corpus/*.json) against an implementation.

`python -m causalab_ref conform [--impl "CMD"] [--fixtures DIR] [--cases DIR] [--timeout S]`. A case
is a document, the data tables it reads, the fixture it runs on (key and recipe digest), the verb to
run it with and the expected result (the format: corpus/case.schema.json; SPEC.md §6,
C1-C20). For each case the runner writes the document and a data root holding exactly the case's
tables into a temporary folder, invokes the implementation through the CLI contract (invoke.py) and
compares what it printed and wrote with the case's `expect`:

* `run`: exit 0 and every metric table under --out (document.json and run.json aside),
  values within the case's tolerance (C6), everything else (positions, tokens, reasons,
  eligible, key order) exact;
* `explain`: exit 0 and the `plan` of `--json explain` (addresses, widths, positions);
* `model`: exit 0 and the `components` of `--json model KEY`;
* `validate`: exit 0;
* a refusal: exit 2 and the last stderr line `<stage>: <path>: <message>`, the stage and path
  exact and the message matching the case's catalogue template (SPEC.md §13).

Fields a case lists as `informative` (an operation name that depends on the transformers
version) are never compared. An implementation that exits 3 says it does not implement what
the case uses: the case is reported not applicable. A case that cannot be read, set up or answered
(a truncated case file, a hung or flooding implementation, a junk file under --out) fails in one
line and the run goes on; a run in which no case passed is not a pass (C19, C20).

An --impl is a subprocess that needs nothing of causalab_ref: the runner exports the fixtures
as ordinary checkpoint folders (or reuses the ones in --fixtures) and hands their places over in
`$CONFORM_CHECKPOINTS`, a JSON object {model key: folder}. With no --impl the implementation is
a command-line entry point the caller hands in (`main`: argv -> exit status; the CLI passes its
own), called in-process with captured streams so the corpus runs in seconds. This module imports
no cli: the structured plan `explain --json` prints lives in plan.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from . import catalogue
from .invoke import CAP, TIMEOUT, CaseError, InProcess, Subprocess, UsageError, command
from .judge import FLOOR, FLOORS, agrees, compare, compare_refusal, informative
from ..fixtures import exported
from ..shapes import printable

ROOT = Path(__file__).resolve().parents[2]  # a source checkout: only --record reads from it (SPEC.md, documents/data)
CASES = Path(__file__).resolve().parent / "corpus"  # package data: the corpus ships with the wheel
VERBS = ("run", "explain", "validate", "model")
NOT_APPLICABLE = 3
__all__ = ["FLOOR", "FLOORS", "CaseError", "InProcess", "Options", "Subprocess", "UsageError", "agrees", "check",
           "compare", "compare_refusal", "conform", "cores", "informative", "listing", "parse_jobs"]


# ---------------------------------------------------------------- one case


def load_cases(folder: Path = CASES) -> list[dict]:
    """Every case file of the folder, in name order. A file that is not a case (not JSON, or missing what
    the runner needs) is kept as {name, _file, _broken: why}: it fails in one line, and the run goes on."""
    cases = []
    for file in sorted(Path(folder).glob("*.json")):
        if file.name.endswith(".schema.json"):
            continue
        try:
            case = json.loads(file.read_text(encoding="utf-8"))
            why = _not_a_case(case)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
            case, why = {}, f"the case file cannot be read: {type(error).__name__}: {str(error)[:200]}"
        if why is not None:
            case = {"name": file.stem, "_broken": f"{file.name}: {why}"}
        case["_file"] = str(file)
        cases.append(case)
    return cases


def _not_a_case(case: Any) -> Optional[str]:
    """Why a parsed case file cannot be run (None when it can): the fields the runner reads, with their types
    (the full format is case.schema.json, C12)."""
    if not isinstance(case, dict):
        return f"a case is a JSON object, got {type(case).__name__}"
    fixture = case.get("fixture")
    wants = [("name", isinstance(case.get("name"), str), "a string"),
             ("verb", case.get("verb") in VERBS, f"one of {list(VERBS)}"),
             ("fixture", isinstance(fixture, str) or (isinstance(fixture, dict)
                                                       and isinstance(fixture.get("key"), str)
                                                       and isinstance(fixture.get("recipe", ""), str)),
              "{key, recipe}"),
             ("document", case.get("verb") == "model" or isinstance(case.get("document"), dict), "an object"),
             ("data", isinstance(case.get("data", {}), dict), "an object"),
             ("files", isinstance(case.get("files", []), list), "a list"),
             ("informative", isinstance(case.get("informative", []), list)
              and all(isinstance(path, str) for path in case.get("informative", [])), "a list of paths (strings)"),
             ("tolerance", _positive(case.get("tolerance", 1e-5)), "a positive number"),
             ("expect", _expectation(case.get("expect", {})), "{status, ...}, a refusal {stage, path, message}")]
    bad = [f"`{key}` must be {what}" for key, good, what in wants if not good]
    return "; ".join(bad) if bad else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _expectation(expect: Any) -> bool:
    if not isinstance(expect, dict):
        return False
    refusal = expect.get("refusal")
    return refusal is None or (isinstance(refusal, dict)
                               and all(isinstance(refusal.get(k), str) for k in ("stage", "path", "message")))


def _inside(base: Path, rel: str, what: str) -> Path:
    """`base / rel`, which must resolve strictly inside `base` (no absolute path, no `..` out, no link out)."""
    if not isinstance(rel, str):
        raise CaseError(f"{what} {rel!r} is not a path (a string)")
    target = base / rel
    try:
        inside = base.resolve() in target.resolve().parents
    except (OSError, RuntimeError, ValueError):
        inside = False
    if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts or not inside:
        raise CaseError(f"{what} {rel!r} escapes its folder ({base}); a case names paths inside it (SPEC.md S12)")
    return target


def _as_written(value: Any) -> str:
    """A case's document or table as the JSON text the implementation reads: the same values, with every
    non-ASCII character escaped, so a string that is JSON but not text (a lone surrogate) reaches the
    implementation as the case holds it, to be refused there (SPEC.md C19)."""
    return json.dumps(value, indent=1, ensure_ascii=True)


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
            target.write_text(_as_written(table), encoding="utf-8")


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
    doc.write_text(_as_written(case["document"]), encoding="utf-8")
    if verb == "run":
        return ["run", str(doc), "--out", str(out), "--data-root", str(data_root)], out
    if verb == "explain":
        return ["--json", "explain", str(doc), "--data-root", str(data_root)], out
    return ["validate", str(doc), "--data-root", str(data_root)], out


def _tables(out: Path, cap: int) -> dict:
    """Every table and tensor file the implementation wrote under --out (document.json and run.json aside),
    as comparable data. What is not such a file (a link, a folder named `*.json`, a file past the cap, text
    that is not JSON, bytes that are not safetensors) fails the case, naming the file (SPEC.md C19)."""
    tables: dict[str, Any] = {}
    if not out.is_dir():
        return tables
    found = []
    for folder, dirs, files in os.walk(out):  # links are never followed
        for name in dirs + files:
            if name.endswith((".json", ".safetensors")) and name not in ("document.json", "run.json"):
                found.append(Path(folder) / name)
    for file in sorted(found, key=lambda f: (f.suffix != ".json", f.relative_to(out).as_posix())):
        rel = file.relative_to(out).as_posix()
        if file.is_symlink() or not file.is_file():
            raise CaseError(f"--out holds {rel}, which is {'a link' if file.is_symlink() else 'not a file'}; "
                            "a run writes its tables and tensors as plain files")
        if file.stat().st_size > cap:
            raise CaseError(f"--out holds {rel} of {file.stat().st_size} bytes, past what conform reads back "
                            f"({cap} bytes)")
        tables[rel] = _read_table(file, rel)
    return tables


def _read_table(file: Path, rel: str) -> Any:
    if file.suffix == ".json":
        try:
            return json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise CaseError(f"--out holds {rel}, which is not a JSON table ({type(error).__name__}: "
                            f"{str(error)[:200]})") from None
    try:
        return tensor_file(file)
    except Exception as error:  # safetensors' own errors, whatever the bytes hold: the implementation's fault
        raise CaseError(f"--out holds {rel}, which is not a safetensors file ({type(error).__name__}: "
                        f"{str(error)[:200]})") from None


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


def observe(case: dict, impl, tmp: Path, cap: int = CAP) -> dict:
    """What the implementation did on this case, in the shape of a case's `expect`."""
    argv, out = _prepare(case, tmp)
    status, stdout, stderr = impl(argv, tmp)
    observed: dict[str, Any] = {"status": status}
    if status == 2:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        observed["refusal"] = catalogue.split_line(lines[-1] if lines else "")
        return observed
    if status != 0:
        observed["stderr"] = stderr.strip()[-2000:]
        return observed
    verb = case["verb"]
    if verb == "run":
        observed["tables"] = _tables(out, cap)
        return observed
    try:
        if verb == "explain":
            observed["plan"] = json.loads(stdout)["plan"]
        elif verb == "model":
            observed["components"] = json.loads(stdout)["components"]
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        observed["stdout_unreadable"] = f"{type(error).__name__}: {str(error)[:200]}"
    return observed


def _key(case: dict) -> str:
    fixture = case["fixture"]
    return fixture if isinstance(fixture, str) else fixture["key"]


def _fixture_diffs(case: dict, recipes: dict[str, str]) -> list[str]:
    """The case's fixture must be the checkpoint its expectation was recorded on (SPEC.md C11)."""
    key, recipe = _key(case), case["fixture"].get("recipe") if isinstance(case["fixture"], dict) else None
    if recipe is None:
        return [f"fixture: the case names {key} without its recipe; record it (conform --record) to give one"]
    if key not in recipes:
        return [f"fixture: no checkpoint folder for {key!r} (the exported fixtures are {sorted(recipes)})"]
    if recipes[key] != recipe:
        return [f"fixture: the case was recorded on {key} recipe {recipe[:12]}, the folder is recipe "
                f"{recipes[key][:12]}; re-export the fixtures or re-record the case"]
    return []


def check(case: dict, impl, record: bool = False, recipes: Optional[dict[str, str]] = None,
          cap: int = CAP) -> tuple[str, list[str], dict]:
    """('pass' | 'fail' | 'n/a', diff lines, observed) for one case."""
    if "_broken" in case:
        return "fail", [case["_broken"]], {}
    if recipes is not None and not record:
        bad = _fixture_diffs(case, recipes)
        if bad:
            return "fail", bad, {}
    with tempfile.TemporaryDirectory(prefix="conform-") as tmp:
        try:
            observed = observe(case, impl, Path(tmp), cap)
        except CaseError as error:
            return "fail", [str(error)], {}
    if observed["status"] == NOT_APPLICABLE:
        return "n/a", [], observed
    if record:
        return "pass", [], observed
    want = case.get("expect")
    if want is None:
        return "fail", ["the case has no `expect` (record it with --record)"], observed
    if "refusal" in want and observed.get("status") == want.get("status"):
        diffs = compare_refusal(want["refusal"], observed.get("refusal"))
        return _verdict(diffs), diffs, observed
    diffs = compare(want, observed, float(case.get("tolerance", 1e-5)), informative_fields=case.get("informative", ()))
    return _verdict(diffs), diffs, observed


def _verdict(diffs: list[str]) -> str:
    return "fail" if diffs else "pass"


# ---------------------------------------------------------------- recording


def recorded(observed: dict, entries: list) -> dict:
    """An observation as a case's `expect`: a refusal's message becomes its catalogue template."""
    if "refusal" not in observed:
        return observed
    entry = catalogue.entry_for(observed["refusal"], entries)
    if entry is None:
        raise SystemExit(f"no catalogue entry (SPEC.md §13) states the refusal {observed['refusal']}; add one first")
    refusal = observed["refusal"]
    return {"status": observed["status"],
            "refusal": {"stage": refusal["stage"], "path": refusal["path"], "message": entry.message}}


ORDER = ("name", "rules", "fixture", "verb", "document", "data", "files", "tolerance", "informative", "confirmed",
         "grounds", "expect")
GROUNDS = ("independent", "identity", "seed", "finding", "recorded")


def grounds_counts(cases: list[dict]) -> dict[str, int]:
    """How many cases rest on each kind of ground (SPEC.md C32), in GROUNDS order; a case without one counts
    as `none`."""
    counts = {kind: 0 for kind in GROUNDS}
    for case in cases:
        kind = (case.get("grounds") or {}).get("kind", "none") if isinstance(case.get("grounds"), dict) else "none"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


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
        if rel in tables or "/" not in rel:
            continue
        try:  # a string that is not a path inside both folders names no shipped table (S12)
            source, target = _inside(shipped, rel, "data table"), _inside(corpus / "data", rel, "data table")
        except CaseError:
            continue
        try:  # a string too long to be a file name (a description with a slash in it) names no table
            shipped_table = source.is_file()
        except OSError:
            shipped_table = False
        if shipped_table:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            tables[rel] = f"data/{rel}"
    if tables:
        case["data"] = dict(sorted(tables.items()))
    marks = {"explain": "plan.*.steps.*.forwards.*.taps.*.op", "model": "components.*.op"}
    if case["verb"] in marks and marks[case["verb"]] not in case.get("informative", []):
        case["informative"] = list(case.get("informative", [])) + [marks[case["verb"]]]
    return case


def _record(case: dict, observed: dict, entries: list) -> None:
    """Write the case file again with what causalab_ref answered; never through a link (S11)."""
    stored = {k: case[k] for k in ORDER if k in case}
    stored["expect"] = recorded(observed, entries)
    text = json.dumps(stored, indent=1, ensure_ascii=False) + "\n"
    try:
        fd = os.open(case["_file"], os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    except OSError as error:
        raise CaseError(f"{Path(case['_file']).name} cannot be recorded: {error.strerror} (a case file is "
                        "recorded in place, never through a link)") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


# ---------------------------------------------------------------- the verb


def checkpoint_folders(cases: list[dict], folder: Path) -> dict[str, str]:
    """The fixture folders the cases need, under `folder`: reused when the manifest there lists the key
    and its files have their digests, exported otherwise (SPEC.md C9)."""
    keys = sorted({_key(c) for c in cases if "_broken" not in c})
    have = exported.verified(folder)
    missing = [k for k in keys if k not in have]
    if missing:
        exported.export(folder, keys=sorted(set(missing) | set(have)))
    return exported.checkpoint_map(folder)


def _report(case: dict, verdict: str, diffs: list[str], seconds: float, quiet: bool, stream) -> None:
    label = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A "}[verdict]
    rules = case.get("rules")  # only shown: a case whose `rules` is not a list (null, fuzz case 158) still reports
    rules = ", ".join(map(str, rules)) if isinstance(rules, list) else "?"
    if verdict != "pass" or not quiet:
        print(printable(f"{label} {case['name']}  [{case.get('verb', '?')}; {rules}]  {seconds:.1f}s", False),
              file=stream)
    for line in diffs[:25]:  # a case file's text, escaped as a refusal line is but not shortened (S76)
        print(f"       {printable(line, False)}", file=stream)
    if len(diffs) > 25:
        print(f"       ... and {len(diffs) - 25} more difference(s)", file=stream)


@dataclass(frozen=True)
class Options:
    """How conform runs: which cases (`cases_dir`, `only`), where the fixture folders are (`fixtures_dir`,
    with an --impl), each call's bounds (`timeout` seconds, `cap` bytes of stdout and of stderr), and
    `fail_fast`, `record` (write causalab_ref's results into the cases), `quiet`, and `jobs`: how many cases an
    --impl runs at once (default the cores this process may use; SPEC.md C33)."""
    cases_dir: Optional[str] = None
    only: Optional[str] = None
    fixtures_dir: Optional[str] = None
    timeout: float = TIMEOUT
    cap: int = CAP
    fail_fast: bool = False
    record: bool = False
    quiet: bool = False
    jobs: int = field(default_factory=lambda: cores())


JOBS_MAX = 256  # --jobs past this is a typo (each job is a process that may load a model), not a machine


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parse_jobs(text: str) -> int:
    """--jobs: an integer from 1 to JOBS_MAX, else a usage error naming the value."""
    digits = text.strip()
    value = int(digits) if re.fullmatch(r"[0-9]{1,4}", digits) else 0  # ASCII digits only: no `1_0`, no `١`
    if not 1 <= value <= JOBS_MAX:
        raise UsageError(f"--jobs {text!r} is not a whole number of cases to run at once from 1 to {JOBS_MAX}")
    return value


def is_folder(path: Path) -> bool:
    """Whether `path` names a folder; a name the system cannot look up at all (past its length, a loop of
    links, no permission) names none (SPEC.md C20)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def selected(options: Options) -> list[dict]:
    """The cases of the corpus folder, narrowed by --only (a comma-separated list: the cases whose name
    contains any of them); a folder that is not there is a usage error."""
    folder = Path(options.cases_dir) if options.cases_dir else CASES
    if not is_folder(folder):
        raise UsageError(f"--cases {str(folder)!r} is not a folder; give the corpus folder (a copy of "
                         "causalab_ref/conformance/corpus, or leave --cases out)")
    cases = load_cases(folder)
    if options.only:
        wanted = [w for w in options.only.split(",") if w]
        cases = [c for c in cases if any(w in c["name"] for w in wanted)]
    return cases


def listing(options: Options) -> dict:
    """`conform --list`: the cases --cases and --only select, in the order a run checks them, each with its
    verb, and nothing run (no --impl needed); {text, cases} (SPEC.md C40)."""
    cases = selected(options)
    rows = [{"name": c["name"], "verb": c.get("verb") if "_broken" not in c else None} for c in cases]
    width = max((len(r["name"]) for r in rows), default=0)
    lines = [f"{r['name']:{width}s}  {r['verb'] or 'unreadable (a run fails it)'}" for r in rows]
    lines.append(f"conform: {len(rows)} case(s) selected")
    return {"text": "\n".join(lines), "cases": rows}


def _implementation(impl_command: Optional[str], main, cases: list[dict], scratch: str, options: Options):
    """(the implementation, {key: recipe digest} the cases are checked against). An --impl given, even
    blank, is the implementation: a blank one is a usage error, never causalab_ref in its place."""
    if impl_command is not None:
        words = command(impl_command)
        if options.record:
            raise UsageError("--record writes causalab_ref's own results into the cases; it takes no --impl")
        folder = Path(options.fixtures_dir or scratch)
        folders = checkpoint_folders(cases, folder)
        recipes = {k: e["recipe"] for k, e in exported.verified(folder).items()}
        return Subprocess(words, folders, options.timeout, options.cap), recipes
    if main is None:
        raise ValueError("conform needs an implementation: a command (impl_command) or an entry point (main)")
    from ..fixtures import builder
    return InProcess(main), {k: builder.recipe_digest(k) for k in {_key(c) for c in cases if "_broken" not in c}}


def _nothing_checked(counts: dict, total: int, options: Options) -> Optional[str]:
    """Why a run that passed no case is not a pass (None when some case passed)."""
    if counts["pass"]:
        return None
    cases_at = options.cases_dir or str(CASES)
    if total == 0 and options.only:
        return f"conform: no case was checked: --only {options.only!r} matches no case in {cases_at}"
    if total == 0:
        return f"conform: no case was checked: {cases_at} holds no case file (*.json)"
    if counts["n/a"] == total:
        return (f"conform: no case was checked: the implementation answered 3 (not applicable) to all {total} "
                "case(s)")
    return None  # some failed: the failures say why


def _checked(cases: list[dict], impl, recipes: Optional[dict[str, str]], options: Options):
    """(case, verdict, diffs, observed, seconds) per case, in the cases' order. With an --impl and --jobs N > 1
    up to N cases run at once, each in its own folder, and each is yielded when it and every case before it are
    done, so the report is --jobs 1's; a consumer that stops (--fail-fast) cancels the cases not started, and
    the ones running are waited for (SPEC.md C33). The in-process check runs one case at a time: its captured
    streams and its working folder are the process's."""
    def one(case: dict) -> tuple[dict, str, list[str], dict, float]:
        case = completed(case) if options.record and "_broken" not in case else case
        t = time.time()
        verdict, diffs, observed = check(case, impl, record=options.record, recipes=recipes, cap=options.cap)
        return case, verdict, diffs, observed, time.time() - t

    if options.jobs <= 1 or not isinstance(impl, Subprocess) or len(cases) <= 1:
        yield from map(one, cases)
        return
    with ThreadPoolExecutor(max_workers=min(options.jobs, len(cases)), thread_name_prefix="conform") as pool:
        futures = [pool.submit(one, case) for case in cases]
        try:
            for future in futures:
                yield future.result()
        except KeyboardInterrupt:  # met while a case is awaited: every running call is stopped, then waited for
            impl.stop()
            raise
        finally:
            for future in futures:
                future.cancel()


def conform(impl_command: Optional[str] = None, options: Options = Options(),
            main: Optional[Callable[[list[str]], int]] = None, stream=None) -> dict:
    """Run the corpus against `impl_command` (a subprocess) or, with none, in-process against `main`.
    `ok` only when some case passed and none failed; `why` says so when no case passed (SPEC.md C20)."""
    stream = stream or sys.stdout
    options = replace(options, jobs=parse_jobs(str(options.jobs)))  # --jobs's text, or an Options built in Python
    cases = selected(options)
    started = time.time()
    counts = {"pass": 0, "fail": 0, "n/a": 0}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="conform-fixtures-") as scratch:
        impl, recipes = _implementation(impl_command, main, cases, scratch, options)
        entries = catalogue.entries((ROOT / "SPEC.md").read_text(encoding="utf-8")) if options.record else []
        print(f"conform: {len(cases)} case(s) against {impl.name}", file=stream)
        try:
            for case, verdict, diffs, observed, seconds in _checked(cases, impl, recipes, options):
                counts[verdict] += 1
                if options.record and verdict == "pass":
                    try:
                        _record(case, observed, entries)
                    except CaseError as error:
                        verdict, diffs = "fail", [str(error)]
                        counts["pass"], counts["fail"] = counts["pass"] - 1, counts["fail"] + 1
                _report(case, verdict, diffs, seconds, options.quiet, stream)
                if verdict == "fail":
                    failed.append(case["name"])
                    if options.fail_fast:
                        break
        except KeyboardInterrupt:  # SIGINT or SIGTERM: what this run started is stopped, every job, at once (C39)
            impl.stop()
            raise
    summary = (f"conform: {counts['pass']} passed, {counts['fail']} failed, {counts['n/a']} not applicable "
               f"({time.time() - started:.0f}s)")
    why = _nothing_checked(counts, len(cases), options)
    return {"summary": summary, "passed": counts["pass"], "failed": failed, "not_applicable": counts["n/a"],
            "why": why, "ok": not failed and why is None}

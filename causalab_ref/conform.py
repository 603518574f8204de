"""Conform: run the conformance corpus (tests/conformance/*.json) against an implementation.

`python -m causalab_ref conform [--impl "CMD"]`. Each case is a document (plus optional
inline data tables), the verb to run it with, and the expected result. The runner writes
the document and a data root (the shipped documents/data plus the case's own tables) to a
temporary folder, invokes the implementation through the CLI contract of SPEC.md §6 Conformance
(rules C1-C7), and compares what it printed and wrote with the case's `expect`:

* `run`: exit 0 and every metric table under --out (document.json and run.json aside),
  values within the case's tolerance, everything else (positions, tokens, reasons,
  eligible, key order) exact;
* `explain`: exit 0 and the `plan` of `--json explain` (addresses, widths, positions);
* `model`: exit 0 and the `components` of `--json model KEY`;
* `validate`: exit 0;
* a refusal: exit 2 and the one stderr line `<stage>: <path>: <message>`, exact.

An implementation that exits 3 says it does not implement what the case uses: the case is
reported not applicable. With no --impl the implementation is a command-line entry point
the caller hands in (`main`: argv -> exit status; the CLI passes its own), called in-process
with captured streams so the corpus runs in seconds; an --impl is always a subprocess. This
module imports no cli: the structured plan `explain --json` prints lives in plan.py.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from . import results

ROOT = Path(__file__).resolve().parents[1]
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
    """Another implementation: `CMD <argv>` in a subprocess (SPEC.md C1)."""

    def __init__(self, command: str):
        self.command = shlex.split(command)
        self.name = command

    def __call__(self, argv: list[str], cwd: Path) -> tuple[int, str, str]:
        done = subprocess.run(self.command + argv, cwd=cwd, capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr


# ---------------------------------------------------------------- one case


def load_cases(folder: Path = CASES) -> list[dict]:
    cases = []
    for file in sorted(Path(folder).glob("*.json")):
        case = json.loads(file.read_text(encoding="utf-8"))
        case["_file"] = str(file)
        cases.append(case)
    return cases


def _repo(case: dict) -> Path:
    """The repository a case belongs to: its folder is <repo>/tests/conformance."""
    return Path(case["_file"]).resolve().parents[2]


def _document(case: dict) -> Any:
    if "document" in case:
        return case["document"]
    return json.loads((_repo(case) / case["document_file"]).read_text(encoding="utf-8"))


def _prepare(case: dict, tmp: Path) -> tuple[list[str], Path]:
    """Write the case's files; return the argv (after CMD) and the --out folder."""
    data_root = tmp / "data"
    shutil.copytree(_repo(case) / "documents" / "data", data_root)
    for rel, table in (case.get("data") or {}).items():
        # a key is a path under the data root: `..`, an absolute path or a link out is refused (SPEC.md S8)
        where = f"{Path(case.get('_file', 'case')).name}: data"
        target = results.confined(data_root, rel, where, data_root, "the data root")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(table, indent=1, ensure_ascii=False), encoding="utf-8")
    for rel in case.get("files") or ():  # repository files a document names by relative path (a bundle)
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_repo(case) / rel, tmp / rel)
    doc = tmp / "document.json"
    out = tmp / "out"
    verb = case["verb"]
    if verb == "model":
        return ["--json", "model", case["fixture"]], out
    doc.write_text(json.dumps(_document(case), indent=1, ensure_ascii=False), encoding="utf-8")
    if verb == "run":
        return ["run", str(doc), "--out", str(out), "--data-root", str(data_root)], out
    if verb == "explain":
        return ["--json", "explain", str(doc), "--data-root", str(data_root)], out
    return ["validate", str(doc), "--data-root", str(data_root)], out


def _tables(out: Path) -> dict:
    tables = {}
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
        got["refusal"] = lines[-1] if lines else ""
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


def compare(want: Any, got: Any, tolerance: float, path: str = "") -> list[str]:
    """Readable differences: `path: expected X, got Y`. A float agrees when |want - got| <=
    tolerance * max(|want|, 0.01) (SPEC.md C6); everything else is exact, and a dict's key order
    counts (a metric table's keys are in a fixed order, SPEC.md R7)."""
    where = path or "<result>"
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isfinite(want) and abs(want - got) <= tolerance * max(abs(want), 0.01):
            return []
        return [f"{where}: expected {want!r}, got {got!r} (relative tolerance {tolerance})"]
    if isinstance(want, dict) and isinstance(got, dict):
        diffs = []
        for key in want:
            if key not in got:
                diffs.append(f"{where}.{key}: expected {_short(want[key])}, missing")
        for key in got:
            if key not in want:
                diffs.append(f"{where}.{key}: not expected, got {_short(got[key])}")
        for key in want:
            if key in got:
                diffs += compare(want[key], got[key], tolerance, f"{path}.{key}" if path else str(key))
        if not diffs and list(want) != list(got):
            diffs.append(f"{where}: keys in order {list(want)}, got {list(got)}")
        return diffs
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: expected {len(want)} items {_short(want)}, got {len(got)} {_short(got)}"]
        diffs = []
        for k, (w, g) in enumerate(zip(want, got)):
            diffs += compare(w, g, tolerance, f"{path}[{k}]")
        return diffs
    if type(want) is not type(got) and not (isinstance(want, int) and isinstance(got, float)
                                            and not isinstance(want, bool)):
        return [f"{where}: expected {_short(want)}, got {_short(got)}"]
    return [] if want == got else [f"{where}: expected {_short(want)}, got {_short(got)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."


def check(case: dict, impl, record: bool = False) -> tuple[str, list[str], dict]:
    """('pass' | 'fail' | 'n/a', diff lines, observed) for one case."""
    with tempfile.TemporaryDirectory(prefix="conform-") as tmp:
        got = observe(case, impl, Path(tmp))
    if got["status"] == NOT_APPLICABLE:
        return "n/a", [], got
    if record:
        return "pass", [], got
    want = case.get("expect")
    if want is None:
        return "fail", ["the case has no `expect` (record it with --record)"], got
    diffs = compare(want, got, float(case.get("tolerance", 1e-5)))
    return ("fail" if diffs else "pass"), diffs, got


# ---------------------------------------------------------------- the verb


def unknown_rules(cases: list[dict]) -> list[str]:
    """Rule ids the cases cite that SPEC.md does not have."""
    import re
    ids = set()
    spec = (_repo(cases[0]) if cases else ROOT) / "SPEC.md"
    for line in spec.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^- \*\*([A-Z]+\d+)\*\*", line)
        if m:
            ids.add(m.group(1))
    return [f"{Path(c['_file']).name}: {r}" for c in cases for r in c.get("rules", []) if r not in ids]


def conform(impl_command: Optional[str] = None, cases_dir: Optional[str] = None, only: Optional[str] = None,
            fail_fast: bool = False, record: bool = False, quiet: bool = False, stream=None,
            main: Optional[Callable[[list[str]], int]] = None) -> dict:
    """Run the corpus against `impl_command` (a subprocess) or, with none, in-process against `main`."""
    stream = stream or sys.stdout
    if not impl_command and main is None:
        raise ValueError("conform needs an implementation: a command (impl_command) or an entry point (main)")
    impl = Subprocess(impl_command) if impl_command else InProcess(main)
    cases = load_cases(Path(cases_dir) if cases_dir else CASES)
    if only:
        cases = [c for c in cases if only in c["name"] or only in Path(c["_file"]).name]
    if record and impl_command:
        raise SystemExit("--record writes causalab_ref's own results into the cases; it takes no --impl")
    counts = {"pass": 0, "fail": 0, "n/a": 0}
    failed = []
    started = time.time()
    print(f"conform: {len(cases)} case(s) against {impl.name}", file=stream)
    for case in cases:
        t = time.time()
        verdict, diffs, got = check(case, impl, record=record)
        counts[verdict] += 1
        if record:
            file = Path(case["_file"])
            stored = {k: v for k, v in case.items() if k != "_file"}
            stored["expect"] = got
            file.write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        label = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A "}[verdict]
        if verdict != "pass" or not quiet:
            print(f"{label} {case['name']}  [{case['verb']}; {', '.join(case.get('rules', []))}]"
                  f"  {time.time() - t:.1f}s", file=stream)
        for line in diffs[:25]:
            print(f"       {line}", file=stream)
        if len(diffs) > 25:
            print(f"       ... and {len(diffs) - 25} more difference(s)", file=stream)
        if verdict == "fail":
            failed.append(case["name"])
            if fail_fast:
                break
    bad_rules = unknown_rules(cases)
    for line in bad_rules:
        print(f"UNKNOWN RULE {line}", file=stream)
    summary = (f"conform: {counts['pass']} passed, {counts['fail']} failed, {counts['n/a']} not applicable "
               f"({time.time() - started:.0f}s)")
    return {"summary": summary, "passed": counts["pass"], "failed": failed, "not_applicable": counts["n/a"],
            "unknown_rules": bad_rules, "ok": not failed and not bad_rules}

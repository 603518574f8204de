"""Safety (SPEC.md §7): the results folder, signals, environment faults, and what a checkpoint may do.

Each test performs the attack: a second run to a claimed --out, a reader racing a replace, a
signal mid-run, a read-only or full file system (tmpfs mounts; skipped with the reason when they
cannot be made), a checkpoint naming its own code, weights that do not match, a damaged fixture.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import inprocess

from causalab_ref.engines import checkpoint, loading, weightless
from causalab_ref import cli, interrupts
from causalab_ref.fixtures import builder, exported, recipes
from causalab_ref.runs import results, run
from causalab_ref.runs import compile as compiler
from causalab_ref.shapes import Model, Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
DOC = ROOT / "documents" / "patching.json"
PATCHING = json.loads(DOC.read_text(encoding="utf-8"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _cli(*args: str, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "causalab_ref", *args], cwd=ROOT, env=env or ENV,
                          capture_output=True, text=True, timeout=300, **kw)


def _one_line(proc, start: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(start), lines[0]
    return lines[0]


def _result(llama, out: Path) -> Path:
    run.execute(compiler.compile_document(PATCHING, llama, DATA), llama, out, progress=False)
    return out


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _slow_root(tmp_path: Path, copies: int = 400) -> Path:
    root = tmp_path / "data"
    shutil.copytree(DATA, root)
    rows = json.loads((DATA / "weekdays" / "train.json").read_text(encoding="utf-8"))
    (root / "weekdays" / "train.json").write_text(json.dumps(rows * copies), encoding="utf-8")
    return root


def _signalled_mid_run(tmp_path: Path, out: Path, sig: int, *extra: str) -> subprocess.CompletedProcess:
    """Start a long run, send `sig` once its staging folder exists, return the finished process."""
    proc = subprocess.Popen([sys.executable, "-m", "causalab_ref", "run", str(DOC), "--data-root",
                             str(_slow_root(tmp_path)), "--out", str(out), "--batch-size", "1", "--quiet", *extra],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.parent.glob(f".{out.name}.partial-*")):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the run never started writing"
            time.sleep(0.02)
        time.sleep(0.3)
        assert proc.poll() is None, "the run finished before it could be signalled; give it more rows"
        os.kill(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


class _Mount:
    """A small tmpfs at `where` (root only); skips the test with the reason when it cannot be mounted."""

    def __init__(self, where: Path, options: str = "size=1m"):
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")
        self.where = where

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.where)], check=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.where)], check=False)


# ================================================================ the results folder


@pytest.mark.parametrize("name", ["", ".", "..", "sub/..", "/"])
def test_an_out_that_names_no_folder_is_refused_and_nothing_changes(tmp_path, monkeypatch, name):
    """SPEC.md:1034 [S1] `--out ""`, `.`, `..` (with --replace) are refused before anything is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(Refusal, match="names no new folder"):
        results.Folder(Path(name), replace=True)
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "keep.txt").read_text() == "mine"


def test_replace_of_the_current_folder_is_refused_by_the_cli(tmp_path):
    """SPEC.md:1034 [S1] through the CLI: `run --out . --replace` is one line, exit 2, the folder untouched."""
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "causalab_ref", "run", str(DOC), "--data-root", str(DATA),
                           "--out", ".", "--replace"], cwd=tmp_path, env={**ENV, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    _one_line(proc, "run: --out: --out '.' names no new folder")
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]


def test_replace_refuses_a_folder_no_run_wrote(tmp_path):
    """SPEC.md:1036 [S2] --replace on a data root (a folder of someone's files) is refused, unchanged."""
    root = tmp_path / "data"
    shutil.copytree(DATA, root)
    before = _tree(root)
    with pytest.raises(Refusal, match="not a folder a run wrote") as caught:
        results.Folder(root, replace=True)
    assert caught.value.path == "--out" and _tree(root) == before
    assert sorted(os.listdir(tmp_path)) == ["data"]  # no staging folder, no lock left beside it


def test_replace_takes_a_folder_a_run_wrote(llama, tmp_path):
    """SPEC.md:1036 [S2] a previous run's folder carries its record, so --replace replaces it."""
    out = _result(llama, tmp_path / "out")
    (out / "stray.txt").write_text("old", encoding="utf-8")
    run.execute(compiler.compile_document(PATCHING, llama, DATA), llama, out, replace=True, progress=False)
    assert not (out / "stray.txt").exists() and results.record_of(out) is not None
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_second_run_to_a_claimed_out_is_refused_and_removes_nothing(llama, tmp_path):
    """SPEC.md:1039 [S3] while one run holds --out (here: this process), a second run with --replace is
    refused in one line naming the holder, and the first run's result and staging folder are intact."""
    out = _result(llama, tmp_path / "out")
    before = _tree(out)
    with results.Folder(out, replace=True) as first:
        first.write("x.json", [1])
        proc = _cli("run", str(DOC), "--data-root", str(DATA), "--out", str(out), "--replace", "--quiet")
        line = _one_line(proc, "run: --out: ")
        assert "being written by another run" in line and f"pid {os.getpid()}" in line
        assert (first.staging / "x.json").is_file() and _tree(out) == before
        first.commit()
    assert json.loads((out / "x.json").read_text()) == [1]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the lock file went with the claim


def test_a_reader_sees_the_old_result_or_the_new_one_whole_during_replaces(tmp_path):
    """SPEC.md:1043 [S4] a reader polling --out while it is replaced 40 times never finds it missing or
    partly written: every look finds one run's three files, whole and of one generation (a look that opened
    the old folder just before the swap may find it removed: that is the old result retired, not a mix)."""
    out = tmp_path / "out"

    def one(generation: int, replace: bool) -> None:
        with results.Folder(out, replace=replace) as folder:
            for name in ("a.json", "b.json"):
                folder.write(name, {"generation": generation, "pad": "x" * 20000})
            folder.write("run.json", {"causalab_ref": "test", "generation": generation})
            folder.commit()

    one(0, False)
    seen, bad, stop = set(), [], threading.Event()

    def look(folder: int) -> tuple[list, set]:
        names, gens = sorted(os.listdir(folder)), set()
        for name in names:
            with os.fdopen(os.open(name, os.O_RDONLY, dir_fd=folder), encoding="utf-8") as file:
                gens.add(json.load(file)["generation"])
        return names, gens

    def reader():  # one look: open --out (never missing), list it and read its files through that handle
        while not stop.is_set():
            try:
                folder = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as error:
                bad.append(f"open: {error!r}")
                continue
            try:
                names, gens = look(folder)
            except (OSError, ValueError) as error:
                names, gens = [repr(error)], set()
            # the old result, swapped out (and being removed) after the look opened it: not --out any more
            retired = os.fstat(folder).st_ino != os.stat(out).st_ino
            os.close(folder)
            if not retired and (names != ["a.json", "b.json", "run.json"] or len(gens) != 1):
                bad.append(f"{names} {gens}")
            seen.update(gens)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for generation in range(1, 41):
            one(generation, True)
    finally:
        stop.set()
        thread.join()
    assert bad == [] and len(seen) > 1
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_an_interrupt_during_a_replace_leaves_the_old_result_whole(llama, tmp_path):
    """SPEC.md:1049 [S5] SIGINT mid-run with --replace: the old result stays, byte for byte, and no
    staging folder or lock is left."""
    out = _result(llama, tmp_path / "results" / "out")
    before = _tree(out)
    proc = _signalled_mid_run(tmp_path, out, signal.SIGINT, "--replace")
    assert proc.returncode == 130 and "interrupted; nothing was written" in proc.stderr, proc.stderr
    assert _tree(out) == before and sorted(os.listdir(out.parent)) == ["out"]


def test_a_result_moved_aside_by_a_killed_replace_is_put_back(tmp_path):
    """SPEC.md:1049 [S5] S4's fallback killed between its two renames: --out is missing and the old result
    is aside under this tool's exact name; the next run's cleanup puts it back (or drops it once --out exists)."""
    out = tmp_path / "out"
    aside = tmp_path / ".out.old-pid999999999-abcd1234"
    aside.mkdir()
    (aside / "run.json").write_text('{"causalab_ref": "old"}', encoding="utf-8")
    results.clean_stale(out)
    assert results.record_of(out) == {"causalab_ref": "old"} and not aside.exists()
    aside.mkdir()
    results.clean_stale(out)
    assert not aside.exists() and results.record_of(out) == {"causalab_ref": "old"}


def test_sigterm_is_handled_like_sigint(tmp_path):
    """SPEC.md:1053 [S6] SIGTERM mid-run: exit 130 with one line, no --out, and the staging folder removed."""
    out = tmp_path / "results" / "out"
    out.parent.mkdir()
    proc = _signalled_mid_run(tmp_path, out, signal.SIGTERM)
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted; nothing was written", proc.stderr
    assert os.listdir(out.parent) == []


def test_stale_cleanup_touches_only_this_tools_exact_names(tmp_path):
    """SPEC.md:1079 [S7] a dead run's `.o*t.partial-pid<P>-<8>` is removed; folders of other names — no pid,
    another suffix, another --out that the name `o*t` would match as a glob, a live pid — stay."""
    out = tmp_path / "o*t"
    dead = tmp_path / ".o*t.partial-pid999999999-abcd_123"
    kept = [tmp_path / ".o*t.partial-x", tmp_path / ".o*t.partial-pid999999999-abc",
            tmp_path / ".out.partial-pid999999999-abcd1234", tmp_path / f".o*t.partial-pid{os.getppid()}-abcd1234",
            tmp_path / ".o*t.partial-pid999999999-abcd1234.extra"]
    for folder in [dead, *kept]:
        folder.mkdir()
    results.clean_stale(out)
    assert not dead.exists() and all(folder.is_dir() for folder in kept)


def test_conform_cases_cannot_write_data_outside_their_root(tmp_path, capsys):
    """SPEC.md:1083 [S8] a case's inline data keys `../../x.json` and an absolute path are refused in one
    line, and no file appears where they point."""
    target = tmp_path / "escaped.json"
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    os.symlink(ROOT / "documents", repo / "documents")
    for key in ("../../../escaped.json", str(target)):
        cases = repo / "tests" / f"cases-{len(key)}"
        cases.mkdir()
        case = json.loads((ROOT / "causalab_ref" / "conformance" / "corpus" / "accept_mixed_sign_span.json").read_text("utf-8"))
        case["data"] = {key: [{"input": "x"}]}
        (cases / "case.json").write_text(json.dumps(case), encoding="utf-8")
        with pytest.raises(SystemExit) as exited:
            cli.main(["conform", "--cases", str(cases)])
        assert exited.value.code == 1
        out = capsys.readouterr().out
        assert f"data key {key!r} escapes its folder" in out and "conform: 0 passed, 1 failed" in out
        assert not target.exists() and not (tmp_path.parent / "escaped.json").exists()


def _case_with(tmp_path, **fields):
    """A folder holding one corpus case (accept_mixed_sign_span) with `fields` replaced, and its files/."""
    cases = tmp_path / "cases"
    (cases / "files").mkdir(parents=True)
    shutil.copytree(ROOT / "causalab_ref" / "conformance" / "corpus" / "data", cases / "data")
    case = json.loads((ROOT / "causalab_ref" / "conformance" / "corpus" / "accept_mixed_sign_span.json").read_text("utf-8"))
    case.update(fields)
    (cases / "case.json").write_text(json.dumps(case), encoding="utf-8")
    return cases


def test_a_case_files_entry_that_climbs_out_fails_that_case_and_writes_nothing_outside(tmp_path, capsys):
    """SPEC.md:1103 [S12] a `files` entry `../r/planted.txt` shipped inside the corpus is neither read from
    outside files/ nor written outside the case's temporary folder: that case fails with one line naming the
    entry, and the file does not appear where the entry points."""
    cases = _case_with(tmp_path, files=["../r/planted.txt"])
    (cases / "r").mkdir()
    (cases / "r" / "planted.txt").write_text("planted", encoding="utf-8")
    before = set(Path(tempfile.gettempdir()).glob("r/planted.txt"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["conform", "--cases", str(cases)])
    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert "files entry '../r/planted.txt' escapes its folder" in out and "0 passed, 1 failed" in out
    assert set(Path(tempfile.gettempdir()).glob("r/planted.txt")) == before


def test_a_case_files_entry_through_a_link_out_fails_that_case(tmp_path, capsys):
    """SPEC.md:1103 [S12] a `files` entry that is a link in files/ to a file outside the corpus is not read."""
    cases = _case_with(tmp_path, files=["secret.txt"])
    (tmp_path / "secret.txt").write_text("secret", encoding="utf-8")
    os.symlink(tmp_path / "secret.txt", cases / "files" / "secret.txt")
    with pytest.raises(SystemExit):
        cli.main(["conform", "--cases", str(cases)])
    assert "files entry 'secret.txt' escapes its folder" in capsys.readouterr().out


def test_a_data_file_a_case_names_outside_the_corpus_fails_that_case(tmp_path, capsys):
    """SPEC.md:1103 [S12] a table named by file as `../../x.json` is not read from outside the corpus."""
    (tmp_path / "x.json").write_text("[]", encoding="utf-8")
    cases = _case_with(tmp_path, data={"weekdays/x.json": "../x.json"})
    with pytest.raises(SystemExit):
        cli.main(["conform", "--cases", str(cases)])
    assert "data file '../x.json' escapes its folder" in capsys.readouterr().out


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_a_planted_lock_is_refused_and_its_target_is_left_whole(tmp_path, plant):
    """SPEC.md:1099 [S11] `.<out>.lock` planted as a link to a file (or a hard link, or a fifo) is refused
    in one line naming it, and the file it points at keeps every byte (it was once emptied, twice)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    lock = tmp_path / ".out.lock"
    {"symlink": lambda: os.symlink(victim, lock), "hardlink": lambda: os.link(victim, lock),
     "fifo": lambda: os.mkfifo(lock)}[plant]()
    with pytest.raises(Refusal) as caught:
        results.Folder(tmp_path / "out")
    assert caught.value.path == "--out" and str(lock) in caught.value.message
    assert ("link" in caught.value.message) if plant != "fifo" else ("not a regular file" in caught.value.message)
    assert victim.read_text(encoding="utf-8") == "precious"
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_a_run_with_a_planted_lock_link_exits_2_and_empties_nothing(llama, tmp_path):
    """SPEC.md:1099 [S11] the attack through the CLI as a subprocess: `run` exits 2 with one line, and the
    link's target is unchanged."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    os.symlink(victim, tmp_path / ".out.lock")
    proc = subprocess.run([sys.executable, "-m", "causalab_ref", "run", str(DOC), "--data-root", str(DATA),
                           "--out", str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "is a link" in proc.stderr
    assert victim.read_text(encoding="utf-8") == "precious"


def test_an_out_under_a_file_or_with_an_overlong_name_is_one_line(tmp_path):
    """SPEC.md:1086 [S9] environment faults name the path and the cause, as refusals of --out."""
    (tmp_path / "file").write_text("x", encoding="utf-8")
    for out, cause in ((tmp_path / "file" / "out", "Not a directory"), (tmp_path / ("x" * 300), "File name too long")):
        with pytest.raises(Refusal) as caught:
            results.Folder(out)
        message = caught.value.message
        assert caught.value.path == "--out" and cause in message and str(out.parent) in message
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_read_only_or_full_file_system_under_out_is_one_line(llama, tmp_path):
    """SPEC.md:1086 [S9] a run onto a read-only tmpfs, and onto one too small for its files: exit 2, one
    line naming the path and the cause, no staging folder left (through the CLI)."""
    mount = _Mount(tmp_path / "mnt", "size=8k")
    try:
        proc = inprocess.cli("run", str(DOC), "--data-root", str(DATA), "--out", str(mount.where / "out"), "--quiet")
        line = _one_line(proc, "run: --out: cannot ")
        assert "No space left on device" in line and str(mount.where) in line
        assert os.listdir(mount.where) == []
        mount.read_only()
        proc = inprocess.cli("run", str(DOC), "--data-root", str(DATA), "--out", str(mount.where / "out"), "--quiet")
        line = _one_line(proc, "run: --out: cannot ")
        assert "Read-only file system" in line and str(mount.where) in line
    finally:
        mount.close()


def test_a_bug_while_loading_stays_an_internal_error(monkeypatch, capsys):
    """SPEC.md:1089 [S10] an exception loading does not raise for a bad checkpoint (a TypeError here) is the
    project's failure: exit 1 and `internal error`, never a refusal of model.key. The bug is in every load
    validate may make: the weightless engine's tokenizer, served from the cached tokenizer.json (tokenjson.py) or
    loaded by transformers on a cold cache (either then leaves the compile to the meta load, SPEC.md:1948 [E9]),
    and the meta load."""
    def broken(*args, **kwargs):
        raise TypeError("a bug")
    monkeypatch.setattr(checkpoint, "standardized", broken)
    monkeypatch.setattr(weightless, "tokenizer", broken)
    monkeypatch.setattr(weightless, "fixture_tokenizer", broken)
    assert cli.main(["validate", str(DOC)]) == 1
    err = capsys.readouterr().err
    assert "internal error (TypeError): a bug" in err and "model.key" not in err


def test_the_summary_line_shows_the_mean_the_count_and_a_few_values(tmp_path):
    """SPEC.md:1125 [S19] 12 rows, one unscored: the mean of 11, `11 of 12`, the first 5 values, `7 more`."""
    values = [float(v) for v in range(11)] + [None]
    rows = [{"metric": "iia", "value": v, "unit": "fraction"} for v in values]
    (tmp_path / "iia.json").write_text(json.dumps(rows), encoding="utf-8")
    line = cli.summary_line(tmp_path / "iia.json")
    want = "iia mean 5 over 11 of 12 rows (fraction); not scored: 1 column-ineligible; rows [0, 1, 2, 3, 4, ... 7 more]"
    assert line == f"{tmp_path / 'iia.json'}: {want}"


# ================================================================ checkpoints


def _copy(tmp_path: Path, key: str = "fixture:tiny-llama") -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(builder.checkpoint_dir(key), dst)
    return dst


def _own_code(ckpt: Path, marker: Path, file: str) -> None:
    (ckpt / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                  "from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizerFast\n"
                                  "class EvilConfig(LlamaConfig):\n    pass\n"
                                  "class EvilModel(LlamaForCausalLM):\n    pass\n"
                                  "class EvilTokenizer(LlamaTokenizerFast):\n    pass\n", encoding="utf-8")
    config = json.loads((ckpt / file).read_text(encoding="utf-8"))
    config["auto_map"] = ({"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
                          if file == "config.json" else {"AutoTokenizer": [None, "evil.EvilTokenizer"]})
    (ckpt / file).write_text(json.dumps(config), encoding="utf-8")


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_checkpoint_naming_its_own_code_is_refused_on_every_verb_and_engine(tmp_path, capsys, file):
    """SPEC.md:1130 [S20] an `auto_map` (config.json or tokenizer_config.json) with its .py beside it:
    validate, explain, model, tokens and run, on both engines, refuse in one line naming the file, and the
    code never runs."""
    ckpt = _copy(tmp_path)
    marker = tmp_path / "ran"
    _own_code(ckpt, marker, file)
    raw = copy.deepcopy(PATCHING)
    raw["model"]["key"] = str(ckpt)
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    calls = [[verb, str(doc), "--engine", kind] for verb in ("validate", "explain") for kind in ("nnterp", "hooks")]
    calls += [["model", str(ckpt), "--engine", "hooks"], ["model", str(ckpt)], ["tokens", str(ckpt), "hi"],
              ["run", str(doc), "--engine", "hooks", "--out", str(tmp_path / "out")], ["run", str(doc), "--out",
                                                                                      str(tmp_path / "out")]]
    for argv in calls:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("compile: model.key: ") and f"{file} has an `auto_map`" in err[0]
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_checkpoint_naming_its_own_code_never_reads_stdin(tmp_path):
    """SPEC.md:1130 [S20] a tokenizer auto_map with "y" waiting on stdin: no question, the code never runs."""
    ckpt = _copy(tmp_path)
    marker = tmp_path / "ran"
    _own_code(ckpt, marker, "tokenizer_config.json")
    proc = _cli("model", str(ckpt), input="y\ny\n")
    _one_line(proc, "compile: model.key: ")
    assert "[y/N]" not in proc.stdout + proc.stderr and not marker.exists()


def test_an_auto_map_key_is_found_by_parsing_and_a_string_that_says_auto_map_is_not_one(tmp_path):
    """SPEC.md:1130 [S20] the JSON files are parsed: an `auto_map` key spelled with an escape is refused; the
    value "auto_map" (a string, not a key) is no code, and the checkpoint loads."""
    ckpt = _copy(tmp_path)
    config = ckpt / "tokenizer_config.json"
    plain = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**plain, "note": "auto_map"}), encoding="utf-8")
    done = inprocess.cli("model", str(ckpt))
    assert done.returncode == 0, done.stderr
    escaped = json.dumps(plain)[:-1] + ', "auto\\u005fmap": {"AutoTokenizer": [null, "evil.EvilTokenizer"]}}'
    assert json.loads(escaped)["auto_map"] and '"auto_map"' not in escaped
    config.write_text(escaped, encoding="utf-8")
    done = inprocess.cli("model", str(ckpt))
    assert done.returncode == 2 and "tokenizer_config.json has an `auto_map`" in done.stderr, done.stderr


def test_a_hub_key_not_in_the_cache_fails_naming_what_was_tried(tmp_path):
    """SPEC.md:1137 [S21] offline first: a hub key not in the local cache, with the hub off (HF_HUB_OFFLINE),
    is refused naming the key, the revision, the cache and the hub."""
    proc = _cli("model", "nobody/none", env={**ENV, "HF_HOME": str(tmp_path / "hf")})
    line = _one_line(proc, "compile: model.key: model 'nobody/none' at revision 'main' could not be found: tried ")
    assert str(tmp_path / "hf") in line and "HF_HUB_OFFLINE is set" in line


def test_a_hub_key_with_no_network_fails_naming_the_unreachable_hub(tmp_path):
    """SPEC.md:1137 [S21] not offline by setting but unreachable: the hub's host is tried once (a refused
    connection here: a local port nothing listens on), then the key is refused naming it."""
    env = {k: v for k, v in ENV.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env = {k: v for k, v in env.items() if "proxy" not in k.lower()}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")
    proc = _cli("model", "nobody/none", env=env)
    line = _one_line(proc, "compile: model.key: model 'nobody/none' at revision 'main' could not be found: tried ")
    assert "the hub http://127.0.0.1:9 (unreachable: " in line


def _weights(ckpt: Path, change) -> None:
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(ckpt / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


def _drop_layer_and_head(t):
    for k in [k for k in t if k.startswith("model.layers.1.") or k == "lm_head.weight"]:
        del t[k]


def _add_stray(t):
    t["model.layers.0.mlp.stray.weight"] = t["model.norm.weight"].clone()


def _reshape_norm(t):
    t["model.norm.weight"] = t["model.norm.weight"][:-1].clone()


@pytest.mark.parametrize("change, kind, named", [
    (_drop_layer_and_head, "missing", "lm_head.weight, model.layers.1."),
    (_add_stray, "unexpected", "model.layers.0.mlp.stray.weight"),
    (_reshape_norm, "mis-shaped", "model.norm.weight"),
])
def test_weights_that_do_not_match_the_model_are_refused_naming_the_tensors(tmp_path, change, kind, named):
    """SPEC.md:1142 [S22] missing (the head and all of layer 1), unexpected and mis-shaped tensors are refused
    on both engines, naming them; nothing loads with random values."""
    ckpt = _copy(tmp_path)
    _weights(ckpt, change)
    for engine_kind in ("nnterp", "hooks"):
        with pytest.raises(Refusal) as caught:
            loading.load(Model(key=str(ckpt), revision="main", dtype="fp32"), kind=engine_kind, weights=True)
        assert caught.value.path == "model.key" and f"{kind} " in caught.value.message, caught.value.message
        assert named in caught.value.message


@pytest.fixture()
def own_cache(tmp_path, monkeypatch):
    """A fixture cache of this test's own, holding a freshly built tiny GPT-2 (the smallest fixture)."""
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path / "cache"))
    folder = builder.checkpoint_dir("fixture:tiny-gpt2")
    return folder, _tree(folder)


@pytest.mark.parametrize("damage", ["overwrite", "truncate", "delete", "record", "nested record"])
def test_a_damaged_fixture_is_rebuilt_not_trusted(own_cache, damage):
    """SPEC.md:1146 [S23] weight bytes overwritten, a truncated file, a missing file, a record without the
    files' digests or nested past the reader: the next use rebuilds the folder to its recorded bytes."""
    folder, before = own_cache
    weights = folder / "model.safetensors"
    if damage == "overwrite":
        data = bytearray(weights.read_bytes())
        data[-64:] = bytes(64)
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "delete":
        (folder / "vocab.json").unlink()
    elif damage == "nested record":  # JSON nested past what the reader takes: RecursionError, not ValueError
        (folder / "fixture_recipe.json").write_text("[" * 100_000, encoding="utf-8")
    else:
        record = json.loads((folder / "fixture_recipe.json").read_text(encoding="utf-8"))
        del record["files"]
        (folder / "fixture_recipe.json").write_text(json.dumps(record), encoding="utf-8")
    assert builder.damaged(folder, json.loads(before["fixture_recipe.json"])["digest"]) != []
    assert builder.checkpoint_dir("fixture:tiny-gpt2") == folder
    assert _tree(folder) == before


def test_a_damaged_fixture_in_a_read_only_cache_is_one_line(tmp_path, monkeypatch):
    """SPEC.md:1150 [S24] a fixture that must be rebuilt where the cache cannot be written: refused naming
    the folder, the cause and $CAUSALAB_REF_CACHE."""
    mount = _Mount(tmp_path / "cache", "size=4m")
    try:
        monkeypatch.setenv(builder.CACHE_ENV, str(mount.where))
        folder = builder.checkpoint_dir("fixture:tiny-gpt2")
        (folder / "vocab.json").write_text("{}", encoding="utf-8")
        mount.read_only()
        with pytest.raises(Refusal) as caught:
            builder.checkpoint_dir("fixture:tiny-gpt2")
        message = caught.value.message
        assert caught.value.path == "model.key" and str(folder) in message
        assert "Read-only file system" in message and "$CAUSALAB_REF_CACHE" in message
    finally:
        mount.close()


# ================================================================ the fixture cache and exported folders

#: the seed's Llama-2 ids of "If today is Thursday, tomorrow is" (SPEC X4)
LLAMA_IDS = [1, 960, 9826, 338, 498, 1295, 3250, 29892, 6454, 22396, 338]


def _entries(root: Path) -> dict:
    """Every entry under `root`, links not followed: a file's bytes, a link's target, a folder's mark."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            out[rel] = (("link", os.readlink(path)) if path.is_symlink() else
                        ("dir",) if path.is_dir() else ("file", path.read_bytes()))
    return out


def test_a_file_dropped_into_a_verified_fixture_folder_is_removed_not_read(tmp_path, monkeypatch):
    """SPEC.md:1152 [S25] a tokenizer.json dropped beside the Llama-2 tokenizer.model of a verified tiny-llama
    cache folder (and a link to a file outside) would be read in its place: a plain load of a copy of the
    folder gives other ids. The next load removes both, the link's target untouched, and gives the seed's
    Llama-2 ids again."""
    from transformers import AutoTokenizer
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(builder, "_TOKENIZERS", {})
    folder = builder.checkpoint_dir("fixture:tiny-llama")
    before = _tree(folder)
    assert builder.tokenizer("fixture:tiny-llama")("If today is Thursday, tomorrow is").input_ids == LLAMA_IDS
    shutil.copyfile(recipes.BPE_DIR / "tokenizer.json", folder / "tokenizer.json")
    victim = tmp_path / "victim.txt"
    victim.write_text("kept", encoding="utf-8")
    (folder / "planted-link").symlink_to(victim)
    poisoned = shutil.copytree(folder, tmp_path / "poisoned", symlinks=True)
    assert AutoTokenizer.from_pretrained(str(poisoned))("If today is Thursday, tomorrow is").input_ids != LLAMA_IDS
    monkeypatch.setattr(builder, "_TOKENIZERS", {})  # the next process's load
    assert builder.tokenizer("fixture:tiny-llama")("If today is Thursday, tomorrow is").input_ids == LLAMA_IDS
    assert _tree(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(before)
    assert victim.read_text(encoding="utf-8") == "kept"


def test_run_json_names_the_recipe_only_for_files_checked_against_it(tmp_path):
    """SPEC.md:1196 [S29] a run on an exported tiny-llama folder records the recipe while its files are the
    manifest's; after one weight value changes (same shapes) it records no recipe, and its model_files are
    the sha256 of the folder's files as they are now."""
    exported.export(tmp_path / "fx", keys=["fixture:tiny-llama"])
    folder = tmp_path / "fx" / "tiny-llama"
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(dict(PATCHING, model=dict(PATCHING["model"], key=str(folder)))), encoding="utf-8")

    def record(out: str) -> dict:
        assert cli.main(["run", str(doc), "--data-root", str(DATA), "--out", str(tmp_path / out), "--quiet"]) == 0
        return json.loads((tmp_path / out / "run.json").read_text(encoding="utf-8"))

    assert record("intact")["fixture_recipe"] == builder.recipe_digest("fixture:tiny-llama")

    def one_value(tensors):
        tensors["model.norm.weight"][0] += 1.0

    _weights(folder, one_value)
    changed = record("changed")
    assert "fixture_recipe" not in changed
    assert changed["model_files"] == {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                      for p in sorted(folder.iterdir())}
    manifest = json.loads((tmp_path / "fx" / "manifest.json").read_text(encoding="utf-8"))
    assert changed["model_files"]["model.safetensors"] != manifest["fixtures"]["fixture:tiny-llama"]["files"][
        "model.safetensors"]


def test_a_cache_root_that_cannot_be_created_is_one_line_naming_the_variable(tmp_path, monkeypatch, capsys):
    """SPEC.md:1161 [S27] $CAUSALAB_REF_CACHE=/proc/x: `fixtures export` is one refusal naming the fixture's folder,
    the cause and $CAUSALAB_REF_CACHE, not an internal error."""
    monkeypatch.setenv(builder.CACHE_ENV, "/proc/x")
    assert cli.main(["fixtures", "export", str(tmp_path / "fx"), "--key", "fixture:tiny-gpt2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compile: model.key: fixture 'tiny-gpt2': its cache folder "
                                                   "/proc/x/tiny-gpt2-"), lines
    assert "(No such file or directory: /proc/x)" in lines[0] and "set $CAUSALAB_REF_CACHE to a folder" in lines[0]


def _plants(dest: Path) -> dict:
    """{attack: (how to plant it where an export of tiny-gpt2 into `dest` goes, the start of the refusal)}."""
    elsewhere, target = dest.parent / "elsewhere", dest / "tiny-gpt2"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("mine", encoding="utf-8")
    return {
        "DIR is a file": (lambda: dest.write_text("mine"), f"{dest} is a file, not a folder"),
        "DIR is a link": (lambda: dest.symlink_to(elsewhere), f"{dest} is a link"),
        "a file of the fixture's name": (lambda: (dest.mkdir(), target.write_text("mine")),
                                         f"{target} is a file where the fixture's folder goes"),
        "a link of the fixture's name": (lambda: (dest.mkdir(), target.symlink_to(elsewhere)),
                                         f"{target} is a link where the fixture's folder goes"),
        "a user's folder of the fixture's name": (lambda: (dest.mkdir(), target.mkdir(),
                                                           (target / "config.json").write_text("{}")),
                                                  f"{target} is a folder no export wrote"),
        "an exported folder with a file added": (lambda: (exported.export(dest, keys=["fixture:tiny-gpt2"]),
                                                          (target / "notes.txt").write_text("mine")),
                                                 f"{target} holds what no export wrote (notes.txt)"),
        "a manifest no export wrote": (lambda: (dest.mkdir(), (dest / "manifest.json").write_text('{"mine": 1}')),
                                       f"{dest / 'manifest.json'} is not a manifest an export wrote"),
    }


@pytest.mark.parametrize("plant", ["DIR is a file", "DIR is a link", "a file of the fixture's name",
                                   "a link of the fixture's name", "a user's folder of the fixture's name",
                                   "an exported folder with a file added", "a manifest no export wrote"])
def test_an_export_onto_what_it_did_not_write_is_one_line_and_changes_nothing(tmp_path, capsys, plant):
    """SPEC.md:1188 [S28] DIR a file or a link, a file or a link or a user's folder of a fixture's name, a file
    added to an exported folder, a manifest.json no export wrote: one refusal at DIR naming it, exit 2, and
    every byte, link and folder under the test's folder as it was."""
    dest = tmp_path / "w" / "fx"
    dest.parent.mkdir()
    plant_it, start = _plants(dest)[plant]
    plant_it()
    capsys.readouterr()
    before = _entries(tmp_path / "w")
    assert cli.main(["fixtures", "export", str(dest), "--key", "fixture:tiny-gpt2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"run: DIR: {start}"), lines
    assert _entries(tmp_path / "w") == before


_STALLED_EXPORT = """
import shutil, sys, time
from pathlib import Path
from causalab_ref.fixtures import exported
real = shutil.copyfile
def stalled(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if str(dst).startswith(sys.argv[1]):
        print("staged", flush=True)
        time.sleep(600)
shutil.copyfile = stalled
exported.export(Path(sys.argv[1]), keys=["fixture:tiny-gpt2"])
"""


def test_a_killed_exports_staging_folder_does_not_survive_the_next_export(tmp_path):
    """SPEC.md:1156 [S26] an export killed (SIGKILL) while it copies leaves `.tiny-gpt2.partial-pid<P>-<8>` in
    DIR; the next export removes it and writes the folder. A staging name of a live process, a link of a
    dead one's name and a name with another suffix stay."""
    dest = tmp_path / "fx"
    dest.mkdir()
    builder.checkpoint_dir("fixture:tiny-gpt2")  # built before, so the child only copies
    proc = subprocess.Popen([sys.executable, "-c", _STALLED_EXPORT, str(dest)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "staged", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    left = [p.name for p in dest.iterdir()]
    assert len(left) == 1 and left[0].startswith(f".tiny-gpt2.partial-pid{proc.pid}-"), left
    kept = [dest / f".tiny-gpt2.partial-pid{os.getpid()}-abcd1234", dest / f".tiny-gpt2.partial-pid{proc.pid}-x"]
    for folder in kept:
        folder.mkdir()
    (dest / f".tiny-gpt2.partial-pid{proc.pid}-abcd_123").symlink_to(kept[0])
    exported.export(dest, keys=["fixture:tiny-gpt2"])
    assert not (dest / left[0]).exists()
    assert all(folder.is_dir() for folder in kept) and (dest / f".tiny-gpt2.partial-pid{proc.pid}-abcd_123").is_symlink()
    assert "fixture:tiny-gpt2" in exported.verified(dest)


def test_a_killed_builds_staging_folder_is_removed_by_the_next_build(tmp_path, monkeypatch):
    """SPEC.md:1156 [S26] a staging folder of a process that is gone, beside a fixture's cache folder, is removed
    when the fixture is next built."""
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path / "cache"))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    name = f"tiny-gpt2-{builder.recipe_digest('fixture:tiny-gpt2')[:12]}"
    stale = tmp_path / "cache" / f".{name}.partial-pid{gone.pid}-abcd1234"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    assert builder.checkpoint_dir("fixture:tiny-gpt2") == tmp_path / "cache" / name
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [name]



def test_a_stale_folder_named_with_a_pid_past_any_process_is_left_and_raises_nothing(tmp_path):
    """SPEC.md:1079 [S7] `.<out>.partial-pid<P>-<8>` whose P is too large for the system call: not a process this
    tool can judge dead, so the folder is kept, and the cleanup raises nothing (it once raised OverflowError)."""
    out = tmp_path / "out"
    huge = tmp_path / f".out.partial-pid{10 ** 30}-abcd1234"
    huge.mkdir()
    results.clean_stale(out)
    assert huge.is_dir() and interrupts.alive(10 ** 30)

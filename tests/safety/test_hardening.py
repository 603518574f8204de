"""Hardening: nothing half-written, confined paths, safe loading, run.json, progress.

A killed run leaves no result folder; a save, a sweep point's folder and a dataset ref cannot
leave --out or the data root (`..`, absolute paths, links); loading runs no checkpoint code and
reads only safetensors; run.json carries device, dtype and wall time; the progress bar shows on a
terminal only.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch

import inprocess

from causalab_ref.runs import compile as compiler
from causalab_ref.runs import data, results, run
from causalab_ref.engines import loading
from causalab_ref.fixtures import builder
from causalab_ref.documents import sweeps, validate
from causalab_ref.shapes import Model, Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _refused(raw, match_path: str):
    with pytest.raises(Refusal) as caught:
        for _label, point in sweeps.points(raw):
            validate.document(point)
    assert caught.value.path == match_path, (caught.value.path, caught.value.message)
    return caught.value


# ================================================================ nothing half-written


def _long_data_root(tmp_path: Path, copies: int) -> Path:
    root = tmp_path / "data"
    shutil.copytree(DATA, root)
    rows = json.loads((DATA / "weekdays" / "train.json").read_text(encoding="utf-8"))
    (root / "weekdays" / "train.json").write_text(json.dumps(rows * copies), encoding="utf-8")
    return root


def test_a_killed_run_leaves_no_result_folder_and_the_next_run_clears_its_staging(tmp_path):
    """SPEC.md:602 [R15] SPEC.md:585 [R10] SIGKILL once the staging folder exists: no --out; the next run
    beside it removes the dead run's `.out.partial-*` folder and writes --out."""
    root = _long_data_root(tmp_path, 400)
    results = tmp_path / "results"
    results.mkdir()
    out = results / "out"
    proc = subprocess.Popen([sys.executable, "-m", "causalab_ref", "run", str(ROOT / "documents" / "patching.json"),
                             "--data-root", str(root), "--out", str(out), "--batch-size", "1", "--quiet"],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(results.glob(".out.partial-*")):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the run never started writing"
            time.sleep(0.01)
        time.sleep(0.3)  # mid-way: forwards under way
        assert proc.poll() is None, "the run finished before it could be killed; give it more rows"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert not out.exists()
    stale = list(results.glob(".out.partial-*"))
    assert stale  # SIGKILL runs no cleanup: the staging folder stays, and is not a result
    done = inprocess.cli("run", str(ROOT / "documents" / "patching.json"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "iia.json").is_file()
    assert sorted(p.name for p in results.iterdir()) == ["out"]


def test_staging_of_a_live_run_is_left_alone(llama, tmp_path):
    """SPEC.md:602 [R15] a staging folder whose process is alive (here: this one's parent) is kept."""
    live = tmp_path / f".out.partial-pid{os.getppid()}-abcd1234"
    dead = tmp_path / ".out.partial-pid999999999-abcd1234"
    live.mkdir()
    dead.mkdir()
    run.execute(compiler.compile_document(PATCHING, llama, DATA), llama, tmp_path / "out", progress=False)
    assert live.is_dir() and not dead.exists()


def test_run_json_records_device_dtype_and_wall_time(llama, tmp_path):
    """SPEC.md:580 [R9] run.json: versions, the fixture digest, device, dtype and wall_seconds."""
    plan = compiler.compile_document(PATCHING, llama, DATA)
    started = time.perf_counter()
    run.execute(plan, llama, tmp_path / "out", progress=False)
    elapsed = time.perf_counter() - started
    record = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))
    assert record["device"] == "cpu"
    assert record["dtype"] == str(torch.float32)  # the document's fp32, as torch names the weights' dtype
    wall = record["wall_seconds"]  # rounded to 1 ms, as `elapsed` is rounded below (rounding keeps the order)
    assert isinstance(wall, float) and math.isfinite(wall)
    assert 0 < wall <= round(elapsed, 3)  # the run's own time, inside the time this test measured around it
    assert record["fixture_recipe"] == builder.recipe_digest("fixture:tiny-llama")
    assert record["model"]["revision"] == "seeded"
    assert record["versions"] == {name: metadata.version(name) for name in ("torch", "transformers", "nnsight",
                                                                            "nnterp")}


# ================================================================ confinement


@pytest.mark.parametrize("file_path", ["../escape.json", "/tmp/abs.json", "a/../../b.json", "./x/../../y.json",
                                       "a//b.json", "run.json"])
def test_a_save_that_would_leave_out_is_refused_with_its_path(file_path):
    """SPEC.md:591 [R12] `..`, absolute and empty parts are refused at validation naming the file_path
    (and a file the run writes itself is refused likewise)."""
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["score"]["saves"][0]["file_path"] = file_path
    refusal = _refused(raw, "steps.score.saves.0.file_path")
    assert file_path in refusal.message


def test_a_save_through_a_link_out_of_out_is_refused(tmp_path):
    """SPEC.md:591 [R12] a path that resolves through a link outside --out is refused with the path."""
    base = tmp_path / "staging"
    base.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", base / "link")
    with pytest.raises(Refusal) as caught:
        results.confined(base, "link/x.json", "steps.score.saves.0.file_path", base)
    assert caught.value.path == "steps.score.saves.0.file_path" and "link/x.json" in caught.value.message
    assert results.confined(base, "sub/x.json", "p", base) == base / "sub" / "x.json"


def test_an_out_that_is_a_link_is_refused(llama, tmp_path):
    """SPEC.md:591 [R12] --out itself may not be a link (replacing it would write through it)."""
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "out")
    plan = compiler.compile_document(PATCHING, llama, DATA)
    with pytest.raises(Refusal, match="is a link or a file"):
        run.execute(plan, llama, tmp_path / "out", replace=True, progress=False)
    assert list((tmp_path / "target").iterdir()) == []


@pytest.mark.parametrize("value", ["../x", "/abs", "a/b", "..\\x", "x" * 300])
def test_a_sweep_point_folder_that_would_leave_out_is_refused(value):
    """SPEC.md:591 [R12] a swept string becomes the point's folder name: a separator, `..`, an absolute
    path or an over-long name is refused at validation with the wrapper's path and the label."""
    raw = copy.deepcopy(PATCHING)
    raw["header"] = {}
    raw["steps"]["score"]["rows"]["counterfactual"] = {"sweep": ["weekdays_train", value]}
    refusal = _refused(raw, "steps.score.rows.counterfactual")
    assert "sweep point's folder" in refusal.message and json.dumps(value)[1:50] in refusal.message


@pytest.mark.parametrize("ref", ["../data/weekdays/train", "/etc/passwd", "weekdays/../../x", "weekdays/../weekdays/train"])
def test_a_dataset_ref_that_leaves_the_data_root_is_refused(ref):
    """SPEC.md:591 [R12] SPEC.md:31 [D9] `..` and absolute refs are refused naming the ref."""
    with pytest.raises(Refusal) as caught:
        data.rows_of(ref, DATA, "steps.score.rows.base")
    assert caught.value.path == "steps.score.rows.base" and ref in caught.value.message


def test_a_linked_table_that_resolves_outside_the_root_is_refused(tmp_path):
    """SPEC.md:591 [R12] a table (or folder) that is a link out of the data root is refused."""
    root = tmp_path / "root"
    (root / "weekdays").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(DATA / "weekdays" / "train.json", outside / "train.json")
    os.symlink(outside / "train.json", root / "weekdays" / "train.json")
    os.symlink(outside, root / "linked")
    for ref in ("weekdays/train", "linked/train"):
        with pytest.raises(Refusal, match="leaves the data root") as caught:
            data.rows_of(ref, root, "steps.score.rows.base")
        assert ref in caught.value.message


# ================================================================ loading


def _copy_checkpoint(tmp_path: Path) -> Path:
    src = builder.checkpoint_dir("fixture:tiny-llama")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_a_checkpoint_with_only_pytorch_bin_weights_is_refused(tmp_path):
    """SPEC.md:595 [R13] only safetensors weights are read: a pytorch_model.bin checkpoint is refused."""
    import torch
    from safetensors.torch import load_file
    ckpt = _copy_checkpoint(tmp_path)
    torch.save(load_file(str(ckpt / "model.safetensors")), str(ckpt / "pytorch_model.bin"))
    (ckpt / "model.safetensors").unlink()
    spec = Model(key=str(ckpt), revision="main", dtype="fp32")
    for kind in ("nnterp", "hooks"):
        with pytest.raises(Refusal) as caught:
            loading.load(spec, kind=kind, weights=True)
        assert caught.value.path == "model.key" and str(ckpt) in caught.value.message


def test_loading_never_runs_a_checkpoints_own_code(tmp_path):
    """SPEC.md:595 [R13] a config whose auto_map names the checkpoint's own code: that code never runs."""
    ckpt = _copy_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    (ckpt / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                  "from transformers import LlamaConfig, LlamaForCausalLM\n"
                                  "class EvilConfig(LlamaConfig):\n    pass\n"
                                  "class EvilModel(LlamaForCausalLM):\n    pass\n", encoding="utf-8")
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    spec = Model(key=str(ckpt), revision="main", dtype="fp32")
    try:
        loading.load(spec, weights=True)
    except Refusal:
        pass
    assert not marker.exists()


# ================================================================ progress


def test_progress_shows_on_a_terminal_only(monkeypatch):
    """SPEC.md:605 [R16] a bar over several passes on a terminal; none with --quiet, off a terminal,
    or for a single pass."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = results.progress(4, True, "run")
    assert bar is not None and bar.total == 4
    bar.close()
    assert results.progress(4, False, "run") is None
    assert results.progress(1, True, "run") is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert results.progress(4, True, "run") is None


def test_quiet_run_off_a_terminal_prints_no_bar(tmp_path):
    """SPEC.md:605 [R16] stderr is not a terminal here: a many-row run writes nothing to it."""
    root = _long_data_root(tmp_path, 2)
    proc = inprocess.cli("run", str(ROOT / "documents" / "patching.json"), "--data-root", str(root),
                         "--out", str(tmp_path / "out"), "--batch-size", "2")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr

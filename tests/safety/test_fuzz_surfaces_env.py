"""What the `env` and `exported` fuzz surfaces found (tests/fuzz_surfaces_env.py), each attack performed once,
and the invariant bench/fuzz.py's check shares with them (tests/invariant.py)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

import fuzz_surfaces
import fuzzing
import inprocess
from causalab_ref.fixtures import builder

LONG = "/" + "a" * 300  # one name past the file system's 255 bytes
VALIDATE = ["validate", str(fuzz_surfaces.PATCHING), "--data-root", str(fuzzing.DATA)]


def _one_refusal(done: inprocess.Completed, *words: str) -> str:
    text = done.stderr.strip()
    assert done.returncode == 2 and "internal error" not in text and len(text.splitlines()) == 1, text
    assert all(word in text for word in words), text
    return text


@pytest.mark.parametrize("value", [LONG, "/tmp/" + "d/" * 2100, "~nosuchuser/tokenizer.model", "/proc/self/mem"])
def test_a_tokenizer_path_the_file_system_will_not_look_at_is_a_place_looked_in(value, tmp_path, monkeypatch):
    """SPEC.md:639 [X2] $CAUSALAB_REF_LLAMA_TOKENIZER past the file system's lengths, under an unknown `~user` or
    unreadable (fuzz, env: an internal OSError once) is a place that had none: one refusal at model.key naming it."""
    monkeypatch.setenv("CAUSALAB_REF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CAUSALAB_REF_LLAMA_TOKENIZER", value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(builder, "source_checkout", lambda: None)  # no ../shared to fall back on, as installed
    _one_refusal(inprocess.cli(*VALIDATE), "compile: model.key:", "$CAUSALAB_REF_LLAMA_TOKENIZER=")


@pytest.mark.parametrize("value", ["[" * 5000, json.dumps({"fixture:tiny-llama": LONG}),
                                   json.dumps({"fixture:tiny-llama": "\u0000"})])
def test_a_checkpoint_map_nested_past_the_reader_or_to_a_path_too_long_is_refused(value, monkeypatch):
    """SPEC.md:681 [X18] $CONFORM_CHECKPOINTS nested past the JSON reader (an internal RecursionError once) or
    mapping the key to a path too long (an internal OSError once) or holding a NUL is one refusal at model.key."""
    monkeypatch.setenv("CONFORM_CHECKPOINTS", value)
    _one_refusal(inprocess.cli(*VALIDATE), "compile: model.key:")


def test_a_cache_under_an_unknown_users_home_is_refused(monkeypatch):
    """SPEC.md:1161 [S27] $CAUSALAB_REF_CACHE=~nosuchuser/x (pathlib's RuntimeError, an internal error once) is one
    refusal at model.key naming the value and $CAUSALAB_REF_CACHE."""
    monkeypatch.setenv("CAUSALAB_REF_CACHE", "~nosuchuser/x")
    _one_refusal(inprocess.cli(*VALIDATE), "compile: model.key:", "~nosuchuser/x", "$CAUSALAB_REF_CACHE")


def _exported_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "exp" / "tiny-llama"
    shutil.copytree(fuzz_surfaces.fixtures_folder(tmp_path) / "tiny-llama", folder)
    return folder


def test_an_exported_config_field_of_the_wrong_type_is_a_model_key_refusal(tmp_path):
    """SPEC.md:1089 [S10] An exported folder whose config.json says `"vocab_size": 10000.0` (huggingface_hub's
    StrictDataclassFieldValidationError, an internal error once) is refused at model.key, on validate."""
    folder = _exported_copy(tmp_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["vocab_size"] = float(config["vocab_size"])
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    _one_refusal(inprocess.cli("validate", _path_key_document(tmp_path, folder), "--data-root", str(fuzzing.DATA)),
                 "compile: model.key:", "vocab_size")


@pytest.mark.parametrize("file, field, value", [("tokenizer_config.json", "tokenizer_class", {}),
                                               ("tokenizer_config.json", "unk_token", True),
                                               ("config.json", "model_type", ["llama"]),
                                               ("config.json", "architectures", [{}])])
def test_a_class_name_of_another_type_is_refused_before_any_library_reads_it(file, field, value, tmp_path):
    """SPEC.md:1204 [S30] An exported folder whose tokenizer_config.json says `"tokenizer_class": {}` (fuzz
    exported seed 3 case 4: an internal TypeError in transformers once), or whose config.json's model_type or
    architectures is not a string, is refused at model.key naming the file and the field."""
    folder = _exported_copy(tmp_path)
    raw = json.loads((folder / file).read_text(encoding="utf-8"))
    raw[field] = value
    (folder / file).write_text(json.dumps(raw), encoding="utf-8")
    path = _path_key_document(tmp_path, folder)
    for verb in ("validate", "explain"):
        _one_refusal(inprocess.cli(verb, path, "--data-root", str(fuzzing.DATA)), "compile: model.key:",
                     f"{file}'s `{field}`")


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(head_dim=0), "ZeroDivisionError"),            # transformers builds the shell: 0 ** -0.5
    (lambda c: c.update(dtype="float32x"), "could not be loaded"),     # transformers' config code indexes a split
    (lambda c: c.update(rope_scaling={"rope_type": {}}), "could not be loaded"),
], ids=["head-dim-0", "dtype-junk", "rope-type-object"])
def test_an_exception_transformers_raises_reading_a_config_is_a_model_key_refusal(edit, says, tmp_path):
    """SPEC.md:1089 [S10] A config.json transformers cannot build a model from, whatever it raises while reading
    it (fuzz exported cases 256, 163, 618 at 6cd13e9: a ZeroDivisionError, an IndexError and a TypeError raised
    inside transformers, internal errors once), is refused at model.key naming the exception, on validate."""
    folder = _exported_copy(tmp_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    edit(config)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    _one_refusal(inprocess.cli("validate", _path_key_document(tmp_path, folder), "--data-root", str(fuzzing.DATA)),
                 "compile: model.key:", says)


def test_a_config_nested_past_the_json_reader_is_a_model_key_refusal(tmp_path):
    """SPEC.md:1089 [S10] config.json nested past the JSON reader (fuzz exported case 1241 at 6cd13e9: an internal
    RecursionError in the weightless engine once) is refused at model.key, as the meta load refuses it."""
    folder = _exported_copy(tmp_path)
    (folder / "config.json").write_text("[" * 5000, encoding="utf-8")
    _one_refusal(inprocess.cli("validate", _path_key_document(tmp_path, folder), "--data-root", str(fuzzing.DATA)),
                 "compile: model.key:")


@pytest.mark.parametrize("field, value", [("model_max_length", {}), ("padding_side", "middle"),
                                          ("truncation_side", 1)])
def test_a_tokenizer_length_or_side_of_another_kind_is_refused_before_tokenizing(field, value, tmp_path):
    """SPEC.md:1204 [S30] tokenizer_config.json's `model_max_length` that is not a number (fuzz exported case 711 at
    6cd13e9: transformers compared it with an int while tokenizing, an internal TypeError once), or a padding or
    truncation side that is not 'left' or 'right', is refused at model.key naming the file and the field."""
    folder = _exported_copy(tmp_path)
    raw = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    raw[field] = value
    (folder / "tokenizer_config.json").write_text(json.dumps(raw), encoding="utf-8")
    _one_refusal(inprocess.cli("explain", _path_key_document(tmp_path, folder), "--data-root", str(fuzzing.DATA)),
                 "compile: model.key:", f"tokenizer_config.json's `{field}`")


def _path_key_document(tmp_path: pathlib.Path, folder: pathlib.Path) -> str:
    doc = json.loads(fuzz_surfaces.PATCHING.read_text(encoding="utf-8"))
    doc["model"]["key"] = str(folder)
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name, how", [("tokenizer_config.json", "zero"), ("tokenizer.model", "zero"),
                                       ("tokenizer_config.json", "fifo"), ("config.json", "huge")])
def test_a_checkpoint_file_that_is_a_device_a_fifo_or_huge_is_refused_unread(name, how, tmp_path):
    """SPEC.md:1212 [S31] An exported folder whose tokenizer_config.json or tokenizer.model is a link to /dev/zero
    (read until memory ran out once: an internal MemoryError), or a FIFO (a reader blocks), or whose config.json
    is past 256 MiB (a sparse file) is refused at model.key naming the file, on validate, nothing read."""
    folder = _exported_copy(tmp_path)
    (folder / name).unlink()
    if how == "zero":
        (folder / name).symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(folder / name)
    else:
        with open(folder / name, "wb") as handle:
            handle.truncate((256 << 20) + 1)
    done = inprocess.cli("validate", _path_key_document(tmp_path, folder), "--data-root", str(fuzzing.DATA))
    _one_refusal(done, "compile: model.key:", f"{name} is ")


def test_an_export_refused_for_an_unknown_key_writes_nothing(tmp_path):
    """SPEC.md:1188 [S28] `fixtures export DIR --key fixture:tiny-llama --key fixture:nope` (which once wrote the
    Llama folder, then refused) is refused before DIR is touched: DIR is not even created."""
    target = tmp_path / "dir"
    done = inprocess.cli("fixtures", "export", str(target), "--key", "fixture:tiny-llama", "--key", "fixture:nope")
    _one_refusal(done, "fixture:nope")
    assert not target.exists()


def test_bench_fuzz_check_applies_the_invariant(tmp_path, monkeypatch):
    """SPEC.md:1086 [S9] fuzzing.check (bench/fuzz.py) is the surfaces' invariant too: a call that ends in a
    one-line refusal but changed a file of the sentinel folder is not the project's own outcome."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep.txt").write_text("keep me\n")

    def cli(*argv, cwd):
        (sentinel / "keep.txt").write_text("")
        return inprocess.Completed(2, "", "validation: x: refused\n")
    monkeypatch.setattr(inprocess, "cli", cli)
    ok, status, text = fuzzing.check(["validate", "doc.json"], sentinel)
    assert not ok and status == 2 and "invariant: changed outside --out" in text, text


def test_a_tokenizer_with_neither_pad_nor_eos_is_refused_at_model_key(tmp_path):
    """SPEC.md:543 [R2] A missing pad token is set to the EOS token; an exported tokenizer with neither (fuzz
    exported case 2385 at 6cd13e9: transformers' ValueError while padding, an internal error once) is refused at
    model.key with a sentence saying what to add."""
    folder = _exported_copy(tmp_path)
    raw = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    for token in ("pad_token", "eos_token"):
        raw[token] = None
    (folder / "tokenizer_config.json").write_text(json.dumps(raw), encoding="utf-8")
    _one_refusal(inprocess.cli("explain", _path_key_document(tmp_path, folder), "--data-root", str(fuzzing.DATA)),
                 "compile: model.key:", "neither a pad token nor an EOS token")

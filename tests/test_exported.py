"""The fixtures as ordinary checkpoint folders (`fixtures export`), path keys and $CONFORM_CHECKPOINTS."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from causalab_ref import cli, exported, fixtures

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "If today is Thursday, tomorrow is"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    dest = tmp_path_factory.mktemp("exported")
    assert cli.main(["fixtures", "export", str(dest)]) == 0
    return dest


def _patching(tmp_path: Path, key: str) -> Path:
    doc = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    doc["model"]["key"] = key
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _values(out: Path) -> list:
    return [row["value"] for row in json.loads((out / "logit_diff.json").read_text(encoding="utf-8"))]


def test_export_writes_every_fixture_as_a_folder_with_a_manifest_of_sha256s(folders):
    """SPEC.md:181 [X15] one folder per fixture key, no project file in it, every file's sha256 in the manifest."""
    manifest = json.loads((folders / "manifest.json").read_text(encoding="utf-8"))["fixtures"]
    assert list(sorted(manifest)) == sorted(fixtures.names())
    for key, entry in manifest.items():
        folder = folders / entry["folder"]
        assert entry["recipe"] == fixtures.recipe_digest(key)
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(entry["files"]) and "fixture_recipe.json" not in names
        assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(names)
        for name, digest in entry["files"].items():
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest


def test_export_reuses_an_intact_folder_and_rewrites_a_changed_one(folders):
    """SPEC.md:181 [X15] a second export reuses what matches the manifest and rewrites a tampered folder."""
    assert all(reused for _k, _f, reused in exported.export(folders))
    (folders / "tiny-gpt2" / "config.json").write_text("{}", encoding="utf-8")
    done = {key: reused for key, _f, reused in exported.export(folders)}
    assert done["fixture:tiny-gpt2"] is False and done["fixture:tiny-llama"] is True
    assert "fixture:tiny-gpt2" in exported.verified(folders)


def test_exported_folders_load_with_plain_transformers(folders):
    """SPEC.md:182 [X16] plain AutoModelForCausalLM / AutoTokenizer load each folder, with the fixture's ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    for key in fixtures.names():
        folder = folders / key[len(fixtures.FIXTURE_PREFIX):]
        model = AutoModelForCausalLM.from_pretrained(str(folder))
        assert model.config.model_type == json.loads((folder / "config.json").read_text())["model_type"]
        assert AutoTokenizer.from_pretrained(str(folder))(PROMPT).input_ids == fixtures.tokenizer(key)(PROMPT).input_ids


def test_a_path_key_runs_the_exported_folder_with_the_fixtures_values(folders, tmp_path):
    """SPEC.md:183 [X17] a document whose model.key is the exported folder's path gives the fixture's values."""
    assert cli.main(["run", str(_patching(tmp_path, str(folders / "tiny-llama"))), "--out", str(tmp_path / "a"),
                     "--quiet", "--data-root", str(ROOT / "documents" / "data")]) == 0
    assert cli.main(["run", str(ROOT / "documents" / "patching.json"), "--out", str(tmp_path / "b"), "--quiet",
                     "--data-root", str(ROOT / "documents" / "data")]) == 0
    assert _values(tmp_path / "a") == _values(tmp_path / "b")


def test_a_path_key_without_a_checkpoint_is_refused_naming_the_key(tmp_path, capsys):
    """SPEC.md:183 [X17] a path key whose folder has no config.json is refused at compile, naming the key."""
    status = cli.main(["validate", str(_patching(tmp_path, str(tmp_path))),
                       "--data-root", str(ROOT / "documents" / "data")])
    line = capsys.readouterr().err.strip()
    assert status == 2 and line.startswith(f"compile: model.key: model key '{tmp_path}' names the folder")


def test_a_mapped_key_loads_its_folder_and_builds_nothing(folders, tmp_path, monkeypatch, capsys):
    """SPEC.md:184 [X18] with $CONFORM_CHECKPOINTS mapping the key, nothing is built: the cache cannot even exist."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("CAUSALAB_REF_CACHE", str(blocker / "cache"))
    monkeypatch.setenv(exported.MAP_ENV, json.dumps({"fixture:tiny-gpt2": str(folders / "tiny-gpt2")}))
    assert cli.main(["--json", "model", "fixture:tiny-gpt2"]) == 0
    assert json.loads(capsys.readouterr().out)["num_layers"] == 5
    assert cli.main(["--json", "model", "fixture:tiny-llama"]) == 1  # unmapped: the build fails on the blocker
    capsys.readouterr()


def test_a_malformed_checkpoint_map_is_refused(monkeypatch, capsys):
    """SPEC.md:184 [X18] a $CONFORM_CHECKPOINTS that is not a JSON object of folders is refused at compile."""
    monkeypatch.setenv(exported.MAP_ENV, "[1, 2]")
    assert cli.main(["model", "fixture:tiny-gpt2"]) == 2
    assert capsys.readouterr().err.startswith("compile: model.key: $CONFORM_CHECKPOINTS is not a JSON object")

"""Exported: the fixtures as ordinary checkpoint folders, and where a model key's folder is.

`export(DIR)` writes each fixture (fixtures.py) as a standard Hugging Face checkpoint
folder `DIR/<name>/` (config.json, model.safetensors, the tokenizer's files) and a
`DIR/manifest.json` giving, per key, the folder, the recipe digest and the sha256 of every
file, so `transformers.AutoModelForCausalLM.from_pretrained(DIR/<name>)` loads it with no
project code. An export that finds a folder whose files already have the manifest's digests
reuses it. SPEC.md §5 Fixtures (X15-X19).

It also owns the two ways a model key names a folder (`folder_for`):
* a path key: a key that starts with `/`, `./` or `../` is a local checkpoint folder;
* the conformance map: `$CONFORM_CHECKPOINTS`, a JSON object {key: folder}, which the
  conformance runner sets (SPEC.md §6) so any implementation finds a case's checkpoint; a
  key it maps is loaded from that folder, never built.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from . import fixtures
from .shapes import Refusal

MANIFEST = "manifest.json"
MAP_ENV = "CONFORM_CHECKPOINTS"
PATH_PREFIXES = ("/", "./", "../")
#: the files of a fixture's cache folder that are not part of the checkpoint
NOT_EXPORTED = ("fixture_recipe.json",)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> dict[str, str]:
    return {p.name: sha256_of(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in NOT_EXPORTED}


def _entry_holds(folder: Path, entry: dict) -> bool:
    """True when `folder` holds exactly the files `entry` lists, with their digests."""
    if not folder.is_dir():
        return False
    return _files(folder) == entry.get("files")


def _read_manifest(dest: Path) -> dict:
    try:
        manifest = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest.get("fixtures", {}) if isinstance(manifest, dict) else {}


def _copy_folder(src: Path, target: Path) -> None:
    """Copy the checkpoint files of `src` to `target` through a temporary folder beside it."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(tmp, 0o755)
    try:
        for file in sorted(src.iterdir()):
            if file.is_file() and file.name not in NOT_EXPORTED:
                shutil.copyfile(file, tmp / file.name)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def export(dest: Path, keys: Optional[list[str]] = None) -> list[tuple[str, Path, bool]]:
    """Write (or reuse) each fixture's checkpoint folder under `dest` and the manifest.

    Returns (key, folder, reused) per fixture, in the fixtures' order.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    old = _read_manifest(dest)
    entries, done = {}, []
    for key in keys or list(fixtures.names()):
        src = fixtures.checkpoint_dir(key)
        name = key[len(fixtures.FIXTURE_PREFIX):]
        target = dest / name
        entry = {"folder": name, "recipe": fixtures.recipe_digest(key), "files": _files(src)}
        reused = old.get(key, {}).get("recipe") == entry["recipe"] and _entry_holds(target, entry)
        if not reused:
            _copy_folder(src, target)
        entries[key] = entry
        done.append((key, target, reused))
    manifest = {"format": "causalab_ref fixtures, one checkpoint folder per key", "fixtures": entries}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return done


def verified(dest: Path) -> dict[str, dict]:
    """The manifest's entries whose folders hold exactly the listed files and digests."""
    dest = Path(dest)
    return {key: entry for key, entry in _read_manifest(dest).items()
            if isinstance(entry, dict) and _entry_holds(dest / str(entry.get("folder")), entry)}


def checkpoint_map(dest: Path) -> dict[str, str]:
    """{key: absolute folder} for every verified entry of the manifest in `dest`."""
    dest = Path(dest).resolve()
    return {key: str(dest / entry["folder"]) for key, entry in verified(dest).items()}


def is_path_key(key: str) -> bool:
    return isinstance(key, str) and key.startswith(PATH_PREFIXES)


def mapped() -> dict[str, str]:
    """`$CONFORM_CHECKPOINTS` as {key: folder}; unset is empty."""
    text = os.environ.get(MAP_ENV)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise Refusal(f"${MAP_ENV} is not a JSON object mapping model keys to checkpoint folders",
                      path="model.key", stage="compile")
    return value


def folder_for(key: str) -> Optional[Path]:
    """The local checkpoint folder a key names (a path key, or a key `$CONFORM_CHECKPOINTS` maps),
    or None for a key that is neither (a fixture to build, or a hub key)."""
    table = mapped()
    if key in table:
        folder = Path(table[key])
    elif is_path_key(key):
        folder = Path(key)
    else:
        return None
    if not (folder / "config.json").is_file():
        raise Refusal(f"model key '{key}' names the folder {folder}, which is not a checkpoint folder "
                      "(it has no config.json); export the fixtures with `causalab-ref fixtures export DIR` "
                      "and name one of its folders", path="model.key", stage="compile")
    return folder


def recipe_of(folder: Path) -> Optional[str]:
    """The recipe digest the manifest beside `folder` gives it, when the folder is an exported fixture."""
    for entry in _read_manifest(folder.parent).values():
        if isinstance(entry, dict) and entry.get("folder") == folder.name:
            return entry.get("recipe")
    return None

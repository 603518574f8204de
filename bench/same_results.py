"""Every shipped document's results, as digests, to show a change left them byte for byte as they were.

    python bench/same_results.py digests OUT.json    # run every document through the API; write the digests
    python bench/same_results.py compare A.json B.json   # the documents and files whose bytes differ

`digests` runs each document under documents/ (and documents/steps_first/) on its model, loaded once per
model block, saves the results folder and records each file's sha256 by its relative path; run.json is
recorded without its wall time (which differs between two runs of one commit, SPEC.md R9) and without the
package's own digest (which differs between two commits by definition).
Run it at two commits (a clone of each on PYTHONPATH) and compare: a renaming or a restructure must leave
every digest equal. Not a test: the fits take minutes; tests/test_api.py runs a few documents in CI.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS, DATA = ROOT / "documents", ROOT / "documents" / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def tree(folder: pathlib.Path) -> dict[str, str]:
    """sha256 of every file under `folder` by its relative path; run.json without its wall time and the
    package's digest."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "run.json" and path.parent == folder:
                record = json.loads(data)
                record.pop("wall_seconds", None)
                record.pop("causalab_ref", None)
                data = json.dumps(record, indent=1).encode()
            found[path.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return found


def digests(out: pathlib.Path) -> int:
    import causalab_ref as cr

    names = sorted(str(p.relative_to(DOCS).with_suffix(""))
                   for p in [*DOCS.glob("*.json"), *DOCS.glob("steps_first/*.json")])
    models: dict = {}
    found: dict = {"python": sys.version.split()[0], "documents": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for k, name in enumerate(names):
            document = cr.read(DOCS / f"{name}.json")
            spec = document.model
            key = (spec.key, spec.revision, spec.dtype, spec.attn_implementation)
            if key not in models:
                models[key] = cr.load(spec.key, revision=spec.revision, dtype=spec.dtype,
                                      attn_implementation=spec.attn_implementation)
            folder = pathlib.Path(tmp) / f"r{k}"
            cr.run(document, models[key], data_root=DATA, progress=False).save(folder)
            found["documents"][name] = tree(folder)
            print(f"{name}: {len(found['documents'][name])} files, {time.perf_counter() - started:.0f} s", flush=True)
    out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    return 0


def compare(a: pathlib.Path, b: pathlib.Path) -> int:
    first, second = (json.loads(p.read_text())["documents"] for p in (a, b))
    differ = 0
    for name in sorted(set(first) | set(second)):
        x, y = first.get(name, {}), second.get(name, {})
        changed = sorted(f for f in set(x) | set(y) if x.get(f) != y.get(f))
        if changed:
            differ += 1
            print(f"{name}: {len(changed)} files differ: {', '.join(changed[:5])}")
    files = sum(len(v) for v in first.values())
    print(f"{len(first)} documents, {files} files: {differ} documents differ")
    return 1 if differ or set(first) != set(second) else 0


if __name__ == "__main__":
    verb, *paths = sys.argv[1:] or ["?"]
    if verb == "digests" and len(paths) == 1:
        raise SystemExit(digests(pathlib.Path(paths[0])))
    if verb == "compare" and len(paths) == 2:
        raise SystemExit(compare(*map(pathlib.Path, paths)))
    raise SystemExit(__doc__)

"""Surface mutations for tests/safety/test_fuzz_surfaces.py and bench/fuzz_surfaces.py.

tests/fuzzing.py mutates documents and data tables; this module mutates every other input
surface and checks one invariant per case:

* bundle: a featurizer bundle (documents/artifacts/*.safetensors, the corpus's files/) with its
  shapes, dtypes, values (NaN, inf), header, metadata or length changed, loaded by a document;
* case: a corpus case file mutated (tests/fuzzing.py's tree edits and broken text), run by
  `conform --cases DIR` in this process;
* impl: `conform --impl` against a fake implementation that misbehaves at random (exit codes, junk
  stdout, junk files under --out, sleeping past --timeout, flooding);
* flags: random values of --memory-budget, --batch-size, --device-map, --engine, --out, --data-root, --timeout, --jobs,
  conform's --list with --only and --cases;
* cache: a copy of a built fixture folder under a temporary $CAUSALAB_REF_CACHE with files added,
  removed, truncated or replaced by links, and its derived tokenizer forged with its record rewritten to match;
* results: a copy of a run's results folder (a swept patching run, a fit with its loss curve, a sweep beside a
  read at every layer) with its tables, document.json, run.json, tensor files and point folders edited, broken,
  removed or replaced by links (a table's values past a float's range, lists, any unit, a layer of any kind, many
  rows), drawn by `plot` to a figure path that may be a link, a folder or a file;
* table: a damaged copy of those results folders (the same damages, and run.json's points edited: labels and
  folders that climb out, name a link, a file or nothing), read by `table` with --csv, --json or --metric;
* env: $CAUSALAB_REF_LLAMA_TOKENIZER, $HF_HUB_OFFLINE, $CAUSALAB_REF_CACHE and $CONFORM_CHECKPOINTS set to
  hostile values (tests/fuzz_surfaces_env.py);
* exported: a damaged copy of a `fixtures export` folder named by a path key, or `fixtures export` onto a
  hostile target (tests/fuzz_surfaces_env.py);
* interrupt: `run`, `validate`, `vocab` or `conform` of a hanging --impl as the command line, sent SIGINT or
  SIGTERM at a random moment (no traceback, status 0, 2 or 130, no implementation left alive).

The invariant (`violations`, tests/invariant.py, the one tests/fuzzing.py's `check` applies too): no
`internal error` or traceback; no metric-table row that is eligible with a non-finite or null value; no
file of a watched folder (a sentinel, the cwd, the corpus, the documents, an exported folder) written,
truncated, removed or added (the call's --out, its staging and lock names aside); no case past its time
bound. An export besides never changes a path with a part named `user*`.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import re
import shutil
import struct
import sys
import time
from typing import Any, Callable, Optional

import fuzz_surfaces_env
import fuzzing
import inprocess
from invariant import BOUND, snapshot, violations  # noqa: F401 (the invariant, tests/invariant.py)

REPO = fuzzing.REPO
CORPUS = REPO / "causalab_ref" / "conformance" / "corpus"
BUNDLES = sorted((REPO / "documents" / "artifacts").glob("*.safetensors")) + sorted(
    (CORPUS / "files").rglob("*.safetensors"))
BUNDLE_DOCS = {"pca": REPO / "documents" / "pca_control.json", "sae": REPO / "documents" / "sae_ablation.json"}
PATCHING = REPO / "documents" / "patching.json"
CACHE_KEY = "tiny-llama"
SURFACES = ("bundle", "case", "impl", "flags", "cache", "results", "env", "exported", "interrupt", "table")
DTYPES = ["F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "X9"]


# ---------------------------------------------------------------- bundle files

def _split(raw: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join(header: Any, data: bytes, pad: bool = True) -> bytes:
    text = json.dumps(header, allow_nan=True).encode("utf-8", "surrogatepass")
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _ints(value: Any) -> bool:
    """A list of plain integers (a shape, or two data offsets), as a well-formed header holds."""
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _tensor_edit(rng: random.Random, header: dict, data: bytes) -> tuple[dict, bytes]:
    """Change one tensor's shape, dtype or values (NaN, inf, huge) with offsets kept or broken."""
    if not isinstance(header, dict):  # an earlier edit made the header something else: nothing to edit here
        return header, data
    names = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
    if not names or not all(_ints(header[n].get(f)) for n in names for f in ("shape", "data_offsets")) or any(
            len(header[n]["data_offsets"]) != 2 for n in names):
        return header, data
    name = rng.choice(names)
    entry = header[name]
    op = rng.randrange(6)
    if op == 0:
        entry["shape"] = rng.choice([list(reversed(entry["shape"])), entry["shape"][:-1], entry["shape"] + [1], [0],
                                     [], [(entry["shape"] or [0])[0] + 1] + entry["shape"][1:], [-1], [2 ** 62]])
    elif op == 1:
        entry["dtype"] = rng.choice(DTYPES)
    elif op == 2:
        start, end = entry["data_offsets"]
        value = rng.choice([float("nan"), float("inf"), float("-inf"), 3e38, -0.0])
        count = rng.choice([1, (end - start) // 4])
        buf = bytearray(data)
        for i in range(count):
            at = start + 4 * rng.randrange(max((end - start) // 4, 1))
            buf[at:at + 4] = struct.pack("<f", value)
        data = bytes(buf)
    elif op == 3:
        entry["data_offsets"] = rng.choice([[0, 0], [entry["data_offsets"][0], 10 ** 12], [-4, 4],
                                            list(reversed(entry["data_offsets"])), [0, len(data) + 4]])
    elif op == 4:
        header[rng.choice(fuzzing.WEIRD_STRINGS + ["W_enc", "weight", "b_dec"])] = header.pop(name)
    else:
        del header[name]
    return header, data


def _metadata_edit(rng: random.Random, header: dict) -> dict:
    if not isinstance(header, dict):  # an earlier edit made the header something else
        return header
    meta = header.setdefault("__metadata__", {})
    if not isinstance(meta, dict):
        meta = header["__metadata__"] = {}
    key = rng.choice(sorted(meta) + ["extra"]) if meta else "k"
    op = rng.randrange(7)
    if op < 4:
        meta[key] = rng.choice(["", "null", "-1", "0", "999999999999", "nan", "inf", "1.5", "x", "fixture:tiny-gpt2",
                                "bf16", "pca", "sae", "das", "\u00e9", "a" * 5000])
    elif op == 4:
        meta.pop(key, None)
    else:
        header["__metadata__"] = rng.choice([None, [], "x", {"k": 1}, {"d": None}])
    return header


def mutated_bundle(rng: random.Random, raw: bytes) -> bytes:
    """One to three edits of a .safetensors file: tensors, metadata, the header's text, the length (a file an
    earlier edit left unreadable is truncated instead)."""
    try:
        header, data = _split(raw)
    except (struct.error, ValueError, RecursionError):
        return raw[:len(raw) // 2]
    for _ in range(rng.choice([1, 1, 2, 3])):
        which = rng.random()
        if which < 0.5:
            header, data = _tensor_edit(rng, header, data)
        elif which < 0.92:
            header = _metadata_edit(rng, header)
        else:
            header = fuzzing.mutate_tree(rng, header, fuzzing._keys(header))
    if not isinstance(header, dict) or rng.random() < 0.15:
        out = _join(header, data, pad=rng.random() < 0.5)
    else:
        out = _join(header, data)
    damage = rng.random()
    if damage < 0.06:  # truncated anywhere
        out = out[:rng.randrange(len(out))]
    elif damage < 0.09:  # a header length past the file
        out = struct.pack("<Q", rng.choice([len(out), 2 ** 63, 2 ** 40])) + out[8:]
    elif damage < 0.12:  # the header not JSON
        out = out[:8] + out[8:].replace(b"{", b"[", 1)
    return out


def bundle_case(rng: random.Random, tmp: pathlib.Path) -> list[list[str]]:
    source = rng.choice(BUNDLES)
    file = tmp / "bundle.safetensors"
    file.write_bytes(mutated_bundle(rng, source.read_bytes()))
    kind = rng.choice(sorted(BUNDLE_DOCS))
    raw = json.loads(BUNDLE_DOCS[kind].read_text(encoding="utf-8"))
    for featurizer in raw["featurizers"].values():
        if "file_path" in featurizer:
            featurizer["file_path"] = str(file)
    doc = tmp / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    root = ["--data-root", str(fuzzing.DATA)]
    argvs = [["validate", str(doc)] + root, ["explain", str(doc)] + root]
    if rng.random() < 0.3:
        argvs.append(["run", str(doc), "--out", str(tmp / "out"), "--replace", "--quiet"] + root)
    return argvs


# ---------------------------------------------------------------- case files and implementations

def _corpus_copy(tmp: pathlib.Path, cases: list[pathlib.Path]) -> pathlib.Path:
    folder = tmp / "cases"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for sub in ("data", "files"):
        shutil.copytree(CORPUS / sub, folder / sub)
    shutil.copy(CORPUS / "case.schema.json", folder / "case.schema.json")
    for case in cases:
        shutil.copy(case, folder / case.name)
    return folder


def _cheap_cases() -> list[pathlib.Path]:
    """Cases that do not run a model (validate, explain, refusals) or run patching-sized documents."""
    return sorted(p for p in CORPUS.glob("*.json") if p.name != "case.schema.json")


def case_case(rng: random.Random, tmp: pathlib.Path) -> list[list[str]]:
    chosen = rng.sample(_cheap_cases(), rng.choice([1, 1, 2]))
    folder = _corpus_copy(tmp, chosen)
    target = folder / chosen[0].name
    raw = json.loads(target.read_text(encoding="utf-8"))
    raw = fuzzing.mutate_tree(rng, raw, fuzzing._keys(raw) + ["document", "expect", "data", "files", "verb"])
    target.write_bytes(fuzzing._text(rng, raw).encode("utf-8", "surrogatepass"))
    return [["conform", "--cases", str(folder), "--quiet"]]


FAKE_IMPL = r'''
import os, random, sys, time
seed, behaviour = int(sys.argv[1]), sys.argv[2]
argv = sys.argv[3:]
rng = random.Random(seed)
out = argv[argv.index("--out") + 1] if "--out" in argv else None
if behaviour == "exit":
    sys.exit(rng.choice([0, 1, 2, 3, 4, 127, 255]))
if behaviour == "junk":
    sys.stdout.write(rng.choice(["", "{", "null", "NaN", "\x00\xff", '{"plan": NaN}', "[]" * 1000]))
    sys.stderr.write(rng.choice(["", "run: x: y", "validation: \n\n", "\x1b[2J"]))
    sys.exit(rng.choice([0, 2]))
if behaviour == "files" and out:
    os.makedirs(out, exist_ok=True)
    name = os.path.join(out, rng.choice(["t.json", "a/b.json", "run.json", "document.json", "x.safetensors"]))
    os.makedirs(os.path.dirname(name), exist_ok=True)
    what = rng.randrange(5)
    if what == 0:
        open(name, "w").write(rng.choice(["", "{", "NaN", '[{"value": NaN, "eligible": true}]', "[1, 2]",
                                          '[{"metric": "m", "value": null, "eligible": true}]', "\ud800"[:0]]))
    elif what == 1:
        os.symlink(rng.choice(["/etc/passwd", "/nonexistent", ".."]), name)
    elif what == 2:
        os.makedirs(name, exist_ok=True)
    elif what == 3:
        open(name, "wb").write(os.urandom(rng.choice([1, 100, 5000])))
    else:
        open(name, "w").write('[{"metric": "m", "value": 1e999, "eligible": true}]' * rng.choice([1, 2]))
    sys.exit(rng.choice([0, 0, 1]))
if behaviour == "sleep":
    time.sleep(float(os.environ.get("FAKE_SLEEP", "5")))
    sys.exit(0)
if behaviour == "flood":
    block = ("x" * 1023 + "\n") * 1024
    stream = sys.stdout if rng.random() < 0.5 else sys.stderr
    for _ in range(rng.choice([2, 40])):
        stream.write(block)
    sys.exit(0)
sys.exit(3)
'''
BEHAVIOURS = ("exit", "junk", "files", "sleep", "flood", "na")


def impl_case(rng: random.Random, tmp: pathlib.Path, fixtures: pathlib.Path) -> list[list[str]]:
    chosen = rng.sample(_cheap_cases(), rng.choice([1, 2, 3]))
    folder = _corpus_copy(tmp, chosen)
    script = tmp / "fake_impl.py"
    script.write_text(FAKE_IMPL, encoding="utf-8")
    behaviour = rng.choice(BEHAVIOURS)
    timeout = rng.choice(["0.5", "1", "2"])
    impl = f"{sys.executable} {script} {rng.randrange(10 ** 6)} {behaviour}"
    return [["conform", "--impl", impl, "--cases", str(folder), "--fixtures", str(fixtures), "--timeout", timeout,
             "--jobs", rng.choice(["1", "2", "3"]), "--quiet"]]


# ---------------------------------------------------------------- command-line flags

BUDGETS = ["0", "-1", "1", "1KiB", "1 GiB", "1GiB", "1gib", "nan", "inf", "1e400", "9" * 5000, "", " ", "1TiB",
           "0.5", "1e3", "10EiB", "-0", "1MiB", "\u0661"]
BATCHES = ["0", "-1", "1", "2", "3", "1000000", str(10 ** 30), "x", "1.5", "", "\u0661"]
DEVICE_MAPS = ["cpu", "cuda", "auto", "meta", "disk", "", "{}", '{"": "cpu"}', '{"": "meta"}', "[", "null",
               "cuda:9", "mps", "balanced", '{"model": 0}']
ENGINES = ["nnterp", "hooks", "ndif", "NDIF", "", "remote"]  # ndif: known and refused by name (E12)
TIMEOUTS = ["0", "-1", "nan", "inf", "-inf", "1e308", "1e-9", "x", "", "0.5", "1e999", "10"]
JOBS = ["0", "-1", "1", "2", "3", "x", "1e9", "1.5", "", "256", "257", "9" * 5000, "\u0661", " 2"]
ONLYS = ["", ",", ",,", "refuse", "run_,validate", "x" * 5000, "\x00", "\u202e", "*", "..", "refuse_unknown_key"]


def _weird_path(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> str:
    return rng.choice(["", ".", "..", "/", str(sentinel), str(sentinel / "keep.txt"), str(tmp / "new" / "deep"),
                       "rel_out", "a" * 300, str(tmp / ("b" * 256)), "/proc/self", "/dev/null", str(REPO),
                       str(sentinel / "link"), "-", "x\ny", str(tmp / "out"), "a\x1b[31mb", "\u202egnp.x",
                       str(tmp / "\x1b]0;title\x07"), "n" * 100_000])


def flags_case(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path,
               fixtures: pathlib.Path) -> list[list[str]]:
    if rng.random() < 0.15:  # conform's --timeout, against a fake that answers "not applicable"
        folder = _corpus_copy(tmp, rng.sample(_cheap_cases(), 1))
        script = tmp / "fake_impl.py"
        script.write_text(FAKE_IMPL, encoding="utf-8")
        argv = ["conform", "--impl", f"{sys.executable} {script} 0 na", "--cases", str(folder), "--fixtures",
                str(fixtures), "--timeout=" + rng.choice(TIMEOUTS), "--jobs=" + rng.choice(JOBS), "--quiet"]
        if rng.random() < 0.4:  # what --list selects (C40), with --only and --cases as hostile as the rest
            argv += ["--list", "--only=" + rng.choice(ONLYS)]
            if rng.random() < 0.3:
                argv[argv.index("--cases") + 1] = _weird_path(rng, tmp, sentinel)
        return [argv]
    verb = rng.choice(["validate", "explain", "run", "run"])
    argv = [verb, str(PATCHING)]
    options = {"--memory-budget": BUDGETS, "--device-map": DEVICE_MAPS, "--engine": ENGINES}
    if verb == "run":
        options["--batch-size"] = BATCHES
    for flag, values in options.items():
        if rng.random() < 0.5:
            argv.append(f"{flag}={rng.choice(values)}")
    root = _weird_path(rng, tmp, sentinel) if rng.random() < 0.4 else str(fuzzing.DATA)
    argv.append(f"--data-root={root}")
    if verb == "run":
        out = _weird_path(rng, tmp, sentinel) if rng.random() < 0.6 else str(tmp / "out")
        argv += [f"--out={out}", "--quiet"] + (["--replace"] if rng.random() < 0.5 else [])
    return [argv]


# ---------------------------------------------------------------- results folders (plot's input)

def _tracing_document() -> dict:
    """patching.json swept over two layers and two positions (read and write move together)."""
    doc = json.loads(PATCHING.read_text(encoding="utf-8"))
    doc["sites"]["target"]["layers"] = {"sweep": [[0], [1]]}
    patching = doc["interventions"]["patching"]
    for place in (patching["reads"]["v_cf"], patching["writes"]["patch"]):
        place["pos"] = {"sweep": [-2, -1], "as": "pos"}
    return doc


def _by_layer_document() -> dict:
    """documents/layer_sweep.json read at every layer ("all") beside a sweep of its read's position: a point per
    position, each holding its tables by layer (D34), which plot draws with the layer as an axis (FG2)."""
    doc = json.loads((PATCHING.parent / "layer_sweep.json").read_text(encoding="utf-8"))
    doc["sites"]["resid"] = {"component": "block_output", "layers": "all"}
    doc["interventions"]["lens"]["reads"]["lens"]["pos"] = {"sweep": [-1, -2]}
    return doc


def results_bases(tmp: pathlib.Path) -> list[pathlib.Path]:
    """Three results folders a run wrote (run once per session): a swept patching run, a fit's run, and a sweep
    beside a read at every layer."""
    fit = json.loads((CORPUS / "run_tiny_das_fit.json").read_text(encoding="utf-8"))["document"]
    bases = []
    for name, doc in (("tracing", _tracing_document()), ("fit", fit), ("by_layer", _by_layer_document())):
        out = tmp / "results" / name
        if not (out / "run.json").exists():
            path = tmp / "results" / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc), encoding="utf-8")
            done = inprocess.cli("run", str(path), "--data-root", str(fuzzing.DATA), "--out", str(out), "--quiet")
            if done.returncode != 0:
                raise RuntimeError(f"the {name} run failed: {done.stderr}")
        bases.append(out)
    return bases


def _damage_entry(rng: random.Random, entry: pathlib.Path, sentinel: pathlib.Path) -> None:
    """One file or folder of a results copy edited, broken, removed or replaced."""
    op = rng.randrange(7)
    if op == 0 and entry.suffix == ".json" and entry.is_file():
        try:
            raw = json.loads(entry.read_text(encoding="utf-8"))
        except ValueError:
            raw = None
        raw = fuzzing.mutate_tree(rng, raw, fuzzing._keys(raw) + ["value", "eligible", "metric", "layer", "steps",
                                                                  "saves"])
        entry.write_bytes(fuzzing._text(rng, raw).encode("utf-8", "surrogatepass"))
    elif op == 1 and entry.is_file():
        raw = entry.read_bytes()
        entry.write_bytes(rng.choice([raw[:rng.randrange(len(raw) + 1)], b"", b"NaN", b"[1e999]", os.urandom(64),
                                      b"[" * 5000]))
    elif op == 2 and entry.suffix == ".safetensors" and entry.is_file():
        entry.write_bytes(mutated_bundle(rng, entry.read_bytes()))
    elif op == 3:
        _remove_entry(entry)
        entry.symlink_to(rng.choice([str(sentinel / "keep.txt"), str(sentinel), "/etc/passwd", "/nonexistent",
                                     entry.name, ".."]))
    elif op == 4:
        _remove_entry(entry)
        entry.mkdir()
    elif op == 5:
        _remove_entry(entry)
    else:
        entry.rename(entry.with_name(rng.choice(["layers=9,pos=-1", "layers=[0],pos=x", "x.json", ".hidden"])))


def _remove_entry(entry: pathlib.Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


def _hostile_table(rng: random.Random, folder: pathlib.Path) -> None:
    """One metric table of a results copy rewritten with values a figure must still take: integers past a
    float's range, [token, probability] lists, signed or out-of-[0, 1] numbers under any unit, a row's layer
    of any kind, many rows."""
    tables = sorted(f for f in folder.rglob("*.json") if f.is_file() and not f.is_symlink()
                    and f.name not in ("document.json", "run.json"))
    if not tables:
        return
    table = rng.choice(tables)
    try:
        rows = json.loads(table.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):
        return
    if not (isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows)):
        return
    values = [10 ** 400, -10 ** 400, [[" Monday", 0.5]], [], -3.5, 7.25, 0.074, 1e308, 10 ** 308]
    layers = [0, 1, 99, -1, 1.5, "x", None, [0], {"layer": 0}, 10 ** 400]
    edited = [dict(r, value=rng.choice(values) if rng.random() < 0.5 else r.get("value"),
                   unit=rng.choice([r.get("unit"), "fraction", "probability", "logit", "nat", 3, None]))
              for r in rows]
    if rng.random() < 0.3:  # a table by layer (D34) whose layers are anything (FG2 makes them an axis)
        edited = [dict(r, layer=rng.choice(layers) if rng.random() < 0.5 else r.get("layer", 0)) for r in edited]
    if rng.random() < 0.3:
        edited = [dict(edited[k % len(edited)], example_id=str(k)) for k in range(rng.choice([150, 3000]))]
    table.write_text(json.dumps(edited), encoding="utf-8")


def results_case(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> list[list[str]]:
    """`plot` of a damaged copy of a results folder, to a figure path that may not be a new file."""
    base = rng.choice(results_bases(tmp.parent))
    folder = tmp / "results" / base.name
    shutil.copytree(base, folder, symlinks=True)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        entries = sorted(folder.rglob("*"))
        if entries:
            with contextlib.suppress(OSError):  # a damage the file system will not take (a rename onto a folder)
                _damage_entry(rng, rng.choice(entries), sentinel)
    if rng.random() < 0.25:  # a table's values past a float, lists (a readout), or its rows many (FG9, FG10)
        _hostile_table(rng, folder)
    if rng.random() < 0.1:  # a bundle dropped in, over whatever a damage left at its name (a folder, a link)
        source = rng.choice(BUNDLES)
        dest = folder / rng.choice(["x.safetensors", "train_loss.safetensors"])
        _remove_entry(dest)
        shutil.copyfile(source, dest)
    argv = ["plot", str(folder), "--data-root", str(fuzzing.DATA)]
    target = rng.choice([None, tmp / "fig.png", tmp / "fig.svg", tmp / "fig.pdf", tmp / "new" / "fig.png",
                         sentinel / "keep.txt", sentinel / "link", sentinel, tmp / ("c" * 300 + ".png"),
                         folder / "run.json"])
    if target is not None:
        argv.append(f"--out={target}")
    if rng.random() < 0.3 and (target is None or tmp in target.parents):
        argv.append("--replace")
    return [argv]


# ---------------------------------------------------------------- results folders (table's input, SPEC.md S64)

POINT_NAMES = ["..", ".", "", "/", "/etc", "../results", "x/../..", "layers=9,pos=-1", "document.json", "run.json",
               "\x00", "c" * 300]


def _damage_points(rng: random.Random, folder: pathlib.Path) -> None:
    """run.json's points edited: a label or folder that climbs out or names no point, a point dropped, doubled,
    made a scalar, or the list made something else."""
    try:
        record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(record, dict):
        return
    points = record.get("points")
    op = rng.randrange(5)
    if op == 0 and isinstance(points, list) and points and isinstance(points[0], dict):
        name = rng.choice(POINT_NAMES)
        points[rng.randrange(len(points))] = {**points[0], "label": name, "folder": rng.choice([name, "."])}
    elif op == 1 and isinstance(points, list) and points:
        points.append(rng.choice(points))
    elif op == 2 and isinstance(points, list) and points:
        points.pop(rng.randrange(len(points)))
    elif op == 3:
        record["points"] = rng.choice([None, {}, "x", 1, [1], [[]], [{"label": 1}], []])
    else:
        record["points"] = fuzzing.mutate_tree(rng, points, ["label", "coordinates", "folder", "points"])
    (folder / "run.json").write_text(json.dumps(record), encoding="utf-8")


def table_case(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> list[list[str]]:
    """`table` of a damaged copy of a results folder (results_case's damages, and run.json's points edited)."""
    base = rng.choice(results_bases(tmp.parent))
    folder = tmp / "results" / base.name
    shutil.copytree(base, folder, symlinks=True)
    if rng.random() < 0.5:
        _damage_points(rng, folder)
    for _ in range(rng.choice([0, 1, 2])):
        entries = sorted(folder.rglob("*"))
        if entries:
            with contextlib.suppress(OSError):
                _damage_entry(rng, rng.choice(entries), sentinel)
    argv = ["table", str(folder)]
    if rng.random() < 0.3:
        argv = ["--json", *argv]
    if rng.random() < 0.3:
        argv.append("--csv")
    if rng.random() < 0.3:
        argv += ["--metric", rng.choice(["iia", "logit_diff", "nope", "", "../x"])]
    return [argv]


# ---------------------------------------------------------------- fixture cache folders

def _built_folder() -> pathlib.Path:
    from causalab_ref.fixtures import builder
    home = pathlib.Path(os.environ.get(builder.CACHE_ENV) or pathlib.Path.home() / ".cache/causalab_ref/fixtures")
    found = sorted(home.glob(f"{CACHE_KEY}-*"))
    if not found:
        raise RuntimeError(f"no built {CACHE_KEY} fixture under {home}: run any test that loads it first")
    return found[0]


def _forge_derived(rng: random.Random, derived: pathlib.Path) -> None:
    """A derived tokenizer.json with two pieces' ids exchanged, its merges reversed, or an added token at another
    piece's id, and the record's digest of it (and of its sources) rewritten to vouch for it (SPEC.md S78)."""
    import hashlib

    try:
        tokenizer = json.loads((derived / "tokenizer.json").read_bytes())
        record = json.loads((derived / "record.json").read_bytes())
        vocab = tokenizer["model"]["vocab"]
        pieces = rng.sample(sorted(vocab), 2)
    except (OSError, ValueError, KeyError, TypeError):
        return
    edit = rng.randrange(3)
    if edit == 0:
        vocab[pieces[0]], vocab[pieces[1]] = vocab[pieces[1]], vocab[pieces[0]]
    elif edit == 1 and isinstance(tokenizer["model"].get("merges"), list):
        tokenizer["model"]["merges"].reverse()
    else:
        tokenizer["added_tokens"].append({"id": vocab[pieces[0]], "content": pieces[1], "single_word": False,
                                          "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    raw = json.dumps(tokenizer).encode("utf-8")
    (derived / "tokenizer.json").write_bytes(raw)
    record.setdefault("files", {})["tokenizer.json"] = hashlib.sha256(raw).hexdigest()
    (derived / "record.json").write_text(json.dumps(record), encoding="utf-8")


def damaged_cache(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> pathlib.Path:
    """A copy of the built fixture folder (and of its cached tokenizer.json's folder) in tmp/cache with one to
    three files added, removed, truncated, replaced by links (to the sentinel, to a sibling, dangling) or by a
    folder."""
    source = _built_folder()
    cache = tmp / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    folder = cache / source.name
    shutil.copytree(source, folder)
    derived = source.parent / "tokenizers" / source.name  # the fixture's cached tokenizer.json (SPEC S71)
    if derived.is_dir():
        shutil.copytree(derived, cache / "tokenizers" / source.name)
    for _ in range(rng.randrange(1, 4)):
        kept = [*folder.iterdir(), *((cache / "tokenizers" / source.name).glob("*"))]
        files = sorted(p for p in kept) or [folder / "x"]
        file = rng.choice(files)
        op = rng.randrange(8)
        with contextlib.suppress(OSError):
            if op == 7:  # the derived tokenizer forged, its record's sha256 lines rewritten to match (S78)
                _forge_derived(rng, cache / "tokenizers" / source.name)
            elif op == 0:
                (folder / rng.choice(["tokenizer.json", "extra.bin", "model.py", ".hidden"])).write_text("{}")
            elif op == 1:
                file.unlink()
            elif op == 2:
                with open(file, "r+b") as handle:
                    handle.truncate(rng.randrange(max(file.stat().st_size, 1)))
            elif op == 3:
                file.unlink()
                file.symlink_to(rng.choice([sentinel / "keep.txt", source / file.name, "/nonexistent", folder]))
            elif op == 4:
                file.unlink()
                file.mkdir()
            elif op == 5:
                with open(file, "r+b") as handle:
                    handle.write(os.urandom(16))
            else:
                os.link(sentinel / "keep.txt", folder / "config.json.extra")
    if rng.random() < 0.2:  # the whole cache a file, or a link (to a folder: a cache as good as any)
        shutil.rmtree(cache)
        if rng.random() < 0.5:
            cache.write_text("not a folder")
        else:
            (tmp / "elsewhere").mkdir(exist_ok=True)
            cache.symlink_to(rng.choice([tmp / "elsewhere", tmp / "nowhere", sentinel / "keep.txt"]))
    return cache


def cache_case(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> list[list[str]]:
    return [[rng.choice(["validate", "explain"]), str(PATCHING), "--data-root", str(fuzzing.DATA)]]


# ---------------------------------------------------------------- interrupts

#: an implementation that never answers: it records its pid and its child's (asleep in its group) and waits
HANGING_IMPL = '''import os, pathlib, subprocess, sys, time
child = subprocess.Popen(["sleep", "1000"])
pathlib.Path(os.environ["HANG_PIDS"], str(os.getpid())).write_text(f"{os.getpid()} {child.pid}")
while True:
    time.sleep(1)
'''


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def interrupt_case(rng: random.Random, tmp: pathlib.Path, fixtures: pathlib.Path) -> list[tuple]:
    """A verb run as the command line (a subprocess), sent SIGINT or SIGTERM after a random delay, at any moment
    from its start to past its end: `run`, `validate`, `vocab`, or `conform` of a hanging --impl under --jobs 1
    to 3. Whatever the moment: no traceback, one of the statuses 0, 2 and 130 (or, before the tool's handler is
    installed, the signal's own default end with nothing printed), the process gone within 60 s, and
    no implementation conform started left alive (SPEC.md S6, S77, C39)."""
    import signal
    import subprocess

    pids = tmp / "pids"
    pids.mkdir()
    verb = rng.choice(["run", "validate", "vocab", "conform", "conform"])
    if verb == "conform":
        script = tmp / "hang.py"
        script.write_text(HANGING_IMPL, encoding="utf-8")
        folder = _corpus_copy(tmp, rng.sample(_cheap_cases(), rng.choice([1, 2, 3])))
        argv = ["conform", "--impl", f"{sys.executable} {script}", "--cases", str(folder), "--fixtures", str(fixtures),
                "--timeout", "600", "--jobs", rng.choice(["1", "2", "3"]), "--quiet"]
    elif verb == "run":
        argv = ["run", str(PATCHING), "--data-root", str(fuzzing.DATA), "--out", str(tmp / "out"), "--quiet"]
    else:
        argv = [verb] + ([str(PATCHING), "--data-root", str(fuzzing.DATA)] if verb == "validate" else [])
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    # from half a second on: before, the interpreter itself is starting (site, .pth files), no program's own yet
    delay = 0.5 + rng.uniform(0.0, 8.0 if verb in ("run", "conform") else 3.0)
    env = {**os.environ, "HANG_PIDS": str(pids), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "causalab_ref", *argv], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    found = []
    try:
        time.sleep(delay)
        proc.send_signal(signum)
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            err, _ = "", found.append(f"still running 60 s after {signal.Signals(signum).name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    seen = [int(p) for f in pids.iterdir() for p in f.read_text().split()]
    left = [pid for pid in seen if _alive(pid)]
    for pid in left:  # what conform left is not left to the machine
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if "Traceback" in err or "internal error" in err:
        found.append(f"a traceback or an internal error: {err.strip()[-300:]!a}")
    early = proc.returncode == -signum and not err.strip()  # before main's handler: the default action, silent
    if proc.returncode not in (0, 2, 130) and not early:
        found.append(f"exit status {proc.returncode}")
    if left:
        found.append(f"implementations left alive: {left}")
    argv_shown = [*argv, f"<{signal.Signals(signum).name} after {delay:.2f}s>"]
    return [(argv_shown, proc.returncode, found, err.strip()[-600:], time.monotonic() - started)]


# ---------------------------------------------------------------- running one case

def _sentinel(tmp: pathlib.Path) -> pathlib.Path:
    sentinel = tmp / "sentinel"
    if not sentinel.exists():
        sentinel.mkdir()
        (sentinel / "keep.txt").write_text("keep me\n")
        (sentinel / "sub").mkdir()
        (sentinel / "sub" / "run.json").write_text("{}")
        (sentinel / "link").symlink_to(sentinel / "keep.txt")
    return sentinel


def fixtures_folder(tmp: pathlib.Path) -> pathlib.Path:
    """The exported fixture folders a fake --impl is handed (exported once per session)."""
    folder = tmp / "exported"
    if not (folder / "manifest.json").exists():
        done = inprocess.cli("fixtures", "export", str(folder), "--key", "fixture:tiny-llama", "--key",
                             "fixture:tiny-gpt2", "--key", "fixture:distributed-gpt2")
        if done.returncode != 0:
            raise RuntimeError(f"fixtures export failed: {done.stderr}")
    return folder


@contextlib.contextmanager
def _environment(env: dict, sleep: str):
    """os.environ with `env` set ({name: value, or None to unset}) for the case, restored after it."""
    env = {**env, "FAKE_SLEEP": sleep}
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            _setenv(k, v)
        yield
    finally:
        for k, v in saved.items():
            _setenv(k, v)


def _setenv(name: str, value: Optional[str]) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _argvs(surface: str, rng: random.Random, case_dir: pathlib.Path, sentinel: pathlib.Path,
           fixtures: pathlib.Path) -> fuzz_surfaces_env.Case:
    """(argvs, environment, folders to watch beside the usual) of one case."""
    if surface in ("env", "exported"):
        make = fuzz_surfaces_env.env_case if surface == "env" else fuzz_surfaces_env.exported_case
        return make(rng, case_dir, sentinel, fixtures)
    if surface == "cache":
        cache = damaged_cache(rng, case_dir, sentinel)
        return cache_case(rng, case_dir, sentinel), {"CAUSALAB_REF_CACHE": str(cache)}, []
    if surface == "bundle":
        return bundle_case(rng, case_dir), {}, []
    if surface == "case":
        return case_case(rng, case_dir), {}, []
    if surface == "impl":
        return impl_case(rng, case_dir, fixtures), {}, []
    if surface == "flags":
        return flags_case(rng, case_dir, sentinel, fixtures), {}, []
    if surface == "table":
        return table_case(rng, case_dir, sentinel), {}, [case_dir / "results"]  # table writes nothing
    return results_case(rng, case_dir, sentinel), {}, [case_dir / "results"]  # plot writes only its figure


def _users(before: dict, after: dict) -> list[str]:
    """Changed paths with a part named `user*`: what an export must never touch, even under its DIR."""
    return [p for p in sorted(set(before) | set(after)) if before.get(p) != after.get(p)
            and any(part.startswith("user") for part in pathlib.Path(p).parts)]


#: what a refusal line never prints raw (SPEC.md S76: C0, C1, DEL, separators, bidi controls), and how long a
#: line of the tool's own words and shortened names may be
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
LINE_MOST = 20_000


def _call(argv: list[str], cwd: pathlib.Path, watched: Callable[[], dict]) -> tuple:
    """One call in this process, judged by the invariant: (argv, status, violations, stderr's end)."""
    before = watched()
    started = time.monotonic()
    done = inprocess.cli(*argv, cwd=cwd)
    seconds = time.monotonic() - started
    after = watched()
    found = violations(argv, done.returncode, done.stderr, seconds, (before, after), cwd)
    if _users(before, after):
        found.append(f"changed what the tool did not write: {_users(before, after)[:5]}")
    lines = done.stderr.strip().splitlines()
    if done.returncode == 2 and lines and (UNSAFE.search(lines[-1]) or len(lines[-1]) > LINE_MOST):
        found.append(f"a refusal line with a raw control character or of {len(lines[-1])} characters (S76): "
                     f"{lines[-1][:200]!a}")
    try:  # a real process's stdout is strict UTF-8: a lone surrogate there would be a traceback
        done.stdout.encode("utf-8")
    except UnicodeEncodeError as error:
        found.append(f"stdout not UTF-8: {done.stdout[max(error.start - 40, 0):error.end + 40]!a}")
    return argv, done.returncode, found, done.stderr.strip()[-600:]


def run_case(rng: random.Random, tmp: pathlib.Path, surface: Optional[str] = None) -> tuple[str, list[tuple]]:
    """One case of `surface` (drawn when None); returns (surface, [(argv, status, violations, stderr)])."""
    surface = surface or rng.choice(SURFACES)
    sentinel, fixtures = _sentinel(tmp), fixtures_folder(tmp)
    case_dir = tmp / "case"
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir()
    cwd = case_dir / "cwd"
    cwd.mkdir()
    (cwd / "here.txt").write_text("cwd sentinel\n")
    if surface == "interrupt":  # the command line itself, in a process of its own, interrupted
        return surface, [result[:4] for result in interrupt_case(rng, case_dir, fixtures)]
    argvs, env, extra = _argvs(surface, rng, case_dir, sentinel, fixtures)
    folders = [sentinel, cwd, CORPUS, REPO / "documents"] + extra

    def watched() -> dict:
        return {k: v for folder in folders for k, v in snapshot(folder).items()}
    # a model a case loads from a folder it damaged (or an environment it set) is loaded afresh
    loads = contextlib.nullcontext() if surface in ("cache", "env", "exported") else fuzzing.cached_loads()
    with _environment(env, rng.choice(["3", "5"])), loads:
        return surface, [_call(argv, cwd, watched) for argv in argvs]

"""Surfaces `env` and `exported` of tests/fuzz_surfaces.py: environment variables and exported folders.

* env: one or two of $CAUSALAB_REF_LLAMA_TOKENIZER, $HF_HUB_OFFLINE, $CAUSALAB_REF_CACHE and
  $CONFORM_CHECKPOINTS set to hostile values (junk JSON, a map to a missing, damaged or file "folder", paths
  that are files, links, loops, under /proc, relative, empty, past the file system's lengths, not UTF-8 as
  the OS takes it), then validate, explain and sometimes run of documents/patching.json (model key
  fixture:tiny-llama). The cache is a fresh temporary folder unless the case sets it, so the Llama
  tokenizer is looked up and built from, and the real cache is never damaged;
* exported: a copy of a `fixtures export` folder (its manifest beside it) with files removed, truncated,
  replaced by links or folders, config.json edited (tests/fuzzing.py's mutate_tree), extra files, weights
  turned to NaN, or a `*.py` dropped in with `auto_map` naming it (no checkpoint code may run: it would write
  into the sentinel), named by a document's `model.key` as a path key (absolute or relative); or `fixtures
  export` onto a hostile target (a file, a link, a folder of a fixture's name the tool did not write, a
  foreign manifest, staging names it must not remove). Nothing whose name holds `user` may change.

Each case is (argvs, environment {name: value or None for unset}, folders to watch).
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import random
import shutil
import stat
import struct
from typing import Optional

import fuzzing

PATCHING = fuzzing.REPO / "documents" / "patching.json"
#: the exported fixtures a damaged copy is taken from, each with a document that runs on it: the seeded Llama,
#: and the trained GPT-2 (GPT-2's tokenizer path, a trained checkpoint's files; SPEC.md X28)
EXPORTED = (("tiny-llama", PATCHING), ("distributed-gpt2", fuzzing.REPO / "documents" / "distributed_random_control.json"))
TOKENIZER_ENV, CACHE_ENV, MAP_ENV, OFFLINE_ENV = (
    "CAUSALAB_REF_LLAMA_TOKENIZER", "CAUSALAB_REF_CACHE", "CONFORM_CHECKPOINTS", "HF_HUB_OFFLINE")
ENV_NAMES = (TOKENIZER_ENV, CACHE_ENV, MAP_ENV, OFFLINE_ENV)
LONG = "a" * 300
DEEP = "/tmp/" + "d/" * 2100  # past PATH_MAX
EVIL = "import pathlib\npathlib.Path({target!r}).write_text('checkpoint code ran')\nclass Evil: pass\n"
Case = tuple[list[list[str]], dict, list[pathlib.Path]]


def _verbs(rng: random.Random, doc: pathlib.Path, tmp: pathlib.Path, run: float) -> list[list[str]]:
    root = ["--data-root", str(fuzzing.DATA)]
    argvs = [[verb, str(doc)] + root for verb in rng.sample(["validate", "explain"], rng.choice([1, 2]))]
    if rng.random() < run:
        argvs.append(["run", str(doc), "--out", str(tmp / "out"), "--replace", "--quiet"] + root)
    return argvs


def _odd_paths(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> list[str]:
    """Paths that are not what a variable wants: files, links, loops, FIFOs, /proc, long, not UTF-8."""
    loop = tmp / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    fifo = tmp / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    return ["", " ", "~", "~nosuchuser/x", str(tmp / "missing"), str(loop), str(loop / "x"), str(fifo),
            "/proc/self/environ", "/proc/self/mem", "/proc/self", "/proc/x", "/dev/null", str(sentinel), str(sentinel / "keep.txt"),
            str(sentinel / "link"), "/" + LONG, LONG, str(tmp / LONG), DEEP, str(tmp / "\udcff\udcfe"),
            "x\ny", "rel/path", str(sentinel / "keep.txt" / "under")]


def _tokenizer_value(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path, real: Optional[str]) -> str:
    folder = tmp / "tok"
    folder.mkdir(exist_ok=True)
    source = pathlib.Path(real or "") / "tokenizer.model" if real and pathlib.Path(real).is_dir() else pathlib.Path(
        real or "/nonexistent")
    raw = source.read_bytes() if source.is_file() else b""
    junk = rng.choice([b"", os.urandom(rng.choice([1, 64, 5000])), raw[:rng.randrange(len(raw) + 1)],
                       b"{}", raw[:100] + os.urandom(100) + raw[200:]])
    which = rng.randrange(5)
    if which == 0:
        (folder / "tokenizer.model").write_bytes(junk)
        return str(rng.choice([folder, folder / "tokenizer.model"]))
    if which == 1:
        (folder / "tokenizer.model").mkdir(exist_ok=True)
        return str(folder)
    if which == 2 and real:
        return rng.choice([real, str(source), str(source) + "/"])
    return rng.choice(_odd_paths(rng, tmp, sentinel))


def _cache_value(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path) -> str:
    """A cache root that is a file, a link, a loop, under /proc or a file, empty (the home cache, read and
    verified only), relative (outside the watched cwd), past the file system's lengths, not UTF-8. Not a
    watched folder: a cache there is the cache, as asked (and the user's home folder is not fuzzed)."""
    (tmp / "cachefile").write_text("not a folder")
    odd = [p for p in _odd_paths(rng, tmp, sentinel) if p.startswith("/") and p != str(sentinel)]
    return rng.choice(odd + ["", "~nosuchuser/x", str(tmp / "cachefile"), str(tmp / "cachefile" / "sub"), "../relcache",
                             "../" + LONG, str(tmp / "fresh" / "deep")])


def _map_value(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path, fixtures: pathlib.Path) -> str:
    """$CONFORM_CHECKPOINTS: junk JSON, or a map whose folder is missing, a file, damaged or odd."""
    if rng.random() < 0.3:
        return rng.choice(["{", "[]", "null", "1", '"x"', "NaN", "[" * 5000, "x" * 100_000, '{"fixture:tiny-llama": 1}',
                           '{"fixture:tiny-llama": null}', '{"fixture:tiny-llama": "\\ud800"}', "\udcff",
                           '{"fixture:tiny-llama": "a", "fixture:tiny-llama": []}', '{"\\u0000": "/"}',
                           "{" + '"k": "v", ' * 10_000 + '"k": "v"}'])
    if rng.random() < 0.3:
        folder = str(damaged_export(rng, tmp, sentinel, fixtures))
    else:
        folder = rng.choice(_odd_paths(rng, tmp, sentinel) + [str(fixtures / "tiny-llama"), str(fixtures / "tiny-gpt2"),
                                                             str(fixtures), "./x", "\ud800"])
    key = rng.choice(["fixture:tiny-llama"] * 4 + ["fixture:tiny-gpt2", "", "./x", "fixture:nope"])
    table = {key: folder}
    if rng.random() < 0.2:
        table[rng.choice(fuzzing.WEIRD_STRINGS)] = rng.choice([str(fixtures / "tiny-gpt2"), "", "/"])
    text = json.dumps(table, ensure_ascii=rng.random() < 0.5)
    try:
        text.encode("utf-8", "surrogateescape")  # what the OS takes
    except UnicodeEncodeError:
        text = json.dumps(table)  # a lone surrogate the OS will not take, escaped
    return text


def env_case(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path, fixtures: pathlib.Path) -> Case:
    """One or two variables set to hostile values; validate, explain, run of patching.json."""
    env: dict[str, Optional[str]] = {CACHE_ENV: str(tmp / "cache")}
    real = os.environ.get(TOKENIZER_ENV)
    for name in rng.sample(ENV_NAMES, rng.choice([1, 1, 2])):
        if name == TOKENIZER_ENV:
            env[name] = None if rng.random() < 0.1 else _tokenizer_value(rng, tmp, sentinel, real)
        elif name == CACHE_ENV:
            env[name] = _cache_value(rng, tmp, sentinel)
        elif name == MAP_ENV:
            env[name] = _map_value(rng, tmp, sentinel, fixtures)
        else:
            env[name] = rng.choice([None, "", "0", "1", "true", "no", "junk", "\udcff", LONG])
    return _verbs(rng, PATCHING, tmp, 0.3), env, [fixtures, tmp / "exp"]


# ---------------------------------------------------------------- exported folders

def _nan_weights(rng: random.Random, file: pathlib.Path) -> None:
    if not file.is_file() or file.is_symlink():  # an earlier damage made it a FIFO, a folder or a link
        return
    raw = bytearray(file.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    for _ in range(rng.choice([1, 10, 1000])):
        at = start + 4 * rng.randrange(max((len(raw) - start) // 4, 1))
        raw[at:at + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), 3e38]))
    file.write_bytes(bytes(raw))


def _code(rng: random.Random, folder: pathlib.Path, sentinel: pathlib.Path) -> None:
    """A module of checkpoint code and an `auto_map` naming it, in config.json or tokenizer_config.json."""
    (folder / "modeling_evil.py").write_text(EVIL.format(target=str(sentinel / "pwned")), encoding="utf-8")
    name = rng.choice(["config.json", "tokenizer_config.json"])
    try:  # an earlier damage may have made the file a FIFO or a link to a device: read only a regular file
        regular = stat.S_ISREG(os.lstat(folder / name).st_mode)
        raw = json.loads((folder / name).read_text(encoding="utf-8")) if regular else {}
    except (OSError, ValueError, RecursionError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    where = raw if rng.random() < 0.7 else raw.setdefault("nested", {})
    where["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil", "AutoConfig": "modeling_evil.Evil",
                         "AutoTokenizer": ["modeling_evil.Evil", None]}
    text = json.dumps(raw)
    if rng.random() < 0.3:
        text = text.replace('"auto_map"', '"auto\\u005fmap"')
    (folder / name).unlink(missing_ok=True)
    (folder / name).write_text(text, encoding="utf-8")


def _replace(entry: pathlib.Path, rng: random.Random, sentinel: pathlib.Path, original: pathlib.Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)
    if rng.random() < 0.3:
        entry.mkdir()
    elif rng.random() < 0.15:  # a reader of a FIFO with no writer blocks
        os.mkfifo(entry)
    elif rng.random() < 0.8:
        entry.symlink_to(rng.choice([sentinel / "keep.txt", sentinel, original / entry.name, "/nonexistent",
                                     entry, "/dev/zero", "/proc/self/environ"]))


def _damage(rng: random.Random, folder: pathlib.Path, sentinel: pathlib.Path, original: pathlib.Path) -> None:
    """One damage of an exported checkpoint folder."""
    files = sorted(folder.iterdir()) or [folder / "config.json"]
    entry = rng.choice(files)
    op = rng.randrange(7)
    if op == 0 and entry.is_file():
        with open(entry, "r+b") as handle:
            handle.truncate(rng.randrange(max(entry.stat().st_size, 1)))
    elif op == 1:
        _replace(entry, rng, sentinel, original)
    elif op == 2 and (folder / "config.json").is_file():
        config = folder / rng.choice(["config.json", "tokenizer_config.json"])
        raw = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        keys = fuzzing._keys(raw) + ["auto_map", "architectures", "model_type", "vocab_size", "num_hidden_layers"]
        config.write_bytes(fuzzing._text(rng, fuzzing.mutate_tree(rng, raw, keys)).encode("utf-8", "surrogatepass"))
    elif op == 3:
        name = rng.choice(["tokenizer.json", "pytorch_model.bin", "model.safetensors.index.json", ".hidden",
                           "generation_config.json", "special_tokens_map.json", "added_tokens.json", "x.py"])
        (folder / name).write_bytes(rng.choice([b"{}", b"", os.urandom(64), b'{"auto_map": {}}', b"[" * 5000]))
    elif op == 4 and (folder / "model.safetensors").is_file():
        _nan_weights(rng, folder / "model.safetensors")
    elif op == 5:
        _code(rng, folder, sentinel)
    else:
        entry.unlink(missing_ok=True) if not entry.is_dir() or entry.is_symlink() else shutil.rmtree(entry)


def damaged_export(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path,
                   fixtures: pathlib.Path, name: str = "tiny-llama") -> pathlib.Path:
    """tmp/exp/<name>: a copy of an exported fixture (the manifest beside it, maybe edited), damaged zero to
    three times."""
    base = tmp / "exp"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    folder = base / name
    shutil.copytree(fixtures / name, folder)
    if rng.random() < 0.8:
        shutil.copyfile(fixtures / "manifest.json", base / "manifest.json")
        if rng.random() < 0.2:
            raw = json.loads((base / "manifest.json").read_text(encoding="utf-8"))
            raw = fuzzing.mutate_tree(rng, raw, fuzzing._keys(raw) + ["folder", "files", "recipe", "format"])
            (base / "manifest.json").write_bytes(fuzzing._text(rng, raw).encode("utf-8", "surrogatepass"))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        try:
            _damage(rng, folder, sentinel, fixtures / name)
        except (OSError, ValueError, RecursionError):  # a damage the file system (or a broken JSON) will not take
            pass
    return folder


def _user_folder(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "user.txt").write_text("a user's file\n")
    return folder


def _export_target(rng: random.Random, victim: pathlib.Path, fixtures: pathlib.Path) -> pathlib.Path:
    """A DIR `fixtures export` must refuse or write around, touching nothing named `user`."""
    users = _user_folder(victim / "user_dir")
    target = victim / "dir"
    op = rng.randrange(9)
    if op == 0:
        return users / "user.txt"
    if op == 1:
        target.symlink_to(rng.choice([users, victim / "nowhere", target]))
    elif op == 2:
        _user_folder(target / "tiny-llama")
    elif op == 3:
        _user_folder(target)
        (target / "manifest.json").write_text(rng.choice(["{}", "junk", '{"format": "x", "fixtures": {}}']))
    elif op == 4:
        shutil.copytree(fixtures / "tiny-llama", target / "tiny-llama")
        shutil.copyfile(fixtures / "manifest.json", target / "manifest.json")
        (target / "tiny-llama" / "user.txt").write_text("mine\n")
    elif op == 5:
        _user_folder(target)
        place = target / "tiny-llama"
        place.symlink_to(users) if rng.random() < 0.5 else place.write_text("a user's file, named as a fixture\n")
    elif op == 6:  # staging names of a live process (pid 1), of no process, and a link so named
        _user_folder(target / ".tiny-llama.partial-pid1-abcdefgh")
        _user_folder(target / ".tiny-llama.partial-x")
        (target / ".tiny-llama.partial-pid999999999-abcdefgh").symlink_to(users)
        (target / ".manifest.json.partial-pid999999999-zzzzzzzz").symlink_to(users / "user.txt")
    elif op == 7:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(users / "user.txt", target) if rng.random() < 0.5 else target.write_text("x")
    return target


LAYER_COUNTS = [10 ** 9, 10_001, 1_001, 1_000, 0, -1, 2.0, "2", True, None, 10 ** 30, [2]]


def hostile_layers(rng: random.Random, folder: pathlib.Path, raw: dict) -> None:
    """A config.json whose layer count is hostile (SPEC.md D36: 10^9 layers once ran validate past 120 s, 0 and -1
    failed inside nnterp), under a document whose first site reads every layer (`layers: "all"`, D34)."""
    config = folder / "config.json"
    if config.is_file() and not config.is_symlink():
        try:
            values = json.loads(config.read_text(encoding="utf-8"))
        except (ValueError, RecursionError, UnicodeDecodeError):
            values = None
        if isinstance(values, dict):
            field = rng.choice(["num_hidden_layers", "num_hidden_layers", "n_layer", "num_layers"])
            values[field] = copy.deepcopy(rng.choice(LAYER_COUNTS))
            config.write_text(json.dumps(values), encoding="utf-8")
    sites = raw.get("sites")
    if isinstance(sites, dict) and sites and rng.random() < 0.8:
        site = sites[sorted(sites)[0]]
        if isinstance(site, dict) and site.get("component") not in ("lm_head", "logits", "embed_tokens"):
            site["layers"] = "all"


def exported_case(rng: random.Random, tmp: pathlib.Path, sentinel: pathlib.Path, fixtures: pathlib.Path) -> Case:
    """A damaged exported folder named as a path key, or `fixtures export` onto a hostile target."""
    if rng.random() < 0.25:
        victim = tmp / "victim"
        victim.mkdir()
        target = _export_target(rng, victim, fixtures)
        keys = rng.choice([["--key", "fixture:tiny-llama"], ["--key", "fixture:tiny-llama", "--key", "fixture:nope"]])
        return [["fixtures", "export", str(target)] + keys], {}, [victim, fixtures]
    name, document = EXPORTED[0] if rng.random() < 0.75 else EXPORTED[1]
    folder = damaged_export(rng, tmp, sentinel, fixtures, name)
    key = rng.choice([str(folder), str(folder) + "/", f"../exp/{name}", f"./../exp/{name}",
                      str(folder.parent / "." / name)])
    raw = json.loads(document.read_text(encoding="utf-8"))
    raw["model"]["key"] = key
    if rng.random() < 0.2:  # a hostile layer count, read by a document with layers "all" (SPEC.md D34, D36)
        hostile_layers(rng, folder, raw)
    if rng.random() < 0.3:
        raw["model"]["revision"] = rng.choice(["main", "", "x" * 300, "seeded"])
    doc = tmp / "doc.json"
    doc.write_text(json.dumps(raw), encoding="utf-8")
    return _verbs(rng, doc, tmp, 0.4), {}, [folder.parent, fixtures]

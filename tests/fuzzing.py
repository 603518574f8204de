"""Document and data mutations for the fuzz test (tests/test_fuzz.py) and bench/fuzz.py.

`case(rng, tmp)` takes one shipped document and, with the data root, writes a mutated
copy into `tmp`: wrong types, missing and extra keys, out-of-range and huge numbers,
unicode, deep nesting, broken JSON, keys named twice, integers past 4300 digits, names
that are paths, a steps-first document's names built to collide across its lowering
(`steps_first`), and the same done to a data table. `check(argv)`
runs the command line in this process and says whether the outcome was the project's
own: status 0, or status 2 with one `<stage>: ...` line, and the invariant fuzz_surfaces.py
checks too (tests/invariant.py: no internal error or traceback, no eligible non-finite row
under --out, nothing changed outside --out in the documents, a sentinel folder or the cwd,
the time bound).

Model loads are the slow part, so `cached_loads()` keeps one engine per
(engine, key, revision, dtype, attention, weights) for the life of the process.
"""
from __future__ import annotations

import contextlib
import copy
import json
import pathlib
import random
import re
import shutil
import time
from typing import Any, Optional

import inprocess
import invariant

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = sorted((REPO / "documents").glob("*.json")) + sorted((REPO / "documents" / "steps_first").glob("*.json"))
DATA = REPO / "documents" / "data"
STAGES = ("validation", "compile", "run", "usage")

WEIRD_STRINGS = ["", " ", "..", "../x", "/abs", "a/../../b", "\u00e9t\u00e9", "\U0001F600\U0001F680", "\x00",
                 "\u202e\u0301", "x" * 5000, "weekdays/../weekdays/train", "weekdays/train#nope", "#",
                 "weekdays//train", "\ud800", "a.b[0]", "c[999]", "[", "block_output", "eager", "fixture:nope",
                 "fixture:tiny-gpt2", "-1", "null", "\n\t", "Monday", "\u3042\u3044",
                 "kl", "js", "top_k", "soft_accuracy", "against", "bare", "clean_logits", "k",  # D24-D29's fields
                 "top_k_overlap", "</s>", "<unk>", "<s>"]  # D28's two top_k kinds; D29's special spellings
PATH_NAMES = ["a/b", "a.b", "..", ".", "", "x/../y", "a\\b", "/abs", "iia.json/x", "n\nl", "a" * 300]
WEIRD_NUMBERS = [0, 1, -1, 2, 3, 7, -7, 10 ** 6, -(10 ** 6), 2 ** 31, 2 ** 63, 10 ** 100, -(10 ** 100), 0.5, -0.0,
                 1e308, float("inf"), float("nan"), True, False, 1e9, 32000, 32001]


def weird_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(WEIRD_STRINGS)
    if kind == 1:
        return rng.choice(WEIRD_NUMBERS)
    if kind == 2:
        return None
    if kind == 3:
        return rng.choice([{}, [], [[]], {"sweep": []}, {"sweep": [0, 1]}, {"index": -1}, {"all": True}])
    if kind == 4:
        return [weird_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 5:
        return {rng.choice(WEIRD_STRINGS + ["sweep", "as", "index", "span"]): weird_value(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    if kind == 6:  # deep nesting
        value: Any = 0
        for _ in range(rng.choice([10, 200, 800])):
            value = [value] if rng.random() < 0.5 else {"a": value}
        return value
    return {"sweep": {"range": [rng.choice(WEIRD_NUMBERS), rng.choice(WEIRD_NUMBERS)]}}


PATH_DEPTH = 64  # deeper nodes (a deep-nesting value) are not edit targets: their parents are


def _paths(node: Any, here: tuple = ()) -> list[tuple]:
    """Every path into a JSON tree down to PATH_DEPTH, the root's `()` first, parents before their
    children; a loop, not a recursion, so an 800-deep value cannot overflow the harness's own stack."""
    found, stack = [], [(node, here)]
    while stack:
        node, here = stack.pop()
        found.append(here)
        if len(here) < PATH_DEPTH:
            children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            stack.extend(reversed([(child, here + (key,)) for key, child in children]))
    return found


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def mutate_tree(rng: random.Random, tree: Any, keys: list[str]) -> Any:
    """One to three edits at random places: replace, delete, add a key, or nudge a number."""
    tree = copy.deepcopy(tree)
    for _ in range(rng.randrange(1, 4)):
        paths = _paths(tree)
        path = rng.choice(paths)
        op = rng.randrange(6)
        if not path:
            if op == 0:
                tree = weird_value(rng)
            continue
        parent, last = _get(tree, path[:-1]), path[-1]
        if op == 0:
            parent[last] = weird_value(rng)
        elif op == 1:
            del parent[last]
        elif op == 2 and isinstance(parent, dict):
            parent[rng.choice(keys + WEIRD_STRINGS)] = weird_value(rng)
        elif op == 3 and isinstance(parent[last], (int, float)) and not isinstance(parent[last], bool):
            parent[last] = rng.choice([parent[last] + 1, parent[last] - 1, -parent[last], parent[last] * 1000])
        elif op == 4:  # swap in a value from elsewhere in the tree (a string where a number goes, ...)
            other = rng.choice(paths)
            if other and other[: len(path)] != path:
                try:
                    parent[last] = copy.deepcopy(_get(tree, other))
                except RecursionError:  # a deep-nesting value: copy too deep for the harness; put a new one
                    parent[last] = weird_value(rng)
        elif op == 5 and isinstance(parent, dict):  # rename a key (a declared name, often) to a path-like one
            parent[rng.choice(PATH_NAMES)] = parent.pop(last)
        else:
            parent[last] = weird_value(rng)
    return tree


def _keys(tree: Any) -> list[str]:
    return sorted({str(p[-1]) for p in _paths(tree) if p and isinstance(p[-1], str)})


def _twice(rng: random.Random, text: str) -> str:
    """A key named twice: repeat one object's key (with another value) right after its `{` or `, `."""
    keys = [m for m in re.finditer(r'([{,] ?)("(?:[^"\\]|\\.)*"): ', text)]
    if not keys:
        return text
    m = rng.choice(keys)
    return text[:m.end(1)] + m.group(2) + ": " + rng.choice(["0", "null", "[1]", '"x"']) + ", " + text[m.end(1):]


def _huge_integer(rng: random.Random, text: str) -> str:
    """An integer of more than 4300 digits (which Python will not convert) where a number was."""
    numbers = list(re.finditer(r"(?<=[:\[,] )-?\d+(?=[,\]}])", text))
    if not numbers:
        return text
    m = rng.choice(numbers)
    return text[:m.start()] + rng.choice(["", "-"]) + "9" * rng.choice([4301, 5000, 20000]) + text[m.end():]


def _text(rng: random.Random, tree: Any) -> str:
    try:
        text = json.dumps(tree, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    except RecursionError:  # nested past what json can write: say so in text instead
        text = "[" * 5000 + "]" * 5000
    if rng.random() < 0.06:
        text = _twice(rng, text)
    if rng.random() < 0.06:
        text = _huge_integer(rng, text)
    if rng.random() < 0.02:  # nested past what json can read
        text = "[" * 100_000 + text + "]" * 100_000
    if rng.random() < 0.08:  # broken JSON: truncated, spliced, or not UTF-8
        how = rng.randrange(3)
        at = rng.randrange(len(text) + 1)
        if how == 0:
            text = text[:at]
        elif how == 1:
            text = text[:at] + rng.choice(["{", "]", ",", "\"", "\\u12", "\x00", "NaN", "//"]) + text[at:]
        else:
            text = "\ufeff" + text
    return text


LAYERS = ["all", "all", "ALL", ["all"], {"sweep": ["all", [0]]}, {"sweep": [[0], [1]], "as": "layers"}]


def _cycle(rng: random.Random, steps: dict) -> None:
    """A steps-first reference back: an earlier forward step swaps in a later step's read (a cycle when the
    later one names it, a forward reference otherwise), or a step's `of` names itself."""
    runs = [n for n, s in steps.items() if isinstance(s, dict) and s.get("kind") == "forward" and s.get("reads")]
    others = [n for n, s in steps.items() if isinstance(s, dict) and "of" in s]
    if len(runs) >= 2 and rng.random() < 0.7:
        first, last = runs[0], runs[-1]
        read = next(iter(steps[last]["reads"]))
        sites = [r.get("site") for r in steps[first]["reads"].values() if isinstance(r, dict)]
        steps[first]["interventions"] = {"writes": {"back": {"site": sites[0] if sites else "target", "pos": -1,
                                                             "mechanism": "swap", "operand": f"{last}.{read}"}}}
    elif others:
        name = rng.choice(others)
        steps[name]["of"] = f"{name}.{name}" if rng.random() < 0.5 else steps[name]["of"]


# ---------------------------------------------------------------- steps-first: names built to collide


GENERATED = ["base", "base-1", "base-2", "original", "stage1", "stage2", "saves", "counterfactual"]  # SF4, SF8
WRONG = [["pairs"], {"a": 1}, 3, None, True, ""]  # SF3's data and field, SF9's saves, of the wrong type


def _refer(value: Any, old: str, new: str) -> Any:
    """A reference (`<step>.<read>`, or a reduce step's name) to `old`, made to name `new`."""
    if value == old:
        return new
    if isinstance(value, str) and value.startswith(old + "."):
        return new + value[len(old):]
    return value


def _renamed(steps: dict, old: str, new: str) -> dict:
    """The steps with step `old` named `new`, in its place, and every reference and save that names it too."""
    out = {}
    for name, step in steps.items():
        if name == "saves":
            step = ({_refer(k, old, new): v for k, v in step.items()} if isinstance(step, dict)
                    else [_refer(v, old, new) for v in step] if isinstance(step, list) else step)
        elif isinstance(step, dict):
            step = {k: _refer(v, old, new) if k not in ("kind", "data", "field") else v for k, v in step.items()}
            writes = (step.get("interventions") or {}).get("writes") if isinstance(step.get("interventions"),
                                                                                  dict) else None
            for write in (writes or {}).values() if isinstance(writes, dict) else ():
                if isinstance(write, dict) and "operand" in write:
                    write["operand"] = _refer(write["operand"], old, new)
        out[new if name == old else name] = step
    return out


def _runs(steps: dict) -> list[str]:
    return [n for n, s in steps.items() if isinstance(s, dict) and s.get("kind") in ("forward", "generate")
            and isinstance(s.get("reads"), dict) and s["reads"]]


def _rename_read(steps: dict, step: str, old: str, new: str) -> None:
    """Step `step`'s read `old` named `new`, and every `<step>.<old>` that names it."""
    steps[step]["reads"] = {new if r == old else r: v for r, v in steps[step]["reads"].items()}
    for name, other in list(steps.items()):
        renamed = _renamed({name: other}, f"{step}.{old}", f"{step}.{new}")  # a reference is the whole string
        steps[name] = next(iter(renamed.values()))


def _chain(rng: random.Random, steps: dict) -> dict:
    """The steps with a chain of forward steps after them, each swapping in the read of the one before
    (SPEC.md Q39)."""
    runs = _runs(steps)
    if not runs:
        return steps
    head = steps[runs[0]]
    read, first = next(iter(head["reads"].items()))
    site = first.get("site") if isinstance(first, dict) else None
    chain, last = dict(steps), runs[0]
    for k in range(rng.choice([50, 200, 400])):
        chain[f"chain{k}"] = {"kind": "forward", "data": head.get("data"), "field": head.get("field"),
                              "interventions": {"writes": {"w": {"site": site, "pos": -1, "mechanism": "swap",
                                                                 "operand": f"{last}.{read}"}}},
                              "reads": {read: {"site": site, "pos": -1}}}
        last = f"chain{k}"
    return chain


def steps_first(rng: random.Random, raw: Any) -> Any:
    """One of issue 38's shapes on a steps-first document: a step, read, write or site named to meet another
    or a name the lowering makes (':' joins, base and base-1, original, stage1, a read and write of one name),
    data, field or saves of the wrong type, no forward step, a long chain of forwards (SPEC.md SF3, SF9, SF20,
    Q39)."""
    raw = copy.deepcopy(raw)
    steps = raw.get("steps") if isinstance(raw, dict) else None
    if not isinstance(steps, dict) or "data" not in raw:
        return raw
    runs = _runs(steps)
    how = rng.randrange(9)
    if how == 0 and len(runs) >= 2:  # p reads q:r, p:q reads r: both once lowered to p:q:r
        a, b = rng.sample(runs, 2)
        r = next(iter(steps[b]["reads"]))
        _rename_read(steps, a, next(iter(steps[a]["reads"])), f"x:{r}")
        steps = _renamed(steps, b, f"{a}:x")
    elif how == 1 and runs:  # a step named as a generated role, model or stage, or as another step's read
        old = rng.choice(runs)
        other = rng.choice(runs)
        steps = _renamed(steps, old, rng.choice(GENERATED + [f"{other}:{next(iter(steps[other]['reads']))}"]))
    elif how == 2 and len(runs) >= 2:  # base on one column, base-1 on another
        a, b = rng.sample(runs, 2)
        steps[b]["field"] = rng.choice(["entity", "answer", steps[a].get("field")])
        steps = _renamed(_renamed(steps, a, "base"), b, "base-1")
    elif how == 3 and runs:  # a read named like a write of its step, or holding ':'; a site named as a hoisted one
        step = rng.choice(runs)
        writes = (steps[step].get("interventions") or {}).get("writes") or {}
        new = rng.choice(list(writes) + ["a:b", f"{step}:x"]) if isinstance(writes, dict) else "a:b"
        _rename_read(steps, step, next(iter(steps[step]["reads"])), new)
        if isinstance(raw.get("sites"), dict) and rng.random() < 0.5:
            raw["sites"][f"{step}:{new}"] = {"component": "lm_head"}
    elif how == 4 and runs:  # data or field of the wrong type
        steps[rng.choice(runs)][rng.choice(["data", "field"])] = copy.deepcopy(rng.choice(WRONG))
    elif how == 5:  # saves of the wrong type, or a step listed twice
        names = [n for n in steps if n != "saves"]
        steps["saves"] = copy.deepcopy(rng.choice(WRONG[2:] + [names[:1] * 2, []]))
    elif how == 6:  # no forward step
        steps = {n: s for n, s in steps.items() if n not in runs}
    elif how == 7:
        steps = _chain(rng, steps)
    elif runs:  # two writeless generations on other rows, saved: one `original.generated`
        data = steps[rng.choice(runs)].get("data")
        steps = {name: {"kind": "generate", "data": data, "field": field, "max_new_tokens": 2,
                        "reads": {"l": {"site": {"component": "lm_head"}, "pos": -1}}}
                 for name, field in (("g1", "input"), ("g2", rng.choice(["input", "counterfactual_inputs[0]"])))}
        steps["saves"] = ["g1"]
    raw["steps"] = steps
    return raw


def language(rng: random.Random, raw: Any) -> Any:
    """The later language's fields (issue #32): a site's layers made "all" (or a wrong spelling of it), and in a
    steps-first document a reference that closes a cycle."""
    raw = copy.deepcopy(raw)
    sites = raw.get("sites") if isinstance(raw, dict) else None
    if isinstance(sites, dict) and sites and rng.random() < 0.6:
        site = sites[rng.choice(sorted(sites))]
        if isinstance(site, dict):
            site["layers"] = copy.deepcopy(rng.choice(LAYERS))
    if isinstance(raw, dict) and "data" in raw and isinstance(raw.get("steps"), dict) and rng.random() < 0.5:
        _cycle(rng, raw["steps"])
    return raw


READOUT_K = [1, 3, 5, 0, -1, 32000, 32001, 250_001, 10 ** 9, 2.0, "3", True, None, [3]]


def readout(rng: random.Random, raw: Any) -> Any:
    """The original's top_k readout (D27, D28): a metric made a list-valued top_k (with or without a stray
    `against`, a hostile `k`), a top_k_overlap without its `against`, or a top_k named as a fit's objective or
    early stop."""
    raw = copy.deepcopy(raw)
    if not isinstance(raw, dict):
        return raw
    if "data" in raw and isinstance(raw.get("steps"), dict):  # steps-first: its metric steps
        metrics = {n: m for n, m in raw["steps"].items() if isinstance(m, dict) and m.get("kind") == "metric"}
        kind_key = "metric"
    else:
        ivs = raw.get("interventions") if isinstance(raw.get("interventions"), dict) else {}
        metrics = {n: m for iv in ivs.values() if isinstance(iv, dict) and isinstance(iv.get("metrics"), dict)
                   for n, m in iv["metrics"].items() if isinstance(m, dict)}
        kind_key = "kind"
    if not metrics:
        return raw
    name = rng.choice(sorted(metrics))
    metric = metrics[name]
    for column in ("expected", "a", "b", "target", "token", "token_form", "against"):
        metric.pop(column, None)
    metric[kind_key] = rng.choice(["top_k", "top_k", "top_k_overlap"])
    if rng.random() < 0.7:
        metric["k"] = copy.deepcopy(rng.choice(READOUT_K))
    if rng.random() < 0.2:
        metric["against"] = metric.get("of")
    for step in (raw.get("steps") or {}).values():
        if isinstance(step, dict) and step.get("kind") == "fit" and rng.random() < 0.5:
            if rng.random() < 0.5:
                step["objective"] = [[1.0, name]]
            elif isinstance(step.get("early_stop"), dict):
                step["early_stop"]["metric"] = name
    return raw


def case(rng: random.Random, tmp: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, str]:
    """A mutated document (and maybe a mutated data root) in `tmp`; returns (doc, data root, source name)."""
    source = rng.choice(DOCUMENTS)
    raw = json.loads(source.read_text(encoding="utf-8"))
    root = DATA
    which = rng.random()
    if rng.random() < 0.2:  # the later language's fields, before any other edit (SPEC.md D34-D36, SF6)
        raw = language(rng, raw)
    if isinstance(raw, dict) and "data" in raw and rng.random() < 0.5:  # names built to collide (SF20)
        raw = steps_first(rng, raw)
    if rng.random() < 0.1:  # the original's top_k readout and its k (SPEC.md D27, D28)
        raw = readout(rng, raw)
    if which < 0.7:
        raw = mutate_tree(rng, raw, _keys(raw))
    if which >= 0.55:  # mutate a data table too (or only)
        root = tmp / "data"
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(DATA, root)
        tables = sorted(root.glob("*/*.json"))
        table = rng.choice(tables)
        rows = json.loads(table.read_text(encoding="utf-8"))
        rows = mutate_tree(rng, rows, _keys(rows))
        table.write_bytes(_text(rng, rows).encode("utf-8", "surrogatepass"))
    doc = tmp / "doc.json"
    doc.write_bytes(_text(rng, raw).encode("utf-8", "surrogatepass"))
    return doc, root, source.name


# ---------------------------------------------------------------- running


_ENGINES: dict = {}


@contextlib.contextmanager
def cached_loads():
    """loading.load (and so HooksEngine.load) memoized per model block and weights, for this process."""
    from causalab_ref.engines import loading

    original = loading.load

    def load(spec, kind="nnterp", weights=True, device_map="cpu"):
        key = (kind, spec.key, spec.revision, spec.dtype, spec.attn_implementation, weights, device_map)
        if key not in _ENGINES:
            _ENGINES[key] = original(spec, kind=kind, weights=weights, device_map=device_map)
        return _ENGINES[key]

    loading.load = load
    try:
        yield
    finally:
        loading.load = original


def _watched(cwd: pathlib.Path, sentinel: Optional[pathlib.Path]) -> dict:
    """What no call may change: the documents (and their data), a sentinel folder, the cwd's own entries."""
    found = invariant.snapshot(REPO / "documents")
    if sentinel is not None:
        found.update(invariant.snapshot(sentinel))
    found.update(invariant.snapshot(cwd, deep=False))  # a cwd may be the repository: its own entries only
    return found


def check(argv: list[str], sentinel: Optional[pathlib.Path] = None) -> tuple[bool, int, str]:
    """Run the CLI in-process (inprocess.cli); (the outcome is the project's own, status, stderr). Own is
    status 0, or status 2 with one `<stage>: ...` line, and the invariant kept (tests/invariant.py: no
    internal error, no eligible non-finite row under --out, nothing changed outside --out in the documents,
    the sentinel or the cwd, the time bound); a broken invariant is appended to stderr."""
    cwd = pathlib.Path.cwd()
    before, started = _watched(cwd, sentinel), time.monotonic()
    try:
        done = inprocess.cli(*argv, cwd=cwd)
    except BaseException as error:  # anything escaping main is foreign
        return False, -1, f"escaped main: {type(error).__name__}: {error}"
    seconds, text = time.monotonic() - started, done.stderr
    lines = text.strip().splitlines()
    ok = (done.returncode == 0 or (done.returncode == 2 and len(lines) == 1 and lines[0].split(":")[0] in STAGES))
    broken = invariant.violations(argv, done.returncode, text, seconds, (before, _watched(cwd, sentinel)), cwd)
    return ok and not broken, done.returncode, text + "".join(f"\ninvariant: {b}" for b in broken)


#: each verb a case runs, as the command line is given it before the document
VERB_ARGS = {"validate": ["validate"], "explain": ["explain"], "tokens": ["tokens", "--document"], "run": ["run"]}


def run_case(rng: random.Random, tmp: pathlib.Path, verbs=tuple(VERB_ARGS), record: bool = False):
    """One mutated case through each verb; returns the foreign outcomes as (verb, source, status, stderr),
    and with `record` also each verb's (verb, status) outcome."""
    doc, root, source = case(rng, tmp)
    sentinel = tmp / "sentinel"
    if not sentinel.exists():
        sentinel.mkdir()
        (sentinel / "keep.txt").write_text("keep me\n")
    foreign, outcomes = [], []
    for verb in verbs:
        argv = [*VERB_ARGS[verb], str(doc), "--data-root", str(root)]
        if verb == "run":
            argv += ["--out", str(tmp / "out"), "--replace", "--quiet"]
        ok, status, text = check(argv, sentinel)
        outcomes.append((verb, status))
        if not ok:
            foreign.append((verb, source, status, text.strip()[-2000:]))
    return (foreign, outcomes) if record else foreign

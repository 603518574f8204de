"""Steps-first: the original's later authoring format, read into the plan-shaped document it means.

A steps-first document (SPEC.md §15, the third format) names its datasets under `data`, its
places under `sites`, and runs `steps` in the order written: a `forward` step runs the model on one
dataset's column with its own reads and writes, a `metric` step scores a read (`"of": "patched.logits"`,
`"expected": "pairs.cf_answer"`), a `reduce` step averages a read over the rows (or keeps its principal
directions), and the reserved `steps.saves` says what is written. `lower(raw)` rewrites it as the
plan-shaped document it means (roles, sites, interventions, observe steps), which the one pipeline then
validates, compiles and runs, as protocol.py does for the protocol format; `Lowered.path` maps a path of
the plan-shaped document in a refusal back to the steps-first document's own; `digest(raw)` is the
produced_by. Everything without a plan-shaped meaning is refused by name, and every name the lowering
makes is its source's alone (SF20). SPEC.md §15 (SF1-SF16, SF20, SF21); stepstages.py orders the steps.

    from causalab_ref.documents import stepsfirst
    lowered = stepsfirst.lower(raw)          # lowered.plan: a plan-shaped document
    lowered.path("interventions.patching.reads.patched:logits.pos")   # 'steps.patched.reads.logits.pos'
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NoReturn

from . import metrics, sweeps
from .stepstages import RUNS, check_order, stages
from .fields import first_unknown, mapping, strict_object
from .reader import canonical_sha256, type_name
from ..shapes import Refusal, nearest

TOP = ("header", "model", "data", "sites", "steps")
KINDS = ("forward", "generate", "metric", "reduce", "fit")
STEP_KEYS = {"forward": ("kind", "data", "field", "reads", "interventions"),
             "generate": ("kind", "data", "field", "reads", "interventions", "max_new_tokens", "min_new_tokens",
                          "do_sample"),
             "reduce": ("kind", "reduce", "of", "k")}
READ_KEYS = ("site", "pos", "view")
WRITE_KEYS = ("site", "pos", "mechanism", "operand", "params", "features")
SITE_KEYS = ("component", "layers", "heads", "units")
STATE = "linear_attention_state"  # the original's Gated DeltaNet state place, refused by name (SF12)
READ_FIELDS = {f for kind in metrics.KINDS.values() for f in kind.reads}  # a metric's fields that are reads
MAX_ROWS = 10_000  # (stage, role) pairs a lowering writes: each stage's observe step has every role's rows (SF21)
SAVES = "saves"  # the reserved key of `steps`: what is written (SF9)
#: what the format has and causalab_ref does not read from it, refused by name (SF12)
UNREAD = {
    "fit": "a fit step of the steps-first format is not read by causalab_ref; write the fit plan-shaped (a fit "
           "step with its objective, optimizer and eval, SPEC.md §9)",
    "featurizers": "featurizers in a steps-first document are not read by causalab_ref; write the document "
                   "plan-shaped (featurizers, and reads and writes naming them, SPEC.md §9)",
    "roles": "roles belong to the plan-shaped format; a steps-first step names its dataset (`data`) and column "
             "(`field`) itself",
    "interventions": "a steps-first document declares no interventions: a forward step writes its own under "
                     "`interventions.writes`",
}


def _fail(path: str, message: str) -> NoReturn:
    raise Refusal(message, path=path, stage="validation")


def _keys(raw: Any, path: str, allowed: tuple, required: tuple = ()) -> dict:
    """fields.strict_object, what the format has but this reader does not read refused by name (UNREAD)."""
    key = first_unknown(raw, allowed)  # refused by name here, else by strict_object as unknown
    if key in UNREAD:
        _fail(f"{path}.{key}" if path else key, UNREAD[key])
    return strict_object(raw, path, allowed, required)


def digest(raw: dict) -> str:
    """The steps-first document's produced_by: sha256 of the document as given without its header, keys
    sorted, compact separators (SF15; the plan-shaped rule D19 on this format's own text)."""
    return canonical_sha256({k: v for k, v in raw.items() if k != "header"})


@dataclass
class Lowered:
    """The plan-shaped document a steps-first one means, and where each of its parts came from."""
    plan: dict
    origin: dict = field(default_factory=dict)  # plan-shaped path prefix -> (steps-first path, {key: key})

    def path(self, path: str) -> str:
        """The steps-first document's path for a path of the plan-shaped document (SF14)."""
        best = max((p for p in self.origin if path == p or path.startswith(p + ".")), key=len, default=None)
        if best is None:
            return path
        target, renamed = self.origin[best]
        rest = path[len(best) + 1:].split(".") if path != best else []
        if rest and rest[0] in renamed:
            rest[0] = renamed[rest[0]]
        return ".".join([target, *rest]) if target else ".".join(rest)


# ---------------------------------------------------------------- references


def _reference(value: Any, path: str, runs: dict) -> tuple[str, str]:
    """A `<step>.<read>` reference to a read of a forward step: (step, read)."""
    if not isinstance(value, str) or "." not in value:
        _fail(path, f"a reference names a forward step's read as '<step>.<read>' (such as 'patched.logits'), got "
                    f"{json.dumps(value)[:60]}")
    step, read = value.split(".", 1)
    if step not in runs:
        _fail(path, f"'{value}' names no forward step '{step}'; forward steps: {sorted(runs)}"
                    f"{nearest(step, sorted(runs))}")
    reads = runs[step].get("reads") if isinstance(runs[step].get("reads"), dict) else {}
    if read not in reads:
        _fail(path, f"'{value}': step '{step}' has no read '{read}'; its reads: {sorted(reads)}"
                    f"{nearest(read, sorted(reads))}")
    return step, read


# ---------------------------------------------------------------- the parts


def _dataset(name: str, raw: Any) -> str:
    entry = _keys(raw, f"data.{name}", ("path",), ("path",))
    if not isinstance(entry["path"], str):
        _fail(f"data.{name}.path", f"a dataset's path is a dataset ref such as 'weekdays/train', got "
                                   f"{type_name(entry['path'])}")
    return entry["path"]


def _layers(value: Any) -> Any:
    """A steps-first site's layers: an integer i is the plan-shaped [i]; a sweep of integers sweeps [i]."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if sweeps.is_wrapper(value) and isinstance(value["sweep"], list):
        return dict(value, sweep=[_layers(v) for v in value["sweep"]])
    if sweeps.is_wrapper(value):
        return [value]  # a range of layers, as a list around it (D23)
    return value


def _site(raw: Any, path: str) -> dict:
    site = dict(_keys(raw, path, SITE_KEYS, ("component",)))
    if site["component"] == STATE:
        _fail(f"{path}.component", "linear_attention_state, the recurrent state a Gated DeltaNet layer hands on, "
                                   "is not a place causalab_ref addresses: its component table has no state row "
                                   "and no fixture checks one (the original's deltanet_state documents stay "
                                   "refused); a linear-attention layer's block and MLP places are addressed, "
                                   "its attention places refused (SPEC.md L30)")
    if "layers" in site:
        site["layers"] = _layers(site["layers"])
    return site


def _plain(name: str, path: str, what: str) -> None:
    """A step, read, write or site name holds no ':', the separator the lowering joins names with (SF20)."""
    if ":" in name:
        _fail(path, f"{what} '{name}' holds ':', and the lowering names a step's read, write or in-place site "
                    "'<step>:<name>', so two names with ':' can lower to one; rename it without ':'")


def _step(name: str, raw: Any, data: dict) -> dict:
    """One step checked by its kind, its own keys only (what they mean is the plan-shaped document's), and its
    names (SF20)."""
    path = f"steps.{name}"
    _plain(name, path, "step")
    if not isinstance(raw, dict):
        _fail(path, f"a step is an object with a kind, got {type_name(raw)}")
    kind = raw.get("kind")
    if kind not in KINDS:
        _fail(f"{path}.kind", f"a step's kind is one of {list(KINDS)}, got {json.dumps(kind)[:60]}"
                              f"{nearest(kind, list(KINDS)) if isinstance(kind, str) else ''}")
    if kind == "fit":
        _fail(f"{path}.kind", UNREAD["fit"])
    if kind == "metric":
        return _keys(raw, path, tuple(raw), ("kind", "metric", "of"))
    step = _keys(raw, path, STEP_KEYS[kind], ("kind", "of", "reduce") if kind == "reduce" else
                 ("kind", "data", "field", "reads"))
    if kind in RUNS:
        if not isinstance(step["data"], str):
            _fail(f"{path}.data", f"a step's `data` is the name of a dataset `data` declares, a string; got "
                                  f"{type_name(step['data'])}")
        if not isinstance(step["field"], str):
            _fail(f"{path}.field", f"a step's `field` is the column its prompt is (such as 'input'), a string; got "
                                   f"{type_name(step['field'])}")
        if step["data"] not in data:
            _fail(f"{path}.data", f"step '{name}' runs on dataset {json.dumps(step['data'])[:60]}, which `data` does "
                                  f"not declare; declared: {sorted(data)}"
                                  f"{nearest(step['data'], sorted(data))}")
        reads = mapping(step["reads"], f"{path}.reads")
        for r in reads:
            _plain(r, f"{path}.reads.{r}", "read")
        if "interventions" in step:
            writes = mapping(_keys(step["interventions"], f"{path}.interventions", ("writes",), ("writes",))["writes"],
                             f"{path}.interventions.writes")
            for w in writes:
                _plain(w, f"{path}.interventions.writes.{w}", "write")
                if w in reads:
                    _fail(f"{path}.interventions.writes.{w}", f"step '{name}' has a read and a write both named "
                                                              f"'{w}', and a site written in place in either is "
                                                              f"named '{name}:{w}'; rename one")
            if writes and name == "original":
                _fail(f"{path}.interventions", "a step that writes is the intervened model named after it, and "
                                               "'original' is the model with no writes; rename the step")
    return step


def _generate(name: str, step: dict) -> int:
    """A generate step's decode length: greedy, exactly max_new_tokens tokens (SF11)."""
    path = f"steps.{name}"
    n = step.get("max_new_tokens")
    if isinstance(n, bool) or not isinstance(n, int):
        _fail(f"{path}.max_new_tokens", "a generate step says how many tokens it decodes, max_new_tokens, an "
                                        "integer")
    if step.get("min_new_tokens", n) != n:
        _fail(f"{path}.min_new_tokens", "a decode runs exactly its number of tokens: min_new_tokens is "
                                        "max_new_tokens or absent (a decode does not stop early)")
    if step.get("do_sample", False) is not False:
        _fail(f"{path}.do_sample", "a decode is greedy: do_sample is false or absent")
    return n


# ---------------------------------------------------------------- the lowering


@dataclass
class _Build:
    """What lowering has made so far: the plan-shaped parts and where each came from."""
    data: dict
    steps: dict
    sites: dict
    roles: dict = field(default_factory=dict)  # (dataset, field) -> role name
    role_of: dict = field(default_factory=dict)  # forward step -> role name
    origin: dict = field(default_factory=dict)
    runs: dict = field(init=False)  # the forward and generate steps, whose reads a reference names

    def __post_init__(self) -> None:
        self.runs = {n: s for n, s in self.steps.items() if s["kind"] in RUNS}


def _roles(build: _Build) -> None:
    """One role per (dataset, column) the forward steps run on; `base` is the one the first metric's read runs
    on (metric columns are its rows, D8), else the first forward's; another is named after its first step (SF4),
    which is never `base` (SF17)."""
    runs = build.runs
    metrics = [s for s in build.steps.values() if s["kind"] == "metric"]
    head = metrics[0].get("of").split(".", 1)[0] if metrics and isinstance(metrics[0].get("of"), str) else None
    first = head if head in runs else next(iter(runs), None)
    order = ([first] if first else []) + [n for n in runs if n != first]
    for name in order:
        pair = (runs[name]["data"], runs[name]["field"])
        if pair not in build.roles:
            if build.roles and name == "base":
                _fail(f"steps.{name}", f"step 'base' runs on dataset '{pair[0]}', field '{pair[1]}', which are not "
                                       "the rows the metrics score, and those rows are the role named 'base'; a "
                                       "step named 'base' runs on them or not at all, so rename the step")
            role = name if build.roles else "base"
            build.roles[pair] = role
            build.origin[f"roles.{role}"] = (f"steps.{name}", {})
        build.role_of[name] = build.roles[pair]


def _site_name(build: _Build, value: Any, path: str, hoisted: str) -> Any:
    """A read's or write's site: a declared name, or an object written in place, hoisted as `hoisted`, the
    `<step>:<name>` no declared site is (SF20)."""
    if isinstance(value, dict) and not sweeps.is_wrapper(value):
        build.sites[hoisted] = _site(value, path)
        build.origin[f"sites.{hoisted}"] = (path, {})
        return hoisted
    return value


def _operand(build: _Build, value: Any, path: str) -> Any:
    """A write's operand: `<step>.<read>` is that read, a reduce step's name its value ({"ref"}), a number
    itself (SF5)."""
    if isinstance(value, str) and value in build.steps and build.steps[value]["kind"] == "reduce":
        return {"ref": value}
    if isinstance(value, str):
        step, read = _reference(value, path, build.runs)
        return f"{step}:{read}"
    return value


def _writes(step: dict) -> dict:
    """A forward or generate step's writes: with any, it is the intervened model named after it (SF8)."""
    return (step.get("interventions") or {}).get("writes", {})


def _forward(build: _Build, name: str, intervention: dict) -> None:
    """A forward step's reads and writes in its stage's intervention; its writes make a model named after it."""
    step, role = build.steps[name], build.role_of[name]
    writes = _writes(step)
    model = name if writes else "original"
    for r, raw in step["reads"].items():
        path = f"steps.{name}.reads.{r}"
        read = dict(_keys(raw, path, READ_KEYS, ("site", "pos")))
        read["site"] = _site_name(build, read["site"], f"{path}.site", f"{name}:{r}")
        intervention["reads"][f"{name}:{r}"] = {**read, "input": role, "model": model}
        build.origin[f"{intervention['path']}.reads.{name}:{r}"] = (path, {"input": "data", "model": "interventions"})
    for w, raw in writes.items():
        path = f"steps.{name}.interventions.writes.{w}"
        write = dict(_keys(raw, path, WRITE_KEYS, ("site", "pos", "mechanism")))
        write["site"] = _site_name(build, write["site"], f"{path}.site", f"{name}:{w}")
        if "operand" in write:
            write["operand"] = _operand(build, write["operand"], f"{path}.operand")
        intervention["writes"][f"{name}:{w}"] = write
        build.origin[f"{intervention['path']}.writes.{name}:{w}"] = (path, {})
    if writes:
        intervention["models"][name] = {"input": role, "writes": [f"{name}:{w}" for w in writes]}
        build.origin[f"{intervention['path']}.models.{name}"] = (f"steps.{name}.interventions", {})


def _column(build: _Build, value: Any, key: str, path: str, base: str) -> Any:
    """A metric's field: `<dataset>.<column>` is a column of the base rows, `<step>.<read>` a read where the
    field is one (`against`), anything else itself (SF5)."""
    if not isinstance(value, str) or "." not in value:
        return value
    head, rest = value.split(".", 1)
    if head in build.data:
        if head != base:
            _fail(path, f"'{value}' is a column of dataset '{head}', and a metric's columns are the rows of the "
                        f"dataset its read runs on, '{base}'")
        return rest
    if head in build.steps:
        if key not in READ_FIELDS:
            _fail(path, f"'{value}' names a read of step '{head}', and `{key}` is a column of the rows the metric "
                        f"scores; write it '{base}.<column>'")
        step, read = _reference(value, path, build.runs)
        return f"{step}:{read}"
    return value


def _metric(build: _Build, name: str, intervention: dict) -> None:
    step, path = build.steps[name], f"steps.{name}"
    base = next(ds for (ds, _f), role in build.roles.items() if role == "base")
    of = _reference(step["of"], f"{path}.of", build.runs)
    metric = {"kind": step["metric"], "of": f"{of[0]}:{of[1]}"}
    for key, value in step.items():
        if key not in ("kind", "metric", "of"):
            metric[key] = _column(build, value, key, f"{path}.{key}", base)
    intervention["metrics"][name] = metric
    build.origin[f"{intervention['path']}.metrics.{name}"] = (path, {"kind": "metric"})


def _saves(build: _Build, raw: Any, stage: dict) -> dict[int, list]:
    """The reserved `steps.saves`, {value: file} or [value, ...] (a metric to `<value>.json`, a reduce's value
    and a decode's ids to `.safetensors`), as each stage's saves (SF9)."""
    if not isinstance(raw, (dict, list)):
        _fail("steps.saves", f"steps.saves is {{value: file}} or [value, ...], naming metric, reduce or generate "
                             f"steps; got {type_name(raw)}")
    if isinstance(raw, list):
        if not all(isinstance(v, str) for v in raw):
            _fail("steps.saves", "a save list names steps: metric, reduce or generate steps")
        twice = next((k for k, v in enumerate(raw) if v in raw[:k]), None)
        if twice is not None:
            _fail(f"steps.saves.{twice}", f"'{raw[twice]}' is listed twice; a step is saved once")
        raw = {v: f"{v}.json" if build.steps.get(v, {}).get("kind") == "metric" else f"{v}.safetensors"
               for v in raw}
        keyed = False
    else:
        keyed = True
    out: dict[int, list] = {}
    for k, (value, file_path) in enumerate(_keys(raw, "steps.saves", tuple(raw)).items()):
        save_path = f"steps.saves.{value}" if keyed else f"steps.saves.{k}"
        kind = build.steps.get(value, {}).get("kind")
        if kind not in ("metric", "reduce", "generate"):
            _fail(save_path, f"save '{value}' names no metric, reduce or generate step; those are what a steps-first "
                         f"document saves (steps: {sorted(build.steps)}){nearest(value, sorted(build.steps))}")
        saves = out.setdefault(stage[value], [])
        build.origin[f"steps.stage{stage[value] + 1}.saves.{len(saves)}"] = (save_path, {})
        if kind == "generate" and not _writes(build.steps[value]):
            _one_original(build, value, stage, save_path)
        if kind == "generate":
            value = f"{value if _writes(build.steps[value]) else 'original'}.generated"
        saves.append({"value": value, "file_path": file_path})
    return out


def _one_original(build: _Build, name: str, stage: dict, save_path: str) -> None:
    """A saved generate step that writes nothing saves the original model's ids, `original.generated`, which
    name one forward only when no other such step of its pass runs on other rows (SF20)."""
    other = next((n for n, s in build.runs.items() if s["kind"] == "generate" and not _writes(s)
                  and stage[n] == stage[name] and build.role_of[n] != build.role_of[name]), None)
    if other is not None:
        _fail(save_path, f"generate step '{name}' writes nothing, so its ids are the original model's "
                     f"('original.generated'), and so are those of step '{other}' in the same pass on other rows "
                     f"(field '{build.steps[other]['field']}'); a pass keeps one 'original.generated', so run "
                     "the other step in a document of its own")


def _decode(build: _Build, names: list[str]) -> int:
    """A stage's decode: 0 for forward steps; a generate step's length when every step run with it decodes
    the same (one intervention has one decode, SF11)."""
    lengths = {n: _generate(n, build.steps[n]) for n in names if build.steps[n]["kind"] == "generate"}
    if not lengths:
        return 0
    first = next(iter(lengths))  # the first generate step of the stage, in its order
    for n in names:
        if lengths.get(n) != lengths[first]:
            _fail(f"steps.{n}.kind", f"step '{n}' runs in one pass with generate step '{first}', and a "
                                     "pass decodes its every forward alike; give the steps one kind and one "
                                     "max_new_tokens, or write the document plan-shaped")
    return lengths[first]


def _stage(build: _Build, k: int, names: list[str], rows: dict) -> tuple[dict, dict]:
    """(the intervention, the observe step) of stage k: its forwards, metrics and reduce steps."""
    stage_path = f"interventions.stage{k + 1}"
    intervention: dict = {"path": stage_path, "reads": {}, "writes": {}, "models": {}, "metrics": {}}
    outputs = {}
    for name in names:
        kind = build.steps[name]["kind"]
        if kind in RUNS:
            _forward(build, name, intervention)
        elif kind == "metric":
            _metric(build, name, intervention)
        else:
            step = build.steps[name]
            of = _reference(step["of"], f"steps.{name}.of", build.runs)
            outputs[name] = {"read": f"{of[0]}:{of[1]}", "reduce": step["reduce"],
                             **({"k": step["k"]} if "k" in step else {})}
            build.origin[f"steps.stage{k + 1}.outputs.{name}"] = (f"steps.{name}", {"read": "of"})
    del intervention["path"]
    decode = _decode(build, [n for n in names if build.steps[n]["kind"] in RUNS])
    if decode:
        intervention["decode"] = decode
        first = next(n for n in names if build.steps[n]["kind"] == "generate")
        build.origin[f"{stage_path}.decode"] = (f"steps.{first}.max_new_tokens", {})
    build.origin[stage_path] = ("steps", {})
    build.origin[f"steps.stage{k + 1}"] = ("steps", {})
    observe = {"kind": "observe", "interventions": f"stage{k + 1}", "rows": rows,
               **({"outputs": outputs} if outputs else {})}
    return {k_: v for k_, v in intervention.items() if v or k_ == "reads"}, observe


def lower(raw: Any) -> Lowered:
    """The plan-shaped document a steps-first document means (SF2-SF13)."""
    top = _keys(raw, "", TOP, ("model", "data", "steps"))
    header = _keys(top.get("header", {}), "header", ("title", "description"))
    data = {name: _dataset(name, entry) for name, entry in mapping(top["data"], "data").items()}
    given = mapping(top["steps"], "steps")
    steps = {name: _step(name, s, data) for name, s in given.items() if name != SAVES}
    if not any(s["kind"] in RUNS for s in steps.values()):
        _fail("steps", "no forward or generate step: a steps-first document runs the model in at least one, and "
                       "its metric and reduce steps score that step's reads; add a forward step")
    clash = sorted(set(steps) & set(data))
    if clash:
        _fail(f"steps.{clash[0]}", f"'{clash[0]}' names both a dataset and a step, so '{clash[0]}.<x>' would mean "
                                   "either; rename one")
    sites = {}
    for name, site in mapping(top.get("sites", {}), "sites").items():
        _plain(name, f"sites.{name}", "site")
        sites[name] = _site(site, f"sites.{name}")
    build = _Build(data=data, steps=steps, sites=sites)
    build.origin.update({f"sites.{n}": (f"sites.{n}", {}) for n in sites})
    check_order(steps)
    stage = stages(steps)
    _roles(build)
    passes = max(stage.values()) + 1
    if passes * len(build.roles) > MAX_ROWS:
        _fail("steps", f"the steps run in {passes} passes (a reduce step's value is used a pass after its forward) "
                       f"over {len(build.roles)} (dataset, field) pairs, and each pass runs over every pair's rows: "
                       f"{passes * len(build.roles)} pass-rows, above the {MAX_ROWS} a document lowers to; use "
                       "fewer passes or fewer (dataset, field) pairs, or split the document")
    rows = {role: data[ds] for (ds, _f), role in build.roles.items()}
    interventions, observes = {}, {}
    in_stage: list[list[str]] = [[] for _k in range(max(stage.values()) + 1)]
    for name in steps:
        in_stage[stage[name]].append(name)
    for k, names in enumerate(in_stage):
        for (ds, _f), role in build.roles.items():
            build.origin[f"steps.stage{k + 1}.rows.{role}"] = (f"data.{ds}.path", {})
        interventions[f"stage{k + 1}"], observes[f"stage{k + 1}"] = _stage(build, k, names, rows)
    for k, saves in _saves(build, given.get(SAVES, {}), stage).items():
        observes[f"stage{k + 1}"]["saves"] = saves
    plan = {"model": top["model"], "roles": {role: {"field": f} for (_ds, f), role in build.roles.items()},
            "sites": build.sites, "interventions": interventions, "steps": observes}
    text = " — ".join(str(header[k]) for k in ("title", "description") if header.get(k))
    if text:
        plan = {"header": {"description": text}, **plan}
    build.origin.update({"roles": ("steps", {}), "interventions": ("steps", {}), "steps": ("steps", {})})
    return Lowered(plan=plan, origin=build.origin)

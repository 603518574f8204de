"""Steps: what a step runs, over which rows, and the files it saves.

The parts every step kind shares: its `rows` (a dataset ref per declared role), the
interventions it runs (`named`: one, several, or written in place and `hoisted` under the
step's name), and its `saves` (each a value it produces, a metric to .json, a tensor to
.safetensors; no two saves of a document write one file, `check_save_paths`). An observe step
is read here (`observe_step`), with its `outputs` (writes/outputs.py) and what it may save
(`produced_names`); a fit or weights step is fits.py's, and validate.py tells the kinds apart.

    from causalab_ref.documents import steps
    steps.observe_step(raw["steps"]["score"], "steps.score", interventions, ("base", "counterfactual"))
    steps.all_saves(step)  # its saves, then a fit's eval saves
"""
from __future__ import annotations

from typing import Any

from ..writes import outputs
from .fields import choice, mapping, strict_object, string
from .names import colliding, inside_out
from .reader import type_name
from ..shapes import Observe, Refusal, Save, nearest


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


def rows(raw: Any, path: str, who: str, roles: tuple) -> tuple[tuple[str, str], ...]:
    """A step's `rows` (`who` is "step '<s>'" or "step '<s>'.eval"): a dataset ref for every declared role."""
    rows_raw = mapping(raw, path, declares=False)
    for role in rows_raw:
        if role not in roles:
            _fail(f"{path}.{role}", f"{who}: undeclared role '{role}'")
        string(rows_raw[role], f"{path}.{role}")
    for role in roles:
        if role not in rows_raw:
            _fail(path, f"{who}: no rows for role '{role}'")
    return tuple(rows_raw.items())


def named(raw: dict, path: str, step: str, interventions: dict) -> tuple[str, ...]:
    """The interventions a step runs: `interventions` or `intervention`, a name or a list; omitted when one."""
    given = raw.get("interventions", raw.get("intervention"))
    key = "interventions" if "interventions" in raw else "intervention"
    if given is None:
        if len(interventions) != 1:
            _fail(path, f"step '{step}' runs a forward and names no intervention; say which with "
                        f"`interventions` — declared: {sorted(interventions)} — or write one there in place")
        names = tuple(interventions)
    elif isinstance(given, str):
        names = (given,)
    elif isinstance(given, list) and given and all(isinstance(n, str) for n in given):
        names = tuple(given)
    else:
        _fail(f"{path}.{key}", "name an intervention, list several, or write one in place as an object")
    for n in names:
        if n not in interventions:
            _fail(f"{path}.{key}", f"step '{step}': undeclared intervention '{n}'; declared: {sorted(interventions)}")
    return names


def saves(raw: Any, path: str, who: str, produced: list, tensors: tuple = (), what: str = "it") -> tuple:
    """A step's `saves`: each a value it produces, a metric to a .json path, a tensor to .safetensors."""
    if not isinstance(raw, list):
        _fail(path, f"expected a list of saves, got {type_name(raw)}")
    out: list[Save] = []
    for k, s in enumerate(raw):
        sp = f"{path}.{k}"
        strict_object(s, sp, ("value", "file_path"), ("value", "file_path"))
        value, file_path = string(s["value"], f"{sp}.value"), string(s["file_path"], f"{sp}.file_path")
        if value not in produced:
            tail = (f" (it produces {produced})" if what == "it" else "") + nearest(value, produced)
            _fail(f"{sp}.value", f"{who}: saves '{value}', which {what} does not produce{tail}")
        if value in tensors and not file_path.endswith(".safetensors"):
            _fail(f"{sp}.file_path", f"save '{value}': a tensor, not a table; give it a .safetensors path, "
                                     f"not '{file_path}'")
        if value not in tensors and not file_path.endswith(".json"):
            _fail(f"{sp}.file_path", f"save '{value}': a per-row metric table; give it a .json path, not "
                                     f"'{file_path}' (a .safetensors file would drop the example ids, eligibility "
                                     "and units)")
        inside_out(file_path, f"{sp}.file_path", "a save's file_path")
        if file_path in ("document.json", "run.json") or file_path in [x.file_path for x in out]:
            _fail(f"{sp}.file_path", f"'{file_path}' is already written by this run; name another file")
        out.append(Save(value=value, file_path=file_path))
    return tuple(out)


# ---------------------------------------------------------------- observe steps


def produced_names(names: tuple, interventions: dict, outputs: tuple = ()) -> dict[str, str]:
    """What a step may save, each name to 'metric' or 'tensor': its intervention's metrics, its outputs, and
    `<model>.generated` for each model read from when the intervention decodes (SPEC.md M19). With several
    interventions each is also `<intervention>/<name>`, the bare name only where it is unambiguous (SPEC.md M12)."""
    per = {}
    for n in names:
        intervention = interventions[n]
        reads = dict(intervention.reads)
        mine = {m: "metric" for m, _ in intervention.metrics}
        if intervention.decode:
            mine |= {f"{read.model}.generated": "tensor" for read in reads.values()}
        mine |= {o: "tensor" for o, output in outputs if output.read in reads}
        per[n] = mine
    if len(names) == 1:
        return per[names[0]]
    bare = [k for n in names for k in per[n]]
    return ({f"{n}/{k}": v for n in names for k, v in per[n].items()}
            | {k: v for n in names for k, v in per[n].items() if bare.count(k) == 1})


def observe_step(raw: Any, path: str, interventions: dict, roles: tuple) -> Observe:
    """An observe step: its rows, the interventions it runs, the outputs it publishes and its saves."""
    strict_object(raw, path, ("kind", "rows", "interventions", "intervention", "outputs", "saves"), ("kind", "rows"))
    choice(string(raw["kind"], f"{path}.kind"), f"{path}.kind", ("observe", "fit", "weights"))
    step = path.split(".", 1)[1]
    step_rows = rows(raw["rows"], f"{path}.rows", f"step '{step}'", roles)
    names = named(raw, path, step, interventions)
    reads = {r for n in names for r, _ in interventions[n].reads}
    declared_outputs = outputs.declare(raw.get("outputs", {}), f"{path}.outputs", step, reads)
    produced = produced_names(names, interventions, declared_outputs)
    step_saves = saves(raw.get("saves", []), f"{path}.saves", f"step '{step}'", sorted(produced),
                       tensors=tuple(k for k, v in produced.items() if v == "tensor"))
    child = tuple((n, _child_saves(step_saves, n, interventions, declared_outputs)) for n in names)
    return Observe(rows=step_rows, interventions=names, saves=step_saves, outputs=declared_outputs,
                   child_saves=child)


def _child_saves(step_saves: tuple, name: str, interventions: dict, declared_outputs: tuple) -> tuple:
    """The saves of one intervention's child step: what it produces (metrics, outputs, generated ids; M19),
    bare or as `<intervention>/<name>`, each as (value, file_path) with the value bare."""
    mine = produced_names((name,), interventions, declared_outputs)
    return tuple((s.value.split("/", 1)[1] if s.value.startswith(f"{name}/") else s.value, s.file_path)
                 for s in step_saves
                 if s.value in mine or (s.value.startswith(f"{name}/") and s.value.split("/", 1)[1] in mine))


def hoisted(steps: Any, declared: Any) -> tuple[Any, Any]:
    """Interventions written in place on a step, hoisted under the step's name (`<step>[<k>]` inside a list);
    returns (interventions, steps) with each object replaced by its name (SPEC.md M22)."""
    if not isinstance(steps, dict) or not isinstance(declared, dict):
        return declared, steps
    declared, steps = dict(declared), dict(steps)
    for step, raw in list(steps.items()):
        given = raw.get("interventions") if isinstance(raw, dict) else None
        items = given if isinstance(given, list) else [given]
        if not any(isinstance(x, dict) for x in items):
            continue
        names = []
        for k, item in enumerate(items):
            name = item if not isinstance(item, dict) else step if not isinstance(given, list) else f"{step}[{k}]"
            if isinstance(item, dict):
                if name in declared:
                    _fail(f"steps.{step}.interventions", f"step '{step}' writes an intervention in place, which is "
                          f"named '{name}' after its step, and `interventions` declares '{name}' already; "
                          "rename one")
                declared[name] = item
            names.append(name)
        steps[step] = {**raw, "interventions": names if isinstance(given, list) else names[0]}
    return declared, steps


# ---------------------------------------------------------------- the files of a document


def all_saves(step) -> tuple:
    """Every file a step writes: its own saves, then (a fit) its eval's."""
    return tuple(step.saves) + tuple(getattr(step, "eval_saves", ()))


def check_save_paths(steps: tuple) -> None:
    """No two saves of a document write one file, and none is a folder of another (SPEC.md D16, S44)."""
    written: dict[str, str] = {}
    saves = [(k, f"{place}.file_path", save.file_path) for k, step in steps for place, save in placed(k, step)]
    for k, path, file_path in saves:
        if file_path in written:
            _fail(path, f"'{file_path}' is already written by step '{written[file_path]}'; name another file")
        written[file_path] = k
    clash = colliding([file_path for _k, _path, file_path in saves])
    if clash is not None:
        (_k, path, mine), other = saves[clash[0]], clash[1]
        inner, outer = (mine, other) if len(mine) > len(other) else (other, mine)
        _fail(path, f"'{mine}' and '{other}' collide as paths: '{inner}' would be "
              f"written inside '{outer}', which this run writes as a file; name another file")


def placed(k: str, step) -> list:
    """(document path, save) of each file a step writes: its saves, then (a fit) its eval's at `eval.saves`."""
    return ([(f"steps.{k}.saves.{i}", save) for i, save in enumerate(step.saves)]
            + [(f"steps.{k}.eval.saves.{i}", save) for i, save in enumerate(getattr(step, "eval_saves", ()))])

"""Validation: JSON in, frozen `shapes.Document` out, or one Refusal naming the dotted path.

Hand-rolled: every object at every depth rejects unknown keys, every field is
type-checked, and the rules that need no model, no tokenizer and no data (SPEC.md
"Documents", the validation rows of "Positions: what is refused" and "Locations:
what is refused") are decided here. Sweeps are lowered before (sweeps.py), so each
point is an ordinary document; JSON text is read by reader.py. `points_of` is the one pass
a command takes before compile. What the format describes but this reference does not
implement yet (outputs, most mechanisms) is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..locations import address
from ..writes import mechanisms, outputs
from . import metrics, sweeps
from ..featurizers import kinds as featurizer_table
from .names import colliding, inside_out, one_segment
from .reader import type_name
from ..shapes import (CUTS, FRAMES, Anchor, Document, Featurizer, Fit, IntervenedModel, Intervention, Metric, Model,
                     Observe, Read, Ref, Refusal, Role, Save, Site, Weights, Where, Write)

DTYPES = ("fp32", "bf16")
ATTN = ("eager", "sdpa")
FLOAT32_MAX = 3.4028234663852886e38


# ---------------------------------------------------------------- raw JSON helpers


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


def _object(raw: Any, path: str, allowed: tuple, required: tuple = ()) -> dict:
    if not isinstance(raw, dict):
        _fail(path, f"expected an object, got {type_name(raw)}")
    for key in raw:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            _fail(where, f"unknown key '{key}'; allowed here: {sorted(allowed)}")
    for key in required:
        if key not in raw:
            where = f"{path}.{key}" if path else key
            _fail(where, "required field is missing")
    return raw


def _mapping(raw: Any, path: str, declares: bool = True) -> dict:
    """An object of named entries; when it declares names, each is one path segment (names.one_segment)."""
    if not isinstance(raw, dict):
        _fail(path, f"expected an object of named entries, got {type_name(raw)}")
    for name in raw if declares else ():
        one_segment(name, f"{path}.{name}")
    return raw


def _str(raw: Any, path: str) -> str:
    if not isinstance(raw, str):
        _fail(path, f"expected a string, got {type_name(raw)}")
    return raw


def _int(raw: Any, path: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        _fail(path, f"expected an integer, got {type_name(raw)}")
    return raw


def _choice(raw: Any, path: str, choices: tuple) -> str:
    _str(raw, path)
    if raw not in choices:
        _fail(path, f"'{raw}' is not one of {list(choices)}")
    return raw


def _index_list(raw: Any, path: str, what: str) -> tuple[int, ...]:
    message = f"{what} is a non-empty list of distinct {'head' if what == 'heads' else 'feature'} indices"
    if not isinstance(raw, list) or not raw:
        _fail(path, message)
    for k, item in enumerate(raw):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            _fail(f"{path}.{k}", message)
    if len(set(raw)) != len(raw):
        _fail(path, message)
    return tuple(raw)


# ---------------------------------------------------------------- positions


def where(raw: Any, path: str) -> Where:
    """A `pos` field: a bare integer is {"index": i}; otherwise a Where object."""
    if isinstance(raw, bool):
        _fail(path, "a position is an integer or an object, got a boolean")
    if isinstance(raw, int):
        return Where(index=raw)
    _object(raw, path, CUTS + ("scope", "frame"))
    named = [c for c in CUTS
             if c in raw and raw[c] is not None and raw[c] is not False]
    if len(named) != 1:
        _fail(path, f"a position names exactly one of index/span/last/all, got {named}")
    frame = _choice(raw.get("frame", "prompt"), f"{path}.frame", FRAMES)
    index = span = last = None
    every = False
    if "index" in named:
        index = _int(raw["index"], f"{path}.index")
    elif "last" in named:
        last = _int(raw["last"], f"{path}.last")
        if last <= 0:
            _fail(f"{path}.last", f"last {last} is not a positive number of tokens")
    elif "span" in named:
        value = raw["span"]
        if (not isinstance(value, list) or len(value) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
            _fail(f"{path}.span", "a span is [a, b], two integers")
        a, b = value
        if (a < 0) == (b < 0) and b <= a:
            _fail(f"{path}.span", f"span [{a}, {b}] is not a forward window")
        span = (a, b)
    else:
        if raw["all"] is not True:
            _fail(f"{path}.all", "all is true or absent")
        every = True
    scope = _anchor(raw["scope"], f"{path}.scope", frame) if raw.get("scope") is not None else None
    return Where(index=index, span=span, last=last, all=every, scope=scope, frame=frame)


def _anchor(raw: Any, path: str, frame: str) -> Anchor:
    """A position's scope: a variable's text, a segment of the frame, or both."""
    scope_raw = _object(raw, path, ("variable", "segment"))
    variable = scope_raw.get("variable")
    segment = scope_raw.get("segment")
    if variable is None and segment is None:
        _fail(path, "an anchor names a variable, a segment, or both")
    if variable is not None:
        _str(variable, f"{path}.variable")
    if segment is not None:
        _str(segment, f"{path}.segment")
        if segment == "eos" and frame == "prompt":
            _fail(f"{path}.segment", "segment 'eos' is a run of the generated frame, not the prompt")
        if segment != "eos" and frame == "generated":
            _fail(f"{path}.segment", f"segment '{segment}' is a run of the prompt frame, not the "
                  "generated one; the continuation has one segment, 'eos'")
    return Anchor(variable=variable, segment=segment)


def _generated_rules(pos: Where, kind: str, name: str, decode: int, path: str, prefix: str):
    """Seed-tables A9: what a read or a write may say in the continuation frame."""
    if pos.frame != "generated":
        return
    if decode <= 0:
        _fail(path, f"{prefix}{kind} '{name}': a generated position needs `decode` > 0")
    if kind == "write":  # the cut is judged before the scope, in A9's order
        if not (pos.all or (pos.index is not None and pos.index >= 0)):
            _fail(path, f"{prefix}write '{name}': a write in the continuation frame is at a step the decode "
                        "has reached — {'index': k} with k >= 0, or {'all': true}. "
                        f"{pos.spelling()} names a cut of the finished continuation, which is something to "
                        "read and not something to write into")
        if pos.scope is not None:
            _fail(path, f"{prefix}write '{name}': a write in the continuation frame takes no scope; "
                        f"{pos.spelling()} is only known once the decode has finished")
    if pos.index is not None and pos.index >= decode:
        _fail(path, f"{prefix}{kind} '{name}': step {pos.index} of a {decode}-token decode")


# ---------------------------------------------------------------- blocks


def model_block(raw: Any) -> Model:
    _object(raw, "model", ("key", "revision", "dtype", "attn_implementation"), ("key", "revision", "dtype"))
    attn = raw.get("attn_implementation")
    if attn is not None:
        _choice(attn, "model.attn_implementation", ATTN)
    return Model(key=_str(raw["key"], "model.key"), revision=_str(raw["revision"], "model.revision"),
                 dtype=_choice(raw["dtype"], "model.dtype", DTYPES), attn_implementation=attn)


def _site(raw: Any, path: str) -> Site:
    _object(raw, path, ("component", "layers", "heads", "units"), ("component",))
    component = _str(raw["component"], f"{path}.component")
    layers = heads = units = None
    if raw.get("layers") is not None:
        value = raw["layers"]
        if not isinstance(value, list) or not value:
            _fail(f"{path}.layers", "layers is a one-element list, [i]")
        if len(value) > 1:
            _fail(f"{path}.layers", "layers must be a one-element band; a band spanning several layers is "
                                     "one address and is not implemented")
        layers = (_int(value[0], f"{path}.layers.0"),)  # a layer outside the stack is refused at compile (L3)
    if raw.get("heads") is not None and raw.get("units") is not None:
        _fail(path, "a site names heads or units, not both: they slice the same axis")
    if raw.get("heads") is not None:
        heads = _index_list(raw["heads"], f"{path}.heads", "heads")
    if raw.get("units") is not None:
        units = _index_list(raw["units"], f"{path}.units", "units")
    facts = address.TABLE.get(component)
    if facts is not None:
        if facts.layered and layers is None:
            _fail(path, f"'{component}' is addressed at one layer: say which with \"layers\": [i]")
        if not facts.layered and layers is not None:
            _fail(f"{path}.layers", f"'{component}' is one per model and takes no layers")
        if heads is not None and not facts.per_head:
            _fail(f"{path}.heads", f"'{component}' is not a per-head tensor; `heads` applies at "
                                    f"{list(address.PER_HEAD)}")
    return Site(component=component, layers=layers, heads=heads, units=units)


def _read(raw: Any, path: str) -> Read:
    _object(raw, path, ("site", "pos", "input", "model", "featurizer", "view"), ("site", "pos", "input"))
    featurizer = _str(raw.get("featurizer", "identity"), f"{path}.featurizer")
    view = _choice(raw.get("view", "raw"), f"{path}.view", ("raw", "logits"))
    return Read(site=_str(raw["site"], f"{path}.site"), pos=where(raw["pos"], f"{path}.pos"),
                input=_str(raw["input"], f"{path}.input"), model=_str(raw.get("model", "original"), f"{path}.model"),
                featurizer=featurizer, view=view)


def _operand(raw: Any, path: str):
    """A write's operand: a read name, a number, {"ref": name} (an earlier step's output), or absent."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, dict):
        _object(raw, path, ("ref",), ("ref",))
        return Ref(_str(raw["ref"], f"{path}.ref"))
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        _fail(path, f"an operand is a read name, a number or {{\"ref\": …}}, got {type_name(raw)}")
    if not (abs(raw) <= FLOAT32_MAX):  # also NaN, and ints past float
        _fail(path, f"operand {raw!r:.40} is not a finite number a float32 activation can hold "
                    f"(|x| <= {FLOAT32_MAX:.6g})")
    return raw


def _write(raw: Any, path: str) -> Write:
    _object(raw, path, ("site", "pos", "mechanism", "operand", "featurizer", "features", "params"),
            ("site", "pos", "mechanism"))
    mechanism = _choice(raw["mechanism"], f"{path}.mechanism", tuple(mechanisms.TABLE))
    operand = _operand(raw.get("operand"), f"{path}.operand")
    features = None
    if raw.get("features") is not None:
        value = raw["features"]
        if not isinstance(value, list):
            _fail(f"{path}.features", f"features is a list of feature indices, got {type_name(value)}")
        features = tuple(_int(v, f"{path}.features.{k}") for k, v in enumerate(value))
    params = raw.get("params", {})
    if not isinstance(params, dict):
        _fail(f"{path}.params", f"expected an object, got {type_name(params)}")
    mechanisms.check(mechanism, operand is not None, params, path)
    featurizer = _str(raw.get("featurizer", "identity"), f"{path}.featurizer")
    return Write(site=_str(raw["site"], f"{path}.site"), pos=where(raw["pos"], f"{path}.pos"),
                 mechanism=mechanism, operand=operand, featurizer=featurizer, features=features,
                 params=tuple(sorted(params.items())))


def _metric(raw: Any, path: str) -> Metric:
    _object(raw, path, ("kind",) + metrics.COLUMNS + ("of", "token_form"), ("kind",))
    kind = _choice(raw["kind"], f"{path}.kind", tuple(metrics.KINDS))
    columns = metrics.KINDS[kind].columns
    _object(raw, path, ("kind", "of", "token_form") + columns, ("kind", "of") + columns)
    _choice(raw.get("token_form", "space_prefixed"), f"{path}.token_form", ("space_prefixed",))
    return Metric(kind=kind, of=_str(raw["of"], f"{path}.of"),
                  columns=tuple((c, _str(raw[c], f"{path}.{c}")) for c in columns))


def _intervention(raw: Any, path: str, site_map: dict, roles: tuple, declared: dict) -> Intervention:
    """Parse an intervention's parts, then check how they name each other, the sites and the roles."""
    _object(raw, path, ("reads", "writes", "models", "metrics", "decode"), ("reads",))
    decode = _int(raw.get("decode", 0), f"{path}.decode")
    if decode < 0:
        _fail(f"{path}.decode", f"decode {decode} is not a number of tokens: 0 is a single forward")
    reads = tuple((k, _read(v, f"{path}.reads.{k}")) for k, v in _mapping(raw["reads"], f"{path}.reads").items())
    writes = tuple((k, _write(v, f"{path}.writes.{k}"))
                   for k, v in _mapping(raw.get("writes", {}), f"{path}.writes").items())
    models = tuple((k, _intervened_model(k, v, f"{path}.models.{k}"))
                   for k, v in _mapping(raw.get("models", {}), f"{path}.models").items())
    metrics_ = tuple((k, _metric(v, f"{path}.metrics.{k}"))
                     for k, v in _mapping(raw.get("metrics", {}), f"{path}.metrics").items())
    if not reads:
        _fail(f"{path}.reads", "an intervention reads at least one value")
    prefix = f"{path}: "
    for r, read in reads:
        _check_read(r, read, f"{path}.reads.{r}", prefix, site_map, roles, dict(models), decode, declared)
    for w, write in writes:
        _check_write(w, write, f"{path}.writes.{w}", prefix, site_map, dict(reads), decode, declared)
    for m, model in models:
        _check_model(m, model, f"{path}.models.{m}", prefix, roles, dict(writes))
    for m, metric in metrics_:
        _check_metric(m, metric, f"{path}.metrics.{m}", prefix, dict(reads))
    return Intervention(reads=reads, writes=writes, models=models, metrics=metrics_, decode=decode)


def _intervened_model(name: str, raw: Any, path: str) -> IntervenedModel:
    if name == "original":
        _fail(path, "'original' is the model with no writes, and is reserved")
    _object(raw, path, ("input", "writes"), ("input", "writes"))
    if not isinstance(raw["writes"], list):
        _fail(f"{path}.writes", f"expected a list of write names, got {type_name(raw['writes'])}")
    return IntervenedModel(input=_str(raw["input"], f"{path}.input"),
                           writes=tuple(_str(w, f"{path}.writes.{i}") for i, w in enumerate(raw["writes"])))


def _check_read(r: str, read: Read, rp: str, prefix: str, site_map: dict, roles: tuple, model_map: dict,
                decode: int, declared: dict) -> None:
    """A read names a declared site, role, model and featurizer; a model's reads take its input (SPEC.md D10)."""
    if read.site not in site_map:
        _fail(f"{rp}.site", f"{prefix}read '{r}': undeclared site '{read.site}'")
    if read.input not in roles:
        _fail(f"{rp}.input", f"{prefix}read '{r}': undeclared role '{read.input}'")
    if read.model != "original" and read.model not in model_map:
        _fail(f"{rp}.model", f"{prefix}read '{r}': model '{read.model}' is neither 'original' nor declared")
    if read.model != "original" and model_map[read.model].input != read.input:
        _fail(f"{rp}.input", f"{prefix}read '{r}': model '{read.model}' runs on '{model_map[read.model].input}', "
                             f"so its reads take input '{model_map[read.model].input}'")
    _declared_featurizer(read, "read", r, declared, f"{rp}.featurizer", prefix)
    component = site_map[read.site].component
    if read.view == "logits" and component not in address.RESIDUAL:
        _fail(f"{rp}.view", f"{prefix}read '{r}': view 'logits' projects the residual stream through the head, "
                            f"and '{component}' is not the residual stream (one of {sorted(address.RESIDUAL)})")
    _generated_rules(read.pos, "read", r, decode, f"{rp}.pos", prefix)


def _check_write(w: str, write: Write, wp: str, prefix: str, site_map: dict, read_map: dict, decode: int,
                 declared: dict) -> None:
    """A write names a declared, writable site and an operand read in the same intervention (SPEC.md D11)."""
    if write.site not in site_map:
        _fail(f"{wp}.site", f"{prefix}write '{w}': undeclared site '{write.site}'")
    component = site_map[write.site].component
    facts = address.TABLE.get(component)
    if facts is not None and facts.read_only:
        _fail(f"{wp}.site", f"{prefix}write '{w}': '{component}' is read-only — the model's input, not an "
                            "activation")
    _declared_featurizer(write, "write", w, declared, f"{wp}.featurizer", prefix)
    _generated_rules(write.pos, "write", w, decode, f"{wp}.pos", prefix)
    if not isinstance(write.operand, str):
        return
    if write.operand not in read_map:
        _fail(f"{wp}.operand", f"{prefix}write '{w}': operand '{write.operand}' is not a read of this "
                               "intervention; a value from an earlier step is {\"ref\": …}")
    operand = read_map[write.operand]
    if operand.view == "logits":
        _fail(f"{wp}.operand", f"{prefix}write '{w}': operand '{write.operand}' is a logits view, which is "
                               "vocabulary-wide and cannot be written back at a site")
    want, have = write.pos.width, operand.pos.width
    if want is not None and have is not None and want != have:
        _fail(f"{wp}.pos", f"{prefix}write '{w}' covers {want} position(s) but its operand "
                           f"'{write.operand}' was read over {have}; the windows must match")


def _check_model(m: str, model: IntervenedModel, mp: str, prefix: str, roles: tuple, write_map: dict) -> None:
    """An intervened model runs on a declared role with declared writes, each named once (SPEC.md D13)."""
    if model.input not in roles:
        _fail(f"{mp}.input", f"{prefix}model '{m}': undeclared role '{model.input}'")
    for k, w in enumerate(model.writes):
        if w not in write_map:
            _fail(f"{mp}.writes.{k}", f"{prefix}model '{m}': undeclared write '{w}'")
    if len(set(model.writes)) != len(model.writes):
        _fail(f"{mp}.writes", f"{prefix}model '{m}' names a write twice")
    _renormalize_last(m, model.writes, write_map, f"{mp}.writes", prefix)


def _check_metric(m: str, metric: Metric, mp: str, prefix: str, read_map: dict) -> None:
    """A metric scores one position per row of a read of this intervention, via 'identity' (SPEC.md D14)."""
    if metric.of not in read_map:
        _fail(f"{mp}.of", f"{prefix}metric '{m}': `of` must be a read name, got '{metric.of}'")
    if read_map[metric.of].featurizer != "identity":
        _fail(f"{mp}.of", f"{prefix}metric '{m}' reads '{metric.of}' via featurizer "
                          f"'{read_map[metric.of].featurizer}', whose features are not the vocabulary's logits; "
                          "a metric's read is via 'identity'")
    width = read_map[metric.of].pos.width
    if width != 1:
        _fail(f"{mp}.of", f"{prefix}metric '{m}' reads '{metric.of}', a window of "
                          f"{'varying' if width is None else width} positions; a metric scores one position "
                          "per row")


def featurizer(raw: Any, path: str) -> Featurizer:
    """One declared featurizer (F§7), with the validator's refusals in the reference's order."""
    _object(raw, path, ("kind", "k", "parametrization", "seed", "file_path"), ("kind",))
    kind = _choice(raw["kind"], f"{path}.kind", tuple(featurizer_table.KINDS))
    k = raw.get("k")
    if k is not None and (_int(k, f"{path}.k") <= 0):
        _fail(f"{path}.k", f"k={k} is not a positive rank")
    _choice(raw.get("parametrization", "cayley"), f"{path}.parametrization", ("cayley",))
    seed = raw.get("seed")
    if seed is not None:
        _int(seed, f"{path}.seed")
    file_path = raw.get("file_path")
    if file_path is not None:
        _str(file_path, f"{path}.file_path")
    row = featurizer_table.KINDS[kind]
    if row.k == "refused" and k is not None:
        _fail(f"{path}.k", "a gate masks every unit of its site and takes no k")
    if row.k == "required" and k is None:
        _fail(path, f"a {kind} needs k, the rank of its basis")
    if row.loaded and file_path is None:
        _fail(path, f"a {kind} featurizer is loaded from a file; nothing draws or trains one")
    if kind == "gate" and seed is not None:
        _fail(f"{path}.seed", "a gate starts at θ = 0, not from a draw; it has no seed")
    if file_path is not None and seed is not None:
        _fail(f"{path}.seed", "a loaded featurizer has no seed: its weights are its bytes")
    return Featurizer(kind=kind, k=k, seed=seed, file_path=file_path)


def _declared_featurizer(op, kind: str, name: str, declared: dict, path: str, prefix: str) -> None:
    """A read or write names 'identity' or a declared featurizer; a logits view is read via 'identity'."""
    if op.featurizer == "identity":
        return
    if op.featurizer not in declared:
        _fail(path, f"{prefix}{kind} '{name}': undeclared featurizer '{op.featurizer}'; declared: {sorted(declared)}")
    if getattr(op, "view", "raw") == "logits":
        _fail(path, f"{prefix}read '{name}': a logits view is vocabulary-wide, not the site's features; read it "
                    "via 'identity'")


def featurizer_sites(declared: dict, interventions) -> dict[str, str]:
    """Each featurizer's one site: the site of every read and write naming it, across all interventions."""
    used: dict[str, set] = {name: set() for name in declared}
    for _i, intervention in interventions:
        for _n, op in intervention.reads + intervention.writes:
            if op.featurizer in used:
                used[op.featurizer].add(op.site)
    for name, sites in used.items():
        if len(sites) != 1:
            _fail(f"featurizers.{name}", f"featurizer '{name}' is used at {sorted(sites)}; one name is one site")
    return {name: next(iter(sites)) for name, sites in used.items()}


def _renormalize_last(model: str, names: tuple, writes: dict, path: str, prefix: str) -> None:
    """A renormalize restores what the other writes at its site changed: it comes after at least one of
    them and last among them (language reference §2.6; SPEC.md M7)."""
    for k, w in enumerate(names):
        if writes[w].mechanism != "renormalize":
            continue
        site = writes[w].site
        same = [n for n in names if writes[n].site == site]
        if len(same) < 2 or same[-1] != w:
            _fail(f"{path}.{k}", f"{prefix}model '{model}': renormalize '{w}' restores the norm the other writes at "
                                 f"site '{site}' changed, so it comes after at least one of them and last among "
                                 "them; first, or alone, it is the identity")


def produced_names(names: tuple, interventions: dict, outputs: tuple = ()) -> dict[str, str]:
    """What a step may save, each name to 'metric' or 'tensor': its intervention's metrics, its outputs, and
    `<model>.generated` for each model read from when the intervention decodes (SPEC.md M19). With several
    interventions each is also `<intervention>/<name>`, the bare name only where it is unambiguous (F§10.1)."""
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


def _rows(raw: Any, path: str, who: str, roles: tuple) -> tuple[tuple[str, str], ...]:
    """A step's `rows` (`who` is "step '<s>'" or "step '<s>'.eval"): a dataset ref for every declared role."""
    rows_raw = _mapping(raw, path, declares=False)
    for role in rows_raw:
        if role not in roles:
            _fail(f"{path}.{role}", f"{who}: undeclared role '{role}'")
        _str(rows_raw[role], f"{path}.{role}")
    for role in roles:
        if role not in rows_raw:
            _fail(path, f"{who}: no rows for role '{role}'")
    return tuple(rows_raw.items())


def _named(raw: dict, path: str, step: str, interventions: dict) -> tuple[str, ...]:
    """The interventions a step runs: `interventions` or `intervention`, a name or a list; omitted when one."""
    named = raw.get("interventions", raw.get("intervention"))
    key = "interventions" if "interventions" in raw else "intervention"
    if named is None:
        if len(interventions) != 1:
            _fail(path, f"step '{step}' runs a forward and names no intervention; say which with "
                        f"`interventions` — declared: {sorted(interventions)} — or write one there in place")
        names = tuple(interventions)
    elif isinstance(named, str):
        names = (named,)
    elif isinstance(named, list) and named and all(isinstance(n, str) for n in named):
        names = tuple(named)
    else:
        _fail(f"{path}.{key}", "name an intervention, list several, or write one in place as an object")
    for n in names:
        if n not in interventions:
            _fail(f"{path}.{key}", f"step '{step}': undeclared intervention '{n}'; declared: {sorted(interventions)}")
    return names


def _saves(raw: Any, path: str, who: str, produced: list, tensors: tuple = (), what: str = "it") -> tuple:
    """A step's `saves`: each a value it produces, a metric to a .json path, a tensor to .safetensors."""
    if not isinstance(raw, list):
        _fail(path, f"expected a list of saves, got {type_name(raw)}")
    saves: list[Save] = []
    for k, s in enumerate(raw):
        sp = f"{path}.{k}"
        _object(s, sp, ("value", "file_path"), ("value", "file_path"))
        value, file_path = _str(s["value"], f"{sp}.value"), _str(s["file_path"], f"{sp}.file_path")
        if value not in produced:
            tail = f" (it produces {produced})" if what == "it" else ""
            _fail(f"{sp}.value", f"{who}: saves '{value}', which {what} does not produce{tail}")
        if value in tensors and not file_path.endswith(".safetensors"):
            _fail(f"{sp}.file_path", f"save '{value}': a tensor, not a table; give it a .safetensors path, "
                                     f"not '{file_path}'")
        if value not in tensors and not file_path.endswith(".json"):
            _fail(f"{sp}.file_path", f"save '{value}': a per-row metric table; give it a .json path, not "
                                     f"'{file_path}' (a .safetensors file would drop the example ids, eligibility "
                                     "and units)")
        inside_out(file_path, f"{sp}.file_path", "a save's file_path")
        if file_path in ("document.json", "run.json") or file_path in [x.file_path for x in saves]:
            _fail(f"{sp}.file_path", f"'{file_path}' is already written by this run; name another file")
        saves.append(Save(value=value, file_path=file_path))
    return tuple(saves)


def _step(raw: Any, path: str, interventions: dict, roles: tuple, declared: dict):
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind == "fit":
        return fit_step(raw, path, interventions, roles, declared)
    if kind == "weights":
        return weights_step(raw, path, declared)
    _object(raw, path, ("kind", "rows", "interventions", "intervention", "outputs", "saves"), ("kind", "rows"))
    kind = _str(raw["kind"], f"{path}.kind")
    _choice(kind, f"{path}.kind", ("observe", "fit", "weights"))
    step = path.split(".", 1)[1]
    rows = _rows(raw["rows"], f"{path}.rows", f"step '{step}'", roles)
    names = _named(raw, path, step, interventions)
    reads = {r for n in names for r, _ in interventions[n].reads}
    declared_outputs = outputs.declare(raw.get("outputs", {}), f"{path}.outputs", step, reads)
    produced = produced_names(names, interventions, declared_outputs)
    saves = _saves(raw.get("saves", []), f"{path}.saves", f"step '{step}'", sorted(produced),
                   tensors=tuple(k for k, v in produced.items() if v == "tensor"))
    return Observe(rows=rows, interventions=names, saves=saves, outputs=declared_outputs)


def hoisted(steps: Any, declared: Any) -> tuple[Any, Any]:
    """Interventions written in place on a step, hoisted under the step's name (`<step>[<k>]` inside a list);
    returns (interventions, steps) with each object replaced by its name (F§0; SPEC.md M22)."""
    if not isinstance(steps, dict) or not isinstance(declared, dict):
        return declared, steps
    declared, steps = dict(declared), dict(steps)
    for step, raw in list(steps.items()):
        named = raw.get("interventions") if isinstance(raw, dict) else None
        items = named if isinstance(named, list) else [named]
        if not any(isinstance(x, dict) for x in items):
            continue
        names = []
        for k, item in enumerate(items):
            name = item if not isinstance(item, dict) else step if not isinstance(named, list) else f"{step}[{k}]"
            if isinstance(item, dict):
                if name in declared:
                    _fail(f"steps.{step}.interventions", f"step '{step}' writes an intervention in place, which is "
                          f"named '{name}' after its step, and `interventions` declares '{name}' already; "
                          "rename one")
                declared[name] = item
            names.append(name)
        steps[step] = {**raw, "interventions": names if isinstance(named, list) else names[0]}
    return declared, steps


# ---------------------------------------------------------------- fit and weights steps (SPEC.md §9)

FIT_KEYS = ("kind", "rows", "interventions", "intervention", "params", "objective", "anneal", "epochs", "pairs",
            "seed", "optimizer", "early_stop", "eval", "saves")
CURVES = ["train/eval", "train/loss"]


def _number(raw: Any, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not abs(raw) <= FLOAT32_MAX:
        _fail(path, f"expected a finite number, got {type_name(raw)}")
    return float(raw)


def _positive(raw: Any, path: str, what: str) -> int:
    value = _int(raw, path)
    if value <= 0:
        _fail(path, f"{what} {value} is not a positive number")
    return value


def _optimizer(raw: Any, path: str) -> tuple[float, float]:
    _object(raw, path, ("name", "lr", "weight_decay"), ("name", "lr"))
    _choice(raw["name"], f"{path}.name", ("adamw",))
    return _number(raw["lr"], f"{path}.lr"), _number(raw.get("weight_decay", 0.0), f"{path}.weight_decay")


def _early_stop(raw: Any, path: str) -> tuple[str, str, int]:
    _object(raw, path, ("metric", "mode", "patience"), ("metric", "patience"))
    return (_str(raw["metric"], f"{path}.metric"), _choice(raw.get("mode", "max"), f"{path}.mode", ("max", "min")),
            _positive(raw["patience"], f"{path}.patience", "patience"))


def _objective(raw: Any, path: str) -> tuple[tuple[float, str], ...]:
    if not isinstance(raw, list) or not raw:
        _fail(path, "an objective is a non-empty list of [weight, term] pairs")
    out = []
    for k, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            _fail(f"{path}.{k}", "an objective term is [weight, term]: a number and a metric or '<gate>.mask'")
        out.append((_number(pair[0], f"{path}.{k}.0"), _str(pair[1], f"{path}.{k}.1")))
    return tuple(out)


def _anneal(raw: Any, path: str) -> tuple[tuple[str, float, float], ...]:
    out = []
    for gate, value in _mapping(raw, path).items():
        _object(value, f"{path}.{gate}", ("start", "end"), ("start", "end"))
        ends = [_number(value[e], f"{path}.{gate}.{e}") for e in ("start", "end")]
        if min(ends) <= 0:
            _fail(f"{path}.{gate}", "an anneal's start and end are temperatures above 0")
        out.append((gate, ends[0], ends[1]))
    return tuple(out)


def _trained(params: Any, path: str, step: str, declared: dict) -> tuple[str, ...]:
    if not isinstance(params, list) or not params:
        _fail(path, "params lists the featurizers this fit trains")
    names = tuple(_str(p, f"{path}.{k}") for k, p in enumerate(params))
    missing = sorted(set(names) - set(declared))
    if missing:
        _fail(path, f"step '{step}': trains {missing}, which is not a declared featurizer")
    for name in names:
        if not featurizer_table.KINDS[declared[name].kind].trainable:
            _fail(path, f"step '{step}': trains '{name}', a {declared[name].kind}, which is fixed by definition — "
                        "a pca basis can be fine-tuned as a subspace loaded from it")
    return names


def _fit_terms(step: str, path: str, metrics: list, params, declared: dict, anneal, early, objective) -> None:
    gates = sorted(p for p in params if declared[p].kind == "gate")
    extra = sorted(g for g, _s, _e in anneal if g not in gates)
    if extra:
        _fail(f"{path}.anneal", f"step '{step}': anneals {extra}; only a gate this fit trains has a temperature "
                                f"(those are {gates})")
    if early[0] not in metrics:
        _fail(f"{path}.early_stop.metric", f"step '{step}': early_stop watches '{early[0]}', not a metric")
    terms = sorted(metrics + [f"{g}.mask" for g in gates])
    for k, (_w, term) in enumerate(objective):
        if term not in terms:
            _fail(f"{path}.objective.{k}", f"step '{step}': objective names '{term}', which is neither a metric "
                                           f"nor the mask of a gate this fit trains (one of {terms})")


def fit_step(raw: dict, path: str, interventions: dict, roles: tuple, declared: dict):
    """A fit step (F§10.4; language-reference §6.1, §6.7)."""
    _object(raw, path, FIT_KEYS, ("kind", "rows", "params", "objective", "epochs", "pairs", "optimizer",
                                  "early_stop", "eval"))
    step = path.split(".", 1)[1]
    rows = _rows(raw["rows"], f"{path}.rows", f"step '{step}'", roles)
    names = _named(raw, path, step, interventions)
    if len(names) != 1:
        _fail(f"{path}.interventions", f"step '{step}': a fit trains through one intervention, not {list(names)}")
    params = _trained(raw["params"], f"{path}.params", step, declared)
    objective, anneal = _objective(raw["objective"], f"{path}.objective"), _anneal(raw.get("anneal", {}),
                                                                                   f"{path}.anneal")
    lr, decay = _optimizer(raw["optimizer"], f"{path}.optimizer")
    early = _early_stop(raw["early_stop"], f"{path}.early_stop")
    metrics = sorted(m for m, _ in interventions[names[0]].metrics)
    _fit_terms(step, path, metrics, params, declared, anneal, early, objective)
    ev = _object(raw["eval"], f"{path}.eval", ("rows", "saves"), ("rows",))
    eval_rows = _rows(ev["rows"], f"{path}.eval.rows", f"step '{step}'.eval", roles)
    eval_saves = _saves(ev.get("saves", []), f"{path}.eval.saves", f"step '{step}'.eval", metrics, what="that pass")
    saves = _saves(raw.get("saves", []), f"{path}.saves", f"step '{step}'", CURVES, tensors=tuple(CURVES))
    return Fit(rows=rows, interventions=names, params=params, objective=objective,
               epochs=_positive(raw["epochs"], f"{path}.epochs", "epochs"),
               pairs=_positive(raw["pairs"], f"{path}.pairs", "pairs"), lr=lr, early_stop=early,
               eval_rows=eval_rows, eval_saves=eval_saves, saves=saves, anneal=anneal,
               seed=_int(raw.get("seed", 0), f"{path}.seed"), weight_decay=decay)


def weights_step(raw: dict, path: str, declared: dict):
    """A weights step: publish featurizers' tensors; each save a stamped .safetensors bundle."""
    _object(raw, path, ("kind", "names", "saves"), ("kind", "names"))
    step = path.split(".", 1)[1]
    if not isinstance(raw["names"], list) or not raw["names"]:
        _fail(f"{path}.names", "names lists the featurizers this step publishes")
    names = tuple(_str(n, f"{path}.names.{k}") for k, n in enumerate(raw["names"]))
    missing = sorted(set(names) - set(declared))
    if missing:
        _fail(f"{path}.names", f"step '{step}': names {missing}, which is not a declared featurizer")
    for name in names:
        kind = declared[name].kind
        if not featurizer_table.KINDS[kind].publishable:
            _fail(f"{path}.names", f"step '{step}': '{name}' is a loaded {kind}; its tensors are the file it came "
                                   "from, and there is no fitted weight to publish")
    saves = _saves(raw.get("saves", []), f"{path}.saves", f"step '{step}'", sorted(names), tensors=names)
    return Weights(names=names, saves=saves)


def all_saves(step) -> tuple:
    """Every file a step writes: its own saves, then (a fit) its eval's."""
    return tuple(step.saves) + tuple(getattr(step, "eval_saves", ()))


def uses(step, interventions: dict) -> set[str]:
    """The featurizers a step uses: those its intervention's reads and writes name, or a weights step's names."""
    if step.kind == "weights":
        return set(step.names)
    out = set()
    for name in step.interventions:
        intervention = interventions[name]
        out |= {op.featurizer for _n, op in intervention.reads + intervention.writes}
    return out - {"identity"}


def check_order(steps, interventions: dict, declared: dict) -> None:
    """No step uses a featurizer before the fit that trains it (language-reference §6.7)."""
    for i, (name, step) in enumerate(steps):
        for used in sorted(uses(step, interventions)):
            later = next((n for n, s in steps[i + 1:] if s.kind == "fit" and used in s.params), None)
            if later is not None:
                _fail(f"steps.{name}", f"step '{name}' uses featurizer '{used}' before step '{later}' trains it, "
                                       "so it would run on the untrained parameter. Move it after the fit — or, for "
                                       "a deliberate untrained baseline, declare a second featurizer that no fit names")


def document(raw: Any) -> Document:
    """Validate one (already lowered) document."""
    _object(raw, "", ("header", "model", "roles", "sites", "featurizers", "interventions", "steps"),
            ("model", "roles", "sites", "interventions", "steps"))
    for path, wrapper in sweeps.find_wrappers(raw, ()):
        _fail(".".join(str(p) for p in path), "a sweep wrapper must be lowered before validation")
    header = _object(raw.get("header", {}), "header", ("description",))
    _str(header.get("description", ""), "header.description")  # authoring metadata: checked, not kept
    model = model_block(raw["model"])
    roles = []
    for k, v in _mapping(raw["roles"], "roles").items():
        _object(v, f"roles.{k}", ("field",), ("field",))
        roles.append((k, Role(field=_str(v["field"], f"roles.{k}.field"))))
    if not roles:
        _fail("roles", "a document declares at least one role")
    role_names = tuple(k for k, _ in roles)
    sites = tuple((k, _site(v, f"sites.{k}")) for k, v in _mapping(raw["sites"], "sites").items())
    declared = {k: featurizer(v, f"featurizers.{k}")
                for k, v in _mapping(raw.get("featurizers", {}), "featurizers").items()}
    interventions_raw, steps_raw = hoisted(raw["steps"], _mapping(raw["interventions"], "interventions"))
    if not interventions_raw:
        _fail("interventions", "a document declares at least one intervention")
    site_map = dict(sites)
    interventions = tuple((k, _intervention(v, f"interventions.{k}", site_map, role_names, declared))
                          for k, v in interventions_raw.items())
    featurizer_sites(declared, interventions)
    steps_raw = _mapping(steps_raw, "steps")
    if not steps_raw:
        _fail("steps", "a document has at least one step")
    steps = tuple((k, _step(v, f"steps.{k}", dict(interventions), role_names, declared))
                  for k, v in steps_raw.items())
    check_order(steps, dict(interventions), declared)
    outputs.check_refs(steps, dict(interventions))
    _check_save_paths(steps)
    return Document(model=model, roles=tuple(roles), sites=sites, interventions=interventions,
                    steps=steps, featurizers=tuple(declared.items()))


def _check_save_paths(steps: tuple) -> None:
    """No two saves of a document write one file, and none is a folder of another (SPEC.md D16, S44)."""
    written: dict[str, str] = {}
    saves = [(k, f"{place}.file_path", save.file_path) for k, step in steps for place, save in _placed(k, step)]
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


def _placed(k: str, step) -> list:
    """(document path, save) of each file a step writes: its saves, then (a fit) its eval's at `eval.saves`."""
    return ([(f"steps.{k}.saves.{i}", save) for i, save in enumerate(step.saves)]
            + [(f"steps.{k}.eval.saves.{i}", save) for i, save in enumerate(getattr(step, "eval_saves", ()))])


@dataclass(frozen=True)
class Point:
    """One sweep point, or the unswept document: its label (its folder under --out, "" when
    unswept), its raw JSON (what is hashed and written as document.json) and its Document."""
    label: str
    raw: Any
    document: Document


def points_of(raw: Any) -> list[Point]:
    """The one pass a document takes before compile: lower its sweeps once, validate each point once."""
    return [Point(label=label, raw=point, document=document(point)) for label, point in sweeps.points(raw)]

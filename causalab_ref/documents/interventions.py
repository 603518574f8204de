"""Interventions: one intervention's reads, writes, models and metrics, and how they name each other.

Each part is read on its own (places.py for reads and writes, `_metric` and `_intervened_model`
here), then held against the rest in the reference's order: a read names a declared site, role,
model and featurizer (SPEC.md D10); a write a declared, writable site and an operand read in the
same intervention, over the same window (D11); an intervened model a role and its own writes,
each once, a renormalize last at its site (D13, M7); a metric one position per row of a read via
'identity' (D14). What the parts are checked against travels in one `Within`.

    from causalab_ref.documents import interventions, places
    sites = {"target": places.site({"component": "block_output", "layers": [0]}, "sites.target"),
             "head": places.site({"component": "lm_head"}, "sites.head")}
    interventions.intervention(raw["interventions"]["patching"], "interventions.patching", sites,
                               ("base", "counterfactual"), declared={})
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..locations import address
from . import metrics, places
from .fields import choice, integer, mapping, positive, strict_object, string
from .reader import type_name
from ..shapes import IntervenedModel, Intervention, Metric, Read, Refusal, Write, nearest


def _fail(path: str, message: str):
    raise Refusal(message, path=path, stage="validation")


@dataclass(frozen=True)
class Within:
    """What the parts of one intervention are checked against: its dotted path, the document's sites,
    roles and declared featurizers, and the intervention's own decode length, reads, writes and models."""

    path: str
    sites: dict
    roles: tuple
    declared: dict
    decode: int
    reads: dict
    writes: dict
    models: dict

    @property
    def prefix(self) -> str:
        """How a refusal names the intervention before naming the part: `interventions.<i>: `."""
        return f"{self.path}: "


def intervention(raw: Any, path: str, sites: dict, roles: tuple, declared: dict) -> Intervention:
    """Parse an intervention's parts, then check how they name each other, the sites and the roles."""
    strict_object(raw, path, ("reads", "writes", "models", "metrics", "decode"), ("reads",))
    decode = integer(raw.get("decode", 0), f"{path}.decode")
    if decode < 0:
        _fail(f"{path}.decode", f"decode {decode} is not a number of tokens: 0 is a single forward")
    reads = tuple((k, places.read(v, f"{path}.reads.{k}"))
                  for k, v in mapping(raw["reads"], f"{path}.reads").items())
    writes = tuple((k, places.write(v, f"{path}.writes.{k}"))
                   for k, v in mapping(raw.get("writes", {}), f"{path}.writes").items())
    models = tuple((k, _intervened_model(k, v, f"{path}.models.{k}"))
                   for k, v in mapping(raw.get("models", {}), f"{path}.models").items())
    metrics_ = tuple((k, _metric(v, f"{path}.metrics.{k}"))
                     for k, v in mapping(raw.get("metrics", {}), f"{path}.metrics").items())
    if not reads:
        _fail(f"{path}.reads", "an intervention reads at least one value")
    within = Within(path=path, sites=sites, roles=roles, declared=declared, decode=decode, reads=dict(reads),
                    writes=dict(writes), models=dict(models))
    for r, read in reads:
        _check_read(r, read, within)
    for w, write in writes:
        _check_write(w, write, within)
    for m, model in models:
        _check_model(m, model, within)
    for m, metric in metrics_:
        _check_metric(m, metric, within)
    return Intervention(reads=reads, writes=writes, models=models, metrics=metrics_, decode=decode)


# ---------------------------------------------------------------- the parts

def _intervened_model(name: str, raw: Any, path: str) -> IntervenedModel:
    if name == "original":
        _fail(path, "'original' is the model with no writes, and is reserved")
    strict_object(raw, path, ("input", "writes"), ("input", "writes"))
    if not isinstance(raw["writes"], list):
        _fail(f"{path}.writes", f"expected a list of write names, got {type_name(raw['writes'])}")
    return IntervenedModel(input=string(raw["input"], f"{path}.input"),
                           writes=tuple(string(w, f"{path}.writes.{i}") for i, w in enumerate(raw["writes"])))


def _metric(raw: Any, path: str) -> Metric:
    """One metric: its kind, `of`, the fields its kind takes (columns, `against`, `k`), its token form
    (SPEC.md D14, D24-D29)."""
    strict_object(raw, path, ("kind", "of", "token_form") + metrics.FIELDS, ("kind",))
    kind = metrics.KINDS[choice(raw["kind"], f"{path}.kind", tuple(metrics.KINDS))]
    if "against" in kind.reads and "against" not in raw:
        _fail(f"{path}.against", f"a {kind.name} metric compares `of` with a reference: name it in `against`, a read "
                                 "of the vocabulary's logits in this intervention")
    strict_object(raw, path, ("kind", "of", "token_form") + kind.fields(), ("kind", "of") + kind.columns + kind.reads)
    token_form = choice(raw.get("token_form", "space_prefixed"), f"{path}.token_form", metrics.TOKEN_FORMS)
    params = {p: positive(raw.get(p, default), f"{path}.{p}", p) for p, default in kind.params}
    return Metric(kind=kind.name, of=string(raw["of"], f"{path}.of"),
                  columns=tuple((c, string(raw[c], f"{path}.{c}")) for c in kind.columns), token_form=token_form,
                  against=string(raw["against"], f"{path}.against") if "against" in kind.reads else None,
                  k=params.get("k"))


# ---------------------------------------------------------------- how they name each other


def _check_read(r: str, read: Read, within: Within) -> None:
    """A read names a declared site, role, model and featurizer; a model's reads take its input (SPEC.md D10)."""
    rp, prefix, models = f"{within.path}.reads.{r}", within.prefix, within.models
    if read.site not in within.sites:
        _fail(f"{rp}.site", f"{prefix}read '{r}': undeclared site '{read.site}'")
    if read.input not in within.roles:
        _fail(f"{rp}.input", f"{prefix}read '{r}': undeclared role '{read.input}'")
    if read.model != "original" and read.model not in models:
        _fail(f"{rp}.model", f"{prefix}read '{r}': model '{read.model}' is neither 'original' nor declared")
    if read.model != "original" and models[read.model].input != read.input:
        _fail(f"{rp}.input", f"{prefix}read '{r}': model '{read.model}' runs on '{models[read.model].input}', "
                             f"so its reads take input '{models[read.model].input}'")
    _declared_featurizer(read, "read", r, within.declared, f"{rp}.featurizer", prefix)
    component = within.sites[read.site].component
    if read.view == "logits" and component not in address.RESIDUAL:
        _fail(f"{rp}.view", f"{prefix}read '{r}': view 'logits' projects the residual stream through the head, "
                            f"and '{component}' is not the residual stream (one of {sorted(address.RESIDUAL)})")
    places.check_generated(read.pos, "read", r, within.decode, f"{rp}.pos", prefix)


def _check_write(w: str, write: Write, within: Within) -> None:
    """A write names a declared, writable site and an operand read in the same intervention (SPEC.md D11)."""
    wp, prefix = f"{within.path}.writes.{w}", within.prefix
    if write.site not in within.sites:
        _fail(f"{wp}.site", f"{prefix}write '{w}': undeclared site '{write.site}'")
    component = within.sites[write.site].component
    facts = address.TABLE.get(component)
    if facts is not None and facts.read_only:
        _fail(f"{wp}.site", f"{prefix}write '{w}': '{component}' is read-only — the model's input, not an "
                            "activation")
    _declared_featurizer(write, "write", w, within.declared, f"{wp}.featurizer", prefix)
    places.check_generated(write.pos, "write", w, within.decode, f"{wp}.pos", prefix)
    if not isinstance(write.operand, str):
        return
    if write.operand not in within.reads:
        _fail(f"{wp}.operand", f"{prefix}write '{w}': operand '{write.operand}' is not a read of this "
                               "intervention; a value from an earlier step is {\"ref\": …}")
    operand = within.reads[write.operand]
    if operand.view == "logits":
        _fail(f"{wp}.operand", f"{prefix}write '{w}': operand '{write.operand}' is a logits view, which is "
                               "vocabulary-wide and cannot be written back at a site")
    want, have = write.pos.per_row, operand.pos.per_row
    if want is not None and have is not None and want != have:
        _fail(f"{wp}.pos", f"{prefix}write '{w}' covers {want} position(s) but its operand "
                           f"'{write.operand}' was read over {have}; the windows must match")


def _check_model(m: str, model: IntervenedModel, within: Within) -> None:
    """An intervened model runs on a declared role with declared writes, each named once (SPEC.md D13)."""
    mp, prefix = f"{within.path}.models.{m}", within.prefix
    if model.input not in within.roles:
        _fail(f"{mp}.input", f"{prefix}model '{m}': undeclared role '{model.input}'")
    for k, w in enumerate(model.writes):
        if w not in within.writes:
            _fail(f"{mp}.writes.{k}", f"{prefix}model '{m}': undeclared write '{w}'")
    if len(set(model.writes)) != len(model.writes):
        _fail(f"{mp}.writes", f"{prefix}model '{m}' names a write twice")
    _renormalize_last(m, model.writes, within.writes, f"{mp}.writes", prefix)


def _check_metric(m: str, metric: Metric, within: Within) -> None:
    """A metric scores one position per row of a read of this intervention, via 'identity' (SPEC.md D14)."""
    mp, prefix, reads = f"{within.path}.metrics.{m}", within.prefix, within.reads
    if metric.of not in reads:
        _fail(f"{mp}.of", f"{prefix}metric '{m}': `of` must be a read name, got '{metric.of}'")
    if metric.against is not None and metric.against not in reads:
        _fail(f"{mp}.against", f"{prefix}metric '{m}': `against` must be a read name of this intervention, got "
                               f"'{metric.against}'{nearest(metric.against, sorted(reads))}")
    _check_metric_read(m, metric.of, "of", within)
    if metric.against is not None:
        _check_metric_read(m, metric.against, "against", within)


def _check_metric_read(m: str, name: str, field: str, within: Within) -> None:
    """A read a metric scores (`of`) or compares with (`against`): via 'identity', one position per row (P49, D25)."""
    path, prefix, read = f"{within.path}.metrics.{m}.{field}", within.prefix, within.reads[name]
    if read.featurizer != "identity":
        _fail(path, f"{prefix}metric '{m}' reads '{name}' via featurizer '{read.featurizer}', whose features are "
                    "not the vocabulary's logits; a metric's read is via 'identity'")
    per_row = read.pos.per_row
    if per_row != 1:
        _fail(path, f"{prefix}metric '{m}' reads '{name}', a window of {'varying' if per_row is None else per_row} "
                    "positions; a metric scores one position per row")


def _declared_featurizer(op, kind: str, name: str, declared: dict, path: str, prefix: str) -> None:
    """A read or write names 'identity' or a declared featurizer; a logits view is read via 'identity'."""
    if op.featurizer == "identity":
        return
    if op.featurizer not in declared:
        _fail(path, f"{prefix}{kind} '{name}': undeclared featurizer '{op.featurizer}'; declared: {sorted(declared)}")
    if getattr(op, "view", "raw") == "logits":
        _fail(path, f"{prefix}read '{name}': a logits view is vocabulary-wide, not the site's features; read it "
                    "via 'identity'")


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

"""Compile: a validated document + a weightless model + the rows on disk -> a plan (plan.py).

The plan is plain data: every site resolved to an address, every prompt tokenized into a left-padded batch,
every metric's answer column tokenized to one id per row with its column eligibility, each step's forwards in
dependency order with their taps in forward order (writes before reads at one address), each step's prompt
frame placed as the run places it (placement.check_step, P58). `explain` prints it. SPEC.md §4 (R1-R5).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from ..featurizers import bundles, fit
from . import data, layers, memory, order, placement, share
from ..positions import resolve
from ..documents import metrics, reader, sweeps, validate
from ..locations.address import check_per_head, refuse_no_width
from ..writes import outputs
from .plan import FeaturizerPlan, FitPlan, Forward, MetricPlan, ObservePlan, Plan, Tap, WeightsPlan, narrowed_width
from .plan import with_digest
from ..shapes import Address, PointDocument, Observe, Ref, Refusal, Where

# ---------------------------------------------------------------- pieces


def _batch(tok, rows: list[dict], field: str, path: str, fits=lambda texts: None):
    """Tokenize one role's prompts as a left-padded batch; conversations through the chat template. `fits`
    sees the texts first (data.refuse_long_texts: a text too long to tokenize is refused untokenized)."""
    values = [data.prompt_of(data.walk(r, field, path, k), field, path, k) for k, r in enumerate(rows)]
    chats = [data.is_conversation(v) for v in values]
    if any(chats) and not all(chats):
        raise Refusal(f"field '{field}': some rows are conversations and some are strings; a role is one or "
                      "the other", path=path, stage="compile")
    if not any(chats):
        fits(values)
        ids, mask = resolve.batch_of_texts(tok, values)
        return ids, mask, None, ""
    texts = [data.render_chat(tok, v, path) for v in values]
    fits(texts)
    ids, mask, frame = resolve.frame_of_texts(tok, texts)
    segments = tuple(resolve.segments_of(frame.texts[k], values[k]) for k in range(len(values)))
    return ids, mask, segments, frame.texts[0]


STACK_LIMIT = 256 * 2 ** 20  # bytes a continuation read may buffer


def stacked(pos: Where) -> bool:
    """A continuation cut other than a fixed decode step is read at every step and cut afterwards."""
    return pos.frame == "generated" and not (pos.index is not None and pos.index >= 0 and pos.scope is None)


def _stack(tap: Tap, decode: int, rows: int, path: str) -> Tap:
    """Mark a continuation read as stacked, refusing one that would buffer more than 256 MiB."""
    if tap.kind != "read" or not stacked(tap.pos):
        return tap
    width = tap.width
    if width is None:
        raise Refusal(f"read '{tap.name}' cuts the continuation at {tap.pos.spelling()}, which stacks every decode "
                      f"step, and '{tap.address.component}' has no fixed width to stack; read it at a decode step "
                      "{\"frame\": \"generated\", \"index\": k}", path=f"{path}.reads.{tap.name}.pos", stage="compile")
    size = rows * decode * width * 4
    if size > STACK_LIMIT:
        raise Refusal(f"read '{tap.name}' at {tap.pos.spelling()} buffers every decode step before it is cut: "
                      f"{rows} rows x {decode} steps x {width} features x 4 bytes = {size} bytes "
                      f"({size / 2 ** 20:.1f} MiB), above the 256 MiB limit. Read fewer rows per pass "
                      "(--batch-size), decode fewer tokens, or narrow the site with heads or units",
                      path=f"{path}.reads.{tap.name}.pos", stage="compile")
    return replace(tap, stacked=decode)


def _check_selection(address: Address, site, name: str) -> None:
    """Heads and units against the real counts at this address (SPEC.md §3 Locations (L15))."""
    path = f"sites.{name}"
    check_per_head(address.component, address.heads is not None, site.heads, path, "compile")
    for h in site.heads or ():
        if h >= address.heads:
            raise Refusal(f"site '{name}': head {h} of a {address.heads}-head tensor", path=f"{path}.heads",
                          stage="compile")
    if site.units is not None:
        if address.width is None:
            refuse_no_width(address.component, f"{path}.units")
        for u in site.units:
            if u >= address.width:
                raise Refusal(f"site '{name}': unit {u} of a {address.width}-wide tensor", path=f"{path}.units",
                              stage="compile")


def _check_vocabulary_wide(name: str, read, sites, addresses, metric: str, path: str) -> None:
    """A metric scores token ids, so its read holds the vocabulary's logits: lm_head or logits whole,
    or a residual-stream read with "view": "logits" (SPEC.md D20); so does the read it compares with (D26).
    `path` is the field's (`<metric>.of`, `<metric>.against`)."""
    site = sites[read.site]
    whole = site.heads is None and site.units is None
    if read.view == "logits" or (site.component in ("lm_head", "logits") and whole):
        return
    narrowed = (f" (heads {list(site.heads)})" if site.heads is not None
                else f" (units {list(site.units)})" if site.units is not None else "")
    raise Refusal(f"metric '{metric}' scores token ids, and its read '{name}' "
                  f"at {addresses[read.site].label()}{narrowed} does not hold the vocabulary's logits; read lm_head or "
                  "logits (whole), or the residual stream with \"view\": \"logits\"", path=path,
                  stage="compile")


def _positions(engine) -> Optional[int]:
    """How many positions the model has (None when its config does not say)."""
    config = engine.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def _check_prompt_fits(engine, mask, role: str, path: str) -> None:
    """A prompt longer than the model's positions is refused naming its rows and their lengths (SPEC.md S45)."""
    limit = _positions(engine)
    lengths = [sum(row) for row in mask]
    over = [(r, n) for r, n in enumerate(lengths) if limit and n > limit]
    if over:
        shown = ", ".join(f"row {r}: {n} tokens" for r, n in over[:10]) + (", ..." if len(over) > 10 else "")
        raise Refusal(f"role '{role}': {len(over)} prompt(s) longer than the model's {limit} positions ({shown}); "
                      f"shorten them to at most {limit} tokens or pick rows that fit", path=path, stage="compile")


def _check_decode_fits(engine, length: int, decode: int, path: str) -> None:
    """A decode that would run past the model's positions is refused before it starts."""
    limit = _positions(engine)
    if decode and limit and length + decode > limit:
        raise Refusal(f"decode {decode} after a {length}-token prompt runs past the model's {limit} positions; "
                      f"decode at most {max(limit - length, 0)} tokens", path=f"{path}.decode", stage="compile")


def _feature_width(tap: Tap) -> Optional[int]:
    """Features per position in the tap's feature space (a featurizer's k, or the site's width)."""
    return tap.space if tap.featurizer != "identity" else tap.width


def _check_operand_widths(forwards: list, path: str) -> None:
    """A write lands its operand's features: both sides' widths are facts before any forward."""
    taps = {t.name: t for f in forwards for t in f.taps}
    for forward in forwards:
        for tap in forward.taps:
            if tap.kind != "write" or not isinstance(tap.operand, str):
                continue
            source = taps[tap.operand]
            want, have = _feature_width(tap), _feature_width(source)
            narrowed = len(tap.features) if tap.features is not None else want
            if want is not None and have is not None and have not in (want, narrowed):
                raise Refusal(f"write '{tap.name}' lands {want} features per position at {tap.address.label()}, and "
                              f"its operand '{tap.operand}' was read with {have} at {source.address.label()}; a swap "
                              "needs the same width on both sides", path=f"{path}.writes.{tap.name}", stage="compile")


PATTERN = ("attention_scores", "attention_probs")


def _check_pattern_layouts(forwards: list, reads: dict, path: str) -> None:
    """A pattern's last axis is the padded batch's keys: a swap between two batches is only key j to
    key j when both have the same layout, so their attention masks must be equal."""
    by_pair = {(f.model, f.input): f for f in forwards}
    for forward in forwards:
        for tap in forward.taps:
            if tap.kind != "write" or tap.address.component not in PATTERN or not isinstance(tap.operand, str):
                continue
            read = reads[tap.operand]
            source = by_pair[(read.model, read.input)]
            if source.mask != forward.mask:
                raise Refusal(_pattern_layouts_differ(tap, read, source, forward), path=f"{path}.writes.{tap.name}",
                              stage="compile")


def _pattern_layouts_differ(tap: Tap, read, source: Forward, forward: Forward) -> str:
    rows: Any = [r for r, (a, b) in enumerate(zip(source.mask, forward.mask)) if a != b]
    if len(source.mask) != len(forward.mask) or len(source.mask[0]) != len(forward.mask[0]):
        rows = f"shapes {len(source.mask)}x{len(source.mask[0])} and {len(forward.mask)}x{len(forward.mask[0])}"
    return (f"write '{tap.name}' swaps the attention pattern read in '{read.model}' on '{read.input}' "
            f"into '{forward.model}' on '{forward.input}', and their attention masks differ "
            f"(rows {rows}). The last axis of a pattern is the padded batch's keys, so key slot j is "
            "the same token only when both batches have the same layout; pair rows whose prompts "
            "tokenize to the same length (documents/data/weekdays_aligned is such a table)")


def _output_shapes(step_name: str, kept: tuple, forwards: list, rows: int) -> tuple:
    """What this step's outputs will hold, as later steps' checks need it (a pca's `k` checked here)."""
    taps = {t.name: t for f in forwards for t in f.taps if t.kind == "read"}
    out = []
    for name, output in kept:
        tap = taps[output.read]
        shape = outputs.PublishedShape(step=step_name, output=output, rows=rows,
                                       per_row=None if tap.pos.ragged else tap.pos.per_row, width=_feature_width(tap))
        outputs.check_pca(step_name, name, shape, f"steps.{step_name}.outputs.{name}")
        out.append((name, shape))
    return tuple(out)


def _check_refs(step_name: str, forwards: list, shapes_of: dict, rows: int, path: str) -> None:
    """Each write whose operand is {"ref": x}: rows, pca, windows and width against the shape of what x publishes
    (M14, M16)."""
    for forward in forwards:
        for tap in forward.taps:
            if tap.kind != "write" or not isinstance(tap.operand, Ref):
                continue
            want = 1 if tap.pos.frame == "generated" else (None if tap.pos.ragged else tap.pos.per_row)
            ref_write = outputs.RefWrite(step=step_name, write=tap.name, rows=rows, per_row=want,
                                         width=_feature_width(tap))
            outputs.check_ref(ref_write, tap.operand.name, shapes_of[tap.operand.name],
                              f"{path}.writes.{tap.name}.operand")


def _stamps(doc: PointDocument, kept: tuple, forwards: list, digest: str) -> tuple:
    """Each output's `.safetensors` metadata: the bundle stamp of the read's site, `kind` output/none,
    output/mean or pca, `k`, `d` the read's width, no parametrization (SPEC.md M20)."""
    taps = {t.name: t for f in forwards for t in f.taps if t.kind == "read"}
    sites = dict(doc.sites)
    out = []
    for name, output in kept:
        tap = taps[output.read]
        kind = "pca" if output.reduce == "pca" else f"output/{output.reduce}"
        holds = bundles.Holds(kind, output.k, tap.width, parametrization="")
        stamp = bundles.stamp(doc.model, tap.site, sites[tap.site], tap.address, holds, digest)
        out.append((name, tuple(sorted(stamp.items()))))
    return tuple(out)


def _tap_sort_key(tap: Tap):
    return (tap.address.rank, 0 if tap.kind == "write" else 1)


# ---------------------------------------------------------------- the compiler


@dataclass
class Context:
    """What every step of one point's compile shares: the document, its places, its featurizers, the cache."""

    doc: PointDocument
    engine: Any
    data_root: Path
    cache: dict
    addresses: dict
    featurizers: dict  # name -> FeaturizerPlan
    digest: str = ""
    published_shapes: dict = field(default_factory=dict)  # output name -> its PublishedShape, so far (SPEC.md §8.2)
    budget: int = memory.DEFAULT_BUDGET  # --memory-budget, bytes (SPEC.md Q11)
    rows_per_pass: int = 0  # the most rows every pass so far runs at once within the budget (0: no bound)

    def bound(self, passes: list, step_name: str) -> None:
        """Fold one document step's passes into the rows per pass (refused when one row does not fit, Q12)."""
        most = memory.rows_per_pass(self.engine, passes, self.budget, f"steps.{step_name}.rows",
                                    self.cache.get("frames"))
        if most:
            self.rows_per_pass = most if not self.rows_per_pass else min(self.rows_per_pass, most)

    def rows(self, rows: tuple, path: str) -> dict[str, list]:
        """Each role's rows of a step (cached by ref); roles pair by index, so their counts must agree."""
        out = {}
        for role, ref in rows:
            if ("rows", ref) not in self.cache:
                self.cache[("rows", ref)] = data.rows_of(ref, self.data_root, f"{path}.{role}")
            out[role] = self.cache[("rows", ref)]
        counts = {role: len(r) for role, r in out.items()}
        if len(set(counts.values())) > 1:
            step = path.split(".")[1]
            raise Refusal(f"step '{step}': roles pair rows by index and these have different counts {counts}",
                          path=path, stage="compile")
        return out

    def batches(self, rows_by_role: dict, key: Any, path: str) -> dict:
        """Each role's rows tokenized as one left-padded batch (cached by `key`: a ref or a minibatch),
        each prompt within the model's positions (refused at `<path>.<role>`)."""
        roles = dict(self.doc.roles)
        out = {}
        for role, rows in rows_by_role.items():
            k = ("batch", key, role, roles[role].field)
            if k not in self.cache:
                fits = functools.partial(data.refuse_long_texts, self.engine.tokenizer, limit=_positions(self.engine),
                                         role=role, path=f"{path}.{role}")
                self.cache[k] = _batch(self.engine.tokenizer, rows, roles[role].field, f"roles.{role}.field", fits)
            out[role] = self.cache[k]
            _check_prompt_fits(self.engine, out[role][1], role, f"{path}.{role}")
        return out


@dataclass(frozen=True)
class StepRows:
    """One step's rows of each role (Context.rows) and their left-padded batches (Context.batches)."""

    by_role: dict
    batches: dict


def compile_point(point: validate.Point, engine, data_root: Path, cache: Optional[dict] = None,
                  budget: int = memory.DEFAULT_BUDGET) -> Plan:
    """One validated point's plan. `cache` keeps rows and tokenized batches across the points of a
    sweep, which share them unless the sweep moves a field or a dataset ref; `budget` bounds a pass's
    memory (memory.py)."""
    doc, raw = point.document, point.raw
    addresses: dict[str, Address] = {}
    for name, site in doc.sites:
        addresses[name] = engine.locate(site.component, site.layer, site=name)
        _check_selection(addresses[name], site, name)
    digest = point.digest
    ctx = Context(doc=doc, engine=engine, data_root=data_root, cache={} if cache is None else cache,
                  addresses=addresses, featurizers={}, digest=digest, budget=budget)
    ctx.featurizers = featurizer_plans(ctx, digest)
    steps: list = []
    for step_name, step in doc.steps:
        first = len(steps)
        if step.kind == "fit":
            steps.append(fit_plan(ctx, step_name, step))
            ctx.bound(list(steps[-1].first) + [steps[-1].evaluation], step_name)
        elif step.kind == "weights":
            steps.append(WeightsPlan(name=step_name, names=step.names,
                                     saves=tuple((s.value, s.file_path) for s in step.saves)))
        else:
            rows_by_role = ctx.rows(step.rows, f"steps.{step_name}.rows")
            rows = StepRows(rows_by_role, ctx.batches(rows_by_role, tuple(step.rows), f"steps.{step_name}.rows"))
            step_shapes: dict = {}
            for i_name in step.interventions:
                name = step_name if len(step.interventions) == 1 else f"{step_name}/{i_name}"
                steps.append(observe_plan(ctx, name, i_name, rows, dict(step.child_saves)[i_name], (step_name, step)))
                step_shapes.update(dict(steps[-1].output_shapes))
            ctx.bound(steps[first:], step_name)
            if len(step.interventions) == 1:  # a step listing several publishes to itself only (M13)
                ctx.published_shapes.update(step_shapes)
    return Plan(label=point.label, digest=digest, document_json=raw, steps=tuple(steps),
                featurizers=tuple(ctx.featurizers.values()), rows_per_pass=ctx.rows_per_pass,
                frames=ctx.cache.get("frames", {}))


def _forwards(ctx: Context, intervention, rows: StepRows, ipath: str) -> list:
    """The forwards one intervention needs over these rows, in dependency order, taps in forward order."""
    tok, roles = ctx.engine.tokenizer, dict(ctx.doc.roles)
    writes, models = dict(intervention.writes), dict(intervention.models)
    read_by: dict[tuple[str, str], list] = {}  # each forward's reads, in the document's order
    for r, read in intervention.reads:
        read_by.setdefault((read.model, read.input), []).append(("read", r, read))
    forwards = []
    for model_name, role in order.forward_order(intervention, list(read_by), ipath):
        ops = list(read_by.get((model_name, role), []))
        if model_name != "original":
            ops += [("write", w, writes[w]) for w in models[model_name].writes]
        taps = [_tap(ctx, entry, rows.by_role[role], roles[role].field, ipath) for entry in ops]
        taps = [_stack(t, intervention.decode, len(rows.by_role[role]), ipath) for t in taps]
        taps.sort(key=_tap_sort_key)
        ids, mask, segments, sample = rows.batches[role]
        _check_decode_fits(ctx.engine, len(ids[0]), intervention.decode, ipath)
        forwards.append(Forward(model=model_name, input=role, ids=ids, mask=mask, taps=tuple(taps),
                                segments=segments, sample=sample, decode=intervention.decode,
                                check=tok.decode(list(ids[0]), skip_special_tokens=False)))
    return forwards


def _metrics(ctx: Context, intervention, base_rows: list, ipath: str) -> list[MetricPlan]:
    tok, sites = ctx.engine.tokenizer, dict(ctx.doc.sites)
    reads = dict(intervention.reads)
    plans = []
    for m, metric in intervention.metrics:
        mpath = f"{ipath}.metrics.{m}"
        _check_vocabulary_wide(metric.of, reads[metric.of], sites, ctx.addresses, m, f"{mpath}.of")
        if metric.against is not None:
            _check_vocabulary_wide(metric.against, reads[metric.against], sites, ctx.addresses, m, f"{mpath}.against")
        _check_k(metric, ctx.engine.vocab_size, m, mpath, len(base_rows))
        columns = tuple(c for _, c in metric.columns)
        eligible = data.answer_eligible(base_rows, columns, m, mpath)
        answers = []
        for field_name, column in metric.columns:
            answers.append((field_name, data.answer_ids(tok, base_rows, eligible, column, f"{mpath}.{field_name}",
                                                    metric.token_form)))
        kind = metrics.KINDS[metric.kind]
        spell = functools.partial(metrics.spelled, tok.decode) if kind.listed else None
        plans.append(MetricPlan(name=m, kind=metric.kind, of=metric.of, answers=tuple(answers),
                                eligible=eligible, unit=kind.unit, estimand_version=kind.estimand_version,
                                against=metric.against, k=metric.k, spell=spell))
    return plans


#: the most [token, probability] pairs one top_k table holds, rows x k (SPEC.md D27)
MOST_PAIRS = 1_000_000


def _check_k(metric, vocabulary: int, name: str, path: str, rows: int) -> None:
    """top_k's k is at most the vocabulary: the top V of V tokens is every token; a listed kind's table holds at
    most MOST_PAIRS pairs, so its rows are bounded before any is made (SPEC.md D27)."""
    if metric.k is not None and metric.k > vocabulary:
        raise Refusal(f"metric '{name}': k {metric.k} is more than the vocabulary's {vocabulary} tokens; k counts "
                      f"top-ranked tokens, so write a k from 1 to {vocabulary}", path=f"{path}.k", stage="compile")
    if metric.k is not None and metrics.KINDS[metric.kind].listed and rows * metric.k > MOST_PAIRS:
        raise Refusal(f"metric '{name}': k {metric.k} on {rows} rows is {rows * metric.k:,} [token, probability] "
                      f"pairs, more than the {MOST_PAIRS:,} a table holds; write a smaller k or score fewer rows",
                      path=f"{path}.k", stage="compile")


def observe_plan(ctx: Context, name: str, i_name: str, rows: StepRows, saves: tuple,
                 step: Optional[tuple[str, Observe]] = None) -> ObservePlan:
    """One pass of one intervention over these rows; `step` (name, Observe) brings the step's outputs, and
    each write with a ref is checked against what earlier steps published (SPEC.md §8.2)."""
    intervention = dict(ctx.doc.interventions)[i_name]
    ipath = f"interventions.{i_name}"
    reads = dict(intervention.reads)
    base_role = "base" if "base" in rows.by_role else ctx.doc.roles[0][0]
    base_rows = rows.by_role[base_role]
    forwards = _forwards(ctx, intervention, rows, ipath)
    _check_pattern_layouts(forwards, reads, ipath)
    _check_operand_widths(forwards, ipath)
    step_name, observe = step if step is not None else (name, None)
    _check_refs(step_name, forwards, ctx.published_shapes, len(base_rows), ipath)
    kept = tuple((o, out) for o, out in (observe.outputs if observe else ()) if out.read in dict(intervention.reads))
    metric_plans = _metrics(ctx, intervention, base_rows, ipath)
    dynamic = any(tap.pos.dynamic for f in forwards for tap in f.taps)
    plan = ObservePlan(name=name, intervention=i_name, forwards=tuple(forwards), metrics=tuple(metric_plans),
                       saves=saves, example_ids=data.example_ids(base_rows), dynamic=dynamic, outputs=kept,
                       publishes=observe is None or len(observe.interventions) == 1,
                       output_shapes=_output_shapes(step_name, kept, forwards, len(base_rows)),
                       stamps=_stamps(ctx.doc, kept, forwards, ctx.digest) if kept else ())
    placement.check_step(ctx.engine, plan, ipath, ctx.cache.setdefault("frames", {}))  # P28-P31, P51
    return plan


def _tap(ctx: Context, entry: tuple[str, str, Any], rows: list, field: str, ipath: str) -> Tap:
    """One read or write of an intervention (`entry`: kind, name, the declared op) over one role's rows."""
    kind, name, op = entry
    path = f"{ipath}.{kind}s.{name}"
    site, address = dict(ctx.doc.sites)[op.site], ctx.addresses[op.site]
    groups, take = _groups(address, site)
    anchors = None
    if op.pos.scope is not None and op.pos.scope.variable is not None:
        anchors = tuple(data.anchor_text(row, field, op.pos.scope.variable, f"{path}.pos.scope.variable", k)
                        for k, row in enumerate(rows))
    width = narrowed_width(address.width, groups, take)
    space = ctx.featurizers[op.featurizer].k if op.featurizer != "identity" else width
    common = dict(name=name, site=op.site, address=address, pos=op.pos, groups=groups, take=take, anchors=anchors,
                  featurizer=op.featurizer, space=space)
    if kind == "write":
        _check_features(op.features, space, name, path)
        return Tap(kind="write", mechanism=op.mechanism, operand=op.operand, features=op.features, params=op.params,
                   **common)
    return Tap(kind="read", view=op.view, **common)


def _check_features(features, space: Optional[int], name: str, path: str) -> None:
    """`features` are distinct dimensions below the feature space's width (SPEC.md FZ24)."""
    if features is None:
        return
    if space is None or not features or len(set(features)) != len(features) or any(
            not 0 <= i < space for i in features):
        prefix = ".".join(path.split(".")[:2])
        raise Refusal(f"{prefix}: write '{name}': features {list(features)} of a {space}-dimensional feature space; "
                      f"they are distinct indices below {space}", path=f"{path}.features", stage="compile")


def _groups(address: Address, site) -> tuple[Optional[int], Optional[tuple[int, ...]]]:
    """How a site's heads or units select its features: (groups the feature axis is viewed as, those kept)."""
    if site.heads is not None:
        return address.heads, site.heads
    if site.units is not None:
        return address.width, site.units
    return None, None


def _featurizer_plan(ctx: Context, name: str, spec, digest: str) -> FeaturizerPlan:
    doc, path, site_name = ctx.doc, f"featurizers.{name}", spec.site
    site, address = dict(doc.sites)[site_name], ctx.addresses[site_name]
    d = narrowed_width(address.width, *_groups(address, site))
    if d is None:
        refuse_no_width(site.component, path)
    if spec.k is not None and spec.kind in ("subspace", "pca") and spec.k > d:
        raise Refusal(f"featurizer '{name}': k={spec.k} is not a subspace of the {d}-wide site '{site_name}'",
                      path=f"{path}.k", stage="compile")
    trainers = [s for _n, s in doc.steps if s.kind == "fit" and name in s.params]
    stamp = bundles.stamp(doc.model, site_name, site, address, bundles.Holds(spec.kind, spec.k, d), digest)
    k, seed, bundle = (d if spec.kind == "gate" else spec.k), None, None
    if spec.file_path is not None:
        tensors, metadata = bundles.read(Path(spec.file_path), f"{path}.file_path", name)
        declared = bundles.Declared(name, spec.kind, spec.k, spec.file_path, d, stamp)
        k = bundles.check(declared, tensors, metadata, f"{path}.file_path")
        bundle = bundles.encode(tensors)
    elif spec.kind == "subspace":
        seed = spec.seed if spec.seed is not None else (trainers[0].seed if trainers else 0)
    return FeaturizerPlan(name=name, kind=spec.kind, site=site_name, d=d, k=k, seed=seed, file_path=spec.file_path,
                          bundle=bundle, trained=bool(trainers), stamp=tuple(sorted(stamp.items())))


def featurizer_plans(ctx: Context, digest: str) -> dict:
    """Every declared featurizer at its one site: width, rank and seed checked, a bundle loaded and checked."""
    return {name: _featurizer_plan(ctx, name, spec, digest) for name, spec in ctx.doc.featurizers}


MAX_UPDATES = 1_000_000  # a fit's epochs x its updates per epoch (SPEC.md S49)


def _epoch(ctx: Context, step, names: tuple[str, str], e: int, epoch: list) -> tuple:
    """One epoch's updates (`names`: the fit's intervention and path), each an observe pass over its own
    minibatch, tokenized as its own batch."""
    (i_name, path), plans = names, []
    train = ctx.rows(step.rows, f"{path}.rows")
    for u, minibatch in enumerate(epoch):  # each update's row numbers
        rows = {role: [r[i] for i in minibatch] for role, r in train.items()}
        batches = ctx.batches(rows, (tuple(step.rows), minibatch), f"{path}.rows")
        plans.append(observe_plan(ctx, f"epochs[{e}][{u}]", i_name, StepRows(rows, batches), ()))
    return tuple(plans)


def _later(ctx: Context, step, names: tuple[str, str], n: int):
    """Epochs 1.. of a fit, each planned when the run reaches it on a fresh cache of the rows alone, so no
    minibatch outlives its epoch (SPEC.md S49)."""
    rows = {key: value for key, value in ctx.cache.items() if key[0] == "rows"}
    for e, epoch in enumerate(fit.epochs_of(n, step.pairs, step.seed)):
        if e:
            yield _epoch(replace(ctx, cache=dict(rows)), step, names, e, epoch)


def fit_plan(ctx: Context, step_name: str, step) -> FitPlan:
    """A fit step: its first epoch's updates planned now (every row is in one), its later epochs when the run
    reaches them, and the eval pass over the eval rows (SPEC.md FZ12, S49)."""
    path, i_name = f"steps.{step_name}", step.interventions[0]
    train, eval_rows = ctx.rows(step.rows, f"{path}.rows"), ctx.rows(step.eval_rows, f"{path}.eval.rows")
    data.disjoint(train, eval_rows, dict(step.rows) == dict(step.eval_rows), f"{path}.eval.rows")
    n = len(next(iter(train.values())))
    if step.epochs * -(-n // step.pairs) > MAX_UPDATES:
        raise Refusal(f"step '{step_name}': {step.epochs} epochs x {-(-n // step.pairs)} updates ({n} rows, "
                      f"{step.pairs} pairs each) is more than {MAX_UPDATES:,} updates; fit fewer epochs or larger "
                      "pairs", path=f"{path}.epochs", stage="compile")
    first = _epoch(ctx, step, (i_name, path), 0, next(fit.epochs_of(n, step.pairs, step.seed)))
    eval_step_rows = StepRows(eval_rows, ctx.batches(eval_rows, tuple(step.eval_rows), f"{path}.eval.rows"))
    evaluation = observe_plan(ctx, "evaluation", i_name, eval_step_rows,
                              tuple((s.value, s.file_path) for s in step.eval_saves))
    own = replace(ctx, published_shapes=dict(ctx.published_shapes))  # later steps' outputs are not this fit's to read
    return FitPlan(name=step_name, intervention=i_name, params=step.params, objective=step.objective, lr=step.lr,
                   weight_decay=step.weight_decay, anneal=step.anneal, early_stop=step.early_stop,
                   epochs=step.epochs, first=first, evaluation=evaluation,
                   saves=tuple((s.value, s.file_path) for s in step.saves),
                   later=functools.partial(_later, own, step, (i_name, path), n))


def compile_document(raw: Any, engine, data_root: Path, points: Optional[list] = None,
                     budget: int = memory.DEFAULT_BUDGET) -> Plan:
    """The root plan: one leaf per sweep point (or the document itself when unswept), and each point's
    coordinates (label -> coordinates, as the points carry them).

    `points` are the document's lowered and validated points (`validate.points_of(raw)`) when the
    caller has them already, so that each is validated once; otherwise they are made here. The
    document's own facts come first (points, the coordinates of the points the run writes, the root's
    digest where there is a root); then each point is compiled once, in order, on one cache of rows and
    batches; then the leaves are joined: folded into one plan for `layers: "all"`, the one leaf itself
    when unswept, a root over them for a sweep. Forwards that several steps compute identically are
    marked shared (share.py)."""
    if points is None or sweeps.every_layer(raw):  # layers "all" is lowered once the layer count is known (D35)
        points = validate.points_of(raw, layers=engine.num_layers)
    coordinates = {point.label if point.fold_label is None else point.fold_label: point.coordinates for point in points}
    digest = reader.digest(raw) if list(coordinates) != [""] else ""  # a root's, over its points
    cache: dict = {}  # rows and batches the points share
    leaves = [compile_point(point, engine, data_root, cache, budget) for point in points]
    if points[0].fold_label is not None:  # layers "all": each layer a point of one shared forward, folded (D34)
        plan = layers.fold(raw, digest, list(zip(points, leaves)))
    elif not digest:  # unswept: the one point is the plan
        plan = leaves[0]
    else:
        rows_per_pass = min((leaf.rows_per_pass for leaf in leaves if leaf.rows_per_pass), default=0)
        plan = Plan(label="", digest=digest, document_json=raw, points=tuple(leaves), rows_per_pass=rows_per_pass)
    return share.mark(replace(plan, coordinates=coordinates))


def compile_read(document, engine, data_root: Path, budget: int = memory.DEFAULT_BUDGET) -> Plan:
    """A read document (validate.read: as given, lowered, its points validated) compiled: a protocol or
    steps-first document's plan keeps the document as given and that format's own digest (SPEC.md PR15,
    SF15); its coordinates are its points' (PY9)."""
    plan = compile_document(document.raw, engine, data_root, list(document.points), budget=budget)
    if document.format == "plan-shaped":
        return plan
    return with_digest(plan, document.digest, document.given)

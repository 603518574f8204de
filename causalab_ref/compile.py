"""Compile: a validated document + a weightless model + the rows on disk -> a plan (plan.py).

The plan is plain data (strings, integers, tuples): every site resolved to an
address, every prompt tokenized into a left-padded batch, every metric's answer
column tokenized to one id per row with its column eligibility, the forwards of
each step in dependency order with their taps in forward order (writes before
reads at one address). `explain` prints it. SPEC.md §4 Runs (R1-R5).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from . import data, locate, reader, sweeps, validate
from .plan import Forward, MetricPlan, ObservePlan, Plan, Tap
from .shapes import Address, Document, Refusal, Where

UNITS = {
    "match": ("fraction", "match/v1"),
    "logit_diff": ("logit", "logit_diff/v1"),
    "cross_entropy": ("nat", "cross_entropy/v1"),
    "token_logit": ("logit", "token_logit/v1"),
    "token_prob": ("probability", "token_prob/v1"),
}


# ---------------------------------------------------------------- pieces


def answer_id(tok, text: str, metric: str, path: str, where: str = "") -> int:
    """space_prefixed: strip leading whitespace, prepend one space, encode without specials; one id.

    `where` names the row and column for the refusal (`row 1, column 'cf_answer'`)."""
    surface = " " + text.lstrip()
    ids = tok.encode(surface, add_special_tokens=False)
    if len(ids) != 1:
        raise Refusal(f"answer '{text}' is {len(ids)} tokens as '{surface}'; a metric column must resolve to "
                      f"exactly one token{f' ({where})' if where else ''}", path=path, stage="compile")
    return ids[0]


def _batch(tok, rows: list[dict], field: str, path: str):
    """Tokenize one role's prompts as a left-padded batch; conversations through the chat template."""
    values = [data.prompt_of(data.walk(r, field, path, k), field, path, k) for k, r in enumerate(rows)]
    chats = [data.is_conversation(v) for v in values]
    if any(chats) and not all(chats):
        raise Refusal(f"field '{field}': some rows are conversations and some are strings; a role is one or "
                      "the other", path=path, stage="compile")
    if not any(chats):
        ids, mask, _frame = locate.frame_of_texts(tok, values, char_map=False)
        return ids, mask, None, ""
    texts = [data.render_chat(tok, v, path) for v in values]
    ids, mask, frame = locate.frame_of_texts(tok, texts)
    segments = tuple(locate.segments_of(frame.texts[k], values[k]) for k in range(len(values)))
    return ids, mask, segments, frame.texts[0]


def _forward_order(intervention, needed: list[tuple[str, str]], path: str) -> list[tuple[str, str]]:
    """Forwards in dependency order: a model's writes need the forwards their operands are read in."""
    reads, writes, models = dict(intervention.reads), dict(intervention.writes), dict(intervention.models)

    def deps(pair):
        model, _role = pair
        if model == "original":
            return []
        out = []
        for w in models[model].writes:
            operand = writes[w].operand
            if isinstance(operand, str):
                r = reads[operand]
                out.append((r.model, r.input))
        return out

    order, seen, active = [], set(), set()

    def visit(pair):
        if pair in seen:
            return
        if pair in active:
            raise Refusal(f"model '{pair[0]}' needs a value read in its own forward (a cycle of operands)",
                          path=path, stage="compile")
        active.add(pair)
        for d in deps(pair):
            visit(d)
        active.discard(pair)
        seen.add(pair)
        order.append(pair)

    for pair in needed:
        visit(pair)
    return order


STACK_LIMIT = 256 * 2 ** 20  # bytes a continuation read may buffer


def stacked(pos: Where) -> bool:
    """A continuation cut other than a fixed decode step is read at every step and cut afterwards."""
    return pos.frame == "generated" and not (pos.index is not None and pos.index >= 0 and pos.scope is None)


def _stack(tap: Tap, decode: int, rows: int, path: str) -> Tap:
    """Mark a continuation read as stacked, refusing one that would buffer more than 256 MiB."""
    if tap.kind != "read" or not stacked(tap.pos):
        return tap
    width = _tap_width(tap)
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
    if site.heads is not None and address.heads is None:
        from .address import PER_HEAD
        raise Refusal(f"'{address.component}' is not a per-head tensor; `heads` applies at {list(PER_HEAD)}",
                      path=f"{path}.heads", stage="compile")
    for h in site.heads or ():
        if h >= address.heads:
            raise Refusal(f"site '{name}': head {h} of a {address.heads}-head tensor", path=f"{path}.heads",
                          stage="compile")
    if site.units is not None:
        if address.width is None:
            raise Refusal(f"the width of '{address.component}' is not a fact about the model: it depends on the "
                          "batch (the attention pattern's key axis) or is not a tensor's", path=f"{path}.units",
                          stage="compile")
        for u in site.units:
            if u >= address.width:
                raise Refusal(f"site '{name}': unit {u} of a {address.width}-wide tensor", path=f"{path}.units",
                              stage="compile")


def _check_vocabulary_wide(name: str, read, sites, addresses, metric: str, path: str) -> None:
    """A metric scores token ids, so its read holds the vocabulary's logits: lm_head or logits whole,
    or a residual-stream read with "view": "logits" (SPEC.md D20)."""
    site = sites[read.site]
    whole = site.heads is None and site.units is None
    if read.view == "logits" or (site.component in ("lm_head", "logits") and whole):
        return
    narrowed = (f" (heads {list(site.heads)})" if site.heads is not None
                else f" (units {list(site.units)})" if site.units is not None else "")
    raise Refusal(f"metric '{metric}' scores token ids, and its read '{name}' "
                  f"at {addresses[read.site].label()}{narrowed} does not hold the vocabulary's logits; read lm_head or logits "
                  "(whole), or the residual stream with \"view\": \"logits\"", path=f"{path}.of", stage="compile")


def _check_decode_fits(engine, length: int, decode: int, path: str) -> None:
    """A decode that would run past the model's positions is refused before it starts."""
    config = engine.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if decode and limit and length + decode > limit:
        raise Refusal(f"decode {decode} after a {length}-token prompt runs past the model's {limit} positions; "
                      f"decode at most {max(limit - length, 0)} tokens", path=f"{path}.decode", stage="compile")


def _tap_width(tap: Tap) -> Optional[int]:
    """Features per position a tap touches: the address's width, narrowed by heads or units."""
    width = tap.address.width
    if width is None or tap.groups is None:
        return width
    return width // tap.groups * len(tap.take)


def _check_operand_widths(forwards: list, reads: dict, path: str) -> None:
    """A write lands its operand's features: both sides' widths are facts before any forward."""
    taps = {t.name: t for f in forwards for t in f.taps}
    for forward in forwards:
        for tap in forward.taps:
            if tap.kind != "write" or not isinstance(tap.operand, str):
                continue
            source = taps[tap.operand]
            want, have = _tap_width(tap), _tap_width(source)
            if want is not None and have is not None and want != have:
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
                rows = [r for r, (a, b) in enumerate(zip(source.mask, forward.mask)) if a != b]
                if len(source.mask) != len(forward.mask) or len(source.mask[0]) != len(forward.mask[0]):
                    rows = f"shapes {len(source.mask)}x{len(source.mask[0])} and {len(forward.mask)}x{len(forward.mask[0])}"
                raise Refusal(f"write '{tap.name}' swaps the attention pattern read in '{read.model}' on '{read.input}' "
                              f"into '{forward.model}' on '{forward.input}', and their attention masks differ "
                              f"(rows {rows}). The last axis of a pattern is the padded batch's keys, so key slot j is "
                              "the same token only when both batches have the same layout; pair rows whose prompts "
                              "tokenize to the same length (documents/data/weekdays_aligned is such a table)",
                              path=f"{path}.writes.{tap.name}", stage="compile")


def _tap_sort_key(tap: Tap):
    return (tap.address.rank, 0 if tap.kind == "write" else 1)


# ---------------------------------------------------------------- the compiler


def compile_point(raw: Any, label: str, engine, data_root: Path, cache: Optional[dict] = None) -> Plan:
    """One point's plan. `cache` keeps rows and tokenized batches across the points of a sweep,
    which share them unless the sweep moves a field or a dataset ref."""
    cache = {} if cache is None else cache
    doc: Document = validate.document(raw)
    tok = engine.tokenizer
    sites = dict(doc.sites)
    roles = dict(doc.roles)
    addresses: dict[str, Address] = {}
    for name, site in doc.sites:
        addresses[name] = engine.locate(site.component, site.layer, site=name)
        _check_selection(addresses[name], site, name)

    steps = []
    for step_name, step in doc.steps:
        rows_by_role = {}
        for role, ref in step.rows:
            if ("rows", ref) not in cache:
                cache[("rows", ref)] = data.rows_of(ref, data_root, f"steps.{step_name}.rows.{role}")
            rows_by_role[role] = cache[("rows", ref)]
        counts = {role: len(rows) for role, rows in rows_by_role.items()}
        if len(set(counts.values())) > 1:
            raise Refusal(f"step '{step_name}': roles pair rows by index and these have different counts {counts}",
                          path=f"steps.{step_name}.rows", stage="compile")
        base_role = "base" if "base" in rows_by_role else doc.roles[0][0]
        base_rows = rows_by_role[base_role]
        batches = {}
        for role, ref in step.rows:
            key = ("batch", ref, roles[role].field)
            if key not in cache:
                cache[key] = _batch(tok, rows_by_role[role], roles[role].field, f"roles.{role}.field")
            batches[role] = cache[key]
        for i_name in step.interventions:
            intervention = dict(doc.interventions)[i_name]
            ipath = f"interventions.{i_name}"
            reads, writes, models = dict(intervention.reads), dict(intervention.writes), dict(intervention.models)
            needed = []
            for r, read in intervention.reads:
                if (read.model, read.input) not in needed:
                    needed.append((read.model, read.input))
            forwards = []
            for model_name, role in _forward_order(intervention, needed, ipath):
                taps = []
                for r, read in intervention.reads:
                    if (read.model, read.input) == (model_name, role):
                        taps.append(_tap("read", r, read, sites, addresses, rows_by_role[role], roles[role].field,
                                         f"{ipath}.reads.{r}"))
                if model_name != "original":
                    for w in models[model_name].writes:
                        taps.append(_tap("write", w, writes[w], sites, addresses, rows_by_role[role],
                                         roles[role].field, f"{ipath}.writes.{w}"))
                taps = [_stack(t, intervention.decode, len(rows_by_role[role]), ipath) for t in taps]
                taps.sort(key=_tap_sort_key)
                ids, mask, segments, sample = batches[role]
                _check_decode_fits(engine, len(ids[0]), intervention.decode, ipath)
                forwards.append(Forward(model=model_name, input=role, ids=ids, mask=mask, taps=tuple(taps),
                                        segments=segments, sample=sample, decode=intervention.decode,
                                        check=tok.decode(list(ids[0]), skip_special_tokens=False)))
            _check_pattern_layouts(forwards, reads, ipath)
            _check_operand_widths(forwards, reads, ipath)
            metrics = []
            for m, metric in intervention.metrics:
                mpath = f"{ipath}.metrics.{m}"
                _check_vocabulary_wide(metric.of, reads[metric.of], sites, addresses, m, mpath)
                columns = tuple(c for _, c in metric.columns)
                eligible = data.answer_eligible(base_rows, columns, m, mpath)
                answers = []
                for field_name, column in metric.columns:
                    per_row = tuple(answer_id(tok, row[column], m, f"{mpath}.{field_name}",
                                              f"row {r}, column '{column}'") if ok else None
                                    for r, (row, ok) in enumerate(zip(base_rows, eligible)))
                    answers.append((field_name, per_row))
                unit, version = UNITS[metric.kind]
                metrics.append(MetricPlan(name=m, kind=metric.kind, of=metric.of, answers=tuple(answers),
                                          eligible=eligible, unit=unit, estimand_version=version))
            dynamic = any(tap.pos.dynamic for f in forwards for tap in f.taps)
            name = step_name if len(step.interventions) == 1 else f"{step_name}/{i_name}"
            mine = dict(intervention.metrics)
            saves = tuple((s.value.split("/", 1)[1] if s.value.startswith(f"{i_name}/") else s.value, s.file_path)
                          for s in step.saves
                          if s.value in mine or (s.value.startswith(f"{i_name}/") and s.value.split("/", 1)[1] in mine))
            steps.append(ObservePlan(name=name, intervention=i_name, forwards=tuple(forwards),
                                     metrics=tuple(metrics), saves=saves, example_ids=data.example_ids(base_rows),
                                     dynamic=dynamic, decode=intervention.decode))
    return Plan(label=label, digest=reader.digest(raw), raw=raw, steps=tuple(steps))


def _tap(kind, name, op, sites, addresses, rows, field, path) -> Tap:
    site = sites[op.site]
    address = addresses[op.site]
    groups = take = None
    if site.heads is not None:
        groups, take = address.heads, site.heads
    elif site.units is not None:
        groups, take = address.width, site.units
    anchors = None
    if op.pos.scope is not None and op.pos.scope.variable is not None:
        anchors = tuple(data.anchor_text(row, field, op.pos.scope.variable, f"{path}.pos.scope.variable", k)
                        for k, row in enumerate(rows))
    if kind == "write":
        return Tap(kind="write", name=name, site=op.site, address=address, pos=op.pos, groups=groups, take=take,
                   mechanism=op.mechanism, operand=op.operand, anchors=anchors)
    return Tap(kind="read", name=name, site=op.site, address=address, pos=op.pos, groups=groups, take=take,
               anchors=anchors, view=op.view)


def compile_document(raw: Any, engine, data_root: Path) -> Plan:
    """The root plan: one leaf per sweep point (or the document itself when unswept)."""
    pts = sweeps.points(raw)
    if len(pts) == 1 and pts[0][0] == "":
        return compile_point(raw, "", engine, data_root)
    cache: dict = {}
    leaves = tuple(compile_point(point, label, engine, data_root, cache) for label, point in pts)
    return Plan(label="", digest=reader.digest(raw), raw=raw, points=leaves)

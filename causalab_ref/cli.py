"""The command line: `python -m causalab_ref <verb>` (or `causalab-ref <verb>`).

Verbs that need no weights: vocab, data, tokens, model, validate, explain; `run`
loads weights and is the only verb that writes files. A refusal prints one line,
`<stage>: <path>: <message>`, on stderr and exits 2; nothing else is written.
Status 1 is kept for the project's own failures. SPEC.md §4 Runs (R17-R19) and §6 Conformance.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

from .interrupts import Interrupts
from .shapes import Refusal, printable

DEFAULT_DATA_ROOT = "documents/data"
DEVICE_MAP_HELP = "where the model runs: cpu (default), cuda, cuda:N or auto (transformers' device_map)"
ENGINES = ("nnterp", "hooks", "ndif")  # engines/loading.ENGINES, named here so argparse imports no torch


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, status 2
        print(printable(f"usage: {message}"), file=sys.stderr)  # argparse quotes no argument it names (S76)
        raise SystemExit(2)


BUDGET_HELP = ("the bytes one pass may hold (a number, or with KiB, MiB, GiB; default 1GiB): rows are split into "
               "passes that fit, unless --batch-size says how many")


def _compile(document: str, data_root: str, memory_budget=None, engine: str = "nnterp", weights: bool = False,
             device_map: str = "cpu"):
    """The one pass down (api.read, then api.compiled): read -> lower (a protocol or steps-first document to the
    plan-shaped one it means) -> validate (each point once) -> load the model -> compile. A protocol
    document's plan keeps the document as given and the protocol's digest (SPEC.md PR15, PR16)."""
    from . import api
    from .runs import memory
    memory.parse_budget(memory_budget)  # refused before the document is read
    read = api.read(document)  # refusals up to here import no torch (Q17)
    return api.compiled(read, data_root, memory_budget, engine=engine, weights=weights, device_map=device_map)


def cmd_validate(args):
    compiled = _compile(args.document, args.data_root, args.memory_budget, args.engine, device_map=args.device_map)
    steps = sum(len(leaf.steps) for leaf in compiled.plan.leaves())
    format_name = compiled.document.format
    text = f"ok: {args.document} is a valid {format_name} document, {steps} step{'s' if steps != 1 else ''}"
    return {"text": text, "ok": True, "format": format_name}


def cmd_explain(args):
    return _compile(args.document, args.data_root, args.memory_budget, args.engine,
                    device_map=args.device_map).explain()


def cmd_run(args):
    from . import api
    from .runs import results, run
    if args.batch_size is not None and args.batch_size <= 0:
        raise Refusal(f"--batch-size {args.batch_size} is not a number of rows", path="--batch-size",
                      stage="validation")
    results.check_out(Path(args.out), args.replace)  # before any weights load; judged again once claimed
    compiled = _compile(args.document, args.data_root, args.memory_budget, args.engine, weights=True,
                        device_map=args.device_map)
    with api.own_paths(compiled.document):  # the run's refusals name the document's own paths too
        written = run.into_folder(Path(args.out), args.replace, compiled.plan, lambda: run.compute(
            compiled.plan, compiled.model, args.batch_size, not args.quiet))
    _note_untested()  # once the results are in place: never before a refusal (R24)
    lines = list(written)
    for path in written:
        summary = summary_line(Path(path))
        if summary:
            lines.append(summary)
    points = [p.as_json() for p in run.leaf_points(compiled.plan)]
    return {"text": "\n".join(lines), "written": written, "points": points}


#: how many of a table's values the run's summary line shows (SPEC.md S19)
SHOWN = 5


def summary_line(path: Path) -> str:
    """One line per written metric table: the mean over scored rows, their count, why the others were not
    scored, and its first values; one line per tensor file: each tensor's shape and dtype (SPEC.md S19)."""
    if path.suffix == ".safetensors":
        return f"{path}: {tensors_line(path)}"
    if path.name in ("document.json", "run.json") or path.suffix != ".json":
        return ""
    rows = json.loads(path.read_text(encoding="utf-8"))
    values = [r["value"] for r in rows]
    scored = [v for v in values if v is not None]
    unscored = _unscored(rows)
    if not scored:
        return f"{path}: no row scored{f' ({unscored})' if unscored else ''}"
    why = f"; not scored: {unscored}" if unscored else ""
    if any(isinstance(v, list) for v in scored):  # a listed kind (top_k): its first row, no mean (SPEC.md D28)
        return (f"{path}: {rows[0]['metric']} {len(scored)} of {len(rows)} rows scored ({rows[0]['unit']}){why}; "
                "first [" + ", ".join(f"{t} {p:.6g}" for t, p in scored[0][:SHOWN]) + "]")
    shown = ", ".join("null" if v is None else f"{v:.6g}" for v in values[:SHOWN])
    more = f", ... {len(values) - SHOWN} more" if len(values) > SHOWN else ""
    return (f"{path}: {rows[0]['metric']} mean {sum(scored) / len(scored):.6g} over {len(scored)} of "
            f"{len(rows)} rows ({rows[0]['unit']}){why}; rows [{shown}{more}]")


def _unscored(rows: list[dict]) -> str:
    """The rows with no value counted by their reason (`2 alignment_missing, 1 column-ineligible`): a
    position's reason where the read was not placed, else the answer columns' half (SPEC.md P30)."""
    counts: dict[str, int] = {}
    for row in rows:
        if row["value"] is None:
            reason = row.get("reason") or "column-ineligible"
            counts[reason] = counts.get(reason, 0) + 1
    return ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def tensors_line(path: Path) -> str:
    """A safetensors file's tensors as `name (d0, d1) float32, ...`, read from its header alone (no torch)."""
    try:
        with path.open("rb") as file:
            size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(size)) if 0 < size <= 100_000_000 else None
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, or nested past the reader
        header = None
    if not isinstance(header, dict):
        return "not a safetensors file"
    dtypes = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
              "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
    tensors = [f"{name} {tuple(t['shape'])} {dtypes.get(t['dtype'], t['dtype'])}".replace(",)", ")")
               for name, t in sorted(header.items()) if name != "__metadata__" and isinstance(t, dict)]
    return ", ".join(tensors) if tensors else "no tensors"


def cmd_vocab(args):
    from .locations import address
    from .writes import mechanisms
    from .documents import metrics
    lines = ["components:"]
    for name, row in address.describe().items():
        accessor = "interior" if row["interior"] else f"nnterp {row['accessor']}"
        marks = ("  [heads]" if row["per_head"] else "") + ("  needs eager attention" if row["eager"] else "") \
            + ("  (read-only)" if row["read_only"] else "")
        lines.append(f"  {name:22s} {accessor}{marks}")
    lines += [
        "mechanisms:       " + ", ".join(mechanisms.describe().values()),
        "metric kinds:     " + ", ".join(kind.signature() for kind in metrics.KINDS.values()),
        "token forms:      " + ", ".join(metrics.TOKEN_FORMS) + " (an answer column's spelling; the first the default)",
        "position forms:   exactly one cut: index=int, span=tuple[int, int], last=int, all=bool",
        "                  scope: variable=str, segment=str",
        "                  frame: Literal['prompt', 'generated']; a bare integer is {\"index\": i}; "
        "-1 is the last token",
    ]
    return {"text": "\n".join(lines), "components": address.describe(), "mechanisms": mechanisms.describe()}


def cmd_data(args):
    from .runs import data
    rows = data.rows_of(args.ref, Path(args.data_root), "ref")
    columns = sorted({c for r in rows for c in r})
    splits = sorted({str(r["split"]) for r in rows if "split" in r})
    lines = [f"{args.ref}: {len(rows)} rows", f"  columns: {', '.join(columns)}"]
    empty = {c: sum(1 for r in rows if r.get(c) in (None, "") or (isinstance(r.get(c), str) and not r[c].strip()))
             for c in columns}
    for c, n in empty.items():
        if n:
            lines.append(f"  empty:   {c} ({n} rows)")
    lines.append(f"  splits:  {', '.join(splits)}")
    sample = json.dumps(dict(sorted(rows[0].items())), ensure_ascii=False)
    lines.append(f"  sample:  {sample}")
    return {"text": "\n".join(lines), "ref": args.ref, "rows": len(rows), "columns": columns, "splits": splits,
            "sample": rows[0]}


def _document_tokens(args):
    """`tokens --document DOC`: each role's rows of the document's first observe step, as `index:'piece'`.

    The indices are the padded batch's, as the run addresses them (so `-1` is the last
    index shown and left padding shifts a shorter row's first index); the pieces are
    the content after the tokenizer's special prefix. Compiled with no weights.
    """
    from .positions import resolve
    if args.key is not None or args.texts:
        raise Refusal("tokens takes either KEY TEXT... or --document DOC, not both", path="--document",
                      stage="validation")
    compiled = _compile(args.document, args.data_root)
    eng, leaf = compiled.model, compiled.plan.leaves()[0]
    step = next((s for s in leaf.steps if s.kind == "observe"), None)  # a fit's rows run in minibatches
    if step is None:
        raise Refusal("this document has no observe step, so it has no rows to show", path="steps", stage="compile")
    by_role = {forward.input: forward for forward in reversed(step.forwards)}  # each role's first forward
    lines, out = [], {}
    roles = compiled.document.points[0].document.roles  # the validated point's, in the document's order
    for role in [r for r, _field in roles if r in by_role]:
        forward = by_role[role]
        # The run's own frame: pieces are sliced from the decoded content by the character map,
        # so ' Saturday' keeps the space a lone sentencepiece decode would drop.
        frame = resolve.frame_of_ids(eng.tokenizer, forward.ids, forward.mask, segments=forward.segments)
        lines.append(f"step '{step.name}', role '{role}': {len(forward.ids)} rows x {len(forward.ids[0])} tokens")
        shown = []
        for r in range(len(forward.ids)):
            pieces = [(j, resolve.tokens_of(frame, (j,), r)) for j in range(frame.starts[r], frame.ends[r])]
            lines.append(f"  {step.example_ids[r]}: " + " ".join(f"{j}:{piece}" for j, piece in pieces))
            shown.append({"example_id": step.example_ids[r], "ids": list(forward.ids[r]),
                          "tokens": [[j, piece] for j, piece in pieces]})
        out[role] = shown
    return {"text": "\n".join(lines), "document": args.document, "step": step.name, "roles": out}


def cmd_tokens(args):
    from .engines import loading
    from .positions import resolve
    from .shapes import Model
    if args.document is not None:
        return _document_tokens(args)
    if args.key is None or not args.texts:
        raise Refusal("tokens takes KEY TEXT... or --document DOC", path="tokens", stage="validation")
    eng = loading.load(Model(key=args.key, revision=args.revision, dtype="fp32"), kind="nnterp", weights=False)
    tok = eng.tokenizer
    lines, out = [], {}
    ids, _mask, frame = resolve.frame_of_texts(tok, list(args.texts))
    for r, text in enumerate(args.texts):
        # pieces sliced by the run's character map, so a piece keeps the space a lone decode drops
        pieces = [f"{k}:{resolve.tokens_of(frame, (k,), r)}" for k in range(frame.starts[r], frame.ends[r])]
        # the metric-column rule (space_prefixed): one space before the stripped text, no specials; it may
        # split the text otherwise than the text as given, whose pieces are the ones listed
        surface = " " + text.lstrip()
        n = len(tok.encode(surface, add_special_tokens=False))
        column = "" if n == len(pieces) else f"; as a metric column it is {surface!r}, {n} token(s)"
        unusable = "  <- not usable as a metric column" if n != 1 else ""
        lines.append(f"{text!r}  {len(pieces)} token(s){column}{unusable}")
        lines.append("  " + " ".join(pieces))
        out[text] = {"tokens": len(pieces), "column_tokens": n, "ids": list(ids[r]), "one_token": n == 1}
    return {"text": "\n".join(lines), "key": args.key, "texts": out}


def cmd_model(args):
    from .engines import loading
    from .shapes import Model
    eng = loading.load(Model(key=args.key, revision=args.revision, dtype=args.dtype,
                            attn_implementation=args.attn_implementation), kind=args.engine, weights=False,
                      device_map=args.device_map)
    if args.lands:
        return _where_each_lands(eng, args.layer)
    return {**describe_components(eng), "dtype": args.dtype, "device_map": eng.device_map}


def describe_components(eng) -> dict:
    """The `model` verb's answer: each component at each layer (the engine's `locate`), its width, its
    operation and what the engine's `detail` adds, or the reason the place is not there; the text is
    formatted here from those answers, one line per place under a line about the model."""
    from .engines import contract
    from .locations import address
    answers: dict[str, dict] = {}
    for component, row in address.TABLE.items():
        for layer in (range(eng.num_layers) if row.layered else [None]):
            label = component if layer is None else f"{component}[{layer}]"
            try:
                a = eng.locate(component, layer)
            except Refusal as refusal:
                answers[label] = {"resolves": False, "why": refusal.message}
                continue
            answers[label] = {"resolves": True, "width": a.width, "op": a.op, **eng.detail(a)}
    tok, heads = eng.tokenizer, contract.attention_heads(eng)  # SPEC.md L35
    lines = [f"{eng.spec.key} via {eng.name}: {eng.num_layers} layers, padding_side={tok.padding_side}, "
             f"{eng.attention()} attention", *contract.heads_lines(heads), *_component_lines(answers)]
    return {"text": "\n".join(lines), "key": eng.spec.key, "engine": eng.name, "num_layers": eng.num_layers,
            "padding_side": tok.padding_side, "attention": heads, "components": answers}


def _component_lines(answers: dict) -> list[str]:
    """A line per place that resolves; a refusal once per component and text, with the layers it applies to
    (`mlp_activation[0-9]  --  ...`), where its first layer's line would be; a text that names its own layer
    (`layer 3 is a post-norm block`) is one text for every layer, printed as its first layer's (SPEC.md L25)."""
    import re

    def key_of(label: str, why: str) -> tuple[str, str]:
        component, _, layer = label.partition("[")
        return component, re.sub(rf"\blayer {layer[:-1]}\b", "layer <i>", why) if layer else why

    refused: dict[tuple[str, str], list[int]] = {}
    for label, a in answers.items():
        if not a["resolves"]:
            layer = label.partition("[")[2]
            refused.setdefault(key_of(label, a["why"]), []).append(int(layer[:-1]) if layer else -1)
    lines, done = [], set()
    for label, a in answers.items():
        if a["resolves"]:
            lines.append(_component_line(label, a))
            continue
        key = key_of(label, a["why"])
        if key not in done:
            done.add(key)
            layers = refused[key]
            lines.append(_component_line(key[0] if layers == [-1] else f"{key[0]}[{_runs(layers)}]", a))
    return lines


def _runs(layers: list[int]) -> str:
    """Layer numbers as runs: [0, 1, 2, 5] -> `0-2, 5`."""
    runs: list[list[int]] = []
    for n in layers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _component_line(label: str, answer: dict) -> str:
    """One place's line: `--` and the reason, or `ok`, its width, its operation and its hook (module.side)."""
    if not answer["resolves"]:
        return f"  {label:24s} --   {answer['why']}"
    width = f"width={answer['width']}" if answer["width"] is not None else "no width (no featurizer here)"
    op = f"  op={answer['op']}" if answer["op"] else ""
    hook = f"  hook={answer['module'] or '<root>'}.{answer['io']}" if "module" in answer else ""
    return f"  {label:24s} ok   {width}{op}{hook}"


def _where_each_lands(eng, layer: int):
    """L18's "where each one lands" printout (address.where_each_lands through the engine's own
    `locate`): rank, io and module (or operation) of every name."""
    from .locations import address
    lines, out = [], {}
    for name, a in address.where_each_lands(None, layer, located_by=eng.locate):
        if isinstance(a, str):
            lines.append(f"{name:22s} --   {a}")
            out[name] = {"resolves": False, "why": a}
            continue
        place = f"op={a.op}" if a.op else f"module={a.module!r}"
        lines.append(f"{name:22s} rank={str(a.rank):10s} io={str(a.io):7s} {place}")
        out[name] = {"resolves": True, "rank": list(a.rank), "io": a.io, "module": a.module, "op": a.op}
    return {"text": "\n".join(lines), "key": eng.spec.key, "layer": layer, "lands": out}


def _note_untested() -> None:
    """`run` and `conform` say in one line on stderr, once their work is done, when the installed stack is not the
    tested one (R24)."""
    from .runs import results
    note = results.untested_note()
    if note:
        print(note, file=sys.stderr)


def _grounds(args):
    """`conform --grounds`: how many of the corpus's cases rest on each kind of ground (SPEC.md C32)."""
    from .conformance import conform as runner
    folder = Path(args.cases) if args.cases else runner.CASES
    if not runner.is_folder(folder):
        raise Refusal(f"--cases {folder} is not a folder", path="--cases", stage="validation")
    counts = runner.grounds_counts(runner.load_cases(folder))
    text = "grounds: " + ", ".join(f"{kind} {n}" for kind, n in counts.items())
    return {"text": text, "grounds": counts}


def cmd_conform(args):
    """Exit 0 when some case passed and none failed; 1 when a case failed or none passed (a line says why);
    2 for a usage error, such as a blank --impl (SPEC.md C20)."""
    from .conformance.conform import Options, UsageError, conform, listing
    if args.grounds:
        return _grounds(args)
    if args.list:  # what --cases and --only select, nothing run (C40)
        try:
            return listing(Options(cases_dir=args.cases, only=args.only))
        except UsageError as error:
            print(f"usage: conform: {error}", file=sys.stderr)
            raise SystemExit(2) from None
    options = Options(cases_dir=args.cases, only=args.only, fixtures_dir=args.fixtures, fail_fast=args.fail_fast,
                      record=args.record, quiet=args.quiet,
                      **{k: v for k in ("timeout", "jobs") if (v := vars(args)[k]) is not None})
    try:
        result = conform(args.impl, options, main=main)
    except UsageError as error:
        print(f"usage: conform: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    _note_untested()  # once the cases are checked, before the last line's why: never with a usage line (R24)
    if not result["ok"]:
        print(result["summary"])
        if result["why"]:
            print(result["why"], file=sys.stderr)
        raise SystemExit(1)
    return {"text": result["summary"], **result}


def _seconds(text: str) -> float:
    """--timeout: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"--timeout {text!r} is not a positive number of seconds")
    return value


def cmd_fixtures(args):
    """`fixtures export DIR`: each fixture as an ordinary checkpoint folder, and DIR/manifest.json (X15)."""
    from .fixtures import exported
    done = exported.export(Path(args.dir), keys=args.key or None)
    lines = [f"{key} -> {folder} ({'reused' if reused else 'exported'})" for key, folder, reused in done]
    lines.append(f"manifest: {Path(args.dir) / exported.MANIFEST}")
    return {"text": "\n".join(lines), "manifest": str(Path(args.dir) / exported.MANIFEST),
            "folders": {key: str(folder) for key, folder, _reused in done}}


def cmd_plot(args):
    """`plot OUT [--out FILE]`: a run's results folder drawn as a figure (SPEC.md §14)."""
    from .figures import plot
    from .runs.plan import plan_json
    folder = Path(args.folder)
    plot.target_of(folder, Path(args.out) if args.out else None, args.replace)  # refused before anything compiles
    plot.check_folder(folder)
    compiled = _compile(str(folder / "document.json"), args.data_root)  # where each swept position lands
    written = plot.draw(folder, Path(args.out) if args.out else None, replace=args.replace,
                        plan=plan_json(compiled.plan, compiled.model))
    return {"text": f"figure: {written}", "figure": str(written)}


def cmd_table(args):
    """`table FOLDER`: one run folder's metric rows across its points as one table, coordinates as columns
    (SPEC.md §16): tab-separated text, CSV with --csv, records with --json."""
    from . import api
    points, tables = api.read_folder(args.folder)
    metrics = list(dict.fromkeys(row.get("metric") for _label, _file, rows in tables for row in rows))
    if args.metric is not None and args.metric not in metrics:
        raise Refusal(f"no metric '{args.metric}' in {args.folder}; it has {', '.join(map(str, metrics)) or 'none'}",
                      path="--metric", stage="table")
    rows, columns = api.tidy(points, tables, args.metric), api.columns_of(points, tables)
    text = api.as_csv(rows, columns) if args.csv else "\n".join(
        "\t".join(_cell(row.get(c)) for c in columns) for row in [dict(zip(columns, columns)), *rows])
    return {"text": text, "columns": columns, "rows": rows, "points": [p.as_json() for p in points]}


def _cell(value) -> str:
    """A tab-separated cell: a string as it is (its tabs and newlines escaped), anything else as JSON."""
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return json.dumps(value, separators=(",", ":"))


def cmd_schema(args):
    from .documents.schema import schema
    return {"text": json.dumps(schema(), indent=1), "schema": schema()}


def _verb(verbs, name: str, func, help_text: str) -> argparse.ArgumentParser:
    p = verbs.add_parser(name, help=help_text)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    p.set_defaults(func=func)
    return p


def _document_verbs(verbs) -> None:
    """validate, explain and run: a document, its data root and the engine."""
    for name, func, help_text in (("validate", cmd_validate, "check a document (compiles it, no weights)"),
                                  ("explain", cmd_explain, "print the compiled plan (no weights)"),
                                  ("run", cmd_run, "run a document and write its results")):
        p = _verb(verbs, name, func, help_text)
        p.add_argument("document")
        p.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
        p.add_argument("--engine", choices=ENGINES, default="nnterp")
        p.add_argument("--device-map", default="cpu", help=DEVICE_MAP_HELP)
        p.add_argument("--memory-budget", default=None, help=BUDGET_HELP)
        if name == "run":
            p.add_argument("--out", default="out")
            p.add_argument("--replace", action="store_true", help="replace an existing --out folder")
            p.add_argument("--batch-size", type=int, default=None)
            p.add_argument("--quiet", action="store_true", help="no progress bar")


def _inspection_verbs(verbs) -> None:
    """vocab, data, tokens and model: what the language, a dataset, a tokenizer and a checkpoint hold."""
    _verb(verbs, "vocab", cmd_vocab, "the component table and the position forms")
    p = _verb(verbs, "data", cmd_data, "a dataset's rows, columns, splits and a sample")
    p.add_argument("ref")
    p.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
    p = _verb(verbs, "tokens", cmd_tokens, "texts (KEY TEXT...) or a document's rows (--document DOC) as the "
              "model's tokenizer splits them, with indices")
    p.add_argument("key", nargs="?")
    p.add_argument("texts", nargs="*")
    p.add_argument("--document", default=None, help="show each role's rows of the document's first observe step")
    p.add_argument("--data-root", default=DEFAULT_DATA_ROOT)
    p.add_argument("--revision", default="main")
    p = _verb(verbs, "model", cmd_model, "every component at every layer of a checkpoint (no weights)")
    p.add_argument("key")
    p.add_argument("--revision", default="main")
    p.add_argument("--engine", choices=ENGINES, default="nnterp")
    p.add_argument("--attn-implementation", choices=("eager", "sdpa"), default=None)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the dtype the model would load in")
    p.add_argument("--device-map", default="cpu", help=DEVICE_MAP_HELP)
    p.add_argument("--lands", action="store_true", help="print where each component lands: rank, io, module")
    p.add_argument("--layer", type=int, default=0, help="the layer --lands asks per-layer components at")


def _corpus_verbs(verbs) -> None:
    """conform, fixtures and schema: what another implementation is checked with."""
    p = _verb(verbs, "conform", cmd_conform, "run the conformance corpus against an implementation (default: this one)")
    p.add_argument("--impl", default=None, help="the other implementation's command, e.g. \"mycli --flag\"")
    p.add_argument("--cases", default=None, help="the corpus folder (default: the corpus that ships "
                   "inside the package, causalab_ref/conformance/corpus)")
    p.add_argument("--fixtures", default=None, help="with --impl: the exported fixture folders to use (reused "
                   "when intact, exported there otherwise; default a temporary folder)")
    p.add_argument("--only", default=None,
                   help="run the cases whose name contains this (comma-separated: any of these)")
    p.add_argument("--list", action="store_true", help="print the cases --cases and --only select, and run nothing")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed case")
    p.add_argument("--record", action="store_true", help="write causalab_ref's results into the cases' expect")
    p.add_argument("--grounds", action="store_true", help="print how many cases rest on each kind of ground, and "
                   "run nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="print failed and not-applicable cases only")
    p.add_argument("--timeout", type=_seconds, default=None, help="with --impl: seconds one call of the "
                   "implementation may take before it is stopped and its case fails (default 300)")
    p.add_argument("--jobs", default=None, help="with --impl: how many cases to run at once, 1 to 256 (default: the "
                   "number of cores); the report is in the corpus's order either way")
    p = _verb(verbs, "fixtures", cmd_fixtures, "write the fixtures as ordinary checkpoint folders with a manifest")
    p.add_argument("action", choices=("export",))
    p.add_argument("dir", help="the folder to write <name>/ checkpoint folders and manifest.json into")
    p.add_argument("--key", action="append", default=None, help="export only this fixture key (repeatable)")
    _verb(verbs, "schema", cmd_schema, "the document format as a JSON Schema")
    p = _verb(verbs, "table", cmd_table, "a run's metric rows across its sweep points as one table, coordinates "
              "as columns")
    p.add_argument("folder", help="the folder a run wrote (its --out)")
    p.add_argument("--metric", default=None, help="only this metric's rows")
    p.add_argument("--csv", action="store_true", help="print CSV (a list or object cell as compact JSON)")
    p = _verb(verbs, "plot", cmd_plot, "draw a run's results folder: heatmaps over its sweep, bars, loss curves")
    p.add_argument("folder", help="the folder a run wrote (its --out)")
    p.add_argument("--out", default=None, help="the figure's file, .png or .svg (default <folder>.png beside it)")
    p.add_argument("--replace", action="store_true", help="replace an existing figure file")
    p.add_argument("--data-root", default=DEFAULT_DATA_ROOT, help="the data root the run read (positions are "
                   "resolved against its rows again)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="causalab-ref", description="A reference implementation of the intervention language.")
    parser.add_argument("--json", action="store_true", help="print the verb's result as JSON")
    parser.add_argument("--traceback", action="store_true", help="show a full traceback on an internal error")
    verbs = parser.add_subparsers(dest="verb", parser_class=_Parser)
    _document_verbs(verbs)
    _inspection_verbs(verbs)
    _corpus_verbs(verbs)
    return parser


def command_line() -> None:
    """The command line's process (`python -m causalab_ref`, `causalab-ref`): `main`'s status, its answer flushed,
    then the process ends at once. CPython's own exit would put the signals' default actions back and run
    libraries' finalisers, where a late signal ends the process with no status of the verb's (S77)."""
    try:
        status = main()
    except SystemExit as done:  # argparse's --help (0) and usage errors (2)
        status = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that stopped early, a stream already closed
            stream.flush()
    os._exit(status)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_usage(sys.stderr)
        return 2
    interrupts = Interrupts()
    previous = interrupts.install()
    try:
        try:
            result = args.func(args)
        finally:
            interrupts.late = True  # from here on a signal raises nothing (S77)
    except Refusal as refusal:  # its paths already the document's own (api.own_paths)
        print(refusal.line(), file=sys.stderr)  # one line, escaped and shortened, whatever the names hold (D4, S76)
        return 2
    except KeyboardInterrupt as interrupt:  # SIGINT, or SIGTERM (S6): the staging folder is already removed
        done = type(interrupt).__name__ == "Written"
        print("interrupted; " + ("the run had finished, and its results are in place" if done
                                 else "nothing was written"), file=sys.stderr)
        return 130
    except Exception as error:  # the project's own failure, never a document's
        if interrupts.raised:  # a library swallowed the interrupt and failed after it: it is the interrupt (S77)
            print("interrupted; nothing was written", file=sys.stderr)
            return 130
        if args.traceback:
            traceback.print_exc()
        print(f"internal error ({type(error).__name__}): {error}. This is a causalab_ref bug; "
              "--traceback shows where", file=sys.stderr)
        return 1
    else:
        try:
            print(json.dumps(result, indent=1, default=str) if args.json else result["text"])
        except BrokenPipeError:  # a reader such as `head` stopped early; the result was complete
            sys.stderr.close()
        return 0
    finally:  # called in-process, the caller's handlers are put back; the command line keeps noting to its exit
        if argv is not None:
            interrupts.restore(previous)

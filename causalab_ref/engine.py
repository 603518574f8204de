"""Engine: a checkpoint loaded as an nnterp StandardizedTransformer, and one forward of a plan.

`load` turns a document's model block into an engine (a `fixture:` key builds or
reuses a seeded fixture; any other key is a hub key and revision). The compiler asks
it for the tokenizer and for addresses (address.py) with no weights; the run asks it
for `forward`: one nnsight trace over a left-padded batch in which every tap is
issued in rank order, writes landing before reads at one address. SPEC.md §4 Runs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import torch

from . import access, address, checkpoint
from .shapes import Model, Refusal


def _mechanism(tap, current: torch.Tensor, operand) -> torch.Tensor:
    """The value a write lands, in the selection's gathered shape."""
    if tap.mechanism == "swap":
        if isinstance(operand, torch.Tensor):
            if operand.shape != current.shape:
                raise Refusal(f"write '{tap.name}' lands {tuple(current.shape)} values but its operand "
                              f"'{tap.operand}' holds {tuple(operand.shape)}; the site and the operand's site "
                              "must have the same width", path=f"writes.{tap.name}", stage="run")
            return operand.to(current.dtype)
        return torch.full_like(current, float(operand))
    raise Refusal(f"mechanism '{tap.mechanism}' is not implemented", path=f"writes.{tap.name}.mechanism",
                  stage="run")


class NNterpEngine:
    """One loaded checkpoint. `weights=False` is a meta load: config, module tree, tokenizer."""

    def __init__(self, spec: Model, model, recipe: Optional[str], extra=None):
        self.spec = spec
        self.extra = dict(extra or {})
        self.model = model
        self.recipe = recipe
        self.tokenizer = model.tokenizer
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    # -------------------------------------------------------------- compile-time questions

    @property
    def num_layers(self) -> int:
        return int(self.model.num_layers)

    def locate(self, component: str, layer: Optional[int], site: str = "target"):
        return address.locate(self.model, component, layer, site=site,
                              attn_implementation=address.runs_attention(self.model), extra=self.extra)

    def describe_components(self) -> dict:
        """Every component at every layer: width and operation, or the reason it is not there."""
        def detail(a):
            return {}, (f"  op={a.op}" if a.op else "")
        return describe_components(self, "nnterp", address.runs_attention(self.model), detail)

    # -------------------------------------------------------------- run-time

    def forward(self, ids, mask, items) -> dict[str, torch.Tensor]:
        """One trace: each (tap, selection, operand) in the order given (rank order).

        Returns each read's gathered value, detached, on the CPU.
        """
        inputs = {"input_ids": torch.tensor(ids, dtype=torch.long),
                  "attention_mask": torch.tensor(mask, dtype=torch.long)}
        saved: dict[str, Any] = {}
        with torch.no_grad(), self.model.trace(inputs):
            written: dict[Any, Any] = {}
            for tap, selection, operand in items:
                read = self._act(tap, selection, operand, written)
                if read is not None:
                    saved[tap.name] = read
        views = {tap.name: tap.view for tap, _s, _o in items}
        return {name: self._viewed(_unwrap(value).detach().cpu(), views[name]) for name, value in saved.items()}

    def _current(self, tap, written: dict):
        """The tensor at the tap's address in the running trace (what an earlier write landed, if any)."""
        key = (tap.address.component, tap.address.layer)
        if key in written:
            return written[key]
        return access.value(self.model, tap.address, path=f"sites.{tap.site}")

    def _act(self, tap, selection, operand, written: dict, current=None):
        """One tap inside a running trace: a write lands (and is remembered, so a later read at the same
        address sees it), a read is gathered and saved. Returns the saved read, or None for a write."""
        from . import select
        key = (tap.address.component, tap.address.layer)
        current = self._current(tap, written) if current is None else current
        if tap.kind == "write":
            part = select.gather(current, selection)
            new = select.scatter(current, selection, _mechanism(tap, part, operand))
            access.assign(self.model, tap.address, new, path=f"sites.{tap.site}")
            written[key] = new
            return None
        return select.gather(current, selection).save()

    def _viewed(self, value: torch.Tensor, view: str) -> torch.Tensor:
        return logits_view(value, view, self.model.ln_final._module, self.model.lm_head._module, self.model.config)

    def generate(self, ids, mask, decode: int, items) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Greedy decode of `decode` tokens with EOS held off (min == max new tokens), taps per step.

        Each item is (tap, selection, operand, steps): a prompt-frame tap fires at step 0
        over its selection; a continuation tap fires at each step in `steps`, at the one
        position that step computes (the last). Step k is the forward that produces
        generated token k. A stacked read comes back (rows, steps, features); any other
        read as its selection gathers. Returns (reads, generated ids (rows, decode)).
        """
        inputs = {"input_ids": torch.tensor(ids, dtype=torch.long),
                  "attention_mask": torch.tensor(mask, dtype=torch.long)}
        length = len(ids[0])
        saved: dict[str, list] = {tap.name: [] for tap, _s, _o, _steps in items if tap.kind == "read"}
        counter = [0]
        with torch.no_grad(), self.model.generate(inputs, max_new_tokens=decode, min_new_tokens=decode,
                                                   do_sample=False,
                                                   pad_token_id=self.tokenizer.pad_token_id) as tracer:
            for _ in tracer.iter[:]:
                step = counter[0]
                written: dict[Any, Any] = {}
                for tap, selection, operand, steps in items:
                    if step not in steps:
                        continue
                    current = self._current(tap, written)
                    here = current.shape[tap.address.seq_axis]
                    if tap.pos.frame == "generated":
                        selection = replace(selection, windows=tuple((here - 1,) for _ in ids), ragged=False)
                    else:
                        selection = _right_aligned(selection, here, length, tap)
                    read = self._act(tap, selection, operand, written, current)
                    if read is not None:
                        saved[tap.name].append(read)
                counter[0] = step + 1
            generated = self.model.generator.output.save()
        reads = {}
        for tap, _s, _o, _steps in items:
            if tap.kind != "read":
                continue
            parts = [_unwrap(v).detach().cpu() for v in saved[tap.name]]
            reads[tap.name] = self._viewed(torch.cat(parts, dim=1) if tap.stacked else parts[0], tap.view)
        return reads, _unwrap(generated).detach().cpu()[:, length:]

    def run_record(self, batch_size: Optional[int]) -> dict:
        return run_record("NNterpEngine", self.spec, batch_size, self.recipe, self.model.lm_head.weight)


def describe_components(engine, name: str, attention: str, detail) -> dict:
    """The `model` verb's answer for either engine: each component at each layer, its width and what
    `detail(address)` adds (answer fields, line text), or the reason the place is not there."""
    lines = [f"{engine.spec.key} via {name}: {engine.num_layers} layers, "
             f"padding_side={engine.tokenizer.padding_side}, {attention} attention"]
    answers: dict[str, Any] = {}
    for component, row in address.TABLE.items():
        for layer in (range(engine.num_layers) if row.layered else [None]):
            label = component if layer is None else f"{component}[{layer}]"
            try:
                a = engine.locate(component, layer)
            except Refusal as refusal:
                answers[label] = {"resolves": False, "why": refusal.message}
                lines.append(f"  {label:24s} --   {refusal.message}")
                continue
            fields, text = detail(a)
            answers[label] = {"resolves": True, "width": a.width, "op": a.op, **fields}
            width = f"width={a.width}" if a.width is not None else "no width (no featurizer here)"
            lines.append(f"  {label:24s} ok   {width}{text}")
    return {"text": "\n".join(lines), "key": engine.spec.key, "engine": name, "num_layers": engine.num_layers,
            "padding_side": engine.tokenizer.padding_side, "components": answers}


def run_record(engine: str, spec: Model, batch_size: Optional[int], recipe: Optional[str], head_weight) -> dict:
    """What run.json says about the engine and the model (both engines)."""
    record = {
        "engine": engine,
        "remote": False,
        "batch_size": batch_size,
        "model": {"key": spec.key, "revision": spec.revision, "dtype": spec.dtype,
                  "attn_implementation": spec.attn_implementation},
        "device": "cpu",
    }
    if recipe is not None:
        record["fixture_recipe"] = recipe
    if head_weight is not None and head_weight.device.type != "meta":
        record["served_dtype"] = str(head_weight.dtype)
    return record


def logits_view(value: torch.Tensor, view: str, norm, head, config) -> torch.Tensor:
    """`"view": "logits"`: the gathered residual through the final norm, the head, and the family's
    final logit softcapping where it has one (Gemma-2). Other views pass through."""
    if view != "logits":
        return value
    with torch.no_grad():
        logits = head(norm(value.to(head.weight.dtype)))
        cap = getattr(config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits


def _right_aligned(selection, have: int, length: int, tap):
    """A prompt position at step 0 of a decode, where a tensor may hold only the last positions.

    During generation the head is computed at the last prompt position only; a window
    that asks for an earlier one is refused rather than read from a neighbour. The refusal's
    path is the tap's, relative to its intervention (the tap does not know which one).
    """
    if have == length:
        return selection
    shift = length - have
    if any(p < shift for window in selection.windows for p in window):
        raise Refusal(f"{tap.kind} '{tap.name}' at {tap.address.label()}: during a decode the model computes this "
                      f"tensor at the last {have} prompt position(s) only, and {tap.pos.spelling()} asks for an "
                      "earlier one. Read it at -1, or in an intervention without decode",
                      path=f"{tap.kind}s.{tap.name}.pos", stage="run")
    return replace(selection, windows=tuple(tuple(p - shift for p in w) for w in selection.windows))


def _unwrap(value):
    return getattr(value, "value", value) if not isinstance(value, torch.Tensor) else value


def load(spec: Model, kind: str = "nnterp", weights: bool = True, extra=None) -> NNterpEngine:
    """The engine for a document's model block.

    `extra` is the load-time extension point: {name: (module path relative to the layer, order)}
    adds places the component table does not have (Python only; SPEC.md §3 Locations, L23).
    """
    if kind == "hooks":
        from .hooks import HooksEngine

        return HooksEngine.load(spec, weights=weights)
    if kind != "nnterp":
        raise Refusal(f"engine '{kind}' is not implemented yet; use --engine nnterp", path="--engine",
                      stage="compile")
    model, _none, recipe = checkpoint.load(spec, weights=weights)
    return NNterpEngine(spec, model, recipe, extra=extra)

"""The engine contract: what compile and run may ask of an engine, and the data that crosses into it.

Compile asks `tokenizer`, `config`, `num_layers`, `locate` and `width`; the run asks
`forward(batch)` and `generate(batch)` for one forward of the plan, and `run_record`;
the `model` verb asks `describe_components`. `Engine` implements everything that is
the same for every engine once — the inputs of a forward, the logits view, the run
record, the component description, the pad token — and an engine (engine.py's
nnterp engine, hooks.py's torch-hooks engine) implements only how the tensor at an
address is reached and replaced, calling the one write seam (seam.py) there.

A forward crosses into an engine as a `Batch` of `Action`s: each a plan tap with its
run-time selection, operand and the decode steps it fires at, in rank order.
SPEC.md §12 How it is built.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import torch

from ..locations import address
from ..positions import locate
from ..shapes import Action, Address, Batch, Model, Refusal


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Each row's positions counted from its own first token, cumsum(mask) - 1 with padding at 0 (the rule
    transformers' generate applies), so a row's numbers do not depend on the rows padded beside it (R20)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def head_bound(batch: Batch) -> tuple[torch.Tensor, tuple[Action, ...]]:
    """Where the head is computed in this forward, and the actions placed on what it computes (SPEC.md Q8).

    The positions are the sorted union of every head tap's windows (`address.HEAD`: lm_head, logits), handed to
    the model as transformers' `logits_to_keep` (a 1-D tensor of sequence indices: the final norm's output is
    sliced there before the head), so the head computes (rows, kept, vocab) instead of (rows, length, vocab);
    with no head tap it computes nothing. Each head action's windows are renumbered into the kept positions;
    every other action is unchanged."""
    kept = sorted({p for a in batch.actions if a.address.component in address.HEAD
                   for window in a.selection.windows for p in window})
    where = {p: k for k, p in enumerate(kept)}
    actions = tuple(replace(a, selection=replace(a.selection, windows=tuple(tuple(where[p] for p in window)
                                                                            for window in a.selection.windows)))
                    if a.address.component in address.HEAD else a for a in batch.actions)
    return torch.tensor(kept, dtype=torch.long), actions


DEVICE_MAPS = "cpu, cuda, cuda:N or auto"


def device_map(text: str) -> str:
    """A `--device-map` value, checked: `cpu`, `auto`, `cuda` or `cuda:N` naming a CUDA device this machine has.
    Anything else is refused in one line saying what to write (R21)."""
    import re

    if text in ("cpu", "auto"):
        return text
    if not re.fullmatch(r"cuda(:\d+)?", text or ""):
        raise Refusal(f"--device-map '{text}' is not a device map; write {DEVICE_MAPS}", path="--device-map",
                      stage="validation")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(text.split(":")[1]) if ":" in text else 0
    if index >= count:
        raise Refusal(f"--device-map {text}: this machine has {count} CUDA device(s); write --device-map cpu, or a "
                      "cuda:N below that count", path="--device-map", stage="validation")
    return text


class Engine:
    """What every engine shares. A subclass sets `name`, `record_name`, `tokenizer` (through
    `__init__`) and `standard` (the nnterp model `config`, `num_layers`, `attention` and `locate`
    are answered from; or it overrides those), and implements `forward`, `generate`,
    `final_modules`, `head_weight` and `detail`."""

    name = "engine"
    record_name = "Engine"
    standard: Any = None  # the nnterp StandardizedTransformer addresses are resolved on (engine.py, hooks.py)

    def __init__(self, spec: Model, tokenizer, recipe: dict[str, Any], extra=None, device_map: str = "cpu"):
        self.spec = spec
        self.recipe = recipe
        self.device_map = device_map
        self.extra = dict(extra or {})
        self.tokenizer = locate.with_pad(tokenizer)

    # -------------------------------------------------------------- asked by compile

    @property
    def config(self):
        """The checkpoint's transformers config."""
        return self.standard.config

    @property
    def num_layers(self) -> int:
        return int(self.standard.num_layers)

    def locate(self, component: str, layer: Optional[int], site: str = "target") -> Address:
        """The address of a place, resolved on the standardized module tree (address.locate, SPEC.md §3)."""
        return address.locate(self.standard, component, layer, site=site, attn_implementation=self.attention(),
                              extra=self.extra)

    def width(self, component: str, layer: Optional[int], site: str = "target") -> Optional[int]:
        """Features per position at a place (None where the width is not a fact about the model)."""
        return self.locate(component, layer, site=site).width

    def attention(self) -> str:
        """The attention implementation the model runs."""
        return address.runs_attention(self.standard)

    # -------------------------------------------------------------- asked by run

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One forward: each read's value (detached, on the CPU, its view applied)."""
        raise NotImplementedError

    def generate(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A greedy decode of `batch.decode` tokens: (reads, generated ids (rows, decode))."""
        raise NotImplementedError

    def final_modules(self) -> tuple[Any, Any]:
        """(final norm, head) as torch modules, for the logits view."""
        raise NotImplementedError

    def head_weight(self):
        """The head's weight (its dtype is what the run served, its device where the head ran), or None
        without weights."""
        raise NotImplementedError

    def input_device(self):
        """Where a forward's inputs go: the device of the model's first parameters (the embedding)."""
        raise NotImplementedError

    def generation_config(self):
        """The checkpoint's transformers generation config (None when it has none)."""
        raise NotImplementedError

    def detail(self, a: Address) -> tuple[dict, str]:
        """What `describe_components` adds for a resolved place: (answer fields, line text)."""
        return {}, ""

    # -------------------------------------------------------------- shared

    def inputs(self, ids, mask) -> dict[str, torch.Tensor]:
        """A forward's keyword inputs: the left-padded ids, their attention mask and the position ids
        derived from the mask (every forward, the prompt's and a decode's, R20)."""
        mask_t = torch.tensor(mask, dtype=torch.long)
        inputs = {"input_ids": torch.tensor(ids, dtype=torch.long), "attention_mask": mask_t,
                  "position_ids": position_ids(mask_t)}
        device = self.input_device()
        return {k: v.to(device) for k, v in inputs.items()}

    def forward_inputs(self, batch: Batch) -> tuple[dict[str, Any], tuple[Action, ...]]:
        """A plain forward's keyword inputs with the head computed only where a tap names it (`head_bound`,
        SPEC.md Q8), and the actions to fire on it. A decode needs no bound: transformers' `generate` computes
        the head at the last position of every step, its prompt's forward included (Q9)."""
        kept, actions = head_bound(batch)
        inputs = self.inputs(batch.ids, batch.mask)
        return {**inputs, "logits_to_keep": kept.to(inputs["input_ids"].device)}, actions

    def stop_ids(self) -> tuple[int, ...]:
        """Every id a continuation can be cut at: the tokenizer's EOS and the generation config's (an id or
        a list). A decode holds all of them off and the continuation frame is cut at the first of them (P53)."""
        ids: set[int] = set()
        for value in (self.tokenizer.eos_token_id, getattr(self.generation_config(), "eos_token_id", None)):
            if value is not None:
                ids.update(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        return tuple(sorted(ids))

    def decoding(self, batch: Batch) -> dict[str, Any]:
        """The keyword arguments of a greedy decode of `batch.decode` tokens with every stop id held off
        (min == max new tokens), the same on every engine (P36, P53)."""
        return {"max_new_tokens": batch.decode, "min_new_tokens": batch.decode, "do_sample": False,
                "eos_token_id": list(self.stop_ids()) or None, "pad_token_id": self.tokenizer.pad_token_id}

    def viewed(self, value: torch.Tensor, view: str) -> torch.Tensor:
        """`"view": "logits"`: the gathered residual through the final norm, the head, and the family's
        final logit softcapping where it has one (Gemma-2). Other views pass through."""
        if view != "logits":
            return value
        norm, head = self.final_modules()
        with torch.no_grad():
            logits = head(norm(value.to(device=head.weight.device, dtype=head.weight.dtype)))
            cap = getattr(self.config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
        return logits.to(value.device)

    def run_record(self, batch_size: Optional[int]) -> dict:
        """What run.json says about the engine and the model."""
        spec = self.spec
        record: dict[str, Any] = {
            "engine": self.record_name,
            "remote": False,
            "batch_size": batch_size,
            "model": {"key": spec.key, "revision": spec.revision, "dtype": spec.dtype,
                      "attn_implementation": spec.attn_implementation},
            "device_map": self.device_map,
        }
        record.update(self.recipe)  # fixture_recipe, model_files: checkpoint.where's provenance
        weight = self.head_weight()
        if weight is not None and weight.device.type != "meta":
            record["served_dtype"] = str(weight.dtype)
            record["device"] = str(weight.device)
        return record

    def describe_components(self) -> dict:
        """The `model` verb's answer: each component at each layer, its width and what `detail` adds,
        or the reason the place is not there."""
        tok = self.tokenizer
        lines = [f"{self.spec.key} via {self.name}: {self.num_layers} layers, "
                 f"padding_side={tok.padding_side}, {self.attention()} attention"]
        answers: dict[str, Any] = {}
        for component, row in address.TABLE.items():
            for layer in (range(self.num_layers) if row.layered else [None]):
                label = component if layer is None else f"{component}[{layer}]"
                try:
                    a = self.locate(component, layer)
                except Refusal as refusal:
                    answers[label] = {"resolves": False, "why": refusal.message}
                    lines.append(f"  {label:24s} --   {refusal.message}")
                    continue
                fields, text = self.detail(a)
                answers[label] = {"resolves": True, "width": a.width, "op": a.op, **fields}
                width = f"width={a.width}" if a.width is not None else "no width (no featurizer here)"
                lines.append(f"  {label:24s} ok   {width}{text}")
        return {"text": "\n".join(lines), "key": self.spec.key, "engine": self.name, "num_layers": self.num_layers,
                "padding_side": tok.padding_side, "components": answers}

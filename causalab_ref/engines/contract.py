"""The engine contract: what compile and run may ask of an engine, and the data that crosses into it.

Compile asks `tokenizer`, `config`, `num_layers`, `locate` and `width`; the run asks
`forward(batch)` and `generate(batch)` for one forward of the plan, `frozen()` around a
fit, and `run_record`; the `model` verb asks `locate` and `detail` and prints the answer
itself (cli.py). `Engine` is those methods: the ones marked abstract each engine
implements (nnterp.py's nnterp engine, hooks.py's torch-hooks engine: how the tensor at
an address is reached and replaced, calling the one write seam, seam.py, there), and the
few both engines would write identically have their one body here.

A forward crosses into an engine as a `Batch` of `Action`s: each a plan tap with its
run-time selection, operand and the decode steps it fires at, in rank order.
SPEC.md §12 How it is built.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, ContextManager, Iterator, Optional

import torch

from ..locations import address
from ..positions import resolve
from ..shapes import Action, Address, Batch, Model, Refusal


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Each row's positions counted from its own first token, cumsum(mask) - 1 with padding at 0 (the rule
    transformers' generate applies), so a row's numbers do not depend on the rows padded beside it (R20)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # (rows, length)


def head_bound(batch: Batch) -> tuple[torch.Tensor, tuple[Action, ...]]:
    """Where the head is computed in this forward, and the actions placed on what it computes (SPEC.md Q8).

    The positions are the sorted union of every head tap's windows (`address.HEAD`: lm_head, logits), handed to
    the model as transformers' `logits_to_keep` (a 1-D tensor of sequence indices: the final norm's output is
    sliced there before the head), so the head computes (rows, kept, vocab) instead of (rows, length, vocab);
    with no head tap it computes nothing. Each head action's windows are renumbered into the kept positions;
    every other action is unchanged."""
    kept = sorted({p for a in batch.actions if a.address.component in address.HEAD
                   for window in a.selection.windows for p in window})
    index_of = {p: k for k, p in enumerate(kept)}  # a position of the sequence -> its index in (B, kept, vocab)
    actions = tuple(replace(a, selection=replace(a.selection, windows=tuple(tuple(index_of[p] for p in window)
                                                                            for window in a.selection.windows)))
                    if a.address.component in address.HEAD else a for a in batch.actions)
    return torch.tensor(kept, dtype=torch.long), actions  # (kept,)


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


@contextlib.contextmanager
def frozen_parameters(module: Optional[torch.nn.Module]) -> Iterator[None]:
    """Inside the block no parameter of `module` asks for a gradient; on the way out each gets back the flag it
    had (a fit trains its featurizers, never the model: SPEC.md E8). `None` (a meta load) freezes nothing."""
    params = list(module.parameters()) if module is not None else []
    before = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, before):
            p.requires_grad_(flag)


class Engine(ABC):
    """The engine contract. An engine sets `name` and `record_name` and implements the abstract methods:
    `forward`, `generate`, `frozen`, `final_modules`, `head_weight`, `input_device`, `generation_config` and
    `detail`.

    The bodies here are the ones both engines share identically: `__init__` (the pad-token fix-up,
    `resolve.with_pad`); compile's questions (`config`, `vocab_size`, `num_layers`, `locate`, `width`,
    `attention`), answered from `standard`, the nnterp StandardizedTransformer addresses are resolved on
    (an engine without one overrides them); the inputs of a forward (`inputs`, `forward_inputs`); the decode's arguments
    (`stop_ids`, `decoding`); the logits view (`viewed`); and the run record (`run_record`)."""

    name = "engine"
    record_name = "Engine"
    standard: Any = None  # the nnterp StandardizedTransformer addresses are resolved on (nnterp.py, hooks.py)

    def __init__(self, spec: Model, tokenizer, recipe: dict[str, Any], extra=None, device_map: str = "cpu"):
        self.spec = spec
        self.recipe = recipe
        self.device_map = device_map
        self.extra = dict(extra or {})
        self.tokenizer = resolve.with_pad(tokenizer)

    # -------------------------------------------------------------- asked by compile

    @property
    def config(self):
        """The checkpoint's transformers config."""
        return self.standard.config

    @property
    def vocab_size(self) -> int:
        """The ids the model's embedding has a row for (address.vocab_size)."""
        return address.vocab_size(self.standard)

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

    @abstractmethod
    def detail(self, a: Address) -> dict[str, Any]:
        """What this engine adds to the `model` verb's answer for a resolved place (fields of the answer)."""

    # -------------------------------------------------------------- asked by run

    @abstractmethod
    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One forward: each read's value (detached, on the CPU, its view applied)."""

    @abstractmethod
    def generate(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A greedy decode of `batch.decode` tokens: (reads, generated ids (rows, decode))."""

    @abstractmethod
    def frozen(self) -> ContextManager[None]:
        """A context in which no weight of the model asks for a gradient, each weight's flag restored on the
        way out (`frozen_parameters` on the engine's torch module): a fit's passes run inside it (SPEC.md E8)."""

    @abstractmethod
    def final_modules(self) -> tuple[Any, Any]:
        """(final norm, head) as torch modules, for the logits view."""

    @abstractmethod
    def head_weight(self):
        """The head's weight (its dtype is what the run served, its device where the head ran), or None
        without weights."""

    @abstractmethod
    def input_device(self):
        """Where a forward's inputs go: the device of the model's first parameters (the embedding)."""

    @abstractmethod
    def generation_config(self):
        """The checkpoint's transformers generation config (None when it has none)."""

    # -------------------------------------------------------------- shared

    def inputs(self, ids, mask) -> dict[str, torch.Tensor]:
        """A forward's keyword inputs: the left-padded ids, their attention mask and the position ids
        derived from the mask (every forward, the prompt's and a decode's, R20)."""
        mask_t = torch.tensor(mask, dtype=torch.long)  # (rows, length)
        inputs = {"input_ids": torch.tensor(ids, dtype=torch.long), "attention_mask": mask_t,
                  "position_ids": position_ids(mask_t)}  # each (rows, length)
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
        """Every id a continuation can end at: the tokenizer's EOS and the generation config's (an id or
        a list). A decode holds all of them off and the continuation frame ends at the first of them (P53)."""
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
            # (..., hidden) -> (..., vocab)
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
        record.update(self.recipe)  # fixture_recipe, model_files: checkpoint.find's provenance
        weight = self.head_weight()
        if weight is not None and weight.device.type != "meta":
            record["served_dtype"] = str(weight.dtype)
            record["device"] = str(weight.device)
        return record


def attention_heads(eng: Engine) -> dict[str, dict]:
    """Each layer's attention as a heads selection sees it (SPEC.md L35): query heads, key/value heads and each
    head's width, read off the places `attention_query`, `attention_key` and `attention_z` land at on the
    standardized tree (whichever engine then reaches them), or why the layer has none (linear attention, L30)."""
    out: dict[str, dict] = {}
    # The tree itself, not the engine's locate: the hooks engine refuses the interiors it cannot hook, but the
    # counts are the model's; an engine with no standardized tree answers through its own locate (E1).
    locate = eng.locate if eng.standard is None else (
        lambda name, layer: address.locate(eng.standard, name, layer, attn_implementation=eng.attention()))
    for layer in range(eng.num_layers):
        try:
            query, key, z = (locate(name, layer) for name in ("attention_query", "attention_key", "attention_z"))
        except Refusal as refusal:
            out[f"attention[{layer}]"] = {"resolves": False, "why": refusal.message}
            continue
        if not (query.heads and key.heads and z.heads and query.width and z.width):
            continue  # no head count at these places: nothing to state
        out[f"attention[{layer}]"] = {"resolves": True, "heads": query.heads, "kv_heads": key.heads,
                                      "head_dim": z.width // z.heads, "qk_head_dim": query.width // query.heads}
    return out


def heads_lines(heads: dict[str, dict]) -> list[str]:
    """The `model` verb's lines for attention_heads' answer: one per run of layers with the same answer
    (`attention[0-2]`), in the components' line format (`ok` and the counts, or `--` and why)."""
    runs: list[tuple[int, int, dict]] = []
    for label, a in heads.items():
        layer = int(label[len("attention["):-1])
        if runs and runs[-1][1] == layer - 1 and runs[-1][2] == a:
            runs[-1] = (runs[-1][0], layer, a)
        else:
            runs.append((layer, layer, a))
    lines = []
    for first, last, a in runs:
        label = f"attention[{first}]" if first == last else f"attention[{first}-{last}]"
        if not a["resolves"]:
            lines.append(f"  {label:24s} --   {a['why']}")
            continue
        qk = f"  qk_head_dim={a['qk_head_dim']}" if a["qk_head_dim"] != a["head_dim"] else ""
        lines.append(f"  {label:24s} ok   heads={a['heads']}  kv_heads={a['kv_heads']}  head_dim={a['head_dim']}{qk}")
    return lines

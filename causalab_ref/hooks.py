"""Hooks engine: the same plan, run with plain torch forward hooks on a transformers model.

`HooksEngine` answers the questions `engine.NNterpEngine` answers — `.tokenizer`,
`.locate(component, layer, site)`, `.forward(ids, mask, items)`, `.run_record(...)`,
`.describe_components()` — but its forward is an ordinary `AutoModelForCausalLM` call
with `register_forward_pre_hook` / `register_forward_hook` (`with_kwargs=True`) on the
modules the plan's taps name; nnsight never runs in the forward.  SPEC.md L6:
an address is a module, an io side and a rank, and that is all a hook needs.

How an address becomes a hook (seed 004:100 "Both engines reach it"):

* addresses are resolved exactly as the nnterp engine resolves them, by
  `address.locate` on a weightless nnterp `StandardizedTransformer` shell of the same
  checkpoint (SPEC.md L24); the shell is only a module tree;
* the address's module (nnterp's standardized spelling, relative to the layer or the
  model root) is walked on the shell, and the envoy's underlying `torch.nn.Module` is
  found by identity in the shell's own `named_modules()`.  That dotted name is the
  transformers name (`model.layers.0.self_attn.o_proj`, `transformer.h.0.attn.c_proj`,
  `transformer.wte`, ...), and the hooked model, loaded from the same directory, has
  the module under the same name.  No per-family rename table is kept;
* the input side is the module's first argument (first positional, else the first
  keyword — `self_attn` is called with `hidden_states=`), reached by a forward
  pre-hook; the output side is the module's output, element 0 of a tuple, reached by
  a forward hook.  `logits` is the root module (empty path) and its output's
  `.logits` field — the same one rule with a different field (seed 004:100,
  SPEC.md L9);
* taps at one boundary run in the order given (rank order, writes before reads,
  SPEC.md R4); each write gathers the current value, applies the mechanism,
  scatters, and the boundary's value becomes the new tensor — so a later read at the
  same boundary, and everything downstream, sees the write.  Reads keep a detached
  clone of the gathered value (select.py's rule, SPEC.md L13); a read with
  `"view": "logits"` is then put through the final norm, the head and Gemma-2's
  softcap, as the nnterp engine does (SPEC.md L10).

What a hook cannot see (seed-tables B6 "interiors are nnterp-engine only";
SPEC.md L12): the four interiors are one argument of one call inside a module's
forward, and are refused at compile by name.  `attention_probs` is refused too: under
eager the attention module does hand its pattern out as output element 1, but as a
by-product the values were already mixed with, so a write there would change nothing
downstream (SPEC.md L11; seed 004:123).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import access, address, checkpoint, select
from .engine import describe_components, logits_view, run_record
from .shapes import Model, Refusal

INTERIOR = ("component '{name}' is an interior — one argument of one call inside a module's forward — and a "
            "forward hook only sees the module's boundary. It is addressed through nnsight's `.source`, which has "
            "no hooks equivalent; run this document on the nnterp engine.")

PROBS = ("component 'attention_probs' is the attention pattern inside the attention forward, not a module "
         "boundary: under eager the attention module hands it out only as a second output the values were already "
         "mixed with, so a hook could read a copy there but a write would change nothing downstream. It is "
         "addressed through nnterp's attention_probabilities; run this document on the nnterp engine.")

def _first_input(args: tuple, kwargs: dict):
    """(where, value): the module's first argument — positional 0, else the first keyword."""
    if args:
        return ("arg", 0), args[0]
    if "hidden_states" in kwargs:
        return ("kw", "hidden_states"), kwargs["hidden_states"]
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            return ("kw", key), value
    raise RuntimeError("a forward pre-hook saw a call with no tensor argument")


class HooksEngine:
    """One checkpoint: a weightless nnterp shell for addresses, a transformers model for the forward.

    `weights=False` loads the shell and the tokenizer only (compile, `model --engine hooks`).
    """

    def __init__(self, spec: Model, shell, hf_model, recipe: Optional[str]):
        self.spec = spec
        self.shell = shell
        self.hf_model = hf_model
        self.recipe = recipe
        self.tokenizer = shell.tokenizer
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._names = {id(m): n for n, m in shell._model.named_modules()}

    # -------------------------------------------------------------- loading

    @classmethod
    def load(cls, spec: Model, weights: bool = True) -> "HooksEngine":
        shell, hf_model, recipe = checkpoint.load(spec, weights=weights, hooked=True)
        return cls(spec, shell, hf_model, recipe)

    # -------------------------------------------------------------- compile-time questions

    @property
    def num_layers(self) -> int:
        return int(self.shell.num_layers)

    def locate(self, component: str, layer: Optional[int], site: str = "target"):
        """The nnterp engine's address, minus what a hook cannot reach (seed-tables B6)."""
        if component in address.INTERIORS:
            raise Refusal(INTERIOR.format(name=component), path=f"sites.{site}", stage="compile")
        if component == "attention_probs":
            raise Refusal(PROBS, path=f"sites.{site}", stage="compile")
        return address.locate(self.shell, component, layer, site=site,
                              attn_implementation=address.runs_attention(self.shell))

    def module_name(self, addr) -> str:
        """The transformers module name of an address's module ('' is the root)."""
        env = access._envoy(self.shell, addr)
        name = self._names.get(id(env._module))
        if name is None:
            raise RuntimeError(f"{addr.label()}: module '{addr.module}' is not in the model's module tree")
        return name

    def describe_components(self) -> dict:
        """Every component at every layer: width and operation, or the reason it is not there."""
        def detail(a):
            module = self.module_name(a)
            return {"module": module, "io": a.io}, f"  hook={module or '<root>'}.{a.io}"
        return describe_components(self, "hooks", address.runs_attention(self.shell), detail)

    # -------------------------------------------------------------- run-time

    def forward(self, ids, mask, items) -> dict[str, torch.Tensor]:
        """One forward with hooks: each (tap, selection, operand) in the order given (rank order).

        Returns each read's gathered value, detached, on the CPU.
        """
        from .engine import _mechanism

        if self.hf_model is None:
            raise Refusal("this engine was loaded without weights and cannot run a forward", stage="run")
        # group the taps by boundary (module, side), keeping their order inside each group
        groups: dict[tuple[str, str], list] = {}
        for tap, selection, operand in items:
            name = self.module_name(tap.address)
            side = "logits" if tap.address.component == "logits" else tap.address.io
            groups.setdefault((name, side), []).append((tap, selection, operand))

        saved: dict[str, torch.Tensor] = {}

        def apply(current: torch.Tensor, taps) -> tuple[torch.Tensor, bool]:
            changed = False
            for tap, selection, operand in taps:
                if tap.kind == "write":
                    part = select.gather(current, selection)
                    current = select.scatter(current, selection, _mechanism(tap, part, operand))
                    changed = True
                else:
                    saved[tap.name] = select.gather(current, selection).detach().clone().cpu()
            return current, changed

        def pre_hook(taps):
            def hook(module, args, kwargs):
                where, current = _first_input(args, kwargs)
                new, changed = apply(current, taps)
                if not changed:
                    return None
                if where[0] == "arg":
                    return (new, *args[1:]), kwargs
                return args, {**kwargs, where[1]: new}
            return hook

        def out_hook(taps):
            def hook(module, args, kwargs, output):
                current = output[0] if isinstance(output, tuple) else output
                new, changed = apply(current, taps)
                if not changed:
                    return None
                return (new, *output[1:]) if isinstance(output, tuple) else new
            return hook

        def logits_hook(taps):
            def hook(module, args, kwargs, output):
                new, changed = apply(output.logits, taps)
                if changed:
                    output.logits = new
                return output if changed else None
            return hook

        handles = []
        try:
            for (name, side), taps in groups.items():
                module = self.hf_model.get_submodule(name)
                if side == "input":
                    handles.append(module.register_forward_pre_hook(pre_hook(taps), with_kwargs=True))
                elif side == "logits":
                    handles.append(module.register_forward_hook(logits_hook(taps), with_kwargs=True))
                else:
                    handles.append(module.register_forward_hook(out_hook(taps), with_kwargs=True))
            inputs = {"input_ids": torch.tensor(ids, dtype=torch.long),
                      "attention_mask": torch.tensor(mask, dtype=torch.long)}
            with torch.no_grad():
                self.hf_model(**inputs, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        views = {tap.name: tap.view for tap, _s, _o in items}
        return {name: self._viewed(value, views[name]) for name, value in saved.items()}

    def _viewed(self, value: torch.Tensor, view: str) -> torch.Tensor:
        """`"view": "logits"`: the gathered residual through the final norm, the head, and the family's
        final logit softcapping where it has one (Gemma-2) — the nnterp engine's rule, on the same modules."""
        if view != "logits":
            return value
        norm = self.hf_model.get_submodule(self.module_name(self.locate("ln_final", None)))
        head = self.hf_model.get_submodule(self.module_name(self.locate("lm_head", None)))
        return logits_view(value, view, norm, head, self.hf_model.config)

    def generate(self, ids, mask, decode: int, items):
        """Decoding (the generated frame) is the nnterp engine's; refused here by name."""
        raise Refusal("decode > 0 (the generated frame) is not implemented on the hooks engine; run this "
                      "document on the nnterp engine", path="decode", stage="run")

    def run_record(self, batch_size: Optional[int]) -> dict:
        head = self.hf_model.lm_head.weight if self.hf_model is not None else None
        return run_record("HooksEngine", self.spec, batch_size, self.recipe, head)

"""Hooks engine: the same plan, run with plain torch forward hooks on a transformers model.

`HooksEngine` implements the engine contract (contract.py) as `engine.NNterpEngine` does,
but its forward (and its decode, transformers' `generate`) is an ordinary
`AutoModelForCausalLM` call with `register_forward_pre_hook` / `register_forward_hook`
(`with_kwargs=True`) on the modules the plan's taps name; nnsight never runs in the
forward.  SPEC.md L6: an address is a module, an io side and a rank, and that is all a
hook needs; SPEC.md E6: in a decode a pre-hook on the root counts the steps.

How an address becomes a hook (SPEC.md E3, L24):

* addresses are resolved exactly as the nnterp engine resolves them, by
  `address.locate` on a weightless nnterp `StandardizedTransformer` shell of the same
  checkpoint (SPEC.md L24); the shell is only a module tree;
* the address's module (nnterp's standardized spelling, relative to the layer or the
  model root) is walked on the shell (`address.envoy`, the walk `locate` uses), and the
  envoy's underlying `torch.nn.Module` is found by identity in the shell's own
  `named_modules()`.  That dotted name is the transformers name
  (`model.layers.0.self_attn.o_proj`, `transformer.h.0.attn.c_proj`, `transformer.wte`,
  ...), and the hooked model, loaded from the same directory, has the module under the
  same name.  No per-family rename table is kept;
* the input side is the module's first argument (first positional, else the first
  keyword — `self_attn` is called with `hidden_states=`), reached by a forward
  pre-hook; the output side is the module's output, element 0 of a tuple, reached by
  a forward hook.  Which of those a tap takes is the component table's `reach`
  column, as the nnterp engine dispatches on it: a `boundary` row is the module's input or
  output; the `model_logits` row (`logits`) is the root module (empty path) and its
  output's `.logits` field (SPEC.md L9);
* taps at one boundary run in the order given (rank order, writes before reads,
  SPEC.md R4) through the one write seam (seam.py), and the boundary's value becomes
  the tensor the seam returns — so a later read at the same boundary, and everything
  downstream, sees the write; a read with `"view": "logits"` is put through the final
  norm, the head and Gemma-2's softcap by the contract's one logits view (SPEC.md L10).

What a hook cannot see (interiors are nnterp-engine only,
SPEC.md L12): the four interiors are one argument of one call inside a module's
forward, and are refused at compile (the table's `interior` column).  `attention_probs`
(the `pattern` reach) is refused too: under eager the attention module does hand its
pattern out as output element 1, but as a by-product the values were already mixed
with, so a write there would change nothing downstream (SPEC.md L11).
"""
from __future__ import annotations

from typing import ContextManager, Optional

import torch

from . import checkpoint
from ..locations import address
from ..writes import seam
from .contract import Engine, frozen_parameters
from ..shapes import Batch, Model, Refusal

INTERIOR = ("component '{name}' is an interior — one argument of one call inside a module's forward — and a "
            "forward hook only sees the module's boundary. It is addressed through nnsight's `.source`, which has "
            "no hooks equivalent; run this document on the nnterp engine.")

PROBS = ("component 'attention_probs' is the attention pattern inside the attention forward, not a module "
         "boundary: under eager the attention module hands it out only as a second output the values were already "
         "mixed with, so a hook could read a copy there but a write would change nothing downstream. It is "
         "addressed through nnterp's attention_probabilities; run this document on the nnterp engine.")


def _first_input(args: tuple, kwargs: dict):
    """(slot, value): the module's first argument — positional 0, else the first keyword."""
    if args:
        return ("arg", 0), args[0]
    if "hidden_states" in kwargs:
        return ("kw", "hidden_states"), kwargs["hidden_states"]
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            return ("kw", key), value
    raise RuntimeError("a forward pre-hook saw a call with no tensor argument")


class _Stopped(Exception):
    """Raised by the hook of a plain forward's last boundary once its actions have landed (SPEC.md Q36)."""


class _Hooked:
    """The hooks of one forward, or of every step of a decode: each boundary's actions through the seam.

    `step` counts the model's forwards (a pre-hook on the root, registered first); `length` is the
    prompt's length in a decode (0: a plain forward, no per-step placement). `last` is a plain forward's
    last boundary's actions: once they have fired, the forward stops (`_Stopped`), as nothing after them is read."""

    def __init__(self, actions, length: int = 0, grad: bool = False, last=None):
        self.reads = seam.Reads(actions)
        self.length = length
        self.grad = grad
        self.step = -1
        self.last = last

    def count(self, module, args):
        self.step += 1

    def fire(self, at_boundary, current: torch.Tensor) -> Optional[torch.Tensor]:
        """The boundary's actions at this step on `current`; the new tensor, or None when nothing was written."""
        acting = seam.firing(at_boundary, self.step)
        if not acting:
            return None
        if self.length:
            # the positions the tensor holds at this step (the prompt's or its last ones at step 0, then 1)
            acting = [seam.at_step(a, current.shape[a.address.seq_axis], self.length) for a in acting]
        applied = seam.apply(current, acting, self.step, self.grad)
        self.reads.keep(applied)
        if at_boundary is self.last:
            raise _Stopped
        return applied.value if applied.changed else None

    def on_input(self, at_boundary):
        def hook(module, args, kwargs):
            slot, current = _first_input(args, kwargs)
            new = self.fire(at_boundary, current)
            if new is None:
                return None
            if slot[0] == "arg":
                return (new, *args[1:]), kwargs
            return args, {**kwargs, slot[1]: new}
        return hook

    def on_output(self, at_boundary):
        def hook(module, args, kwargs, output):
            new = self.fire(at_boundary, output[0] if isinstance(output, tuple) else output)
            if new is None:
                return None
            return (new, *output[1:]) if isinstance(output, tuple) else new
        return hook

    def on_logits(self, at_boundary):
        def hook(module, args, kwargs, output):
            new = self.fire(at_boundary, output.logits)
            if new is None:
                return None
            output.logits = new
            return output
        return hook


class HooksEngine(Engine):
    """One checkpoint: a weightless nnterp shell for addresses, a transformers model for the forward.

    `weights=False` loads the shell and the tokenizer only (compile, `model --engine hooks`).
    """

    name = "hooks"
    record_name = "HooksEngine"

    def __init__(self, spec: Model, shell, hf_model, recipe: dict, device_map: str = "cpu"):
        super().__init__(spec, shell.tokenizer, recipe, device_map=device_map)
        self.shell = self.standard = shell
        self.hf_model = hf_model
        self._names = {id(m): n for n, m in shell._model.named_modules()}

    # -------------------------------------------------------------- loading

    @classmethod
    def load(cls, spec: Model, weights: bool = True, device_map: str = "cpu") -> "HooksEngine":
        shell, hf_model, recipe = checkpoint.load(spec, weights=weights, hooked=True, device_map=device_map)
        return cls(spec, shell, hf_model, recipe, device_map=device_map)

    # -------------------------------------------------------------- compile-time questions

    def locate(self, component: str, layer: Optional[int], site: str = "target"):
        """The nnterp engine's address, minus what a hook cannot reach (SPEC.md L12)."""
        if component in address.INTERIORS:
            raise Refusal(INTERIOR.format(name=component), path=f"sites.{site}", stage="compile")
        if address.reach(component) == "pattern":
            raise Refusal(PROBS, path=f"sites.{site}", stage="compile")
        return super().locate(component, layer, site=site)

    def module_name(self, addr) -> str:
        """The transformers module name of an address's module ('' is the root)."""
        env = address.envoy(self.shell, addr)
        name = self._names.get(id(env._module))
        if name is None:
            raise RuntimeError(f"{addr.label()}: module '{addr.module}' is not in the model's module tree")
        return name

    def detail(self, a) -> dict:
        """The transformers module a hook goes on, and its side."""
        return {"module": self.module_name(a), "io": a.io}

    def final_modules(self):
        return (self.hf_model.get_submodule(self.module_name(self.locate("ln_final", None))),
                self.hf_model.get_submodule(self.module_name(self.locate("lm_head", None))))

    def head_weight(self):
        return self.hf_model.lm_head.weight if self.hf_model is not None else None

    def _weighted(self) -> None:
        if self.hf_model is None:
            raise Refusal("this engine was loaded without weights and cannot run a forward", stage="run")

    def input_device(self):
        self._weighted()
        return self.hf_model.device

    def generation_config(self):
        model = self.hf_model if self.hf_model is not None else self.shell._model
        return getattr(model, "generation_config", None)

    def frozen(self) -> ContextManager[None]:
        return frozen_parameters(self.hf_model)

    # -------------------------------------------------------------- run-time: reaching an address

    def _boundaries(self, actions) -> dict[tuple[str, str], list]:
        """The actions grouped by boundary (module name, side), keeping their order at each boundary."""
        out: dict[tuple[str, str], list] = {}
        for action in actions:
            side = "logits" if address.reach(action.address.component) == "model_logits" else action.address.io
            out.setdefault((self.module_name(action.address), side), []).append(action)
        return out

    def _hook(self, hooked: _Hooked, bounds: dict) -> list:
        """Register the hooks of `bounds` (`_boundaries`' actions by boundary; the step counter first); returns
        their handles."""
        self._weighted()
        handles = [self.hf_model.register_forward_pre_hook(hooked.count)]
        for (name, side), at_boundary in bounds.items():
            module = self.hf_model.get_submodule(name)
            if side == "input":
                handles.append(module.register_forward_pre_hook(hooked.on_input(at_boundary), with_kwargs=True))
            else:
                hook = hooked.on_logits(at_boundary) if side == "logits" else hooked.on_output(at_boundary)
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return handles

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One forward with hooks: the actions in rank order. Returns each read's value, detached, on the CPU."""
        inputs, actions = self.forward_inputs(batch)
        bounds = self._boundaries(actions)  # in rank order: the last boundary is the last the forward reaches
        hooked = _Hooked(actions, grad=batch.grad, last=list(bounds.values())[-1] if bounds else None)
        handles = self._hook(hooked, bounds)
        try:
            with torch.set_grad_enabled(batch.grad):
                self.hf_model(**inputs, use_cache=False)
        except _Stopped:  # the last boundary's actions landed: nothing the model computes after them is read (Q36)
            pass
        finally:
            for handle in handles:
                handle.remove()
        return hooked.reads.result(self.viewed, grad=batch.grad)

    def generate(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """transformers' greedy decode with the hooks on (`decoding`, the nnterp engine's arguments): the root's
        pre-hook counts the steps, so each boundary fires the actions of the step it is in, placed as the
        nnterp engine places them (seam.at_step). Returns (reads, generated ids (rows, decode))."""
        length = len(batch.ids[0])
        hooked = _Hooked(batch.actions, length)
        handles = self._hook(hooked, self._boundaries(batch.actions))
        try:
            with torch.no_grad():
                out = self.hf_model.generate(**self.inputs(batch.ids, batch.mask), **self.decoding(batch))
        finally:
            for handle in handles:
                handle.remove()
        return hooked.reads.result(self.viewed), out.detach().cpu()[:, length:]  # (B, length + decode) -> (B, decode)

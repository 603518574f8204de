"""Engine: a checkpoint loaded as an nnterp StandardizedTransformer, and one forward of a plan on it.

`NNterpEngine` implements the engine contract (contract.py) by
reaching each address inside an nnsight trace (access.py) and handing the tensor
there to the write seam (seam.py); one trace over a left-padded batch issues every
address in rank order, writes landing before reads at one address. SPEC.md §4 Runs, §12.
"""
from __future__ import annotations

import torch

from . import access
from ..writes import seam
from .contract import Engine
from ..shapes import Batch, Model


class NNterpEngine(Engine):
    """One loaded checkpoint. `weights=False` is a meta load: config, module tree, tokenizer."""

    name = "nnterp"
    record_name = "NNterpEngine"

    def __init__(self, spec: Model, model, recipe: dict, extra=None, device_map: str = "cpu"):
        super().__init__(spec, model.tokenizer, recipe, extra=extra, device_map=device_map)
        self.model = self.standard = model

    # -------------------------------------------------------------- compile-time questions

    def detail(self, a) -> tuple[dict, str]:
        return {}, (f"  op={a.op}" if a.op else "")

    def final_modules(self):
        return self.model.ln_final._module, self.model.lm_head._module

    def head_weight(self):
        return self.model.lm_head.weight

    def generation_config(self):
        return getattr(self.model._model, "generation_config", None)

    def input_device(self):
        return self.model._model.device

    # -------------------------------------------------------------- run-time: reaching an address

    def _land(self, actions, reads: seam.Reads, step: int = 0, length: int = 0, grad: bool = False) -> None:
        """Inside a running trace: each address's actions through the seam, in rank order; a write's result
        replaces the tensor there (access.assign), a read is saved."""
        for addr, group in seam.groups(actions):
            path = f"sites.{group[0].tap.site}"
            current = access.value(self.model, addr, path=path)
            if length:
                here = current.shape[addr.seq_axis]
                group = [seam.at_step(a, here, length) for a in group]
            landed = seam.apply(current, group, step, grad)
            if landed.changed:
                access.assign(self.model, addr, landed.value, path=path)
            reads.keep(landed, keep=lambda v: v.save())

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One trace: the actions in rank order. Returns each read's value, detached, on the CPU."""
        inputs, actions = self.forward_inputs(batch)
        reads = seam.Reads(actions)
        with torch.set_grad_enabled(batch.grad), self.model.trace(inputs):
            self._land(actions, reads, grad=batch.grad)
        return reads.result(self.viewed, _unwrap, batch.grad)

    def generate(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Greedy decode of `batch.decode` tokens with every stop id held off (`decoding`), actions per step.

        A prompt-frame action fires at step 0 over its selection; a continuation action fires at
        each of its steps, at the one position that step computes (the last). Step k is the forward
        that produces generated token k. Returns (reads, generated ids (rows, decode)).
        """
        length = len(batch.ids[0])
        reads = seam.Reads(batch.actions)
        counter = [0]
        inputs = self.inputs(batch.ids, batch.mask)
        with torch.no_grad(), self.model.generate(inputs, **self.decoding(batch)) as tracer:
            for _ in tracer.iter[:]:
                step = counter[0]
                self._land(seam.firing(batch.actions, step), reads, step, length)
                counter[0] = step + 1
            generated = self.model.generator.output.save()
        return reads.result(self.viewed, _unwrap), _unwrap(generated).detach().cpu()[:, length:]


def _unwrap(value):
    return getattr(value, "value", value) if not isinstance(value, torch.Tensor) else value

"""The nnterp engine: a checkpoint loaded as an nnterp StandardizedTransformer, and one forward of a plan on it.

`NNterpEngine` implements the engine contract (contract.py) by reaching each address inside an
nnsight trace and handing the tensor there to the write seam (seam.py); one trace over a left-padded
batch issues every address in rank order, writes landing before reads at one address. SPEC.md §4 Runs,
§12. (Loading one is checkpoint.py's; choosing the engine, loading.py's.)

Reaching an address is two verbs a trace uses: `value(model, address)` (the tensor held there, to read
or `.save()`) and `assign(model, address, new)` (replace it). Both must be called inside a
`with model.trace(...)` block, and (nnsight's rule) in forward order (`Address.rank`), reads and writes
interleaved as the forward meets them.

How each kind of place is reached: the component table's `reach` column, dispatched on by `REACH`
(SPEC.md §3 Locations; stack-facts "Tracing rules"):

* a module boundary: the envoy's `.input` (first argument) or `.output` (the module found by
  `address.envoy`, the one module-tree walk); a tuple output is its element 0, and a write puts the
  new value in that slot;
* an interior: the attention forward's `.source` operation `address.op` (`attention_interface_0`
  here): argument 1 is the query, 2 the key, output[0] is z. Writes replace the operation's
  inputs/output (an in-place write into GPT-2's query fails: it is a view from a split). Under eager
  attention the operation's own `.source` is touched before its inputs, so a later read of the scores
  (one level deeper) is still ahead of the forward;
* attention_scores: the softmax inside the function the call dispatches to, found in the trace (the
  one nested operation whose name says softmax), its input;
* attention_probs: nnterp's `attention_probabilities[layer]`;
* logits: the model output's `.logits`.
"""
from __future__ import annotations

from typing import ContextManager

import torch

from ..locations.address import TABLE, envoy, reach, runs_attention
from ..shapes import Address, Batch, Model, Refusal
from ..writes import seam
from .contract import Engine, frozen_parameters

# ---------------------------------------------------------------- reaching an address


def _eager(model) -> bool:
    return runs_attention(model) == "eager"


def _op(model, address: Address, touch: bool = True):
    """The attention call's operation envoy; under eager its nested .source is touched
    first, so the dispatched function's operations stay reachable later in the pass."""
    op = getattr(model.layers[address.layer].self_attn.source, str(address.op))
    if touch and _eager(model):
        op.source  # noqa: B018 -- touching installs the nested source for this forward
    return op


def _softmax(model, address: Address, path: str = ""):
    op = _op(model, address)
    inner = op.source
    names = [n for n in inner.accessor.line_numbers if "softmax" in n.lower()]
    if len(names) != 1:
        raise Refusal(f"component '{address.component}': the function '{address.op}' dispatches "
                      f"to has {len(names)} softmax operations ({names}); its operations are "
                      f"{list(inner.accessor.line_numbers)}", path=path, stage="run")
    return getattr(inner, names[0])


def _call_arg(k: int):
    """The reach of argument `k` of the attention call: read it, or replace it in the call's inputs."""
    def get(model, address, path):
        arg = _op(model, address).inputs[0][k]  # the query or the key, (B, heads, T, head_dim)
        return arg, arg

    def put(model, address, new, enclosing, path):
        op = _op(model, address)
        args, kwargs = op.inputs
        args = list(args)
        args[k] = new
        op.inputs = (tuple(args), kwargs)
    return get, put


def _get_call_output(model, address, path):
    out = _op(model, address).output
    return out[0], out  # z, (B, T, H, D), in slot 0


def _put_call_output(model, address, new, enclosing, path):
    _op(model, address).output = (new, *enclosing[1:]) if isinstance(enclosing, tuple) else new


def _get_softmax_input(model, address, path):
    tensor = _softmax(model, address, path).input  # (B, H, T, T)
    return tensor, tensor


def _put_softmax_input(model, address, new, enclosing, path):
    _softmax(model, address, path).input = new


def _get_pattern(model, address, path):
    tensor = model.attention_probabilities[address.layer]  # (B, H, T, T)
    return tensor, tensor


def _put_pattern(model, address, new, enclosing, path):
    model.attention_probabilities[address.layer] = new


def _get_model_logits(model, address, path):
    tensor = model.output.logits  # (B, kept, vocab)
    return tensor, tensor


def _put_model_logits(model, address, new, enclosing, path):
    model.output.logits = new


def _get_boundary(model, address, path):
    env = envoy(model, address)
    enclosing = env.input if address.io == "input" else env.output
    return (enclosing[0] if isinstance(enclosing, tuple) else enclosing), enclosing


def _put_boundary(model, address, new, enclosing, path):
    env = envoy(model, address)
    if address.io == "input":
        env.input = new
        return
    env.output = (new, *enclosing[1:]) if isinstance(enclosing, tuple) else new


#: the component table's `reach` column -> (get, put): how a trace reaches each kind of place. `get` returns the
#: tensor there and what the module holds (`enclosing`: a tuple whose slot 0 it is, or the tensor itself); `put` takes
#: that `enclosing` back, so a write rebuilds the tuple it came in without asking the trace for it again
REACH = {
    "boundary": (_get_boundary, _put_boundary),
    "call_arg1": _call_arg(1),
    "call_arg2": _call_arg(2),
    "call_output": (_get_call_output, _put_call_output),
    "softmax_input": (_get_softmax_input, _put_softmax_input),
    "pattern": (_get_pattern, _put_pattern),
    "model_logits": (_get_model_logits, _put_model_logits),
}


def reached(model, address: Address, path: str = ""):
    """(the tensor held at `address` in the running trace, what its module holds there, which encloses it:
    `assign`'s `enclosing`)."""
    get, _ = REACH[reach(address.component)]
    return get(model, address, path)


def value(model, address: Address, path: str = ""):
    """The tensor held at `address` in the running trace (read it, or `.save()` it).

    `path` is the document path a refusal here carries (the site's, `sites.<site>`)."""
    return reached(model, address, path)[0]


def assign(model, address: Address, new, path: str = "", enclosing=None) -> None:
    """Replace the tensor at `address` with `new` in the running trace (`path` as for `value`); `enclosing` is what
    `reached` said the module holds there (asked again when not given)."""
    row = TABLE.get(address.component)
    if row is not None and row.read_only:
        raise Refusal(f"{address.component} is read-only: it is the model's input, and a write naming it "
                      "means nothing", path=path, stage="run")
    _, put = REACH[reach(address.component)]
    put(model, address, new, reached(model, address, path)[1] if enclosing is None else enclosing, path)


# ---------------------------------------------------------------- the engine


class NNterpEngine(Engine):
    """One loaded checkpoint. `weights=False` is a meta load: config, module tree, tokenizer."""

    name = "nnterp"
    record_name = "NNterpEngine"

    def __init__(self, spec: Model, model, recipe: dict, extra=None, device_map: str = "cpu"):
        super().__init__(spec, model.tokenizer, recipe, extra=extra, device_map=device_map)
        self.model = self.standard = model

    # -------------------------------------------------------------- the contract's questions

    def detail(self, a: Address) -> dict:
        """Nothing beyond the address: its operation (`op`) is already in the answer."""
        return {}

    def final_modules(self):
        return self.model.ln_final._module, self.model.lm_head._module

    def head_weight(self):
        return self.model.lm_head.weight

    def generation_config(self):
        return getattr(self.model._model, "generation_config", None)

    def input_device(self):
        return self.model._model.device

    def frozen(self) -> ContextManager[None]:
        return frozen_parameters(self.model._module)

    # -------------------------------------------------------------- run-time: reaching an address

    def _land(self, actions, reads: seam.Reads, step: int = 0, length: int = 0, grad: bool = False) -> None:
        """Inside a running trace: each address's actions through the seam, in rank order; a write's result
        replaces the tensor there (`assign`), a read is saved."""
        for addr, at_address in seam.by_address(actions):
            path = f"sites.{at_address[0].tap.site}"
            current, enclosing = reached(self.model, addr, path=path)
            if length:
                here = current.shape[addr.seq_axis]  # positions held at this step (seam.at_step)
                at_address = [seam.at_step(a, here, length) for a in at_address]
            applied = seam.apply(current, at_address, step, grad)
            if applied.changed:
                assign(self.model, addr, applied.value, path=path, enclosing=enclosing)
            reads.keep(applied, keep=lambda v: v.save())

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One trace: the actions in rank order. Returns each read's value, detached, on the CPU."""
        from nnsight.intervention.interleaver import EarlyStopException

        inputs, actions = self.forward_inputs(batch)
        reads = seam.Reads(actions)
        try:
            with torch.set_grad_enabled(batch.grad), self.model.trace(inputs) as tracer:
                self._land(actions, reads, grad=batch.grad)
                tracer.stop()  # the last action has landed: nothing the model computes after it is read (Q36)
        except EarlyStopException as stop:  # nnsight lets the stop out only when an interrupt met it: the interrupt
            raise _interrupt_of(stop) or stop  # is the run's to handle (SIGINT, SIGTERM: SPEC.md S5, S6)
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
        # (B, length + decode) -> the generated ids, (B, decode)
        return reads.result(self.viewed, _unwrap), _unwrap(generated).detach().cpu()[:, length:]


def _interrupt_of(error: BaseException):
    """The interrupt (a BaseException that is no Exception: KeyboardInterrupt, as SIGINT and SIGTERM raise it)
    among what `error` was raised while handling, or None."""
    seen = error.__context__ or error.__cause__
    for _ in range(16):  # a chain, not a loop: a few links at most
        if seen is None:
            return None
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__ or seen.__cause__
    return None


def _unwrap(value):
    return getattr(value, "value", value) if not isinstance(value, torch.Tensor) else value

"""SPEC §12: the engine contract, the write seam and the mechanism table, through the contract.

Each seam test runs the same `Batch` on both engines (the nnterp engine and the hooks engine
on the Llama fixture) and checks the values against numbers computed here, not by the seam.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.engines import contract, loading, nnterp
from causalab_ref.positions import resolve
from causalab_ref.writes import mechanisms, seam
from causalab_ref.runs import run
from causalab_ref.runs.plan import Tap
from causalab_ref.shapes import Action, Batch
from causalab_ref.engines.hooks import HooksEngine
from causalab_ref.shapes import Model, Refusal, Selection, Where

from conftest import Delegate

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())
TEXTS = ["If today is Thursday, tomorrow is", "Monday comes"]


@pytest.fixture(scope="module")
def hooks():
    return loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), kind="hooks")


def _batch(llama, *actions):
    ids, mask, _frame = resolve.frame_of_texts(llama.tokenizer, TEXTS)
    return Batch(ids=ids, mask=mask, actions=tuple(actions))


def _last(llama):
    ids, _mask, _frame = resolve.frame_of_texts(llama.tokenizer, TEXTS)
    return tuple((len(ids[0]) - 1,) for _ in ids)


def _read(llama, name, component, layer=None, view="raw", windows=None):
    a = llama.locate(component, layer)
    return Action(Tap(kind="read", name=name, site=name, address=a, pos=Where(index=-1), view=view),
                  Selection(windows=_last(llama) if windows is None else windows, seq_axis=a.seq_axis))


def _write(llama, name, component, layer, mechanism, operand, featurizer=None, params=()):
    a = llama.locate(component, layer)
    tap = Tap(kind="write", name=name, site=name, address=a, pos=Where(index=-1), mechanism=mechanism,
              operand=operand if not isinstance(operand, torch.Tensor) else "cf", params=params)
    return Action(tap, Selection(windows=_last(llama), seq_axis=a.seq_axis), operand, featurizer=featurizer)


def test_compile_and_run_need_nothing_but_the_contract(llama):
    """SPEC.md:1901 [E1] — an engine that offers only the contract (no `model`, no `shell`) compiles
    documents/patching.json to the same plan and runs it to the same values as the nnterp engine."""
    only = Delegate(llama)
    assert not hasattr(only, "model") and not hasattr(only, "shell")
    plan = compiler.compile_document(PATCHING, only, DATA)
    assert plan == compiler.compile_document(PATCHING, llama, DATA)
    got, want = run.run_step(only, plan.steps[0]), run.run_step(llama, plan.steps[0])
    assert got.scores == want.scores
    assert only.width("block_output", 0) == llama.locate("block_output", 0).width == 16


def test_actions_and_batches_are_frozen_dataclasses(llama):
    """SPEC.md:1909 [E2] — what crosses into an engine is a frozen Batch of frozen Actions, each naming its tap,
    selection, operand, steps, featurizer and (gaussian) draw offset; the engines read them by field."""
    action = _read(llama, "head", "lm_head")
    batch = _batch(llama, action)
    for value, field in ((action, "operand"), (batch, "decode")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, 1)
    assert [f.name for f in dataclasses.fields(Action)] == ["tap", "selection", "operand", "steps", "featurizer",
                                                            "draw_offset"]
    assert [f.name for f in dataclasses.fields(Batch)] == ["ids", "mask", "actions", "decode", "grad"]
    assert set(llama.forward(batch)) == {"head"}


class Doubled:
    """A featurizer for the test: f = 2x, x' = f'/2 (so a swap of c in feature space lands c/2)."""

    def featurize(self, x):
        return 2 * x, None

    def inverse(self, f, err, x):
        return f / 2


def test_a_featurized_write_goes_through_featurize_and_inverse_on_both_engines(llama, hooks):
    """SPEC.md:1912 [E3] — a swap of 3.0 in the space of a featurizer that doubles lands 1.5 at the site, read
    back identically on both engines (the same seam), and changes the head the same way."""
    batch = _batch(llama, _write(llama, "w", "block_output", 0, "swap", 3.0, featurizer=Doubled()),
                   _read(llama, "at", "block_output", 0), _read(llama, "head", "lm_head"))
    got_nn, got_hk = llama.forward(batch), hooks.forward(batch)
    assert torch.equal(got_nn["at"], torch.full_like(got_nn["at"], 1.5))
    for name in ("at", "head"):
        assert torch.allclose(got_nn[name], got_hk[name], atol=1e-6, rtol=0), name


def test_a_row_added_to_the_mechanism_table_is_landed_by_both_engines(llama, hooks, monkeypatch):
    """SPEC.md:1917 [E4] — a mechanism added as a row of mechanisms.TABLE (here f' = f·scale + o, with a
    default scale) is landed by both engines through the seam, its params over its defaults."""
    def formula(f, operand, params, context):
        return f * params["scale"] + operand

    row = mechanisms.Mechanism(name="scale_add", formula=formula, operand=True, optional=(("scale", 2.0),))
    monkeypatch.setitem(mechanisms.TABLE, "scale_add", row)
    clean = llama.forward(_batch(llama, _read(llama, "at", "block_output", 0)))["at"]
    for params, scale in (((), 2.0), ((("scale", -1.0),), -1.0)):
        batch = _batch(llama, _write(llama, "w", "block_output", 0, "scale_add", 0.5, params=params),
                       _read(llama, "at", "block_output", 0))
        for eng in (llama, hooks):
            assert torch.allclose(eng.forward(batch)["at"], clean * scale + 0.5, atol=1e-6), (eng.name, scale)


def test_the_mechanism_context_holds_the_value_as_it_arrived(llama, hooks, monkeypatch):
    """SPEC.md:1917 [E4] — `context.f0()` is the tap's value before its first write: after a swap of 9.0, a
    second write returning 2·f0 lands twice the clean value, not 18. A number operand reaches the formula
    as a 0-d float32 tensor; a tensor operand of another shape is refused with the seam's text."""
    seen = []

    def formula(f, operand, params, context):
        seen.append(operand)
        return 2 * context.f0()

    monkeypatch.setitem(mechanisms.TABLE, "twice_f0", mechanisms.Mechanism("twice_f0", formula, operand=True))
    clean = llama.forward(_batch(llama, _read(llama, "at", "block_output", 0)))["at"]
    batch = _batch(llama, _write(llama, "nine", "block_output", 0, "swap", 9.0),
                   _write(llama, "w", "block_output", 0, "twice_f0", 1.0), _read(llama, "at", "block_output", 0))
    for eng in (llama, hooks):
        assert torch.allclose(eng.forward(batch)["at"], 2 * clean, atol=1e-6), eng.name
    assert all(o.shape == () and o.dtype == torch.float32 for o in seen)
    wrong = _write(llama, "w", "block_output", 0, "swap", torch.zeros(2, 1, 3))
    for eng in (llama, hooks):
        with pytest.raises(Refusal) as refused:
            eng.forward(_batch(llama, wrong))
        assert refused.value.message == ("write 'w' lands (2, 1, 16) values but its operand 'cf' holds (2, 1, 3); "
                                         "the site and the operand's site must have the same width")
        assert (refused.value.stage, refused.value.path) == ("run", "writes.w")


def test_the_shared_parts_exist_once_in_the_contract():
    """SPEC.md:1925 [E5] — neither engine overrides the logits view, the inputs, the run record or the width;
    the pad-token fix-up is resolve.with_pad, used by both."""
    for cls in (nnterp.NNterpEngine, HooksEngine):
        for name in ("viewed", "inputs", "run_record", "width"):
            assert getattr(cls, name) is getattr(contract.Engine, name), (cls.__name__, name)

    class NoPad:
        pad_token, eos_token = None, "</s>"
    assert resolve.with_pad(NoPad()).pad_token == "</s>"


def test_the_contract_is_the_methods_an_engine_implements():
    """SPEC.md:1901 [E1] — `contract.Engine`'s abstract methods are the eight an engine implements, an engine
    missing one cannot be made, and the contract describes no component (the `model` verb's text is cli.py's)."""
    assert contract.Engine.__abstractmethods__ == {"forward", "generate", "frozen", "final_modules", "head_weight",
                                                   "input_device", "generation_config", "detail"}
    every_but_frozen = {k: v for k, v in vars(Delegate).items() if k == "__init__" or not k.startswith("_")}
    del every_but_frozen["frozen"]
    with pytest.raises(TypeError, match="abstract method frozen"):
        type("NoFrozen", (contract.Engine,), every_but_frozen)(None)
    assert not hasattr(contract.Engine, "describe_components")


def test_the_model_verb_answer_is_built_from_the_contract_alone(llama):
    """SPEC.md:1925 [E5] — the CLI's component description of an engine that offers only the contract is the
    nnterp engine's, its text included; each place's line is the one the answer's fields spell."""
    from causalab_ref import cli
    got, want = cli.describe_components(Delegate(llama)), cli.describe_components(llama)
    assert got["components"] == want["components"]
    assert got["text"].splitlines()[1:] == want["text"].splitlines()[1:]
    assert got["text"].splitlines()[0] == want["text"].splitlines()[0].replace("via nnterp", "via delegate")
    assert "  block_output[0]          ok   width=16" in want["text"].splitlines()
    assert "  attention_query[0]       ok   width=16  op=attention_interface_0" in want["text"].splitlines()


def _flags(params) -> list[bool]:
    return [p.requires_grad for p in params]


def test_frozen_turns_off_every_weight_and_gives_each_its_own_flag_back(llama, hooks):
    """SPEC.md:1943 [E8] — on both engines, inside `frozen()` no weight of the model asks for a gradient; on
    the way out (the block raising too) each gets its own flag back: one turned off beforehand stays off."""
    for eng, params in ((llama, list(llama.model._module.parameters())),
                        (hooks, list(hooks.hf_model.parameters()))):
        params[0].requires_grad_(False)
        before = _flags(params)
        try:
            with eng.frozen():
                assert not any(_flags(params)), eng.name
            assert _flags(params) == before
            with pytest.raises(ZeroDivisionError), eng.frozen():
                1 / 0
            assert _flags(params) == before and before[1:] == [True] * (len(params) - 1), eng.name
        finally:
            params[0].requires_grad_(True)


def test_a_fit_on_an_engine_offering_only_the_contract_leaves_the_model_untrained(llama, tmp_path):
    """SPEC.md:1943 [E8] — a DAS fit run on an engine that offers only the contract (no `model`, no
    `hf_model`): during each of its passes no weight of the model asks for a gradient, after it no weight holds
    one, and each weight's flag is what it was before the fit."""
    params = list(llama.model._module.parameters())
    params[0].requires_grad_(False)
    before, seen = _flags(params), []

    class Watching(Delegate):
        def forward(self, batch):
            seen.append((batch.grad, any(_flags(params))))
            return super().forward(batch)

    raw = json.loads((ROOT / "documents" / "das.json").read_text())
    raw["steps"]["fit"]["epochs"] = 1
    eng = Watching(llama)
    try:
        run.execute(compiler.compile_document(raw, eng, DATA), eng, tmp_path / "out", progress=False)
        assert (True, False) in seen and (True, True) not in seen  # the fit's passes, all with the model frozen
        assert all(p.grad is None for p in params)
        assert _flags(params) == before
    finally:
        params[0].requires_grad_(True)


def test_an_unknown_or_missing_device_is_refused_in_one_line(capsys):
    """SPEC.md:624 [R21] — `--device-map gpu` and a CUDA device this machine lacks are refused at validation,
    one line each, before any model loads; on every verb that takes the flag."""
    from causalab_ref import cli
    doc = str(ROOT / "documents" / "patching.json")
    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    cases = ((["validate", doc, "--device-map", "gpu"], "validation: --device-map: --device-map 'gpu' is not a "
              "device map; write cpu, cuda, cuda:N or auto"),
             (["explain", doc, "--device-map", missing], f"validation: --device-map: --device-map {missing}: this "
              f"machine has {missing[5:]} CUDA device(s); write --device-map cpu, or a cuda:N below that count"),
             (["model", "fixture:tiny-llama", "--device-map", "cuda:x"], "validation: --device-map: --device-map "
              "'cuda:x' is not a device map; write cpu, cuda, cuda:N or auto"))
    for argv, line in cases:
        assert cli.main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines() == [line]


def test_the_device_map_loads_both_engines_and_is_recorded(llama):
    """SPEC.md:624 [R21] — `auto` loads both engines (on this machine, onto the cpu), the forward's numbers are
    the default engine's, and the run record carries the map and the device."""
    spec = Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32")
    batch = _batch(llama, _write(llama, "w", "block_output", 0, "swap", 3.0), _read(llama, "head", "lm_head"))
    want = llama.forward(batch)["head"]
    for kind in ("nnterp", "hooks"):
        eng = loading.load(spec, kind=kind, device_map="auto")
        assert torch.allclose(eng.forward(batch)["head"], want, atol=1e-6), kind
        record = eng.run_record(None)
        assert (record["device_map"], record["device"]) == ("auto", "cpu")
    assert llama.run_record(None)["device_map"] == "cpu"


def test_the_model_verb_takes_dtype_and_device_map(capsys):
    """SPEC.md:624 [R21] — `model KEY --dtype bf16 --device-map cpu` answers as without them and says both."""
    from causalab_ref import cli
    assert cli.main(["--json", "model", "fixture:tiny-gpt2", "--dtype", "bf16", "--device-map", "cpu"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["dtype"], got["device_map"]) == ("bf16", "cpu")
    assert got["components"]["block_output[0]"] == {"resolves": True, "width": 32, "op": None}


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_read_is_copied_only_where_it_is_a_view_of_a_tensor_the_forward_may_still_change(llama):
    """SPEC.md:1742 [Q13] a read of one run of positions at the residual stream is a copy (changing the tensor
    afterwards leaves it as read); the whole of the head's output is kept as it is; part of the head is copied;
    an index gather is already the read's own."""
    x = torch.randn(3, 5, 6)
    kept = seam.read(x, _read(llama, "r", "block_output", 0, windows=((4,),) * 3))
    before = kept.clone()
    x.mul_(0)
    assert not _shares(kept, x) and torch.equal(kept, before)
    head = torch.randn(3, 1, 6)
    assert _shares(seam.read(head, _read(llama, "r", "lm_head", windows=((0,),) * 3)), head)
    wider = torch.randn(3, 2, 6)
    assert not _shares(seam.read(wider, _read(llama, "r", "lm_head", windows=((1,),) * 3)), wider)
    ragged = seam.read(x, _read(llama, "r", "block_output", 0, windows=((4,), (3,), (4,))))
    assert not _shares(ragged, x) and torch.equal(ragged[:, 0], torch.stack([x[0, 4], x[1, 3], x[2, 4]]))


def test_a_write_at_logits_after_a_read_of_the_whole_head_leaves_the_read_as_it_was(llama, hooks):
    """SPEC.md:1742 [Q13] the head read uncopied is the head as computed: a swap at `logits` later in the same forward
    replaces the tensor (a scatter writes a copy), so the read equals a forward that only reads, on both engines."""
    clean = llama.forward(_batch(llama, _read(llama, "head", "lm_head")))["head"]
    batch = _batch(llama, _read(llama, "head", "lm_head"), _write(llama, "w", "logits", None, "swap", 7.0),
                   _read(llama, "after", "logits"))
    for eng in (llama, hooks):
        got = eng.forward(batch)
        assert torch.equal(got["head"], clean), eng.name
        assert torch.equal(got["after"], torch.full_like(got["after"], 7.0)), eng.name

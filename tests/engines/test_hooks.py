"""hooks.py: the hooks engine against the nnterp engine on the four fixtures.

Both engines resolve addresses with address.locate; the hooks engine runs them with plain
torch forward hooks on a transformers model, so equal reads here mean the boundary a hook sees
is the tensor nnterp's accessor names (seed 004:100 "Both engines reach it").
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import inprocess

from causalab_ref.locations import address
from causalab_ref import cli
from causalab_ref.engines import loading
from causalab_ref.positions import resolve
from causalab_ref.runs.plan import Tap
from causalab_ref.shapes import Action, Batch
from causalab_ref.engines.hooks import HooksEngine
from causalab_ref.shapes import Model, Refusal, Selection, Where

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("llama", "gpt2", "gemma2", "gptoss")
TEXTS = ["If today is Thursday, tomorrow is", "Monday comes", "The day after Friday is"]
BOUNDARY = tuple(n for n in address.TABLE if n not in address.INTERIORS and n != "attention_probs")


def _spec(family: str, attn=None) -> Model:
    return Model(key=f"fixture:tiny-{family}", revision="seeded", dtype="fp32", attn_implementation=attn)


@pytest.fixture(scope="module")
def engines():
    """(nnterp, hooks) per family, loaded once with weights."""
    cache: dict = {}

    def get(family):
        if family not in cache:
            cache[family] = (loading.load(_spec(family), "nnterp"), loading.load(_spec(family), "hooks"))
        return cache[family]
    yield get
    cache.clear()


def _batch(tok):
    ids, mask, frame = resolve.frame_of_texts(tok, TEXTS)
    return ids, mask, frame


def _read(name, addr, windows, ragged=False, groups=None, take=None):
    tap = Tap(kind="read", name=name, site=name, address=addr, pos=Where(index=-1))
    return Action(tap, Selection(windows=windows, seq_axis=addr.seq_axis, ragged=ragged, groups=groups, take=take))


def _write(name, addr, windows, operand, ragged=False, groups=None, take=None):
    tap = Tap(kind="write", name=name, site=name, address=addr, pos=Where(index=-1), mechanism="swap",
              operand="cf" if isinstance(operand, torch.Tensor) else operand)
    return Action(tap, Selection(windows=windows, seq_axis=addr.seq_axis, ragged=ragged, groups=groups, take=take),
                  operand)


def _windows(ids, frame):
    """index -1, every content position (ragged), and the last n positions every row has (rectangular)."""
    n = len(ids[0])
    shortest = min(e - s for s, e in zip(frame.starts, frame.ends))
    last = tuple((n - 1,) for _ in ids)
    every = tuple(tuple(range(s, e)) for s, e in zip(frame.starts, frame.ends))
    rect = tuple(tuple(range(n - shortest, n)) for _ in ids)
    return last, every, rect


def _sorted(items):
    return sorted(items, key=lambda item: (item.address.rank, 0 if item.tap.kind == "write" else 1))


def _both(nn, hk, ids, mask, items):
    batch = Batch(ids=ids, mask=mask, actions=tuple(items))
    return nn.forward(batch), hk.forward(batch)


# ---------------------------------------------------------------- reads


@pytest.mark.parametrize("family", FAMILIES + ("olmo2", "qwen3next"))
def test_every_boundary_read_equals_the_nnterp_engines(engines, family):
    """SPEC.md:394 [L6] / SPEC.md:399 [L7] / SPEC.md:548 [R4] / seed 004:100 / SPEC.md:488 [L24] — every boundary
    component that resolves (layer 0 and the last layer) reads the same values through a hook as
    through nnterp: at {"index": -1}, over every content position, over a rectangular window, and
    one head of attention_premix (SPEC.md:421 [L13]); the post-norm and hybrid fixtures' placements too (their
    attention places at the hybrid's softmax layer 1)."""
    nn, hk = engines(family)
    ids, mask, frame = _batch(nn.tokenizer)
    last, every, rect = _windows(ids, frame)
    items, resolved = [], []
    for name in BOUNDARY:
        layers = (0, nn.num_layers - 1) if address.TABLE[name].layered else (None,)
        for layer in layers:
            try:
                addr = nn.locate(name, layer)
            except Refusal as refusal:
                with pytest.raises(Refusal) as hooked:
                    hk.locate(name, layer)
                assert hooked.value.message == refusal.message
                continue
            assert hk.locate(name, layer) == addr
            label = addr.label()
            resolved.append(label)
            items += [_read(f"{label}/last", addr, last), _read(f"{label}/every", addr, every, ragged=True),
                      _read(f"{label}/rect", addr, rect)]
            if name == "attention_premix":
                items.append(_read(f"{label}/head1", addr, last, groups=addr.heads, take=(1,)))
    at = 1 if family == "qwen3next" else 0
    expected = {"input_ids", "embeddings", "ln_final", "lm_head", "logits", "block_input[0]", "block_output[0]",
                f"attention_output[{at}]", f"attention_premix[{at}]", "mlp_output[0]", "block_mid[0]", "mlp_input[0]"}
    assert expected <= set(resolved)
    if family != "gptoss":
        assert {"mlp_activation[0]", "mlp_neuron_output[0]"} <= set(resolved)
    got_nn, got_hk = _both(nn, hk, ids, mask, _sorted(items))
    assert set(got_nn) == set(got_hk) == {item.name for item in items}
    for name in got_nn:
        a, b = got_nn[name], got_hk[name]
        assert a.shape == b.shape, name
        if a.dtype == torch.long:
            assert torch.equal(a, b), name
        else:
            assert torch.allclose(a, b, atol=1e-6, rtol=0), (name, (a - b).abs().max())
    # the shapes are select.py's: rectangular (rows, w, F), ragged (total, F)
    width = nn.locate("block_output", 0).width
    assert got_hk["block_output[0]/last"].shape == (len(TEXTS), 1, width)
    assert got_hk["block_output[0]/every"].shape == (sum(len(w) for w in every), width)


# ---------------------------------------------------------------- writes


@pytest.mark.parametrize("family", FAMILIES)
def test_a_swap_at_block_output_then_a_head_read_agree(engines, family):
    """SPEC.md:548 [R4] / SPEC.md:421 [L13] — a swap (a tensor operand, and a number) at block_output[0]
    on the last token, then reads downstream and at the written address itself, equal on both engines;
    the write changed the head's output."""
    nn, hk = engines(family)
    ids, mask, frame = _batch(nn.tokenizer)
    last, every, _rect = _windows(ids, frame)
    out0, head = nn.locate("block_output", 0), nn.locate("lm_head", None)
    operand = torch.randn(len(TEXTS), 1, out0.width, generator=torch.Generator().manual_seed(0))
    clean = hk.forward(Batch(ids=ids, mask=mask, actions=(_read("head", head, last),)))["head"]
    for value in (operand, 3.0):
        items = _sorted([_write("patch", out0, last, value), _read("at", out0, every, ragged=True),
                         _read("head", head, last)])
        got_nn, got_hk = _both(nn, hk, ids, mask, items)
        for name in ("at", "head"):
            assert torch.allclose(got_nn[name], got_hk[name], atol=1e-6, rtol=0), (family, name)
        written = got_hk["at"][[sum(len(w) for w in every[:r + 1]) - 1 for r in range(len(TEXTS))]]
        expect = operand[:, 0] if isinstance(value, torch.Tensor) else torch.full_like(written, value)
        assert torch.equal(written, expect)
        assert not torch.allclose(got_hk["head"], clean)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_input_side_write_of_one_head_agrees(engines, family):
    """SPEC.md:421 [L13] — a write at an input boundary (attention_premix, a forward pre-hook) of one head
    over every content position lands the same as nnterp's, read back at block_output and logits."""
    nn, hk = engines(family)
    ids, mask, frame = _batch(nn.tokenizer)
    last, every, _rect = _windows(ids, frame)
    layer = nn.num_layers - 1
    premix = nn.locate("attention_premix", layer)
    items = _sorted([_write("zero", premix, every, 0.0, ragged=True, groups=premix.heads, take=(0,)),
                     _read("premix", premix, last), _read("out", nn.locate("block_output", layer), last),
                     _read("logits", nn.locate("logits", None), last)])
    got_nn, got_hk = _both(nn, hk, ids, mask, items)
    for name in got_nn:
        assert torch.allclose(got_nn[name], got_hk[name], atol=1e-6, rtol=0), (family, name)
    per_head = got_hk["premix"].reshape(len(TEXTS), premix.heads, -1)
    assert torch.equal(per_head[:, 0], torch.zeros_like(per_head[:, 0]))
    assert per_head[:, 1:].abs().sum() > 0


def test_gemma2_lm_head_and_logits_differ_by_the_softcap_on_both_engines(engines):
    """SPEC.md:403 [L9] / seed 004:98 — a swap of 100.0 into the head reads 100.0 at lm_head and
    tanh(100/30)*30 at logits; the hooks engine reaches logits as the root's output field."""
    nn, hk = engines("gemma2")
    ids, mask, frame = _batch(nn.tokenizer)
    last, _every, _rect = _windows(ids, frame)
    head, logits = nn.locate("lm_head", None), nn.locate("logits", None)
    items = _sorted([_write("hundred", head, last, 100.0), _read("head", head, last), _read("logits", logits, last)])
    got_nn, got_hk = _both(nn, hk, ids, mask, items)
    capped = torch.tanh(torch.tensor(100.0 / 30.0)) * 30.0
    for got in (got_nn, got_hk):
        assert torch.all(got["head"] == 100.0)
        assert torch.allclose(got["logits"], capped.expand_as(got["logits"]), atol=1e-5)
    # and a write at logits itself lands after the cap
    items = _sorted([_write("seven", logits, last, 7.0), _read("logits", logits, last)])
    got_nn, got_hk = _both(nn, hk, ids, mask, items)
    assert torch.all(got_hk["logits"] == 7.0) and torch.equal(got_nn["logits"], got_hk["logits"])


@pytest.mark.parametrize("family", ("llama", "gemma2"))
def test_a_logits_view_read_agrees(engines, family):
    """SPEC.md:406 [L10] / SPEC.md:403 [L9] — a residual read with "view": "logits" goes through the final
    norm, the head and (Gemma-2) the softcap on both engines; at the last layer's output it is the logits."""
    nn, hk = engines(family)
    ids, mask, frame = _batch(nn.tokenizer)
    last, _every, _rect = _windows(ids, frame)
    out = nn.locate("block_output", nn.num_layers - 1)
    lens = Action(Tap(kind="read", name="lens", site="resid", address=out, pos=Where(index=-1), view="logits"),
                  Selection(windows=last, seq_axis=1))
    items = _sorted([lens, _read("logits", nn.locate("logits", None), last)])
    got_nn, got_hk = _both(nn, hk, ids, mask, items)
    assert got_hk["lens"].shape == got_hk["logits"].shape
    assert torch.allclose(got_nn["lens"], got_hk["lens"], atol=1e-6, rtol=0)
    assert torch.allclose(got_hk["lens"], got_hk["logits"], atol=1e-5)


# ---------------------------------------------------------------- a row as if alone

SHORT, LONG = "If today is Thursday, tomorrow is", "The day after the day after Friday is surely a day that"


def _patched_reads(eng, texts):
    """A swap of 0.5 at block_output[0] on the last token, then the last layer's output and the logits there."""
    ids, mask, _frame = resolve.frame_of_texts(eng.tokenizer, texts)
    last = tuple((len(ids[0]) - 1,) for _ in ids)
    items = _sorted([_write("half", eng.locate("block_output", 0), last, 0.5),
                     _read("out", eng.locate("block_output", eng.num_layers - 1), last),
                     _read("logits", eng.locate("logits", None), last)])
    return mask, eng.forward(Batch(ids=ids, mask=mask, actions=tuple(items)))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_row_reads_the_same_alone_and_left_padded_on_both_engines(engines, family):
    """SPEC.md:616 [R20] — the short row alone and the same row left-padded beside a longer prompt read the
    same (a write, then the last layer and the logits at -1) to 1e-5, on both engines."""
    for eng in engines(family):
        _mask, alone = _patched_reads(eng, [SHORT])
        mask, padded = _patched_reads(eng, [SHORT, LONG])
        assert mask[0][0] == 0, "the short row is left-padded in the batch"
        for name in ("out", "logits"):
            assert torch.allclose(alone[name][0], padded[name][0], atol=1e-5, rtol=0), (family, eng.name, name)


def _observe_document(family: str) -> dict:
    return {"model": {"key": f"fixture:tiny-{family}", "revision": "seeded", "dtype": "fp32"},
            "roles": {"base": {"field": "input"}},
            "sites": {"out": {"component": "block_output", "layers": [0]}, "head": {"component": "lm_head"}},
            "interventions": {"half": {
                "reads": {"logits": {"site": "head", "pos": -1, "model": "patched", "input": "base"}},
                "writes": {"w": {"site": "out", "pos": -1, "mechanism": "swap", "operand": 0.5}},
                "models": {"patched": {"input": "base", "writes": ["w"]}},
                "metrics": {"ce": {"kind": "cross_entropy", "of": "logits", "target": "answer",
                                   "token_form": "space_prefixed"}}}},
            "steps": {"score": {"kind": "observe", "interventions": "half", "rows": {"base": "t/rows"},
                                "saves": [{"value": "ce", "file_path": "ce.json"}]}}}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_rows_metric_is_the_same_alone_padded_and_under_batch_size_one(engines, family, tmp_path):
    """SPEC.md:616 [R20] / SPEC.md:588 [R11] — a document's metric for the short row is the same when the row
    is alone, beside a longer row (left-padded), and beside it under --batch-size 1, to 1e-5."""
    from causalab_ref.runs import compile as compiler
    from causalab_ref.runs import run
    nn = engines(family)[0]
    values = []
    for rows, batch_size in (([SHORT], None), ([SHORT, LONG], None), ([SHORT, LONG], 1)):
        (tmp_path / "t").mkdir(exist_ok=True)
        (tmp_path / "t" / "rows.json").write_text(json.dumps([{"input": r, "answer": " is"} for r in rows]))
        plan = compiler.compile_document(_observe_document(family), nn, tmp_path)
        values.append(run.run_step(nn, plan.steps[0], batch_size).scores["ce"][0])
    assert values[0] is not None
    assert values[1] == pytest.approx(values[0], abs=1e-5) and values[2] == pytest.approx(values[0], abs=1e-5)


# ---------------------------------------------------------------- decoding


def _decode_actions(eng, ids, decode):
    """A prompt read and a continuation write and reads: at fixed steps, and stacked over every step."""
    def act(kind, name, component, layer, pos, steps, operand=None, stacked=0):
        a = eng.locate(component, layer)
        tap = Tap(kind=kind, name=name, site=name, address=a, pos=pos, mechanism="swap" if kind == "write" else None,
                  operand=operand, stacked=stacked)
        windows = tuple((len(ids[0]) - 1,) if pos.frame == "prompt" else (0,) for _ in ids)
        return Action(tap, Selection(windows=windows, seq_axis=a.seq_axis), operand, steps=steps)
    every = tuple(range(decode))
    return (act("read", "prompt", "block_output", 0, Where(index=-1), (0,)),
            act("write", "half", "block_output", 0, Where(frame="generated", index=2), (2,), 0.5),
            act("read", "out", "block_output", eng.num_layers - 1, Where(frame="generated", index=-1), every,
                stacked=decode),
            act("read", "step1", "lm_head", None, Where(frame="generated", index=1), (1,)),
            act("read", "logits", "logits", None, Where(frame="generated", index=-1), every, stacked=decode))


@pytest.mark.parametrize("family", FAMILIES)
def test_both_engines_decode_the_same_tokens_and_per_step_values(engines, family):
    """SPEC.md:1929 [E6] / SPEC.md:345 [P53] — the hooks engine decodes: on a padded batch, with a write at
    step 2, both engines generate the same greedy ids and read the same prompt, per-step and stacked values
    (allclose 1e-6); both hold off the same stop ids, the tokenizer's EOS among them."""
    nn, hk = engines(family)
    ids, mask, _frame = resolve.frame_of_texts(nn.tokenizer, [SHORT, LONG])
    batch = Batch(ids=ids, mask=mask, actions=_decode_actions(nn, ids, 5), decode=5)
    (got_nn, ids_nn), (got_hk, ids_hk) = nn.generate(batch), hk.generate(batch)
    assert ids_nn.shape == (2, 5) and torch.equal(ids_nn, ids_hk)
    assert set(got_nn) == set(got_hk) == {"prompt", "out", "step1", "logits"}
    assert got_hk["out"].shape[:2] == (2, 5)
    for name in got_nn:
        assert torch.allclose(got_nn[name], got_hk[name], atol=1e-6, rtol=0), (family, name)
    assert nn.stop_ids() == hk.stop_ids() and nn.tokenizer.eos_token_id in hk.stop_ids()


# ---------------------------------------------------------------- refusals


def test_interiors_are_refused_by_name_at_compile():
    """SPEC.md:488 [L24] / SPEC.md:415 [L12] / seed-tables B6 "interiors are nnterp-engine only" — the four interiors are
    refused on the hooks engine with the seed's text; attention_probs too, saying why, even under eager
    where the nnterp engine resolves it (SPEC.md:408 [L11])."""
    hk = loading.load(_spec("llama", "eager"), "hooks", weights=False)
    assert isinstance(hk, HooksEngine)
    for name in address.INTERIORS:
        with pytest.raises(Refusal) as refused:
            hk.locate(name, 0, site="q")
        assert refused.value.message == (
            f"component '{name}' is an interior — one argument of one call inside a module's forward — and a "
            "forward hook only sees the module's boundary. It is addressed through nnsight's `.source`, which "
            "has no hooks equivalent; run this document on the nnterp engine.")
        assert (refused.value.stage, refused.value.path) == ("compile", "sites.q")
    with pytest.raises(Refusal) as refused:
        hk.locate("attention_probs", 0)
    assert "a write would change nothing downstream" in refused.value.message
    assert "run this document on the nnterp engine" in refused.value.message
    assert address.locate(hk.shell, "attention_probs", 0).component == "attention_probs"
    described = cli.describe_components(hk)
    assert described["engine"] == "hooks"
    assert not described["components"]["attention_query[0]"]["resolves"]
    assert described["components"]["block_output[0]"]["module"] == "model.layers.0"


def test_the_hooks_module_names_are_the_transformers_names(engines):
    """SPEC.md:390 [L5] / SPEC.md:394 [L6] — nnterp's standardized spelling maps to the transformers module
    by identity in the shell's module tree, never by a rename table."""
    hk = engines("gpt2")[1]
    name = lambda component, layer=None: hk.module_name(hk.locate(component, layer))  # noqa: E731
    assert name("block_output", 0) == "transformer.h.0"
    assert name("attention_premix", 0) == "transformer.h.0.attn.c_proj"
    assert name("embeddings") == "transformer.wte" and name("ln_final") == "transformer.ln_f"
    assert name("lm_head") == "lm_head" and name("logits") == ""
    hk = engines("llama")[1]
    assert hk.module_name(hk.locate("block_mid", 1)) == "model.layers.1.post_attention_layernorm"
    assert hk.module_name(hk.locate("embeddings", None)) == "model.embed_tokens"


# ---------------------------------------------------------------- the command line


def _values(out: Path) -> dict:
    return {f: [r["value"] for r in json.loads((out / f).read_text())] for f in ("iia.json", "logit_diff.json")}


def test_patching_document_gives_the_same_numbers_on_both_engines(tmp_path):
    """SPEC.md:580 [R9] / SPEC.md:548 [R4] — `run documents/patching.json --engine hooks` writes the same
    iia and logit_diff values as the nnterp engine, and run.json records which engine ran."""
    hooks_out, nnterp_out = tmp_path / "hooks", tmp_path / "nnterp"
    done = inprocess.cli("run", "documents/patching.json", "--engine", "hooks", "--out", str(hooks_out))
    assert done.returncode == 0, done.stderr
    assert cli.main(["run", str(ROOT / "documents" / "patching.json"), "--data-root",
                     str(ROOT / "documents" / "data"), "--out", str(nnterp_out)]) == 0
    got, want = _values(hooks_out), _values(nnterp_out)
    for file in want:
        assert len(got[file]) == len(want[file]) == 4
        assert torch.allclose(torch.tensor(got[file]), torch.tensor(want[file]), atol=1e-6, rtol=0), file
    assert json.loads((hooks_out / "run.json").read_text())["engine"] == "HooksEngine"
    assert json.loads((nnterp_out / "run.json").read_text())["engine"] == "NNterpEngine"

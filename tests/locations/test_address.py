"""address.py (the component table, locate), the nnterp engine's value and assign (nnterp.py) and
checkpoint.py (load) on the four fixture families."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from causalab_ref.engines import checkpoint, loading, nnterp
from causalab_ref.locations import address
from causalab_ref.fixtures import builder
from causalab_ref.documents import validate
from causalab_ref.runs import compile as compiler
from causalab_ref.shapes import Model, Refusal

FAMILIES = ("llama", "gpt2", "gemma2", "gptoss")
#: the four above and the two block structures they lack: a post-norm block, a linear/softmax hybrid
ALL_FIXTURES = FAMILIES + ("olmo2", "qwen3next")

# two left-padded rows; every id is below the smallest vocab (1000)
IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 6], [0, 0, 0, 0, 0, 1, 11, 12]])
MASK = torch.tensor([[1] * 8, [0] * 5 + [1] * 3])
INPUTS = {"input_ids": IDS, "attention_mask": MASK}

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())
#: the load-time extension point: the gate projection, between mlp_input (40) and mlp_activation (44)
GATE = {"mlp_gate_output": ("mlp.gate_proj", 42)}


def _dir(family: str) -> str:
    return str(builder.checkpoint_dir(f"fixture:tiny-{family}"))


_EAGER: dict[str, object] = {}


@pytest.fixture(scope="module")
def eager():
    """One eager load (weights, attention probabilities enabled) per family."""
    def get(family):
        if family not in _EAGER:
            _EAGER[family] = checkpoint.standardized(_dir(family), attn_implementation="eager")
        return _EAGER[family]
    yield get
    _EAGER.clear()


@pytest.fixture(scope="module")
def llama_meta():
    """The Llama fixture at its default attention (sdpa), no weights."""
    return checkpoint.standardized(_dir("llama"), weights=False)


@pytest.fixture(scope="module")
def llama_engine_meta():
    """The Llama fixture as an engine, no weights, with the `mlp_gate_output` extra (what compile is given)."""
    return loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), weights=False, extra=GATE)


def _compile_at(eng, name: str, site: dict):
    """Compile the shipped patching document with its swap (read and write) at site `name` = `site`."""
    raw = copy.deepcopy(PATCHING)
    del raw["sites"]["target"]
    raw["sites"][name] = site
    patching = raw["interventions"]["patching"]
    patching["reads"]["v_cf"]["site"] = patching["writes"]["patch"]["site"] = name
    return compiler.compile_document(raw, eng, DATA)


@pytest.fixture(scope="module")
def gemma2_meta():
    """Gemma-2 at its default attention (eager) without enable_attention_probs, no weights."""
    return checkpoint.standardized(_dir("gemma2"), weights=False)


def _located(model, layer: int = 0):
    """Every row that resolves at `layer` (whole-model rows once), in rank order."""
    rows = [a for _, a in address.where_each_lands(model, layer) if not isinstance(a, str)]
    return sorted(rows, key=lambda a: a.rank)


def _read_all(model, layer: int = 0):
    addrs = _located(model, layer)
    got = {}
    with model.trace(INPUTS):
        for a in addrs:
            got[a.component] = nnterp.value(model, a).save()
    return addrs, got


def _read_every_layer(model):
    """{(component, layer): value} for every place that resolves at any layer, read in one trace."""
    addrs = {(a.component, a.layer): a for i in range(model.num_layers) for a in _located(model, i)}
    got = {}
    with model.trace(INPUTS):
        for key, a in sorted(addrs.items(), key=lambda kv: kv[1].rank):
            got[key] = nnterp.value(model, a).save()
    return got


# ---------------------------------------------------------------- the table


def test_describe_lists_the_21_components_as_plain_data():
    """seed 004:5 / SPEC.md:390 [L5] — 21 names; per layer, per head, eager, read-only, width."""
    d = address.describe()
    assert len(d) == 21
    assert d["input_ids"]["read_only"] and not d["input_ids"]["layered"]
    assert d["attention_probs"]["eager"] and d["attention_scores"]["eager"]
    assert d["attention_key"]["head_count"] == "key_value"
    assert d["attention_query"]["head_count"] == "query"
    assert {n for n, r in d.items() if r["interior"]} == {
        "attention_query", "attention_key", "attention_scores", "attention_z"}
    assert {n for n, r in d.items() if not r["layered"]} == {
        "input_ids", "embeddings", "ln_final", "lm_head", "logits"}
    assert d["lm_head"]["width"] == "vocab_size" and d["attention_probs"]["width"] is None
    assert {n for n, r in d.items() if r["residual"]} == {
        "embeddings", "block_input", "block_output", "ln_final"}


# ---------------------------------------------------------------- refusals


def test_unknown_component_is_refused_listing_the_names(llama_meta):
    """seed-tables B11 / SPEC.md:431 [L17] — a name neither the table nor an extension has."""
    with pytest.raises(Refusal) as e:
        address.locate(llama_meta, "block_ouput", 0)
    assert e.value.message.startswith(
        "component 'block_ouput' has no address here, and this model's internals have no "
        "accessor of that name either. causalab_ref's are [")
    assert str(list(address.NAMES)) in e.value.message
    assert e.value.stage == "compile"


def test_layer_outside_the_stack_is_refused_by_number(llama_meta):
    """seed 004:35 / SPEC.md:384 [L3] — `site 'target': layer 24 is outside the model's N layers`."""
    with pytest.raises(Refusal) as e:
        address.locate(llama_meta, "block_output", 24, site="target")
    assert e.value.message == "site 'target': layer 24 is outside the model's 2 layers"
    assert e.value.path == "sites.target" and e.value.stage == "compile"


def test_a_negative_layer_is_refused_at_compile_by_number(llama_engine_meta):
    """SPEC.md:384 [L3] a negative layer is outside the stack: refused when compiled, by number."""
    doc = copy.deepcopy(PATCHING)
    doc["sites"]["target"]["layers"] = [-1]
    validate.document(doc)
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama_engine_meta, DATA)
    assert (refusal.value.stage, refusal.value.message) == ("compile", "site 'target': layer -1 is outside the "
                                                            "model's 2 layers")


def test_per_layer_component_without_a_layer_is_refused(llama_meta):
    """seed 004:90 / SPEC.md:386 [L4] / SPEC.md:399 [L7] — block_output is addressed at one layer."""
    with pytest.raises(Refusal) as e:
        address.locate(llama_meta, "block_output", None)
    assert e.value.message == "'block_output' is addressed at one layer: say which with \"layers\": [i]"


def test_whole_model_component_with_a_layer_is_refused(llama_meta):
    """seed 004:90 / SPEC.md:386 [L4] / SPEC.md:399 [L7] — lm_head takes no layers."""
    with pytest.raises(Refusal) as e:
        address.locate(llama_meta, "lm_head", 0)
    assert e.value.message == "'lm_head' is one per model and takes no layers"


@pytest.mark.parametrize("name", ["attention_probs", "attention_scores"])
def test_pattern_under_sdpa_is_refused_saying_eager(llama_meta, name):
    """seed 004:127 / SPEC.md:408 [L11] — scores and probs exist only under eager attention."""
    with pytest.raises(Refusal) as e:
        address.locate(llama_meta, name, 0)
    assert e.value.message == (
        f"component '{name}' exists only under 'eager' attention, and this model runs 'sdpa': "
        "say \"attn_implementation\": \"eager\" in the document's model block")


def test_probs_refused_when_eager_but_not_enabled(gemma2_meta):
    """seed 004:216 / SPEC.md:408 [L11] — Gemma-2 runs eager by default; the pattern row stays disabled."""
    assert address.locate(gemma2_meta, "attention_scores", 0).op == "attention_interface_0"
    with pytest.raises(Refusal) as e:
        address.locate(gemma2_meta, "attention_probs", 0)
    assert e.value.message == (
        "component 'attention_probs': Attention probabilities are disabled for this model. "
        "Set enable_attention_probs=True when loading the model to enable them.")


@pytest.mark.parametrize("name,accessor", [("mlp_activation", "mlps_activation"),
                                           ("mlp_neuron_output", "mlps_neurons")])
def test_moe_layer_refuses_activation_and_neurons(eager, name, accessor):
    """seed 004:209 / SPEC.md:456 [L20] — a mixture of experts has no single activation; per layer."""
    m = eager("gptoss")
    for layer in range(2):
        with pytest.raises(Refusal) as e:
            address.locate(m, name, layer)
        assert e.value.message == (
            f"component '{name}': {accessor} does not exist on a mixture-of-experts layer, where "
            "a token goes through top-k of N experts and has no single activation. mlps_input "
            "and mlps_output are the block's boundaries and work as usual.")
    assert address.locate(m, "mlp_input", 1).module == "mlp"


# ---------------------------------------------------------------- where each one lands

SEED_PRINTOUT = {  # seed 004:62 — rank, io, llama module, gpt2 module
    "attention_query": ((0, 11), None, None, None),
    "attention_key": ((0, 12), None, None, None),
    "attention_scores": ((0, 15), None, None, None),
    "attention_probs": ((0, 20), "output", "self_attn", "self_attn"),
    "attention_z": ((0, 22), None, None, None),
    "input_ids": ((-1, -2), "input", "embed_tokens", "embed_tokens"),
    "embeddings": ((-1, -1), "output", "embed_tokens", "embed_tokens"),
    "block_input": ((0, 0), "input", "", ""),
    "attention_input_norm": ((0, 5), "output", "input_layernorm", "ln_1"),
    "attention_premix": ((0, 25), "input", "self_attn.o_proj", "self_attn.c_proj"),
    "attention_output": ((0, 30), "output", "self_attn", "self_attn"),
    "block_mid": ((0, 33), "input", "post_attention_layernorm", "ln_2"),
    "mlp_input_norm": ((0, 36), "output", "post_attention_layernorm", "ln_2"),
    "mlp_input": ((0, 40), "input", "mlp", "mlp"),
    "mlp_activation": ((0, 44), "output", "mlp.act_fn", "mlp.act"),
    "mlp_neuron_output": ((0, 47), "input", "mlp.down_proj", "mlp.c_proj"),
    "mlp_output": ((0, 50), "output", "mlp", "mlp"),
    "block_output": ((0, 60), "output", "", ""),
    "ln_final": ((None, 1000), "output", "ln_final", "ln_final"),
    "lm_head": ((None, 1001), "output", "lm_head", "lm_head"),
    "logits": ((None, 1002), "output", "", ""),
}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_where_each_one_lands_matches_the_seed_printout(eager, family):
    """seed 004:62 / SPEC.md:436 [L18] / SPEC.md:394 [L6] — module, io and rank per component on Llama and GPT-2."""
    m = eager(family)
    n = m.num_layers
    for name, a in address.where_each_lands(m):
        rank, io, llama_mod, gpt2_mod = SEED_PRINTOUT[name]
        expect_rank = (n if rank[0] is None else rank[0], rank[1])
        assert (a.rank, a.io, a.module) == (
            expect_rank, io, llama_mod if family == "llama" else gpt2_mod), name


def test_gemma2_sandwich_reads_contributions_after_the_post_norms(eager):
    """seed 004:84 / SPEC.md:450 [L19] — block_mid/mlp_input_norm at pre_feedforward_layernorm;
    attention_output/mlp_output are the post-norms' outputs."""
    m = eager("gemma2")
    got = {n: (address.locate(m, n, 0).module, address.locate(m, n, 0).io) for n in
           ("block_mid", "mlp_input_norm", "attention_output", "mlp_output")}
    assert got == {"block_mid": ("pre_feedforward_layernorm", "input"),
                   "mlp_input_norm": ("pre_feedforward_layernorm", "output"),
                   "attention_output": ("post_attention_layernorm", "output"),
                   "mlp_output": ("post_feedforward_layernorm", "output")}


def test_interiors_carry_the_operation_found_by_the_needle(llama_meta):
    """seed 004:139 / SPEC.md:415 [L12] — one op matches "attention_interface(" (here attention_interface_0)."""
    for name in ("attention_query", "attention_key", "attention_z"):
        a = address.locate(llama_meta, name, 1)
        assert (a.op, a.module, a.io) == ("attention_interface_0", None, None)
    assert address.locate(llama_meta, "attention_query", 0).seq_axis == 2
    assert address.locate(llama_meta, "attention_z", 0).seq_axis == 1


def test_find_op_refuses_unless_exactly_one_operation_matches(llama_meta):
    """seed 004:139 / SPEC.md:415 [L12] — refused unless exactly one matches, listing the operations."""
    with pytest.raises(Refusal) as e:
        address.find_op(llama_meta.layers[0].self_attn, needle="no_such_call(")
    assert "attention_interface_0" in e.value.message
    assert "ALL_ATTENTION_FUNCTIONS_get_interface_0" in e.value.message


def test_per_head_width_uses_the_right_head_count(eager):
    """seed 004:165 / SPEC.md:429 [L16] — GptOss: query 64 (4 heads), key 32 (2 kv heads)."""
    m = eager("gptoss")
    q, k = address.locate(m, "attention_query", 0), address.locate(m, "attention_key", 0)
    assert (q.width, q.heads, k.width, k.heads) == (64, 4, 32, 2)
    assert address.locate(m, "attention_premix", 0).width == 64


def test_extra_name_is_a_boundary_without_width(llama_meta):
    """seed 004:259 / SPEC.md:480 [L23] — an added name: module output, per layer, no width."""
    a = address.locate(llama_meta, "mlp_gate_output", 0, extra={"mlp_gate_output": ("mlp.gate_proj", 42)})
    assert (a.module, a.io, a.rank, a.width) == ("mlp.gate_proj", "output", (0, 42), None)
    with pytest.raises(Refusal) as e:
        address.width(a)
    assert e.value.message == (
        "the width of 'mlp_gate_output' is not a fact about the model: it depends on the batch "
        "(the attention pattern's key axis) or is not a tensor's")


# ---------------------------------------------------------------- reading in a trace


@pytest.mark.parametrize("family", ALL_FIXTURES)
def test_every_component_reads_in_one_trace_in_rank_order(eager, family):
    """seed 004:62 / SPEC.md:394 [L6] / SPEC.md:436 [L18] — all resolving components, one trace, forward order; shapes.
    (Qwen3-Next at its softmax layer 1; GptOss and Qwen3-Next's layer 1 lack the two MoE places, OLMo-2 the two
    input norms.)"""
    m = eager(family)
    addrs, got = _read_all(m, 1 if family == "qwen3next" else 0)
    assert len(addrs) == (19 if family in ("gptoss", "olmo2", "qwen3next") else 21)
    b, t = IDS.shape
    for a in addrs:
        shape = tuple(got[a.component].shape)
        if a.component == "input_ids":
            assert shape == (b, t)
        elif a.component in ("attention_query", "attention_key"):
            assert shape == (b, a.heads, t, a.width // a.heads), a.component
        elif a.component == "attention_z":
            assert shape == (b, t, a.heads, a.width // a.heads)
        elif a.component in ("attention_scores", "attention_probs"):
            sink = 1 if (family == "gptoss" and a.component == "attention_scores") else 0
            assert shape == (b, a.heads, t, t + sink), a.component
        else:
            assert shape == (b, t, a.width), a.component


@pytest.mark.parametrize("family", ALL_FIXTURES)
def test_block_identities_hold(eager, family):
    """seed 004 B2 callout / SPEC.md:462 [L21] — at every layer, read in one trace: block_mid = input +
    attention_output, block_output = block_mid + mlp_output, mlp_input_norm == mlp_input, flat attention_z ==
    attention_premix bit for bit; where a structure has no such place (OLMo-2's norms, Qwen3-Next's
    linear layer 0) the identity has nothing to say, and the gated attention of Qwen3-Next is L32's."""
    m = eager(family)
    g = _read_every_layer(m)
    for i in range(m.num_layers):
        at = {c: v for (c, layer), v in g.items() if layer == i}
        assert torch.allclose(at["block_output"], at["block_mid"] + at["mlp_output"], atol=1e-6), i
        if (family, i) != ("qwen3next", 0):
            assert torch.allclose(at["block_mid"], at["block_input"] + at["attention_output"], atol=1e-6), i
        if family != "olmo2":
            assert torch.equal(at["mlp_input_norm"], at["mlp_input"]), i
        if family != "qwen3next":
            assert torch.equal(at["attention_z"].flatten(2), at["attention_premix"]), i
    assert {c for (c, layer) in g if layer == 0} >= {"block_input", "block_mid", "mlp_output", "block_output"}


# ---------------------------------------------------------------- writing in a trace


def test_gemma2_lm_head_swap_reads_back_softcapped_at_logits(eager):
    """seed 004:98 / SPEC.md:403 [L9] — 100.0 into lm_head reads 100.0 there, tanh(100/30)*30 at logits."""
    m = eager("gemma2")
    head, logits = address.locate(m, "lm_head"), address.locate(m, "logits")
    with m.trace(INPUTS):
        nnterp.assign(m, head, torch.full_like(nnterp.value(m, head), 100.0))
        at_head = nnterp.value(m, head).save()
        at_logits = nnterp.value(m, logits).save()
    assert torch.all(at_head == 100.0)
    assert torch.allclose(at_logits, torch.full_like(at_logits, math.tanh(100 / 30) * 30))


@pytest.mark.parametrize("family", FAMILIES)
def test_query_write_replaces_the_call_inputs(eager, family):
    """stack-facts Tracing rules / SPEC.md:415 [L12] — a query write (zeros) reaches the scores; GPT-2 too."""
    m = eager(family)
    q, s = address.locate(m, "attention_query", 0), address.locate(m, "attention_scores", 0)
    with m.trace(INPUTS):
        nnterp.assign(m, q, torch.zeros_like(nnterp.value(m, q)))
        back = nnterp.value(m, q).save()
        scores = nnterp.value(m, s).save()
    assert torch.all(back == 0)
    real = scores[..., : IDS.shape[1]]
    visible = real > torch.finfo(real.dtype).min / 2
    # a zero query makes every unmasked score of a row the same (0; GptOss shifts by the row max)
    hi = torch.where(visible, real, -torch.inf).amax(-1)
    lo = torch.where(visible, real, torch.inf).amin(-1)
    spread = torch.where(visible.any(-1), hi - lo, torch.zeros_like(hi))
    assert visible.any()
    assert torch.all(spread.abs() < 1e-5)


def _written_then_read(m, write_at: tuple, read_at: tuple, make):
    """In one forward of INPUTS, replace the tensor at `write_at` by `make(it)` and return what `read_at` holds."""
    w, r = address.locate(m, *write_at), address.locate(m, *read_at)
    with m.trace(INPUTS):
        nnterp.assign(m, w, make(nnterp.value(m, w)))
        got = nnterp.value(m, r).save()
    return got


def test_z_write_reaches_premix(eager):
    """SPEC.md:415 [L12] — writing attention_z (replacing the call's output) is what o_proj reads."""
    got = _written_then_read(eager("llama"), ("attention_z", 1), ("attention_premix", 1), torch.ones_like)
    assert torch.all(got == 1)


def test_scores_write_changes_the_pattern(eager):
    """seed 004:122 / SPEC.md:415 [L12] — a write at the softmax's argument is what the pattern comes from."""
    probs = _written_then_read(eager("llama"), ("attention_scores", 0), ("attention_probs", 0), torch.zeros_like)
    t = IDS.shape[1]
    assert torch.allclose(probs[0, 0, -1], torch.full((t,), 1.0 / t))


def test_probs_write_reads_back(eager):
    """seed 004:123 / SPEC.md:408 [L11] — a write at attention_probs is the pattern mixed with."""
    m = eager("gpt2")
    p, z = address.locate(m, "attention_probs", 0), address.locate(m, "attention_z", 0)
    with m.trace(INPUTS):
        cur = nnterp.value(m, p)
        new = torch.zeros_like(cur)
        new[..., 0] = 1.0  # every query attends to key 0
        nnterp.assign(m, p, new)
        back = nnterp.value(m, p).save()
        zz = nnterp.value(m, z).save()
    assert torch.equal(back, new)
    assert torch.allclose(zz[0, 1], zz[0, 0])  # rows attend identically, so z is equal


def test_input_ids_write_is_refused(eager):
    """seed 004:92 / SPEC.md:401 [L8] — input_ids is the only read-only place."""
    m = eager("llama")
    with pytest.raises(Refusal):
        nnterp.assign(m, address.locate(m, "input_ids"), torch.zeros(1))


# ---------------------------------------------------------------- heads and units past the end


def test_a_head_or_unit_past_the_end_is_refused_at_compile_against_the_real_count(llama_engine_meta):
    """seed 004:167 / SPEC.md:427 [L15] — `site 't': head 4 of a 4-head tensor`, `site 't': unit 20 of a
    16-wide tensor`; the last head and the last unit are accepted."""
    premix = {"component": "attention_premix", "layers": [0]}
    _compile_at(llama_engine_meta, "t", {**premix, "heads": [3]})
    with pytest.raises(Refusal) as e:
        _compile_at(llama_engine_meta, "t", {**premix, "heads": [0, 4]})
    assert (e.value.message, e.value.path, e.value.stage) == (
        "site 't': head 4 of a 4-head tensor", "sites.t.heads", "compile")
    out = {"component": "block_output", "layers": [0]}
    _compile_at(llama_engine_meta, "t", {**out, "units": [15]})
    with pytest.raises(Refusal) as e:
        _compile_at(llama_engine_meta, "t", {**out, "units": [20]})
    assert (e.value.message, e.value.path) == ("site 't': unit 20 of a 16-wide tensor", "sites.t.units")


def test_a_write_and_operand_of_different_widths_are_refused_at_compile(llama_engine_meta):
    """SPEC.md:500 [L26] 64 mlp_activation features cannot land in a 16-wide block_output: refused when
    compiled, naming both places."""
    doc = copy.deepcopy(PATCHING)
    doc["sites"]["act"] = {"component": "mlp_activation", "layers": [0]}
    doc["interventions"]["patching"]["reads"]["v_cf"]["site"] = "act"
    with pytest.raises(Refusal) as refusal:
        compiler.compile_document(doc, llama_engine_meta, DATA)
    assert refusal.value.message == ("write 'patch' lands 16 features per position at block_output[0], and its "
                                     "operand 'v_cf' was read with 64 at mlp_activation[0]; a swap needs the same "
                                     "width on both sides")
    assert (refusal.value.stage, refusal.value.path) == ("compile", "interventions.patching.writes.patch")


# ---------------------------------------------------------------- the extension point


def test_units_at_an_extra_name_are_refused_for_want_of_a_width(llama_meta, llama_engine_meta, eager):
    """seed 004:259 / SPEC.md:480 [L23] — an added name has no width, so `units` there (what a featurizer
    would need) is refused with the seed's text at compile; its order puts it in forward order: the gate
    projection (42) reads in one trace between mlp_input (40) and mlp_activation (44), act_fn of it."""
    extra = GATE
    a = address.locate(llama_meta, "mlp_gate_output", 1, extra=extra)
    assert (a.layer, a.heads, a.seq_axis) == (1, None, 1)
    m = eager("llama")
    addrs = [address.locate(m, "mlp_input", 1), address.locate(m, "mlp_gate_output", 1, extra=extra),
             address.locate(m, "mlp_activation", 1)]
    assert [x.rank for x in addrs] == sorted(x.rank for x in addrs)
    with m.trace(INPUTS):
        gate = nnterp.value(m, addrs[1]).save()
        activation = nnterp.value(m, addrs[2]).save()
    act = m.layers[1].mlp.act_fn._module
    assert torch.allclose(act(gate), activation, atol=1e-6)
    with pytest.raises(Refusal) as e:
        _compile_at(llama_engine_meta, "g", {"component": "mlp_gate_output", "layers": [1], "units": [0]})
    assert (e.value.message, e.value.path, e.value.stage) == (
        "the width of 'mlp_gate_output' is not a fact about the model: it depends on the batch "
        "(the attention pattern's key axis) or is not a tensor's", "sites.g.units", "compile")
    lands = dict(address.where_each_lands(llama_meta, 0, extra=extra))
    assert set(lands) == set(address.TABLE)  # the printout is the table's; an extra is asked for by name
    with pytest.raises(Refusal) as e:
        address.locate(llama_meta, "mlp_gate_output", 0, extra={"mlp_gate_output": ("mlp.no_such", 42)})
    assert e.value.message == "component 'mlp_gate_output': this model's layer 0 has no module 'mlp.no_such'"


def test_heads_at_an_added_place_with_no_head_count_is_refused(llama_engine_meta):
    """SPEC.md:424 [L14] heads at a place added with `extra` (no head count) is refused, not a TypeError."""
    with pytest.raises(Refusal) as refusal:
        _compile_at(llama_engine_meta, "target", {"component": "mlp_gate_output", "layers": [0], "heads": [0]})
    assert refusal.value.message.startswith("'mlp_gate_output' is not a per-head tensor; `heads` applies at [")
    assert refusal.value.path == "sites.target.heads"


# ---------------------------------------------------------------- block structures no fixture has


def _neox(tmp_path, parallel: bool) -> str:
    """A tiny GPT-NeoX checkpoint (random weights) with the GPT-2 fixture's tokenizer files."""
    import shutil

    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, use_parallel_residual=parallel,
                        bos_token_id=0, eos_token_id=0)
    where = tmp_path / ("neox-parallel" if parallel else "neox-sequential")
    GPTNeoXForCausalLM(cfg).save_pretrained(str(where))
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(builder.checkpoint_dir("fixture:tiny-gpt2") / f, where / f)
    return str(where)


def _refusals_at_every_layer(m, names) -> dict:
    """{(name, layer): the refusal's message} for each name at each of the model's two layers; a name that
    resolves at a layer is missing from the map (so the comparison fails)."""
    said = {}
    for name in names:
        for layer in range(2):
            try:
                address.locate(m, name, layer)
            except Refusal as refusal:
                said[(name, layer)] = refusal.message
    return said


def test_a_parallel_block_has_no_block_mid_and_no_mlp_input_norm(tmp_path):
    """seed 004:230 / SPEC.md:467 [L22] — GPT-NeoX with use_parallel_residual loads in nnterp 1.3.0; its
    layers keep a post_attention_layernorm, but it norms the block input, so the config flag decides:
    block_mid and mlp_input_norm are refused with a sentence at every layer, the rest resolves. Without
    the flag the same module tree resolves both, and block_mid == block_input + attention_output."""
    m = checkpoint.standardized(_neox(tmp_path, parallel=True), weights=False)
    assert _refusals_at_every_layer(m, ("block_mid", "mlp_input_norm")) == {
        (name, layer): f"component '{name}': layer {layer} is a parallel block, where attention and the MLP both "
        "read the block input: there is no residual stream between them, so there is no such place"
        for name in ("block_mid", "mlp_input_norm") for layer in range(2)}
    assert address.locate(m, "attention_premix", 0).module == "self_attn.dense"
    assert address.locate(m, "mlp_neuron_output", 0).module == "mlp.dense_4h_to_h"
    refused = [n for n, a in address.where_each_lands(m) if isinstance(a, str)]
    assert refused == ["attention_scores", "attention_probs", "block_mid", "mlp_input_norm"]  # sdpa + parallel

    s = checkpoint.standardized(_neox(tmp_path, parallel=False), attn_implementation="eager")
    assert address.locate(s, "block_mid", 0).module == "post_attention_layernorm"
    _, g = _read_all(s)
    assert torch.allclose(g["block_mid"], g["block_input"] + g["attention_output"], atol=1e-6)
    assert torch.equal(g["mlp_input_norm"], g["mlp_input"])


def test_a_document_names_an_extra_component_given_at_load():
    """SPEC.md:480 [L23] — loading.load(extra=...) makes the name addressable from a document: a read there
    compiles to the module's output at (layer, order); `units` there is refused for want of a width."""
    raw = copy.deepcopy(PATCHING)
    raw["sites"]["target"] = {"component": "mlp_gate_output", "layers": [1]}
    eng = loading.load(validate.document(raw).model, weights=False, extra=GATE)
    step = compiler.compile_document(raw, eng, DATA).steps[0]
    taps = {t.name: t for f in step.forwards for t in f.taps}
    assert (taps["v_cf"].address.module, taps["v_cf"].address.io, taps["v_cf"].address.rank) == (
        "mlp.gate_proj", "output", (1, 42))
    bad = copy.deepcopy(raw)
    bad["sites"]["target"]["units"] = [0]
    with pytest.raises(Refusal) as e:
        compiler.compile_document(bad, eng, DATA)
    assert e.value.message.startswith("the width of 'mlp_gate_output' is not a fact about the model")


# ---------------------------------------------------------------- a post-norm block and a hybrid (fixtures)


def test_a_post_norm_block_refuses_the_two_input_norms_and_places_the_rest(eager):
    """seed 004:230 / SPEC.md:467 [L22] — OLMo-2 (norms only after each sublayer): attention_input_norm and
    mlp_input_norm are refused with a sentence at every layer; block_mid is the MLP's input, attention_output
    and mlp_output the post-norms' outputs, so block_output == block_input + attention_output + mlp_output."""
    m = eager("olmo2")
    assert _refusals_at_every_layer(m, ("attention_input_norm", "mlp_input_norm")) == {
        (name, layer): f"component '{name}': layer {layer} is a post-norm block, where each sublayer reads the "
        "residual stream itself and the norm comes after: there is no such place"
        for name in ("attention_input_norm", "mlp_input_norm") for layer in range(2)}
    got = {n: (address.locate(m, n, 1).module, address.locate(m, n, 1).io)
           for n in ("block_mid", "attention_output", "mlp_output")}
    assert got == {"block_mid": ("mlp", "input"), "attention_output": ("post_attention_layernorm", "output"),
                   "mlp_output": ("post_feedforward_layernorm", "output")}
    refused = [n for n, a in address.where_each_lands(m, 1) if isinstance(a, str)]
    assert refused == ["attention_input_norm", "mlp_input_norm"]
    _, g = _read_all(m, 1)
    assert torch.allclose(g["block_output"], g["block_input"] + g["attention_output"] + g["mlp_output"], atol=1e-6)
    assert not torch.allclose(g["block_mid"], g["block_input"])


LINEAR = ("component '{name}': layer 0 is a linear-attention layer (Qwen3NextGatedDeltaNet); "
          "attentions/attention_probabilities are only defined on softmax-attention layers")


def test_a_hybrids_linear_attention_layer_has_no_attention_place(eager):
    """seed 004:228 / SPEC.md:503 [L30] — Qwen3-Next, layer 0 linear (Gated DeltaNet), layer 1 softmax: every
    attention_* place at layer 0 is refused with the seed's sentence naming the layer; the block boundaries
    and the MLP's places resolve there, and every place of layer 1 resolves (but the MoE pair); all of them
    read in one trace, the pattern of layer 1 included."""
    m = eager("qwen3next")
    lands0 = dict(address.where_each_lands(m, 0))
    refused0 = {n: a for n, a in lands0.items() if isinstance(a, str)}
    assert refused0 == {n: LINEAR.format(name=n) for n in address.ATTENTION}
    assert len(address.ATTENTION) == 8
    refused1 = [n for n, a in address.where_each_lands(m, 1) if isinstance(a, str)]
    assert refused1 == ["mlp_activation", "mlp_neuron_output"]  # a mixture of experts at layer 1 (L20)
    g = _read_every_layer(m)
    assert ("attention_probs", 1) in g and ("block_mid", 0) in g and ("mlp_activation", 0) in g
    assert torch.allclose(g[("attention_probs", 1)].sum(-1)[0], torch.ones(4, IDS.shape[1]), atol=1e-5)
    assert all(torch.isfinite(v).all() for v in g.values())


def test_nnterp_alone_cannot_load_the_hybrid_and_the_loader_can():
    """SPEC.md:514 [L31] — nnterp 1.3.0's StandardizedTransformer refuses the hybrid (it checks self_attn on
    layer 0); the loader gives it ignore_attn and checks the pattern at the first softmax layer."""
    from nnterp import StandardizedTransformer
    from nnterp.rename_utils import RenamingError

    with pytest.raises(RenamingError, match="Could not find self_attn module"):
        StandardizedTransformer(_dir("qwen3next"), device_map="cpu", dispatch=False)
    m = checkpoint.standardized(_dir("qwen3next"), attn_implementation="eager", weights=False)
    assert m.attn_probs_available
    assert address.locate(m, "attention_probs", 1).module == "self_attn"


def test_gated_attention_premix_is_z_scaled_by_a_gate(eager):
    """SPEC.md:520 [L32] — on Qwen3-Next's softmax layer o_proj reads flat(attention_z) * sigmoid(gate):
    not z's numbers, each ratio strictly between 0 and 1."""
    _, g = _read_all(eager("qwen3next"), 1)
    z, premix = g["attention_z"].flatten(2), g["attention_premix"]
    assert not torch.equal(z, premix)
    big = z.abs() > 1e-6
    ratio = premix[big] / z[big]
    assert big.any() and bool(((ratio > 0) & (ratio < 1)).all())


def test_mlp_widths_are_read_off_the_down_projection(eager):
    """SPEC.md:525 [L33] — GPT-2's config says intermediate_size 37 (a stray key); the module tree builds 128,
    and both MLP-inner places are 128 wide; on Llama they are its down_proj's in_features, 64."""
    gpt2 = eager("gpt2")
    assert gpt2.config.intermediate_size == 37
    assert [address.locate(gpt2, n, 0).width for n in ("mlp_activation", "mlp_neuron_output")] == [128, 128]
    llama = eager("llama")
    assert [address.locate(llama, n, 1).width for n in ("mlp_activation", "mlp_neuron_output")] == [64, 64]


@pytest.mark.parametrize("family,runs", [("llama", "sdpa"), ("gpt2", "sdpa"), ("gemma2", "eager"), ("gptoss", "eager")])
def test_with_no_attn_implementation_a_model_runs_its_familys_default(family, runs):
    """SPEC.md:410 [L34] stack-facts 11 — with no `attn_implementation` the attention is the loaded model's own:
    sdpa on Llama and GPT-2 (attention_scores refused), eager on Gemma-2 and GptOss (attention_scores resolves)."""
    model = checkpoint.standardized(_dir(family), weights=False)
    assert address.runs_attention(model) == runs
    if runs == "eager":
        assert address.locate(model, "attention_scores", 0).op == "attention_interface_0"
    else:
        with pytest.raises(Refusal, match="exists only under 'eager' attention, and this model runs 'sdpa'"):
            address.locate(model, "attention_scores", 0)

"""Mechanisms on the fixtures, against hand-written transformers forward hooks (SPEC.md §8).

Each mechanism runs in a document (a write at block_output[0]) and its numbers are compared with
a plain transformers forward hook that applies the formula as the reference writes it, on the same
rows and positions: the prompt frame (pos -1) on both engines, and the continuation frame
({"frame": "generated", "all": true}, every decode step) on the nnterp engine. The gaussian noise
is an independent torch draw written here, not the package's.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from causalab_ref.runs import compile as compiler
from causalab_ref.engines import loading
from causalab_ref.fixtures import builder
from causalab_ref.runs import run
from causalab_ref.shapes import Model, Refusal

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
ROWS = json.loads((DATA / "weekdays" / "train.json").read_text())
DECODE = 3

# name -> (write fields, hand formula f, o -> f')
CASES = {
    "swap": ({"mechanism": "swap", "operand": "v_cf"}, lambda f, o: o),
    "add_scaled": ({"mechanism": "add_scaled", "operand": "v_cf", "params": {"scale": -2.5}},
                   lambda f, o: f + -2.5 * o),
    "add_scaled_default": ({"mechanism": "add_scaled", "operand": "v_cf"}, lambda f, o: f + o),
    "lerp": ({"mechanism": "lerp", "operand": "v_cf", "params": {"t": 0.25}}, lambda f, o: 0.75 * f + 0.25 * o),
    "gaussian": ({"mechanism": "gaussian", "params": {"seed": 7, "scale": 0.5}},
                 lambda f, o: f + 0.5 * torch.randn(f.shape, generator=torch.Generator().manual_seed(7))),
    "clamp": ({"mechanism": "clamp", "params": {"lo": -0.05, "hi": 0.1}},
              lambda f, o: torch.minimum(torch.maximum(f, torch.tensor(-0.05)), torch.tensor(0.1))),
    "clamp_hi_only": ({"mechanism": "clamp", "params": {"hi": 0.0}}, lambda f, o: torch.where(f > 0, 0.0, f)),
    "renormalize": (None, lambda f, o: (f + 4.0 * o) * f.norm(dim=-1, keepdim=True)
                    / (f + 4.0 * o).norm(dim=-1, keepdim=True)),
}
FAMILIES = {"llama": "fixture:tiny-llama", "gpt2": "fixture:tiny-gpt2"}


@pytest.fixture(scope="module")
def engines(llama):
    loaded = {("llama", "nnterp"): llama}

    def get(family, kind):
        if (family, kind) not in loaded:
            loaded[(family, kind)] = loading.load(Model(key=FAMILIES[family], revision="seeded", dtype="fp32"),
                                                 kind=kind)
        return loaded[(family, kind)]
    return get


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM
    models = {}

    def get(family):
        if family not in models:
            models[family] = AutoModelForCausalLM.from_pretrained(builder.checkpoint_dir(FAMILIES[family])).eval()
        return models[family]
    return get


def _document(family: str, frame: str, names=tuple(CASES)) -> dict:
    """One intervention: v_cf read on the counterfactual prompts; per mechanism a model `m_<name>` on the
    base prompts with its write(s) at block_output[0], and the written value read back after the write
    (`after_<name>`, or `after_<name>_<k>` per decode step in the continuation frame)."""
    pos = -1 if frame == "prompt" else {"frame": "generated", "all": True}
    reads = {"v_cf": {"site": "target", "pos": -1, "model": "original", "input": "counterfactual"}}
    writes, models = {}, {}
    for name in names:
        fields = CASES[name][0]
        if fields is None:  # renormalize: after a steer at the same site
            writes[f"{name}_steer"] = {"site": "target", "pos": pos, "mechanism": "add_scaled", "operand": "v_cf",
                                       "params": {"scale": 4.0}}
            writes[name] = {"site": "target", "pos": pos, "mechanism": "renormalize"}
        else:
            writes[name] = {"site": "target", "pos": pos, **copy.deepcopy(fields)}
        models[f"m_{name}"] = {"input": "base", "writes": [w for w in writes if w.split("_steer")[0] == name]}
        at = {f"after_{name}": -1} if frame == "prompt" else {
            f"after_{name}_{k}": {"frame": "generated", "index": k} for k in range(DECODE)}
        reads.update({r: {"site": "target", "pos": p, "model": f"m_{name}", "input": "base"} for r, p in at.items()})
    intervention = {"reads": reads, "writes": writes, "models": models}
    if frame == "generated":
        intervention["decode"] = DECODE
    return {
        "model": {"key": FAMILIES[family], "revision": "seeded", "dtype": "fp32"},
        "roles": {"base": {"field": "input"}, "counterfactual": {"field": "counterfactual_inputs[0]"}},
        "sites": {"target": {"component": "block_output", "layers": [0]}},
        "interventions": {"m": intervention},
        "steps": {"s": {"kind": "observe", "interventions": "m",
                        "rows": {"base": "weekdays/train", "counterfactual": "weekdays/train"}}},
    }


def _layer0(model, family):
    return model.model.layers[0] if family == "llama" else model.transformer.h[0]


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Each row's positions from its own first token (left padding at 0), as a row alone would have them."""
    return torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)


def _operand(model, family, tok, cf, frame):
    """Layer 0's output at the last counterfactual token, as the forward the read runs in computes it: a
    forward with each row's own positions, or the first forward of transformers' own decode."""
    kept = []
    handle = _layer0(model, family).register_forward_hook(
        lambda _m, _a, output: kept.append((output[0] if isinstance(output, tuple) else output)[:, -1:].clone()))
    try:
        with torch.no_grad():
            if frame == "prompt":
                model(**cf, position_ids=_positions(cf["attention_mask"]))
            else:
                model.generate(**cf, max_new_tokens=1, do_sample=False, pad_token_id=tok.pad_token_id)
    finally:
        handle.remove()
    return kept[0]


def _hand(model, family, tok, name, frame):
    """The same write by a forward hook on layer 0's output: (values written per call, generated ids)."""
    formula = CASES[name][1]
    base = tok([r["input"] for r in ROWS], return_tensors="pt", padding=True)
    cf = tok([r["counterfactual_inputs"][0] for r in ROWS], return_tensors="pt", padding=True)
    o = _operand(model, family, tok, cf, frame)
    written = []

    def hook(_module, _args, output):
        tensor = (output[0] if isinstance(output, tuple) else output).clone()
        tensor[:, -1:] = formula(tensor[:, -1:].clone(), o)
        written.append(tensor[:, -1:].clone())
        return (tensor, *output[1:]) if isinstance(output, tuple) else tensor

    handle = _layer0(model, family).register_forward_hook(hook)
    try:
        with torch.no_grad():
            if frame == "prompt":
                model(**base, position_ids=_positions(base["attention_mask"]))
                return written, None
            out = model.generate(**base, max_new_tokens=DECODE, min_new_tokens=DECODE, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
    finally:
        handle.remove()
    return written, out[:, base["input_ids"].shape[1]:]


def _run(eng, doc):
    plan = compiler.compile_document(doc, eng, DATA)
    return run.run_step(eng, plan.steps[0]).values


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", ["nnterp", "hooks"])
def test_each_mechanism_equals_a_hand_hook_in_the_prompt_frame(engines, hf, family, kind):
    """SPEC.md:1350 [M1] each mechanism's formula, applied by the write seam at block_output[0] -1, equals a
    transformers forward hook applying the reference's formula to the same rows and position (atol 1e-6),
    on the Llama and GPT-2 fixtures and on both engines."""
    eng = engines(family, kind)
    values = _run(eng, _document(family, "prompt"))
    for name in CASES:
        written, _ = _hand(hf(family), family, eng.tokenizer, name, "prompt")
        torch.testing.assert_close(values[f"after_{name}"], written[0], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", ["nnterp", "hooks"])
def test_each_mechanism_equals_a_hand_hook_at_every_decode_step(engines, hf, family, kind):
    """SPEC.md:1355 [M2] a write at {"frame": "generated", "all": true} applies the formula at every decode
    step (steering): each step's written value and the generated ids equal a hand hook applied to every
    forward of transformers' own greedy decode, on both engines."""
    eng = engines(family, kind)
    values = _run(eng, _document(family, "generated"))
    for name in CASES:
        written, generated = _hand(hf(family), family, eng.tokenizer, name, "generated")
        assert torch.equal(values[f"m_{name}.generated"], generated), name
        for k in range(DECODE):
            torch.testing.assert_close(values[f"after_{name}_{k}"], written[k], atol=1e-6, rtol=0, msg=name)


def test_gaussian_noise_is_the_seeds_independent_draw(llama):
    """SPEC.md:1358 [M3] the noise a gaussian write adds is torch.randn(f.shape) from a new CPU generator
    seeded with `seed`, element for element: the written value minus the clean value over scale."""
    doc = _document("llama", "prompt", ["gaussian"])
    doc["interventions"]["m"]["reads"]["clean"] = {"site": "target", "pos": -1, "model": "original",
                                                    "input": "base"}
    values = _run(llama, doc)
    eps = (values["after_gaussian"] - values["clean"]) / 0.5
    expected = torch.randn((4, 1, 16), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(eps, expected, atol=1e-5, rtol=0)


def test_gaussian_noise_does_not_depend_on_the_batch_size(llama):
    """SPEC.md:1365 [M4] Reading: a row's noise is the same with and without --batch-size (each chunk takes its rows
    of the whole pass's draw), where the original redraws per chunk and repeats chunk 1's noise."""
    doc = _document("llama", "prompt", ["gaussian"])
    plan = compiler.compile_document(doc, llama, DATA)
    whole = run.run_step(llama, plan.steps[0]).values["after_gaussian"]
    chunked = run.run_step(llama, plan.steps[0], rows_per_pass=1).values["after_gaussian"]
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)
    assert not torch.allclose(whole[0], whole[1])


def test_an_integral_seed_written_as_a_float_is_that_integer(llama):
    """SPEC.md:1369 [M5] Reading: `"seed": 7.0` is the integer seed 7 (the original hands torch the float and
    fails); the noise equals `"seed": 7`'s."""
    doc = _document("llama", "prompt", ["gaussian"])
    seven = _run(llama, doc)["after_gaussian"]
    doc["interventions"]["m"]["writes"]["gaussian"]["params"]["seed"] = 7.0
    assert torch.equal(_run(llama, doc)["after_gaussian"], seven)


# ---------------------------------------------------------------- validation of params and ordering


PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())


def _patching_write(**fields) -> dict:
    raw = copy.deepcopy(PATCHING)
    write = raw["interventions"]["patching"]["writes"]["patch"]
    write.update(fields)
    for key in [k for k, v in fields.items() if v is None]:
        del write[key]
    return raw


def _refusal(raw) -> tuple[str, str]:
    from causalab_ref.documents import validate
    with pytest.raises(Refusal) as caught:
        validate.document(raw)
    assert caught.value.stage == "validation"
    return caught.value.path, caught.value.message


W = "interventions.patching.writes.patch"


@pytest.mark.parametrize("fields, path, message", [
    ({"mechanism": "lerp"}, f"{W}.params", "mechanism 'lerp' needs params ['t']"),
    ({"mechanism": "gaussian", "operand": None}, f"{W}.params", "mechanism 'gaussian' needs params ['seed']"),
    ({"mechanism": "swap", "params": {"scale": 2.0}}, f"{W}.params", "mechanism 'swap' takes no params ['scale']"),
    ({"mechanism": "add_scaled", "params": {"t": 1, "scale": 2}}, f"{W}.params",
     "mechanism 'add_scaled' takes no params ['t']"),
    ({"mechanism": "gaussian", "params": {"seed": 1}}, f"{W}.operand", "mechanism 'gaussian' takes no operand"),
    ({"mechanism": "clamp"}, f"{W}.operand", "mechanism 'clamp' takes no operand"),
    ({"mechanism": "renormalize"}, f"{W}.operand", "mechanism 'renormalize' takes no operand"),
    ({"mechanism": "add_scaled", "operand": None}, f"{W}.operand", "mechanism 'add_scaled' needs an operand"),
    ({"mechanism": "clamp", "operand": None}, f"{W}.params", "mechanism 'clamp' needs a bound: params lo, hi or both"),
])
def test_params_are_checked_by_name_both_ways_in_the_reference_order(fields, path, message):
    """SPEC.md:1379 [M8] missing params, then unknown params, then an operand given or missing, then clamp's
    bound: the first failure is the refusal, with the reference's text, at validation."""
    assert _refusal(_patching_write(**fields)) == (path, message)


def test_a_param_is_a_finite_number():
    """SPEC.md:1383 [M9] a param that is a boolean, a string or not finite is refused naming it."""
    for bad in (True, "2", 1e400):
        raw = _patching_write(mechanism="add_scaled", params={"scale": bad})
        path, message = _refusal(raw)
        assert path == f"{W}.params.scale" and "param 'scale' is a finite number" in message


def test_a_seed_that_is_not_whole_is_refused():
    """SPEC.md:1369 [M5] `"seed": 7.5` is not an integer seed and is refused at validation."""
    path, message = _refusal(_patching_write(mechanism="gaussian", operand=None, params={"seed": 7.5}))
    assert path == f"{W}.params.seed"
    assert message.startswith("mechanism 'gaussian': seed 7.5 is not an integer a torch generator takes")


def _renormalized(order) -> dict:
    raw = copy.deepcopy(PATCHING)
    intervention = raw["interventions"]["patching"]
    intervention["writes"]["restore"] = {"site": "target", "pos": -1, "mechanism": "renormalize"}
    intervention["models"]["patched"]["writes"] = order
    return raw


@pytest.mark.parametrize("order", [["restore"], ["restore", "patch"]])
def test_renormalize_alone_or_first_at_its_site_is_refused(order):
    """SPEC.md:1375 [M7] a renormalize must follow at least one other write at its site and be last there."""
    path, message = _refusal(_renormalized(order))
    assert path == f"interventions.patching.models.patched.writes.{order.index('restore')}"
    assert message == ("interventions.patching: model 'patched': renormalize 'restore' restores the norm the other "
                       "writes at site 'target' changed, so it comes after at least one of them and last among them; "
                       "first, or alone, it is the identity")


def test_renormalize_after_a_write_at_its_site_is_accepted():
    """SPEC.md:1375 [M7] after another write at the same site (another position counts), it is accepted."""
    from causalab_ref.documents import validate
    raw = _renormalized(["patch", "restore"])
    raw["interventions"]["patching"]["writes"]["restore"]["pos"] = -2
    assert validate.document(raw)


def test_renormalize_restores_the_norm_the_value_arrived_with(llama):
    """SPEC.md:1372 [M6] renormalize's f0 is the value before the tap's first write: after a steer it restores
    the unwritten norm per row, keeping the steered direction (cosine 1)."""
    doc = _document("llama", "prompt", ["renormalize"])
    intervention = doc["interventions"]["m"]
    intervention["reads"]["clean"] = {"site": "target", "pos": -1, "model": "original", "input": "base"}
    intervention["models"]["steered"] = {"input": "base", "writes": ["renormalize_steer"]}
    intervention["reads"]["steered"] = {"site": "target", "pos": -1, "model": "steered", "input": "base"}
    values = _run(llama, doc)
    after, clean, steered = values["after_renormalize"], values["clean"], values["steered"]
    torch.testing.assert_close(after.norm(dim=-1), clean.norm(dim=-1), atol=1e-6, rtol=1e-5)
    assert (steered.norm(dim=-1) > clean.norm(dim=-1) * 1.5).all()
    cosine = torch.nn.functional.cosine_similarity(after, steered, dim=-1)
    torch.testing.assert_close(cosine, torch.ones_like(cosine), atol=1e-6, rtol=0)


def test_vocab_lists_the_mechanisms_with_their_params():
    """SPEC.md:1439 [M23] `vocab` prints each mechanism with its operand and params (defaults shown)."""
    from causalab_ref import cli
    result = cli.cmd_vocab(None)
    assert result["mechanisms"] == {"swap": "swap(operand)", "add_scaled": "add_scaled(operand, scale=1.0)",
                                    "lerp": "lerp(operand, t)", "gaussian": "gaussian(seed, scale=1.0)",
                                    "clamp": "clamp(lo, hi)", "renormalize": "renormalize()"}
    assert "mechanisms:       swap(operand), add_scaled(operand, scale=1.0)" in result["text"]


def test_the_written_out_float32_bounds_are_torchs():
    """SPEC.md:1787 [Q17] the float32 bounds validation uses are written out (no torch at validation): they are
    exactly torch.finfo(torch.float32)'s max and smallest normal."""
    from causalab_ref.documents import fields
    from causalab_ref.writes import mechanisms

    assert mechanisms.FLOAT32_MAX == float(torch.finfo(torch.float32).max)
    assert fields.FLOAT32_TINY == float(torch.finfo(torch.float32).tiny)

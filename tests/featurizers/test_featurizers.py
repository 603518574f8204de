"""The featurizer maps and bundle files, through featurizers.py and bundles.py (SPEC.md §9)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from causalab_ref.featurizers import bundles, kinds
from causalab_ref.shapes import Refusal

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)

D = 16


def _x(*shape, seed=0):
    return torch.randn(*shape, D, generator=torch.Generator().manual_seed(seed))


def _orthonormal(k, seed=3):
    q, _ = torch.linalg.qr(torch.randn(D, k, generator=torch.Generator().manual_seed(seed)))
    return q


def _encoder(kind, tied=False):
    g = torch.Generator().manual_seed(5)
    tensors = {"W_enc": torch.randn(D, 32, generator=g) / 4, "b_enc": torch.randn(32, generator=g),
               "b_dec": torch.randn(D, generator=g)}
    if not tied:
        tensors["W_dec"] = torch.randn(32, D, generator=g) / 4
    return kinds.KINDS[kind].build(tensors)


def _all():
    gate = kinds.drawn("gate", D, None, 0)
    gate.weight = torch.randn(D, generator=torch.Generator().manual_seed(9))
    return {"identity": kinds.Identity(D), "subspace": kinds.drawn("subspace", D, 8, 0),
            "pca": kinds.KINDS["pca"].build({"weight": _orthonormal(4)}), "gate": gate,
            "sae": _encoder("sae"), "linear": _encoder("linear")}


@pytest.mark.parametrize("kind", ["identity", "subspace", "pca", "gate", "sae", "linear"])
def test_inverse_of_featurize_is_the_activation(kind):
    """SPEC.md:1449 [FZ1] inverse(featurize(x)) == x with no edit, for every kind (rectangular and flat)."""
    featurizer = _all()[kind]
    for x in (_x(3, 2), _x(5)):
        back = kinds.change_through(featurizer, x, lambda f: f)
        assert torch.allclose(back, x, atol=1e-6), (back - x).abs().max()


def test_cayley_basis_is_orthonormal_for_any_parameter():
    """SPEC.md:1451 [FZ2] Q = solve(I − A, (I + A)E) has QᵀQ = I even for a parameter scaled to 50; W = 0 gives E."""
    w = kinds.initial_draw(D, 8, 1) * 50
    q = kinds.cayley(w)
    assert torch.allclose(q.T @ q, torch.eye(8), atol=1e-4)
    assert torch.equal(kinds.cayley(torch.zeros(D, 8)), torch.eye(D)[:, :8])


def test_initial_draw_is_the_seeded_cpu_randn_over_root_d():
    """SPEC.md:1455 [FZ3] the untrained parameter is randn(d, k) on a fresh CPU generator seeded with the seed, / √d."""
    want = torch.randn(D, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float32) / D ** 0.5
    assert torch.equal(kinds.drawn("subspace", D, 8, 7).weight, want)
    assert not torch.equal(kinds.drawn("subspace", D, 8, 8).weight, want)
    with pytest.raises(ValueError, match=r"k must be in 1\.\.16 for a 16-wide activation, got 17"):
        kinds.initial_draw(D, 17, 0)


def test_subspace_swap_with_k_equal_d_is_a_plain_swap():
    """SPEC.md:1458 [FZ4] a subspace swap with k = d lands the operand's activation itself."""
    rot = kinds.drawn("subspace", D, D, 2)
    base, source = _x(4, 1, seed=1), _x(4, 1, seed=2)
    operand = kinds.read(rot, source)
    out = kinds.change_through(rot, base, lambda f, o: o, None, operand)
    assert torch.allclose(out, source, atol=1e-5)


def test_subspace_swap_keeps_the_base_complement():
    """SPEC.md:1458 [FZ4] a k < d swap changes only the part in Q's directions: the base's orthogonal complement stays."""
    rot = kinds.drawn("subspace", D, 4, 2)
    base, source = _x(4, 1, seed=1), _x(4, 1, seed=2)
    out = kinds.change_through(rot, base, lambda f, o: o, None, kinds.read(rot, source))
    q = kinds.cayley(rot.weight)
    complement = torch.eye(D) - q @ q.T
    assert torch.allclose(out @ complement, base @ complement, atol=1e-5)
    assert torch.allclose(out @ q, source @ q, atol=1e-5)


@pytest.mark.parametrize("kind", ["identity", "subspace", "gate", "sae"])
def test_features_touch_only_their_dimensions(kind):
    """SPEC.md:1460 [FZ5] with `features`, the mechanism sees f[..., features]; every other dimension passes
    through bit for bit, and a full-width operand is sliced to the same dimensions."""
    featurizer = _all()[kind]
    f, _ = featurizer.featurize(_x(3, 1))
    operand = torch.arange(f.shape[-1], dtype=torch.float32).expand_as(f)
    seen = []

    def change(part, o):
        seen.append((tuple(part.shape), o))
        return o
    out = kinds.change_features(f, (0, 2), change, operand)
    assert seen[0][0] == (3, 1, 2) and torch.equal(seen[0][1], operand[..., [0, 2]])
    assert torch.equal(out[..., [0, 2]], operand[..., [0, 2]])
    others = [i for i in range(f.shape[-1]) if i not in (0, 2)]
    assert torch.equal(out[..., others], f[..., others])
    assert torch.equal(kinds.change_features(f, (1,), lambda part, o: part + o, 5.0)[..., 1], f[..., 1] + 5.0)


def test_identity_features_leave_other_units_of_the_activation():
    """SPEC.md:1460 [FZ5] through the seam with identity, `features` [0, 2] change units 0 and 2 only."""
    x = _x(2, 1)
    out = kinds.change_through(kinds.Identity(D), x, lambda part, o: o, (0, 2), 0.0)
    assert torch.equal(out[..., [0, 2]], torch.zeros(2, 1, 2))
    keep = [i for i in range(D) if i not in (0, 2)]
    assert torch.equal(out[..., keep], x[..., keep])


def test_sae_error_term_passes_through_an_edit():
    """SPEC.md:1464 [FZ6] inverse(f', err, x) = decode(f') + err: an edit moves x by exactly decode's change."""
    sae = _encoder("sae")
    x = _x(2, 1)
    f, err = sae.featurize(x)
    out = kinds.change_through(sae, x, lambda part: part * 0, (3,))
    t = sae.table
    want = x - f[..., [3]] @ t["W_dec"][[3]]
    assert torch.allclose(out, want, atol=1e-5)
    assert torch.equal(err, x - (f @ t["W_dec"] + t["b_dec"]))


def test_sae_without_w_dec_is_tied():
    """SPEC.md:1467 [FZ7] a missing W_dec decodes with W_encᵀ; missing biases are zeros."""
    sae = kinds.KINDS["sae"].build({"W_enc": _orthonormal(4)})
    assert torch.equal(sae.table["W_dec"], sae.table["W_enc"].T)
    assert torch.equal(sae.table["b_dec"], torch.zeros(D)) and torch.equal(sae.table["b_enc"], torch.zeros(4))
    assert sae.tensors().keys() == {"W_enc"}


def test_linear_is_sae_without_the_relu():
    """SPEC.md:1467 [FZ7] `linear` encodes without the nonlinearity: it keeps negative latents that `sae` zeroes."""
    x = _x(6)
    f_lin, _ = _encoder("linear").featurize(x)
    f_sae, _ = _encoder("sae").featurize(x)
    assert (f_lin < 0).any() and torch.equal(f_sae, torch.relu(f_lin))


def test_unfitted_gate_writes_nothing_and_soft_mask_is_half():
    """SPEC.md:1471 [FZ8] a gate starts at θ = 0: the hard mask (outside a fit's update) is all zeros, so a
    write through it changes nothing; while training the mask is sigmoid(θ/T) = ½."""
    gate = kinds.drawn("gate", D, None, 0)
    x, source = _x(2, 1, seed=1), _x(2, 1, seed=2)
    assert torch.equal(kinds.change_through(gate, x, lambda f, o: o, None, source), x)
    gate.training = True
    assert torch.equal(gate.mask(), torch.full((D,), 0.5))
    gate.weight = torch.linspace(-1, 1, D)
    gate.temperature = 0.05
    assert torch.allclose(gate.mask(), torch.sigmoid(torch.linspace(-1, 1, D) / 0.05))
    gate.training = False
    assert torch.equal(gate.mask(), (torch.linspace(-1, 1, D) > 0).float())


def test_declared_featurizers_compute_in_float32():
    """SPEC.md:1474 [FZ9] every declared kind featurizes in float32 whatever the activation's dtype; identity
    keeps it."""
    x = _x(2, 1).to(torch.bfloat16)
    for kind, featurizer in _all().items():
        f = kinds.read(featurizer, x)
        assert f.dtype == (torch.bfloat16 if kind == "identity" else torch.float32), kind


def test_bundle_bytes_are_canonical_and_safetensors_reads_them(tmp_path):
    """SPEC.md:1476 [FZ10] the same tensors and metadata always give the same bytes, whatever the dict order,
    and the file is an ordinary safetensors file."""
    w = kinds.initial_draw(D, 8, 0)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    bundles.write(a, {"weight": w, "bias": torch.arange(3)}, {"k": "8", "d": "16", "kind": "subspace"})
    bundles.write(b, {"bias": torch.arange(3), "weight": w}, {"kind": "subspace", "d": "16", "k": "8"})
    assert a.read_bytes() == b.read_bytes()
    assert torch.equal(load_file(str(a))["weight"], w)
    tensors, metadata = bundles.read(a, "featurizers.rot.file_path", "rot")
    assert metadata == {"k": "8", "d": "16", "kind": "subspace"} and torch.equal(tensors["bias"], torch.arange(3))


def test_bundle_refusals_in_order(tmp_path):
    """SPEC.md:1479 [FZ11] a bundle is checked by tensor names, then its stamp key by key, then shapes, with the
    reference's texts; a missing file is `no bundle at`."""
    where = "featurizers.rot.file_path"
    with pytest.raises(Refusal, match=r"featurizer 'rot': no bundle at '.*nope.safetensors'"):
        bundles.read(tmp_path / "nope.safetensors", where, "rot")
    w = {"weight": torch.zeros(D, 8)}
    with pytest.raises(Refusal) as names:
        bundles.check(bundles.Declared("dictionary", "sae", None, "f", D, {}), w, {}, where)
    assert names.value.message == ("featurizer 'dictionary': 'f' holds ['weight']; a sae bundle holds ['W_enc'] "
                                   "and optionally ['W_dec', 'b_enc', 'b_dec']")
    expected = {"layer": "1", "k": "4", "site": "other", "produced_by": "x", "kind": "subspace"}
    with pytest.raises(Refusal) as stamp:
        bundles.check(bundles.Declared("rot", "subspace", 4, "f", D, expected), w,
                      {"layer": "0", "k": "8", "site": "target", "produced_by": "y", "kind": "subspace"}, where)
    assert stamp.value.message == ("featurizer 'rot': 'f' is not this featurizer — k: bundle says '8', document "
                                   "says '4'; layer: bundle says '0', document says '1'")
    with pytest.raises(Refusal) as shape:
        bundles.check(bundles.Declared("rot", "subspace", 4, "f", D, {}), w, {}, where)
    assert shape.value.message == ("featurizer 'rot': 'f' has weight (16, 8), not the (16, 4) this document and "
                                   "its 16-wide site declare")
    assert bundles.check(bundles.Declared("rot", "subspace", None, "f", D, {"k": "4"}), w, {"k": "8"}, where) == 8


def test_every_metadata_value_of_a_shipped_or_corpus_tensor_file_follows_the_encoding():
    """SPEC.md:1560 [FZ36] in documents/artifacts, the corpus's files/ and every tensor file a corpus case expects,
    `layer`, `heads`, `units`, `k` and `d` are JSON text (an int, a list of ints or null) and the names are text."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    root = Path(__file__).resolve().parents[2]
    json_keys = {"layer", "heads", "units", "k", "d"}
    stamps = []
    for file in sorted((root / "documents" / "artifacts").glob("*.safetensors")) + sorted(
            (root / "causalab_ref" / "conformance" / "corpus" / "files").rglob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            stamps.append((str(file), handle.metadata() or {}))
    for case in sorted((root / "causalab_ref" / "conformance" / "corpus").glob("*.json")):
        tables = (json.loads(case.read_text(encoding="utf-8")).get("expect") or {}).get("tables") or {}
        stamps += [(f"{case.name}: {name}", t["metadata"]) for name, t in tables.items() if name.endswith(".safetensors")]
    assert len([s for s in stamps if s[1]]) >= 3
    for where, meta in stamps:
        for key, value in meta.items():
            assert isinstance(value, str), (where, key)
            if key in json_keys:
                parsed = json.loads(value)
                ok = parsed is None or (type(parsed) is int) or (isinstance(parsed, list) and all(type(x) is int for x in parsed))
                assert ok, (where, key, value)

"""Featurizers: the feature spaces a read is taken in and a write acts in (SPEC.md §9).

This module owns the featurizer table (`KINDS`, one row per kind: which tensors a bundle
holds, whether the kind takes `k`, is loaded from a file, is trained or published) and
the maps themselves, each a small object with

* `featurize(x) -> (f, err)`: the value `x` gathered at a site, `(…, d)`, to features
  `(…, k)` in float32, plus an error term that the inverse adds back (or None);
* `inverse(f, err, x) -> x'`: features back to the site, `(…, d)`, given the pre-write `x`;
* `tensors()`: what a bundle file holds (subspace: the Cayley parameter `weight`, not Q);
* `params()`: the float32 leaves a fit trains.

`identity` is the implicit featurizer (`(x, None)` and back, in the model's dtype). Every
declared kind computes in float32 with autocast off; `x` keeps the model's dtype until
the scatter casts the result back. `change_features` applies a mechanism to the `features`
dimensions only (`take_features` narrows an operand to them); `change_through` is featurize ->
change -> inverse. No model, no document: compile builds these from a site width, a `k`, a
seed or the tensors of a bundle (bundles.py reads and checks the file).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from typing import TYPE_CHECKING

from ..shapes import Lazy

if TYPE_CHECKING:
    import torch
else:
    torch = Lazy("torch")  # imported when a tensor is first made, not when a document is validated (Q17)


def cayley(weight: torch.Tensor) -> torch.Tensor:
    """The orthonormal (d, k) basis of a Cayley parameter W (d, k): Q = (I − A)⁻¹ (I + A) E with
    E the first k columns of I and A = W·Eᵀ − E·Wᵀ (skew), so QᵀQ = I for every W and W = 0 gives E."""
    d, k = weight.shape
    eye = torch.eye(d, dtype=weight.dtype, device=weight.device)
    first = eye[:, :k]
    skew = weight @ first.T - first @ weight.T
    return torch.linalg.solve(eye - skew, (eye + skew) @ first)


def initial_draw(d: int, k: int, seed: int) -> torch.Tensor:
    """The untrained subspace parameter: randn(d, k) on a fresh CPU generator seeded with `seed`, / √d."""
    if not 1 <= k <= d:
        raise ValueError(f"k must be in 1..{d} for a {d}-wide activation, got {k}")
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randn(d, k, generator=generator, dtype=torch.float32) / d ** 0.5


def _leaf(value: torch.Tensor) -> torch.Tensor:
    return value.detach().to(torch.float32).clone().contiguous()


class Identity:
    """The site's own space: nothing is cast, nothing is added back."""

    kind = "identity"

    def __init__(self, d: Optional[int] = None):
        self.d = self.k = d
        self.training = False

    def featurize(self, x: torch.Tensor):
        return x, None

    def inverse(self, f: torch.Tensor, err, x: torch.Tensor) -> torch.Tensor:
        return f

    def params(self) -> list:
        return []

    def tensors(self) -> dict:
        return {}


class Basis:
    """An orthonormal (d, k) basis Q: featurize Qᵀx, inverse Q·f plus the pre-write complement x − QQᵀx.

    `subspace` recomputes Q from its Cayley parameter on every use (so a fit's update is seen at once);
    `pca` holds Q itself, loaded."""

    def __init__(self, kind: str, weight: torch.Tensor, rotation: bool):
        self.kind = kind
        self.weight = _leaf(weight)
        self.rotation = rotation
        self.d, self.k = self.weight.shape
        self.training = False

    def basis(self, device) -> torch.Tensor:
        weight = self.weight.to(device)
        return cayley(weight) if self.rotation else weight

    def featurize(self, x: torch.Tensor):
        q = self.basis(x.device)  # (d, k), orthonormal columns
        return x.float() @ q, None  # (..., d) @ (d, k) -> (..., k)

    def inverse(self, f: torch.Tensor, err, x: torch.Tensor) -> torch.Tensor:
        q = self.basis(x.device)
        x = x.float()
        return f @ q.T + (x - (x @ q) @ q.T)  # (..., k) @ (k, d) + x's part orthogonal to q's columns: (..., d)

    def params(self) -> list:
        return [self.weight]

    def tensors(self) -> dict:
        return {"weight": self.weight.detach().cpu().contiguous()}


class Gate:
    """A mask over the site's d units (DBM): inverse m⊙f + (1−m)⊙x with m = sigmoid(θ/T) while a fit
    updates it and the hard mask [θ > 0] otherwise. θ starts at 0: an unfitted gate writes nothing."""

    kind = "gate"

    def __init__(self, weight: torch.Tensor):
        self.weight = _leaf(weight)
        self.d = self.k = self.weight.shape[0]
        self.training = False
        self.temperature = 1.0

    def mask(self, device=None) -> torch.Tensor:
        theta = self.weight if device is None else self.weight.to(device)
        if self.training:
            return torch.sigmoid(theta / self.temperature)
        return (theta > 0).to(torch.float32)

    def featurize(self, x: torch.Tensor):
        return x.float(), None

    def inverse(self, f: torch.Tensor, err, x: torch.Tensor) -> torch.Tensor:
        m = self.mask(x.device)
        return m * f + (1 - m) * x.float()

    def params(self) -> list:
        return [self.weight]

    def tensors(self) -> dict:
        return {"weight": self.weight.detach().cpu().contiguous()}


class Encoder:
    """A dictionary: f = act((x − b_dec)·W_enc + b_enc), decode(f) = f·W_dec + b_dec, err = x − decode(f),
    inverse decode(f′) + err; act is ReLU for `sae`, none for `linear`. A missing W_dec is W_encᵀ (tied),
    missing biases are zeros."""

    def __init__(self, kind: str, tensors: dict):
        self.kind = kind
        w_enc = _leaf(tensors["W_enc"])
        self.d, self.k = w_enc.shape
        self.table = {
            "W_enc": w_enc,
            "W_dec": _leaf(tensors["W_dec"]) if "W_dec" in tensors else w_enc.T.contiguous(),
            "b_enc": _leaf(tensors["b_enc"]) if "b_enc" in tensors else torch.zeros(self.k),
            "b_dec": _leaf(tensors["b_dec"]) if "b_dec" in tensors else torch.zeros(self.d),
        }
        self.given = tuple(sorted(tensors))
        self.training = False

    def _on(self, device) -> dict:
        return {name: value.to(device) for name, value in self.table.items()}

    def _decode(self, f: torch.Tensor, t: dict) -> torch.Tensor:
        return f @ t["W_dec"] + t["b_dec"]  # (..., k) @ (k, d) + (d,) -> (..., d)

    def featurize(self, x: torch.Tensor):
        t = self._on(x.device)
        x = x.float()
        f = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]  # (..., d) @ (d, k) + (k,) -> (..., k)
        if self.kind == "sae":
            f = torch.relu(f)
        return f, x - self._decode(f, t)

    def inverse(self, f: torch.Tensor, err, x: torch.Tensor) -> torch.Tensor:
        return self._decode(f, self._on(f.device)) + err

    def params(self) -> list:
        return []

    def tensors(self) -> dict:
        return {name: self.table[name].detach().cpu().contiguous() for name in self.given}


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Kind:
    """One featurizer kind: what its bundle holds and what a document may do with it."""

    name: str
    required: tuple[str, ...]   # tensors a bundle must hold
    optional: tuple[str, ...]   # tensors a bundle may hold besides
    k: str                      # "required" (a basis rank), "refused" (k = d), "bundle" (W_enc's width)
    loaded: bool                # only from a file_path: nothing draws one
    trainable: bool             # a fit may list it in params
    publishable: bool           # a weights step may publish its weight
    build: Callable[[dict], object]  # bundle tensors (fp32) -> featurizer


KINDS = {row.name: row for row in (
    Kind("subspace", ("weight",), (), "required", loaded=False, trainable=True, publishable=True,
         build=lambda t: Basis("subspace", t["weight"], rotation=True)),
    Kind("pca", ("weight",), (), "required", loaded=True, trainable=False, publishable=True,
         build=lambda t: Basis("pca", t["weight"], rotation=False)),
    Kind("gate", ("weight",), (), "refused", loaded=False, trainable=True, publishable=True,
         build=lambda t: Gate(t["weight"])),
    Kind("sae", ("W_enc",), ("W_dec", "b_enc", "b_dec"), "bundle", loaded=True, trainable=False,
         publishable=False, build=lambda t: Encoder("sae", t)),
    Kind("linear", ("W_enc",), ("W_dec", "b_enc", "b_dec"), "bundle", loaded=True, trainable=False,
         publishable=False, build=lambda t: Encoder("linear", t)),
)}


def drawn(kind: str, d: int, k: Optional[int], seed: int):
    """A featurizer that is not loaded: a subspace from its seeded draw, a gate at θ = 0."""
    if kind == "subspace":
        assert k is not None, "a subspace has its k (validated)"
        return KINDS[kind].build({"weight": initial_draw(d, k, seed)})
    if kind == "gate":
        return KINDS[kind].build({"weight": torch.zeros(d)})
    raise ValueError(f"a {kind} featurizer is loaded from a file; nothing draws one")


def expected_shapes(kind: str, d: int, k: int) -> dict[str, tuple[int, ...]]:
    """Each bundle tensor's shape for a d-wide site and rank k (a gate's k is d)."""
    if kind == "gate":
        return {"weight": (d,)}
    if kind in ("subspace", "pca"):
        return {"weight": (d, k)}
    return {"W_enc": (d, k), "W_dec": (k, d), "b_enc": (k,), "b_dec": (d,)}


# ---------------------------------------------------------------- the write seam's middle


def take_features(value, width: int, index: Optional[torch.Tensor]):
    """An operand (or renormalize's f0) in the write's feature space, narrowed to the `features` dimensions
    when it is a tensor as wide as the space; a literal or an already narrowed tensor is used as given."""
    if index is None or not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[-1] != width:
        return value
    return value[..., index.to(value.device)]  # (..., width) -> (..., len(index))


def _landed(value, like: torch.Tensor) -> torch.Tensor:
    """A mechanism's result as a tensor of `like`'s shape (a literal broadcasts)."""
    value = torch.as_tensor(value, device=like.device)
    return value.to(like.dtype).broadcast_to(like.shape)


def change_features(f: torch.Tensor, features: Optional[tuple[int, ...]], change: Callable, *operands) -> torch.Tensor:
    """`change(part, *operands)` on the `features` dimensions of f (all of f without them); the other
    dimensions pass through untouched. Each operand is narrowed to those dimensions as `take_features` says."""
    if features is None:
        return _landed(change(f, *operands), f)
    index = torch.tensor(features, dtype=torch.long, device=f.device)
    width = f.shape[-1]
    part = f[..., index]  # (..., width) -> (..., len(features)): gathered
    out = f.clone()
    changed = change(part, *(take_features(value, width, index) for value in operands))
    out[..., index] = _landed(changed, part)  # scattered
    return out


def change_through(featurizer, x: torch.Tensor, change: Callable, features: Optional[tuple[int, ...]] = None,
            *operands) -> torch.Tensor:
    """featurize -> change the (selected) features -> inverse, with autocast off (SPEC.md §9)."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        f, err = featurizer.featurize(x)
        return featurizer.inverse(change_features(f, features, change, *operands), err, x)


def read(featurizer, x: torch.Tensor) -> torch.Tensor:
    """A featurized read: the features of x, autocast off."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        return featurizer.featurize(x)[0]


def build(plans) -> dict:
    """The built featurizers of one plan (root or sweep point) from its compiled FeaturizerPlans: a bundle's
    checked bytes rebuilt in float32, or the seeded draw / θ = 0. Shared by every later step of that plan."""
    from safetensors.torch import load

    out = {}
    for plan in plans:
        if plan.bundle is not None:
            out[plan.name] = KINDS[plan.kind].build(load(plan.bundle))
        else:
            out[plan.name] = drawn(plan.kind, plan.d, plan.k, plan.seed if plan.seed is not None else 0)
    return out

"""The metric kinds: one table row per kind, read by every stage that needs a fact about one.

A row says which base-row columns the kind names, which further read of logits it compares with
(`against`) and which numbers it takes (`k`) (validation, the schema, `vocab`), the unit and estimand
version its table carries (compile), and how it scores rows of vocabulary logits given each row's
token id of each column and the reference rows (run). SPEC.md §1 Documents (D14, D24-D29) and §4 Runs (R7, R8):

    kind = KINDS["kl"]
    kind.score(patched, {"against": clean})      # (n, V), (n, V) -> (n,): KL(patched || clean) in nats
    KINDS["top_k"].score(patched, {"k": 3})   # (probabilities, ids), each (n, 3): a list per row (listed)
    KINDS["top_k_overlap"].score(patched, {"against": clean, "k": 3})   # the fraction of the top 3 both share
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


TOKEN_FORMS = ("space_prefixed", "bare")  # how an answer column's text is spelt before encoding (D15, D29)
TOP_K_DEFAULT = 5  # the original's default k


def _match(logits, ids: dict):
    return argmax_is(logits, ids["expected"]).float()


def argmax_is_plain(logits, expected):
    """The definition of `match`: whether each row's first largest entry is at its expected id (SPEC.md D14).
    (n, V), (n,) -> (n,) bool."""
    return logits.argmax(-1) == expected


def argmax_is(logits, expected):
    """An optimisation of `argmax_is_plain`, equal to it on every input (ties, infinities, NaN; a test checks):
    one vectorised max instead of torch's argmax, a slow scalar loop on the CPU. A row matches when its
    expected entry is the maximum and every entry before it is smaller; a row whose maximum is NaN is answered
    by the definition itself (SPEC.md Q30). (n, V), (n,) -> (n,) bool."""
    top = logits.amax(-1)  # (n,)
    out = logits.gather(-1, expected.unsqueeze(-1)).squeeze(-1) == top  # (n,): the expected entry is a maximum
    for r in out.nonzero()[:, 0].tolist():  # an earlier entry equal to the maximum is argmax's instead
        e = int(expected[r])
        if e and not bool(logits[r, :e].amax() < top[r]):
            out[r] = False
    nan = top.isnan()
    if bool(nan.any()):
        out[nan] = argmax_is_plain(logits[nan], expected[nan])
    return out


def _logit_diff(logits, ids: dict):
    return _at(logits, ids["a"]) - _at(logits, ids["b"])


def _cross_entropy(logits, ids: dict):
    return -_at(logits.log_softmax(-1), ids["target"])


def _token_logit(logits, ids: dict):
    return _at(logits, ids["token"])


def _token_prob(logits, ids: dict):
    return _at(logits.softmax(-1), ids["token"])


def _soft_accuracy(logits, ids: dict):
    return _at(logits.softmax(-1), ids["expected"])


def _weighted(p, q):
    """Σ exp(p) · (p − q) over the vocabulary, p and q log-probabilities (n, V); a token p gives no mass adds 0
    (the limit of 0 · log 0), not the NaN the arithmetic would give."""
    return (p.exp() * (p - q)).masked_fill(p == -math.inf, 0.0).sum(-1)  # torch only as methods: validation needs none


def _kl(logits, given: dict):
    """KL(P || Q) in nats, P the softmax of `of` and Q of `against`, both from log-softmax, summed in float64 (two
    near-equal distributions over 32,000 tokens lose a fifth of their KL to float32 cancellation) and returned
    in the logits' dtype."""
    p, q = logits.double().log_softmax(-1), given["against"].double().log_softmax(-1)
    return _weighted(p, q).to(logits.dtype)


def _js(logits, given: dict):
    """Jensen–Shannon in nats: the mean of KL(P || M) and KL(Q || M), M = (P + Q) / 2."""
    p, q = logits.double().log_softmax(-1), given["against"].double().log_softmax(-1)  # float64, as kl
    # log M = max(p, q) + log((1 + exp(-|p - q|)) / 2): exactly p where p == q, so JS(P, P) is 0
    m = p.maximum(q) + ((1 + (-(p - q).abs()).exp()) / 2).log()
    return ((_weighted(p, m) + _weighted(q, m)) / 2).to(logits.dtype)


def _top(logits, k: int):
    """Each row's k highest-ranked ids as a mask (n, V): ranked by logit, a tie to the lower id."""
    order = logits.sort(dim=-1, descending=True, stable=True).indices[:, :k]  # (n, k); stable: equal logits by id
    return logits.new_zeros(logits.shape).bool().scatter(-1, order, True)


def _top_k(logits, given: dict):
    """The original's readout: each row's k most likely tokens, most likely first, as (probabilities, ids), each
    (n, k): P = softmax(`of`) in float32, ranked by P, equal probabilities by the lower id (D28)."""
    probabilities = logits.float().softmax(-1)
    order = probabilities.sort(dim=-1, descending=True, stable=True)  # stable: equal probabilities by id
    return order.values[:, :given["k"]], order.indices[:, :given["k"]]


def _top_k_overlap(logits, given: dict):
    """The fraction of `against`'s k top-ranked tokens that are among `of`'s k top-ranked tokens."""
    k = given["k"]
    return (_top(logits, k) & _top(given["against"], k)).sum(-1).float() / k


def _at(logits, ids):
    """Each row's entry at its own token id: (n, V), (n,) -> (n,)."""
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class MetricKind:
    """One metric kind: its columns, the unit and estimand version of its table, its scoring.

    `score(logits, given)` takes n rows' logits over the vocabulary (a float tensor (n, V)) and
    what the kind takes beside them: each column's token id per row (`{"a": tensor([12, 7]),
    "b": tensor([40, 40])}`, int64 (n,)), each further read's rows of logits (`"against"`: (n, V))
    and each number (`"k": 3`); it returns the rows' values (n,), differentiable but for `match`
    and `top_k_overlap` (a fit's objective keeps the graph). Each row's value depends on that row alone:
    scoring rows together gives, bit for bit, what scoring each alone gives (SPEC.md R8).
    `reads` names the fields that are further reads of logits; `params` the numbers, with defaults.
    `listed`: a row's value is a list, `[[token, probability], ...]` (top_k): `score` returns
    (probabilities, ids), each (n, k), which the run spells; it is no objective and no early stop (D27)."""
    name: str
    columns: tuple[str, ...]
    unit: str
    estimand_version: str
    score: Callable[..., Any]
    reads: tuple[str, ...] = ()
    params: tuple[tuple[str, int], ...] = ()
    listed: bool = False

    def signature(self) -> str:
        """`logit_diff(a, b)`, `top_k_overlap(against, k=5)`: the kind with the fields it takes, as `vocab` prints
        it."""
        named = self.columns + self.reads + tuple(f"{p}={d}" for p, d in self.params)
        return f"{self.name}({', '.join(named)})"

    def fields(self) -> tuple[str, ...]:
        """Every field of a metric of this kind beside `kind`, `of` and `token_form`."""
        return self.columns + self.reads + tuple(p for p, _ in self.params)


KINDS: dict[str, MetricKind] = {k.name: k for k in (
    MetricKind("match", ("expected",), "fraction", "match/v1", _match),
    MetricKind("logit_diff", ("a", "b"), "logit", "logit_diff/v1", _logit_diff),
    MetricKind("cross_entropy", ("target",), "nat", "cross_entropy/v1", _cross_entropy),
    MetricKind("token_logit", ("token",), "logit", "token_logit/v1", _token_logit),
    MetricKind("token_prob", ("token",), "probability", "token_prob/v1", _token_prob),
    MetricKind("soft_accuracy", ("expected",), "probability", "soft_accuracy/v1", _soft_accuracy),
    MetricKind("kl", (), "nat", "kl/v1", _kl, reads=("against",)),
    MetricKind("js", (), "nat", "js/v1", _js, reads=("against",)),
    MetricKind("top_k", (), "[token, probability] list", "top_k/v1", _top_k, params=(("k", TOP_K_DEFAULT),),
               listed=True),
    MetricKind("top_k_overlap", (), "fraction", "top_k_overlap/v1", _top_k_overlap, reads=("against",),
               params=(("k", TOP_K_DEFAULT),)),
)}

LISTED = tuple(name for name, kind in KINDS.items() if kind.listed)  # the kinds whose row value is a list


def spelled(decode, token: int) -> str:
    """One token id as a top_k row spells it: repr() of its decoded text, as a table's `tokens` spells a window
    (P34; the original's readout spells it so)."""
    return repr(decode([token]))


FIELDS = tuple(sorted({f for kind in KINDS.values() for f in kind.fields()}))  # every field any kind takes

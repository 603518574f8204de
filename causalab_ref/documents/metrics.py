"""The metric kinds: one table row per kind, read by every stage that needs a fact about one.

A row says which base-row columns the kind names (validation, the schema, `vocab`), the unit
and estimand version its table carries (compile), and how it scores rows of vocabulary
logits given each row's token id of each column (run). SPEC.md §1 Documents (D14) and §4 Runs (R7, R8).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _match(logits, ids: dict):
    return argmax_is(logits, ids["expected"]).float()


def argmax_is(logits, expected):
    """Whether each row's first largest entry is at its expected id: exactly `logits.argmax(-1) == expected`, from
    one vectorised max (torch's argmax is a slow scalar loop on the CPU): a row matches when its expected entry is
    the maximum and every entry before it is smaller; a row whose maximum is NaN is argmax's own (SPEC.md Q30).
    (n, V), (n,) -> (n,) bool."""
    top = logits.amax(-1)  # (n,)
    out = logits.gather(-1, expected.unsqueeze(-1)).squeeze(-1) == top  # (n,): the expected entry is a maximum
    for r in out.nonzero()[:, 0].tolist():  # an earlier entry equal to the maximum is argmax's instead
        e = int(expected[r])
        if e and not bool(logits[r, :e].amax() < top[r]):
            out[r] = False
    nan = top.isnan()
    if bool(nan.any()):
        out[nan] = logits[nan].argmax(-1) == expected[nan]
    return out


def _logit_diff(logits, ids: dict):
    return _at(logits, ids["a"]) - _at(logits, ids["b"])


def _cross_entropy(logits, ids: dict):
    return -_at(logits.log_softmax(-1), ids["target"])


def _token_logit(logits, ids: dict):
    return _at(logits, ids["token"])


def _token_prob(logits, ids: dict):
    return _at(logits.softmax(-1), ids["token"])


def _at(logits, ids):
    """Each row's entry at its own token id: (n, V), (n,) -> (n,)."""
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@dataclass(frozen=True)
class MetricKind:
    """One metric kind: its columns, the unit and estimand version of its table, its scoring.

    `score(logits, ids)` takes n rows' logits over the vocabulary (a float tensor (n, V)) and
    each column's token id per row (`{"a": tensor([12, 7]), "b": tensor([40, 40])}`, int64 (n,))
    and returns the rows' values (n,), differentiable but for `match` (a fit's objective keeps
    the graph). Each row's value depends on that row alone: scoring rows together gives, bit
    for bit, what scoring each alone gives (SPEC.md R8)."""
    name: str
    columns: tuple[str, ...]
    unit: str
    estimand_version: str
    score: Callable[..., Any]

    def signature(self) -> str:
        """`logit_diff(a, b)`: the kind with the columns it names, as `vocab` prints it."""
        return f"{self.name}({', '.join(self.columns)})"


KINDS: dict[str, MetricKind] = {k.name: k for k in (
    MetricKind("match", ("expected",), "fraction", "match/v1", _match),
    MetricKind("logit_diff", ("a", "b"), "logit", "logit_diff/v1", _logit_diff),
    MetricKind("cross_entropy", ("target",), "nat", "cross_entropy/v1", _cross_entropy),
    MetricKind("token_logit", ("token",), "logit", "token_logit/v1", _token_logit),
    MetricKind("token_prob", ("token",), "probability", "token_prob/v1", _token_prob),
)}

COLUMNS = tuple(sorted({c for kind in KINDS.values() for c in kind.columns}))  # every column any kind names

"""The metric kinds: one table row per kind, read by every stage that needs a fact about one.

A row says which base-row columns the kind names (validation, the schema, `vocab`), the unit
and estimand version its table carries (compile), and how it scores one row's vocabulary
logits given the token id of each column (run). SPEC.md §1 Documents (D14) and §4 Runs (R7, R8).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _match(vector, ids: dict):
    return (vector.argmax() == ids["expected"]).float()


def _logit_diff(vector, ids: dict):
    return vector[ids["a"]] - vector[ids["b"]]


def _cross_entropy(vector, ids: dict):
    return -vector.log_softmax(-1)[ids["target"]]


def _token_logit(vector, ids: dict):
    return vector[ids["token"]]


def _token_prob(vector, ids: dict):
    return vector.softmax(-1)[ids["token"]]


@dataclass(frozen=True)
class MetricKind:
    """One metric kind: its columns, the unit and estimand version of its table, its scoring.

    `score(vector, ids)` takes one row's logits over the vocabulary (a float tensor) and the
    token id of each column (`{"a": 12, "b": 40}`) and returns the row's value as a 0-d tensor,
    differentiable but for `match` (a fit's objective keeps the graph)."""
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

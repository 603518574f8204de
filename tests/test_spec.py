"""SPEC.md is citable: every rule has a test that cites it, and every citation points at its rule."""
from __future__ import annotations

from spec_rules import citations, rules


def test_every_citation_names_the_rule_on_its_line():
    """A citation `SPEC.md:N [ID]` is stale when line N no longer holds rule ID."""
    where = rules()
    stale = [(f, n, a, b, rule) for f, n, a, b, rule in citations()
             if not rule or rule not in where or not a <= where[rule] <= b]
    assert stale == [], f"stale or unnamed citations (run python tests/spec_rules.py --fix): {stale}"


def test_every_rule_is_cited_by_a_test():
    """A rule no test cites is not yet tested."""
    cited = {rule for *_, rule in citations()}
    uncited = sorted(set(rules()) - cited, key=lambda r: rules()[r])
    assert uncited == [], f"rules with no citing test: {uncited}"

"""SPEC.md is citable: every rule has a test that cites it, and every citation points at its rule."""
from __future__ import annotations

import pytest

from spec_rules import citations, placeholders, rules

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)


def test_every_citation_names_the_rule_on_its_line():
    """A citation (SPEC.md, a line number N, a rule ID) is stale when line N no longer holds rule ID."""
    where = rules()
    stale = [(f, n, a, b, rule) for f, n, a, b, rule in citations()
             if not rule or rule not in where or not a <= where[rule] <= b]
    assert stale == [], f"stale or unnamed citations (run python tests/spec_rules.py --fix): {stale}"


def test_every_rule_is_cited_by_a_test():
    """A rule no test cites is not yet tested (a citation in the package's own source does not count)."""
    cited = {rule for file, *_, rule in citations() if file.startswith("tests/")}
    uncited = sorted(set(rules()) - cited, key=lambda r: rules()[r])
    assert uncited == [], f"rules with no citing test: {uncited}"


def test_every_citation_has_a_line_number():
    """A SPEC.md citation whose colon is followed by anything but a digit (a section placeholder such as
    LOCATIONS) is one the two tests above cannot see; cite the rule by its line and id instead."""
    assert placeholders() == [], f"citations without a line number: {placeholders()}"

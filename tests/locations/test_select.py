"""select.py: gather and scatter of a shapes.Selection (pure torch)."""
from __future__ import annotations

import pytest
import torch

from causalab_ref.locations.select import gather, scatter
from causalab_ref.shapes import Selection

pytestmark = pytest.mark.fast  # the edit-test loop's subset: `pytest -m fast` (README)


def _t(*shape):
    return torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape)


def test_rectangular_gather_is_rows_by_window_by_features():
    """seed 004:159 / SPEC.md:421 [L13] — a rectangular selection gathers (rows, w, features)."""
    x = _t(2, 5, 6)
    g = gather(x, Selection(windows=((3, 4), (1, 2))))
    assert g.shape == (2, 2, 6)
    assert torch.equal(g[0], x[0, 3:5]) and torch.equal(g[1], x[1, 1:3])


def test_ragged_gather_concatenates_rows_in_order():
    """seed 004:159 / SPEC.md:421 [L13] — a ragged selection gathers flat (total, features)."""
    x = _t(2, 5, 6)
    g = gather(x, Selection(windows=((4,), (0, 1, 2)), ragged=True))
    assert g.shape == (4, 6)
    assert torch.equal(g, torch.cat([x[0, 4:5], x[1, 0:3]]))


def test_groups_view_features_and_keep_take():
    """seed 004:159 / SPEC.md:421 [L13] — features viewed as (groups, -1), `take` kept, flat."""
    x = _t(1, 3, 8)
    g = gather(x, Selection(windows=((2,),), groups=4, take=(3, 1)))
    assert g.shape == (1, 1, 4)
    assert torch.equal(g[0, 0], torch.cat([x[0, 2, 6:8], x[0, 2, 2:4]]))


def test_head_axis_is_the_group_axis_for_interiors_on_axis_2():
    """seed 004:163 / SPEC.md:421 [L13] — (batch, head, seq, head_dim) with seq_axis 2 gathers what
    the same tensor held (batch, seq, head*head_dim) gathers: group h is head h."""
    q = _t(2, 4, 5, 3)  # batch, head, seq, head_dim
    flat = q.transpose(1, 2).reshape(2, 5, 12)
    sel2 = Selection(windows=((4,), (2,)), seq_axis=2, groups=4, take=(2,))
    sel1 = Selection(windows=((4,), (2,)), seq_axis=1, groups=4, take=(2,))
    assert torch.equal(gather(q, sel2), gather(flat, sel1))
    assert torch.equal(gather(q, sel2)[1, 0], q[1, 2, 2])


def test_attention_z_held_seq_head_dim_flattens_head_major():
    """seed 004:163 / SPEC.md:421 [L13] / SPEC.md:462 [L21] — attention_z (batch, seq, head, head_dim), seq_axis 1, equals
    attention_premix (its flattening) under any selection."""
    z = _t(2, 5, 4, 3)
    sel = Selection(windows=((0, 3), (1, 4)), groups=4, take=(0, 3))
    assert torch.equal(gather(z, sel), gather(z.flatten(2), sel))


def test_pattern_positions_are_queries_and_features_are_keys():
    """seed 004 B5 / SPEC.md:421 [L13] — scores/probs (rows, heads, q, k): positions on the query
    axis 2, heads on axis 1, a head's features are its row of keys."""
    p = _t(1, 2, 4, 4)
    g = gather(p, Selection(windows=((3,),), seq_axis=2, groups=2, take=(1,)))
    assert g.shape == (1, 1, 4)
    assert torch.equal(g[0, 0], p[0, 1, 3])


@pytest.mark.parametrize("shape,seq_axis", [((2, 6, 8), 1), ((2, 4, 6, 2), 2), ((2, 6, 4, 2), 1)])
@pytest.mark.parametrize("ragged", [False, True])
def test_scatter_of_the_gather_is_the_identity(shape, seq_axis, ragged):
    """seed 004:161 / SPEC.md:421 [L13] — scatter(x, s, gather(x, s)) == x on every layout."""
    x = torch.randn(shape)
    windows = ((1, 2), (5,)) if ragged else ((1, 2), (4, 5))
    sel = Selection(windows=windows, seq_axis=seq_axis, ragged=ragged, groups=4, take=(1, 2))
    y = scatter(x, sel, gather(x, sel))
    assert torch.equal(y, x) and y.shape == x.shape


@pytest.mark.parametrize("shape,seq_axis", [((2, 6, 8), 1), ((2, 4, 6, 2), 2)])
def test_scatter_writes_named_groups_and_leaves_the_rest(shape, seq_axis):
    """seed 004:161 / SPEC.md:421 [L13] — a scatter puts the named groups back and leaves the others."""
    x = torch.randn(shape)
    before = x.clone()
    sel = Selection(windows=((3,), (0,)), seq_axis=seq_axis, groups=4, take=(2,))
    vals = torch.full_like(gather(x, sel), 7.0)
    y = scatter(x, sel, vals)
    assert torch.equal(gather(y, sel), vals)
    assert int((y != x).sum()) == vals.numel()  # nothing else moved
    assert torch.equal(x, before)  # the input is not modified in place
    other = Selection(windows=((3,), (0,)), seq_axis=seq_axis, groups=4, take=(0, 1, 3))
    assert torch.equal(gather(y, other), gather(x, other))


def test_whole_feature_axis_when_no_groups():
    """seed 004:159 / SPEC.md:421 [L13] — groups/take None means the whole feature axis."""
    x = _t(1, 4, 3)
    sel = Selection(windows=((1, 2),))
    y = scatter(x, sel, torch.zeros(1, 2, 3))
    assert torch.all(y[0, 1:3] == 0) and torch.equal(y[0, [0, 3]], x[0, [0, 3]])


def test_two_dimensional_ids_have_no_feature_axis():
    """seed 004 B2 / SPEC.md:421 [L13] / SPEC.md:401 [L8] — input_ids (batch, seq) gathers (rows, w) and refuses groups."""
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    assert torch.equal(gather(ids, Selection(windows=((2,), (0,)))), torch.tensor([[7], [8]]))
    with pytest.raises(ValueError):
        gather(ids, Selection(windows=((2,), (0,)), groups=3, take=(0,)))


def test_a_group_past_the_end_is_an_error():
    """seed 004:167 / SPEC.md:427 [L15] — head 3 of a 2-head tensor is not gathered silently."""
    with pytest.raises(ValueError):
        gather(_t(1, 2, 4), Selection(windows=((0,),), groups=2, take=(3,)))


@pytest.mark.parametrize("shape, seq_axis, window, ragged, groups", [
    ((4, 5, 6), 1, (4,), False, None),
    ((4, 5, 6), 1, (1, 2, 3), True, None),
    ((4, 5, 8), 1, (0, 1), False, (4, (3, 1))),
    ((4, 2, 5, 3), 2, (2, 3), False, (2, (1,))),
    ((4, 5), 1, (3, 4), True, None),
])
def test_windows_that_are_one_run_gather_what_the_index_gather_takes(shape, seq_axis, window, ragged, groups):
    """SPEC.md:1742 [Q13] three rows sharing one run of positions are gathered as a slice with exactly the values
    the index gather takes for them (a fourth, different row sends the same rows through the index gather)."""
    x = _t(*shape)
    g, take = groups if groups else (None, None)
    other = tuple(p - 1 if window[0] else p + 1 for p in window)

    def sel(windows):
        return Selection(windows=windows, seq_axis=seq_axis, ragged=ragged, groups=g, take=take)

    fast = gather(x, sel((window,) * 3))
    indexed = gather(x, sel((window,) * 3 + (other,)))
    assert torch.equal(fast, indexed[: 3 * len(window)] if ragged else indexed[:3])


def test_the_last_position_of_every_row_is_gathered_as_a_view():
    """SPEC.md:1742 [Q13] the last token of each row of a left-padded batch is read as a view of the tensor
    (no index copy); the values are the tensor's own."""
    x = _t(3, 5, 6)
    g = gather(x, Selection(windows=((4,),) * 3))
    assert g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert torch.equal(g[:, 0], x[:, 4])

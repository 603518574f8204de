"""Select: gather and scatter the part of a tensor a `shapes.Selection` names (pure torch).

This module owns the one slicing rule every read and write uses (SPEC.md L13): positions
along `selection.seq_axis`, one window per row, and the feature axis viewed as `(groups, -1)`
keeping the groups in `take`.

The tensor is first put in a canonical `(batch, seq, features)` view:

* a module boundary, `(batch, seq, F)`, seq_axis 1: as it is;
* attention_z, `(batch, seq, head, head_dim)`, seq_axis 1: the trailing axes flatten
  to `head * head_dim`, head-major, so group h is head h;
* a per-head interior held `(batch, head, seq, head_dim)`, seq_axis 2 (the query,
  the key): the head axis IS the group axis — it moves behind the sequence axis and
  flattens with head_dim, so group h is again head h;
* the pattern, attention_scores / attention_probs, `(batch, head, query, key)`,
  seq_axis 2: the same rule — positions index the QUERY axis (2), heads are axis 1,
  and the "features" of one head are its row of keys.  A gathered pattern is
  `(…, len(take) * keys)`;
* `(batch, seq)` (input_ids): no feature axis; a gather returns `(rows, w)` or
  `(total,)`, and a selection naming groups there is an error.

So what is gathered is flat, `(…, len(take) * per_group)`, however the model holds
it.  A rectangular selection (`ragged=False`, every window the same length) gathers
`(rows, w, features)`; a ragged one gathers `(total, features)`, the rows' windows
concatenated in row order.  `scatter` takes a value of exactly that shape, writes
the named positions and groups into a copy, and leaves everything else as it was.
Rows are the first `len(selection.windows)` rows of the batch.

The shape comments name B the batch, T the sequence, F the features of the canonical view,
N the selection's rows (its windows), W a rectangular window's length, P the positions
named in all (the windows' lengths summed, `total` in the code), G the groups and K the groups
kept (`take`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..shapes import Selection


def _canonical(tensor: torch.Tensor, seq_axis: int) -> torch.Tensor:
    """(batch, seq, F) (or (batch, seq) for a 2-D tensor) view/copy of `tensor`."""
    if tensor.dim() == 2:
        if seq_axis != 1:
            raise ValueError(f"a 2-D tensor has its sequence on axis 1, not {seq_axis}")
        return tensor
    t = tensor.movedim(seq_axis, 1)  # (B, T, ...): the sequence axis second
    # (B, T, F), the trailing axes flattened: spelled out so that a 0-position tensor reshapes too (Q8)
    return t.reshape(t.shape[0], t.shape[1], math.prod(t.shape[2:]))


def _restore(canon: torch.Tensor, like: torch.Tensor, seq_axis: int) -> torch.Tensor:
    if like.dim() == 2:
        return canon
    moved_shape = list(like.movedim(seq_axis, 1).shape)  # (B, T, ...)
    return canon.reshape(moved_shape).movedim(1, seq_axis).contiguous()  # (B, T, F) -> like's own shape


def _index(selection: Selection, device) -> tuple[torch.Tensor, torch.Tensor]:
    rows: list[int] = []
    pos: list[int] = []
    for r, window in enumerate(selection.windows):
        rows.extend([r] * len(window))
        pos.extend(window)
    return (torch.tensor(rows, dtype=torch.long, device=device),  # (P,): the row of each named position
            torch.tensor(pos, dtype=torch.long, device=device))  # (P,): its position in that row


def _check(selection: Selection, canon: torch.Tensor) -> None:
    if len(selection.windows) > canon.shape[0]:
        raise ValueError(f"{len(selection.windows)} windows for a batch of {canon.shape[0]} rows")
    if not selection.ragged:
        widths = {len(w) for w in selection.windows}
        if len(widths) > 1:
            raise ValueError(f"a rectangular selection has windows of lengths {sorted(widths)}")
    if (selection.groups is None) != (selection.take is None):
        raise ValueError("groups and take go together")
    if selection.groups is not None and selection.take is not None:
        if canon.dim() == 2:
            raise ValueError("a (batch, seq) tensor has no feature axis to take groups of")
        f = canon.shape[-1]
        if f % selection.groups:
            raise ValueError(f"{f} features do not split into {selection.groups} groups")
        bad = [t for t in selection.take if not 0 <= t < selection.groups]
        if bad:
            raise ValueError(f"groups {bad} of {selection.groups}")


def shared_slice(selection: Selection, seq: int) -> Optional[tuple[int, int]]:
    """(lo, hi) when every window is the same consecutive positions lo..hi-1 inside a sequence of `seq`
    positions (the last token of a left-padded batch, a decode step's one position), else None (SPEC.md Q13)."""
    windows = selection.windows
    first = windows[0] if windows else ()
    if not first or first[0] < 0 or first[-1] >= seq or any(w != first for w in windows):
        return None
    lo, hi = first[0], first[0] + len(first)
    return (lo, hi) if tuple(first) == tuple(range(lo, hi)) else None


def gather(tensor: torch.Tensor, selection: Selection, dense: bool = False) -> torch.Tensor:
    """The part of `tensor` the selection names, flat over features; with `dense`, laid out contiguously.

    Rectangular: (rows, w, len(take) * per_group); ragged: (total, len(take) * per_group).
    Without groups the whole feature axis is kept. Windows that are all the same consecutive positions
    (`shared_slice`) are taken as a slice, a view of `tensor` where its layout allows (Q13): callers never
    write into a gathered value (a read clones it, a mechanism computes a new tensor, `scatter` writes a
    copy). What a featurizer or a mechanism computes must not depend on that layout: the seam gathers for
    them `dense`.
    """
    canon = _canonical(tensor, selection.seq_axis)
    _check(selection, canon)
    shared = shared_slice(selection, canon.shape[1])
    if shared is None:
        rows, pos = _index(selection, canon.device)
        flat = canon[rows, pos]  # (P, F), or (P,) with no feature axis
    else:
        n, (lo, hi) = len(selection.windows), shared
        flat = canon[:n, lo:hi].reshape(n * (hi - lo), *canon.shape[2:])  # (N, W, F) -> (P, F), P = N * W
    if selection.groups is not None:
        take = torch.tensor(selection.take, dtype=torch.long, device=canon.device)  # (K,)
        # (P, F) -> (P, G, F/G) -> (P, K, F/G) -> (P, K * F/G)
        flat = flat.reshape(flat.shape[0], selection.groups, -1)[:, take].reshape(flat.shape[0], -1)
    if not selection.ragged:
        n = len(selection.windows)
        flat = flat.reshape(n, len(selection.windows[0]) if n else 0, *flat.shape[1:])  # (P, F') -> (N, W, F')
    return flat.contiguous() if dense else flat


def scatter(tensor: torch.Tensor, selection: Selection, values: torch.Tensor) -> torch.Tensor:
    """A new tensor: `tensor` with the selected positions/groups replaced by `values`
    (shaped as `gather` returns them); everything else is left as it was."""
    canon = _canonical(tensor, selection.seq_axis)
    _check(selection, canon)
    out = canon.clone()  # (B, T, F), or (B, T)
    shared = shared_slice(selection, canon.shape[1]) if selection.groups is None else None
    if shared is not None:  # every window the same positions lo..hi-1: a slice names what the index would (Q35)
        n, (lo, hi) = len(selection.windows), shared
        out[:n, lo:hi] = values.to(dtype=out.dtype, device=out.device).reshape(n, hi - lo, *out.shape[2:])
        return _restore(out, tensor, selection.seq_axis)
    rows, pos = _index(selection, canon.device)  # (P,), (P,)
    total = rows.shape[0]
    vals = values.to(dtype=out.dtype, device=out.device)  # (N, W, F') or (P, F'), as gathered
    if out.dim() == 2:
        out[rows, pos] = vals.reshape(total)  # (P,)
        return _restore(out, tensor, selection.seq_axis)
    vals = vals.reshape(total, -1)  # (P, F'): F' = F, or K * F/G with groups
    if selection.groups is None or selection.take is None:
        out[rows, pos] = vals
    else:
        take = torch.tensor(selection.take, dtype=torch.long, device=out.device)  # (K,)
        cur = out[rows, pos].reshape(total, selection.groups, -1)  # (P, F) -> (P, G, F/G)
        cur[:, take] = vals.reshape(total, len(selection.take), -1)  # (P, K * F/G) -> (P, K, F/G)
        out[rows, pos] = cur.reshape(total, -1)  # (P, G, F/G) -> (P, F)
    return _restore(out, tensor, selection.seq_axis)

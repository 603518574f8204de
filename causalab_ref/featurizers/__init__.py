"""Featurizers (SPEC.md §9): a change of basis around a write, fitted or loaded.

    kinds.py    the featurizer kinds (identity, subspace, rotation, pca, sae, ...) as a table
    bundles.py  a featurizer's tensors in a .safetensors bundle: read, checked, written
    fit.py      the fit loop (observe, loss, optimizer updates) that trains a featurizer's parameters

    from causalab_ref.featurizers import kinds
    rot = kinds.drawn("subspace", 16, 2, seed=0)             # d=16, k=2, the seeded initial draw
    y = kinds.change_through(rot, x, lambda part: part * 0)  # x (..., 16): its 2 features zeroed, the rest kept
    kinds.read(rot, y)                                       # (..., 2), all zero
"""

"""Featurizers (SPEC.md §9): a change of basis around a write, fitted or loaded.

    kinds.py    the featurizer kinds (identity, subspace, rotation, pca, sae, ...) as a table
    bundles.py  a featurizer's tensors in a .safetensors bundle: read, checked, written
    fit.py      the fit loop (observe, loss, optimizer updates) that trains a featurizer's parameters

    from causalab_ref.featurizers import kinds
"""

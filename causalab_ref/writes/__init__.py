"""Writes (SPEC.md §8): the one write seam, the mechanisms it applies, and what a step publishes.

    seam.py        gather -> featurize -> mechanism -> inverse -> scatter, for both engines
    mechanisms.py  swap, lerp, clamp, gaussian noise, ... as functions of (base, operand, params)
    outputs.py     a step's outputs and the `{"ref"}` operands later steps read

    from causalab_ref.writes import mechanisms
    mechanisms.swap(torch.zeros(2), torch.ones(2), {}, None)   # tensor([1., 1.]): the operand replaces the base
"""

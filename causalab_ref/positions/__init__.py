"""Positions (SPEC.md §2): each row's tokens, resolved against the model's own tokenizer.

    locate.py    frames, cuts, anchors, chat turns, BOS and left padding, and the character map

It imports only the standard library, torch and shapes.py, so it can run where a remote model is.

    from causalab_ref.positions import locate
"""

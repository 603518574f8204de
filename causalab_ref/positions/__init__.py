"""Positions (SPEC.md §2): each row's tokens, resolved against the model's own tokenizer.

    locate.py    frames, cuts, anchors, chat turns, BOS and left padding, and the character map

It imports only the standard library, torch and shapes.py, so it can run where a remote model is.

    from causalab_ref.positions import locate
    from causalab_ref.shapes import Anchor, Where
    _ids, _mask, frame = locate.frame_of_texts(tok, ["If today is Monday, tomorrow is", "Monday"])
    locate.locate(frame, Where(index=-1))                  # (((8,), (8,)), ('', '')): left-padded, GPT-2
    locate.locate(frame, Where(index=-1, scope=Anchor(variable="entity")), ["Monday", "Monday"])
                                                           # (((5,), (8,)), ('', ''))
"""

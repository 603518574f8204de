"""Positions (SPEC.md §2): each row's tokens, resolved against the model's own tokenizer.

    resolve.py    frames, cuts, anchors, chat turns, BOS and left padding, and the character map

It imports only the standard library, torch and shapes.py, so it can run where a remote model is.

    from causalab_ref.positions import resolve
    from causalab_ref.shapes import Anchor, Where
    _ids, _mask, frame = resolve.frame_of_texts(tok, ["If today is Monday, tomorrow is", "Monday"])
    resolve.resolve(frame, Where(index=-1))                # (((8,), (8,)), ('', '')): left-padded, GPT-2
    resolve.resolve(frame, Where(index=-1, scope=Anchor(variable="entity")), ["Monday", "Monday"])
                                                           # (((5,), (8,)), ('', ''))
"""

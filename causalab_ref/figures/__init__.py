"""Figures (SPEC.md §14): a run's results drawn (matplotlib, the optional extra `causalab_ref[plot]`).

    plot.py   a results folder made panels (heatmaps over a sweep, bars per row, loss curves) and a PNG or SVG

    from causalab_ref.figures import plot
    plot.draw(Path("out"), Path("out.png"))
"""

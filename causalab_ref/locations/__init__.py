"""Locations (SPEC.md §3): a component at a layer (heads, units) made an address the engines reach.

    address.py   the component table per architecture family, as plain data, and the module-tree walk
    select.py    gathering and scattering the positions and features an address's selection names
    families.py  what a meta load's module tree says, as plain data per family (the weightless engine's tree)

    from causalab_ref.locations import address
    address.locate(engine.model, "block_output", 1)
    # Address(component='block_output', layer=1, io='output', seq_axis=1, width=16, ...) on tiny-llama
"""

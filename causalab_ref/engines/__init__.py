"""Engines (SPEC.md §12): how a tensor at an address is reached, and nothing else.

    contract.py    what compile and run may ask of an engine
    loading.py     a model block made an engine (`load`), for either engine
    nnterp.py      the nnterp engine: addresses reached inside an nnsight trace (access.py)
    access.py      nnsight's envoy of each component, read and replaced
    hooks.py       the plain torch-hooks engine
    checkpoint.py  a checkpoint loaded safely: no code, offline first, weights that fit the config

    from causalab_ref.engines import loading
    engine = loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"))
"""

"""Engines (SPEC.md §12): how a tensor at an address is reached, and nothing else.

    contract.py    what compile and run may ask of an engine
    loading.py     a model block made an engine (`load`), for either engine
    nnterp.py      the nnterp engine: each address's envoy read and replaced inside an nnsight trace
    hooks.py       the plain torch-hooks engine
    checkpoint.py  a checkpoint loaded safely: no code, offline first, weights that fit the config
    weightless.py  compile's engine from config.json and the tokenizer alone (no nnsight, nnterp, modeling code)

    from causalab_ref.engines import loading
    engine = loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"))
"""

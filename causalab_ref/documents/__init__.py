"""Documents (SPEC.md §1, §10): a JSON document read, its sweeps lowered, and every field checked.

    reader.py         strict JSON (duplicate keys, malformed numbers) and the document's dataclasses
    sweeps.py         `{"sweep": [...]}` wrappers lowered to one document per point
    validate.py       the document walked block by block, each sweep point validated once; `read`, the one pass
    fields.py         raw JSON values: an object's keys, strings, integers, choices, numbers
    places.py         what a site, a read, a write and a position say
    interventions.py  how an intervention's reads, writes, models and metrics name each other
    steps.py          a step's rows, interventions and saves; observe steps and their outputs
    fits.py           fit and weights steps; no featurizer used before the fit that trains it
    names.py          a declared name is one path segment; save paths that collide
    metrics.py        the metric kinds as a table (columns, units, formulas)
    schema.py         the document format as a JSON Schema
    protocol.py       the protocol format (SPEC.md §10) read into the same document

    from causalab_ref.documents import validate
    document = validate.read("documents/patching.json")   # read, lowered, every point validated once
    document.points[0].document.model.key                 # 'fixture:tiny-llama'

"""

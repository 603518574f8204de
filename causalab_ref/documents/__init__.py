"""Documents (SPEC.md §1, §10): a JSON document read, its sweeps lowered, and every field checked.

    reader.py    strict JSON (duplicate keys, malformed numbers) and the document's dataclasses
    sweeps.py    `{"sweep": [...]}` wrappers lowered to one document per point
    validate.py  every check that needs no model: names, cross-references, widths, mechanisms
    names.py     a declared name is one path segment; save paths that collide
    metrics.py   the metric kinds as a table (columns, units, formulas)
    schema.py    the document format as a JSON Schema
    protocol.py  the protocol format (F§19) read into the same document

    from causalab_ref.documents import reader, validate
    points = validate.validate(reader.read("documents/patching.json"))
"""

"""Bundles: `.safetensors` files of featurizer weights and other tensors, written canonically and
read back with their identity stamp checked (SPEC.md §9).

`write` lays the file out itself — header JSON with sorted keys and compact separators,
tensors in name order, padded to 8 bytes as the format says — so the same tensors and
metadata always give the same bytes (stock `save_file` orders `__metadata__` at random per
process). `read` returns (tensors, metadata) or refuses a file that is not one. `stamp` is
the metadata a weights step writes; `check` holds a loaded bundle against the document
that loads it: tensor names, stamp key by key, shapes, in that order.

    expected = bundles.stamp(doc.model, "target", site, address, bundles.Holds("subspace", 4, 16), digest)
    tensors, metadata = bundles.read(file, "featurizers.rot.file_path", "rot")
    k = bundles.check(bundles.Declared("rot", "subspace", 4, str(file), 16, expected), tensors, metadata,
                      "featurizers.rot.file_path")
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from . import kinds
from ..shapes import Refusal

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
ENGINE = "causalab_ref"


def encode(tensors: dict[str, torch.Tensor], metadata: Optional[dict[str, str]] = None) -> bytes:
    """The canonical bytes of a safetensors file holding `tensors` and string `metadata`."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    blobs, offset = [], 0
    for name in sorted(tensors):
        value = tensors[name].detach().cpu().contiguous()
        blob = value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        header[name] = {"dtype": DTYPES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write(file: Path, tensors: dict[str, torch.Tensor], metadata: Optional[dict[str, str]] = None) -> None:
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(encode(tensors, metadata))


def read(file: Path, path: str, name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file; a missing or unreadable file is refused at compile."""
    from safetensors import safe_open

    file = Path(file)
    if not file.is_file():
        raise Refusal(f"featurizer '{name}': no bundle at '{file}'", path=path, stage="compile")
    try:
        with safe_open(str(file), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # a file that is not safetensors: the library's own error, one line
        first = (str(error).splitlines() or [""])[0][:200]
        raise Refusal(f"featurizer '{name}': '{file}' is not a safetensors file ({type(error).__name__}: {first})",
                      path=path, stage="compile") from None
    for key in sorted(tensors):
        _finite(tensors[key], f"featurizer '{name}': '{file}' holds {key}", path)
    return tensors, metadata


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _finite(value: torch.Tensor, what: str, path: str) -> None:
    """A bundle's tensor is used in float32 (kinds.py): every value finite and within float32's range, or the
    file is refused (SPEC.md S35); the refusal counts the values that are not."""
    if not value.is_floating_point() or value.numel() == 0:
        return
    wide = value.double()
    bad = int((~torch.isfinite(wide)).sum())
    if bad:
        raise Refusal(f"{what} with {bad} value(s) that are not finite numbers (NaN or infinite); a bundle's "
                      "values are finite", path=path, stage="compile")
    past = int((wide.abs() > FLOAT32_MAX).sum())
    if past:
        raise Refusal(f"{what} with {past} value(s) past float32's range (|x| <= {FLOAT32_MAX:.6g}), which a "
                      "featurizer computes in; they would be infinite", path=path, stage="compile")


@dataclass(frozen=True)
class Holds:
    """What a bundle's tensors are: a featurizer's kind (or an output's, `output/mean`), its rank k and
    its site's width d (None where there is none), and its parametrization (a subspace's; "" for an output)."""

    kind: str
    k: Optional[int]
    d: Optional[int]
    parametrization: str = "cayley"


def stamp(model, site_name: str, site, address, holds: Holds, digest: str) -> dict[str, str]:
    """The identity a weights step writes into a bundle: which model, place, kind and shape it is of."""
    return {
        "produced_by": digest,
        "model_key": model.key,
        "model_revision": model.revision,
        "model_dtype": model.dtype,
        "site": site_name,
        "component": site.component,
        "layer": json.dumps(address.layer),
        "heads": json.dumps(list(site.heads)) if site.heads is not None else "null",
        "units": json.dumps(list(site.units)) if site.units is not None else "null",
        "kind": holds.kind,
        "k": json.dumps(holds.k),
        "d": json.dumps(holds.d),
        "parametrization": holds.parametrization,
        "featurizer_dtype": "fp32",
        "engine": ENGINE,
    }


def _names(name: str, file: str, kind: str, keys, path: str) -> None:
    row = kinds.KINDS[kind]
    keys = set(keys)
    if set(row.required) <= keys <= set(row.required) | set(row.optional):
        return
    tail = f" and optionally {list(row.optional)}" if row.optional else ""
    raise Refusal(f"featurizer '{name}': '{file}' holds {sorted(keys)}; a {kind} bundle holds "
                  f"{list(row.required)}{tail}", path=path, stage="compile")


@dataclass(frozen=True)
class Declared:
    """A loaded featurizer as its document declares it, which the bundle it loads must be: its name, kind
    and rank k (None: the bundle's own), the file it loads, its site's width d, and the stamp a weights
    step would write for it (`stamp`)."""

    name: str
    kind: str
    k: Optional[int]
    file: str
    d: int
    stamp: dict[str, str]


def _stamp(declared: Declared, metadata: dict, path: str) -> None:
    """Only keys the bundle carries are compared, never site, engine or produced_by; parametrization
    only for a subspace; k only when the document gives one."""
    skip = {"site", "engine", "produced_by"}
    if declared.kind != "subspace":
        skip.add("parametrization")
    if declared.k is None:
        skip.add("k")
    expected = declared.stamp
    wrong = [f"{key}: bundle says '{metadata[key]}', document says '{expected[key]}'"
             for key in sorted(metadata) if key in expected and key not in skip and metadata[key] != expected[key]]
    if wrong:
        raise Refusal(f"featurizer '{declared.name}': '{declared.file}' is not this featurizer — {'; '.join(wrong)}",
                      path=path, stage="compile")


def check(declared: Declared, tensors: dict, metadata: dict, path: str) -> int:
    """Refuse a bundle that is not this document's featurizer; returns its k (a gate's is d)."""
    name, file, kind, d = declared.name, declared.file, declared.kind, declared.d
    _names(name, file, kind, tensors, path)
    _stamp(declared, metadata, path)
    for key in sorted(tensors):
        if tensors[key].dim() == 0:  # no last axis to read k from (SPEC.md S36)
            shape = "a vector" if len(kinds.expected_shapes(kind, d, 1)[key]) == 1 else "a matrix"
            raise Refusal(f"featurizer '{name}': '{file}' holds {key} as a 0-d tensor (one number), where a {kind} "
                          f"bundle's {key} is {shape}", path=path, stage="compile")
    first = tensors[kinds.KINDS[kind].required[0]]
    k = d if kind == "gate" else (declared.k if declared.k is not None else int(first.shape[-1]))
    shapes = kinds.expected_shapes(kind, d, k)
    for key in sorted(tensors):
        have = tuple(tensors[key].shape)
        if have != shapes[key]:
            raise Refusal(f"featurizer '{name}': '{file}' has {key} {have}, not the {shapes[key]} this document "
                          f"and its {d}-wide site declare", path=path, stage="compile")
    return k


EXAMPLE_SAE = "documents/artifacts/sae.safetensors"


def example_sae(d: int = 16, k: int = 32, seed: int = 0) -> bytes:
    """The shipped example dictionary (documents/artifacts/sae.safetensors), built from a seeded CPU generator so
    the file is reproducible and never hand-edited: W_enc (d, k) and W_dec (k, d) drawn / √d, both biases zero
    (so a latent is active where its direction meets the activation, about half of them per prompt); stamped for
    block_output[0] of the Llama fixture."""
    g = torch.Generator().manual_seed(seed)
    tensors = {"W_enc": torch.randn(d, k, generator=g) / d ** 0.5, "W_dec": torch.randn(k, d, generator=g) / d ** 0.5,
               "b_enc": torch.zeros(k), "b_dec": torch.zeros(d)}
    metadata = {"model_key": "fixture:tiny-llama", "model_revision": "seeded", "model_dtype": "fp32",
                "component": "block_output", "layer": "0", "heads": "null", "units": "null", "kind": "sae",
                "k": str(k), "d": str(d), "featurizer_dtype": "fp32", "engine": ENGINE,
                "produced_by": "causalab_ref.bundles.example_sae"}
    return encode(tensors, metadata)

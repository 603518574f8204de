#!/usr/bin/env python3
"""independent.py: recompute the `run` cases of the causalab_ref conformance corpus from scratch.

    python3 independent.py --fixtures DIR CASE.json [CASE.json ...]

Each case's document is read from the case file and executed with plain transformers and torch forward hooks
on the exported checkpoint folder (DIR/manifest.json maps model keys to folders); the metric tables and tensor
files it would write are rebuilt and compared with the case's `expect.tables` under the rule
|e - g| <= tol * max(|e|, 0.01) (exact for non-floats). Nothing of the reference implementation is imported:
the semantics come from SPEC.md, whose rule ids are cited in comments (e.g. "P23").
Exit status 0 iff every case given passes; a case using something not implemented here is SKIP.
"""
import argparse
import copy
import hashlib
import itertools
import json
import math
import os
import random
import re
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402


class Skip(Exception):
    """The case uses a feature this script does not implement."""


class Refusal(Exception):
    def __init__(self, stage, path, message):
        super().__init__(f"{stage}: {path}: {message}")
        self.stage, self.path, self.message = stage, path, message


UNITS = {"match": "fraction", "logit_diff": "logit", "cross_entropy": "nat", "token_logit": "logit",
         "token_prob": "probability", "soft_accuracy": "probability", "kl": "nat", "js": "nat",
         "top_k_overlap": "fraction", "top_k": "[token, probability] list"}
VERSIONS = {}  # D28; every kind's is "<kind>/v1"
COLUMNS = {"match": ["expected"], "logit_diff": ["a", "b"], "cross_entropy": ["target"],
           "token_logit": ["token"], "token_prob": ["token"], "soft_accuracy": ["expected"], "kl": [], "js": [],
           "top_k_overlap": [], "top_k": []}
# Refusal templates, verbatim from SPEC.md section 13 (the placement ones the corpus's run cases reach).
T_FIXED = ("<kind> '<name>' at <spelling> has no position on row(s) <rows>. A position of a fixed width names the "
           "same number of tokens on every row, so a row it does not fit is refused rather than skipped; a position "
           "anchored to the row's own text may skip a row, and says why")
T_NOTHING = ("write '<name>' has nothing to write on row(s) <rows>. A read may skip a row; a write may not — writing "
             "nothing somewhere is not an intervention, and the row would score as if one had happened. <why>")
T_RAGGED = ("write '<name>' covers <want> positions per row but its operand '<operand>' was read over <have>; rows "
            "<rows> differ. Landing a window of one width in another is a policy this slice does not implement — the "
            "protocol's `exact_length_buckets` and `padded_masked` — so it refuses")
T_EMPTY_METRIC = "metric '<name>': no row is both column-eligible and placed by its read '<of>'; a metric of nothing has no mean"


# ----------------------------------------------------------------------------------------------- documents
def canon_pos(p):
    """D19: a position in its one spelling (bare int -> {"index": i}, defaults left out)."""
    if isinstance(p, int) and not isinstance(p, bool):
        return {"index": p}
    if not isinstance(p, dict):
        return p
    out = {}
    for k, v in p.items():
        if (k == "frame" and v == "prompt") or (k == "all" and v is False) or v is None:
            continue
        if k == "scope" and isinstance(v, dict):
            v = {sk: sv for sk, sv in v.items() if sv is not None}
        out[k] = v
    return out


def canon_doc(o):
    if isinstance(o, dict):
        return {k: (canon_pos(v) if k == "pos" else canon_doc(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [canon_doc(v) for v in o]
    return o


def sha(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def produced_by(point, protocol_raw=None):
    if protocol_raw is not None:  # PR15: the raw protocol document, header reduced to protocol_version
        raw = dict(protocol_raw)
        raw["header"] = {"protocol_version": protocol_raw["header"]["protocol_version"]}
        return sha(raw)
    return sha(canon_doc({k: v for k, v in point.items() if k != "header"}))  # D19


def expand_sweeps(doc):
    """D17/D18: every {"sweep": ...} wrapper is an axis; independent axes form a cross product."""
    wrappers = []

    def find(o, path):
        if isinstance(o, dict):
            if "sweep" in o and set(o) <= {"sweep", "as"}:
                wrappers.append((path, o))
                return
            for k, v in o.items():
                if path == () and k in ("model", "header"):
                    continue
                find(v, path + (k,))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                find(v, path + (i,))

    find(doc, ())
    if not wrappers:
        return [("", doc)]
    axes = {}  # axis name -> list of (path, values)
    for path, w in wrappers:
        vals = w["sweep"]
        if isinstance(vals, dict):
            r = vals["range"]
            vals = list(range(*r))
        name = w.get("as") or next(p for p in reversed(path) if isinstance(p, str))
        axes.setdefault(name, []).append((path, vals))
    names = list(axes)
    points = []
    for combo in itertools.product(*[range(len(axes[n][0][1])) for n in names]):
        point = copy.deepcopy(doc)
        label = []
        for n, i in zip(names, combo):
            for path, vals in axes[n]:
                tgt = point
                for p in path[:-1]:
                    tgt = tgt[p]
                tgt[path[-1]] = vals[i]
            v = axes[n][0][1][i]
            v = v[0] if isinstance(v, list) and len(v) == 1 else v
            label.append(f"{n}={v if isinstance(v, (int, float)) else json.dumps(v, separators=(',', ':'))}")
        points.append((",".join(label), point))
    return points


def lower_protocol(doc):
    """SPEC §10 (PR5-PR13): the protocol subset lowered to a plan-shaped document."""
    m = doc["method"]
    writes = {w: {"site": x["site"], "pos": x["pos"], "mechanism": "swap", "operand": x["do"]["swap"]}
              for w, x in m.get("writes", {}).items()}
    iv = {"reads": m["reads"], "writes": writes, "models": m.get("intervened_models", {}), "metrics": m["metrics"]}
    return {"model": doc["model"], "roles": {r: {"field": d["field"]} for r, d in doc["data"].items()},
            "sites": m["sites"], "interventions": {"method": iv},
            "steps": {"observe": {"kind": "observe", "interventions": "method",
                                  "rows": {r: d["dataset"] for r, d in doc["data"].items()},
                                  "saves": [{"value": s["value"], "file_path": s["file_path"]} for s in m["save"]]}}}


def lower_steps_first(doc):
    """SPEC §15 (SF3-SF10): a steps-first document as the plan-shaped one it means (forward, metric and
    reduce steps; one intervention and one observe step per stage, `stage<k>`)."""
    body = {n: st for n, st in doc["steps"].items() if n != "saves"}
    runs = [n for n, st in body.items() if st["kind"] in ("forward", "generate")]
    reduces = [n for n, st in body.items() if st["kind"] == "reduce"]

    def named(st):  # the steps a step's references name, and whether each is a reduce value swapped in
        out = [(st[k].split(".")[0], False) for k in ("of", "against") if isinstance(st.get(k), str)]
        for w in st.get("interventions", {}).get("writes", {}).values():
            op = w.get("operand")
            if isinstance(op, str):
                out.append((op, True) if op in reduces else (op.split(".")[0], False))
        return out
    stage = {n: 0 for n in body}
    for _ in range(len(body) + 1):
        for n, st in body.items():
            deps = named(st)
            level = max([stage[n]] + [stage[d] + (1 if later else 0) for d, later in deps])
            for d in [n] + [d for d, later in deps if not later]:
                stage[d] = max(stage[d], level)
    metric_of = [body[n]["of"].split(".")[0] for n in body if body[n]["kind"] == "metric"]
    order = sorted(runs, key=lambda n: (n != (metric_of[0] if metric_of else runs[0]), runs.index(n)))
    role: dict = {}
    roles: dict = {}
    for n in order:
        pair = (body[n]["data"], body[n]["field"])
        have = [r for r, p in roles.items() if p == pair]
        role[n] = have[0] if have else ("base" if not roles else n)
        roles[role[n]] = pair
    base_data = roles["base"][0]

    def ref(x):
        return x.replace(".", ":", 1)
    ivs, steps = {}, {}
    for k in range(max(stage.values()) + 1):
        name = f"stage{k + 1}"
        iv = {"reads": {}, "writes": {}, "models": {}, "metrics": {}}
        outputs = {}
        for n in [n for n in body if stage[n] == k]:
            st = body[n]
            if st["kind"] == "reduce":
                outputs[n] = {"read": ref(st["of"]), "reduce": st["reduce"], **({"k": st["k"]} if "k" in st else {})}
            elif st["kind"] == "metric":
                m = {"kind": st["metric"]}
                for key, v in st.items():
                    if key not in ("kind", "metric"):
                        m[key] = (v[len(base_data) + 1:] if isinstance(v, str) and v.startswith(base_data + ".")
                                  else ref(v) if isinstance(v, str) and v.split(".")[0] in runs else v)
                iv["metrics"][n] = m
            else:
                writes = st.get("interventions", {}).get("writes", {})
                model = n if writes else "original"
                for r, x in st["reads"].items():
                    site = x["site"]
                    if isinstance(site, dict):
                        doc.setdefault("sites", {})[f"{n}:{r}"] = site
                        site = f"{n}:{r}"
                    iv["reads"][f"{n}:{r}"] = dict(x, site=site, input=role[n], model=model)
                for w, x in writes.items():
                    op = x.get("operand")
                    op = {"ref": op} if op in reduces else ref(op) if isinstance(op, str) else op
                    iv["writes"][f"{n}:{w}"] = dict(x, **({"operand": op} if "operand" in x else {}))
                if writes:
                    iv["models"][n] = {"input": role[n], "writes": [f"{n}:{w}" for w in writes]}
        ivs[name] = {k_: v for k_, v in iv.items() if v or k_ == "reads"}
        steps[name] = {"kind": "observe", "interventions": name, "rows": {r: doc["data"][p[0]]["path"]
                                                                          for r, p in roles.items()},
                       **({"outputs": outputs} if outputs else {}), "saves": []}
    saves = doc["steps"].get("saves", {})
    if isinstance(saves, list):
        saves = {v: f"{v}.json" if body[v]["kind"] == "metric" else f"{v}.safetensors" for v in saves}
    for v, fp in saves.items():
        steps[f"stage{stage[v] + 1}"]["saves"].append({"value": v, "file_path": fp})
    sites = {n: dict(x, layers=[x["layers"]]) if isinstance(x.get("layers"), int) else x
             for n, x in doc.get("sites", {}).items()}
    return {"model": doc["model"], "roles": {r: {"field": p[1]} for r, p in roles.items()}, "sites": sites,
            "interventions": ivs, "steps": steps}


def get_field(row, path):
    """D7: `column`, `column[i]`, `a.b`."""
    v = row
    for part in path.split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[\d+\])*)", part)
        v = v[m.group(1)]
        for i in re.findall(r"\[(\d+)\]", m.group(2)):
            v = v[int(i)]
    return v


def variable_text(row, field, var):
    """P16: first `<column>_variables` beside the role's field, then a top-level column."""
    m = re.fullmatch(r"([^\[\].]+)(.*)", field)
    try:
        return get_field(row, f"{m.group(1)}_variables{m.group(2)}.{var}")
    except (KeyError, IndexError, TypeError):
        pass
    if var in row:
        return row[var]
    raise Skip(f"variable {var!r} on no row (a compile refusal this script does not reproduce)")


# ----------------------------------------------------------------------------------------------- the model
class Model:
    def __init__(self, folder, dtype, attn):
        kw = {"dtype": torch.bfloat16 if dtype == "bf16" else torch.float32}
        if attn:
            kw["attn_implementation"] = attn
        self.hf = AutoModelForCausalLM.from_pretrained(folder, **kw).eval()
        self.tok = AutoTokenizer.from_pretrained(folder)
        if self.tok.pad_token is None:  # R2
            self.tok.pad_token = self.tok.eos_token
        self.cfg = self.hf.config
        self.prefix = list(self.tok("").input_ids)  # P24
        gen = self.hf.generation_config.eos_token_id
        gen = [] if gen is None else ([gen] if isinstance(gen, int) else list(gen))
        self.stop_ids = sorted({self.tok.eos_token_id, *gen} - {None})  # P53
        core = getattr(self.hf, "model", None) or self.hf.transformer
        self.layers = core.layers if hasattr(core, "layers") else core.h
        self.final_norm = core.norm if hasattr(core, "norm") else core.ln_f
        self.n_heads = self.cfg.num_attention_heads
        self.n_kv = getattr(self.cfg, "num_key_value_heads", self.n_heads)

    def attn(self, layer):
        L = self.layers[layer]
        return L.self_attn if hasattr(L, "self_attn") else L.attn


MODELS = {}


def load_model(fixtures, manifest, mblock):
    key = mblock["key"]
    ent = manifest["fixtures"].get(key)
    if ent is None:
        raise Skip(f"model key {key} is not in the manifest")
    ck = (key, mblock.get("dtype"), mblock.get("attn_implementation"))
    if ck not in MODELS:
        MODELS[ck] = Model(os.path.join(fixtures, ent["folder"]), mblock.get("dtype"), mblock.get("attn_implementation"))
    return MODELS[ck]


# ----------------------------------------------------------------------------------------------- frames
class Frame:
    """One row's run of addressable tokens: content ids, its text and its character map (P22)."""

    def __init__(self, tok, ids, start, segments=None):
        self.tok, self.ids, self.start = tok, list(ids), start
        self.text = tok.decode(self.ids)
        self.offsets = [0]
        for k in range(1, len(self.ids) + 1):  # P22 by definition (prefix decodes); Q3: a non-prefix keeps the last
            t = tok.decode(self.ids[:k])
            self.offsets.append(len(t) if self.text.startswith(t) else self.offsets[-1])
        self.offsets[-1] = len(self.text)
        self.segments = segments or {}

    def tokens_over(self, lo, hi):
        """P23: the tokens overlapping the character range [lo, hi), as a run [first, last+1)."""
        ks = [k for k in range(len(self.ids)) if self.offsets[k] < hi and self.offsets[k + 1] > lo]
        return (ks[0], ks[-1] + 1) if ks else None

    def window_text(self, lo, hi):
        return self.text[self.offsets[lo]:self.offsets[hi]]


def chat_segments(frame, messages):
    """P11/P12: each turn searched as itself, forward from the end of the previous turn."""
    counts = {}
    for m in messages:
        counts[m["role"]] = counts.get(m["role"], 0) + 1
    segs, seen, cursor = {}, {}, 0
    for m in messages:
        k = seen.get(m["role"], 0)
        seen[m["role"]] = k + 1
        at = frame.text.find(m["content"], cursor)
        found = None if at < 0 else (at, at + len(m["content"]))
        if found:
            cursor = found[1]
        segs[f"{m['role']}[{k}]"] = found
        segs[m["role"]] = found if counts[m["role"]] == 1 else "ambiguous"
    return segs


def encode_role(model, values):
    """R2/P9/P10/P24/P26: one left-padded batch; a conversation is rendered with the generation prompt."""
    tok = model.tok
    chats = [isinstance(v, list) for v in values]
    texts = []
    for v in values:
        if isinstance(v, list):
            t = tok.apply_chat_template(v, tokenize=False, add_generation_prompt=True)
            if tok.bos_token and t.startswith(tok.bos_token):
                t = t[len(tok.bos_token):]
            texts.append(t)
        else:
            texts.append(v)
    enc = tok(texts, padding=True, return_tensors="pt")
    ids, mask = enc.input_ids, enc.attention_mask
    frames = []
    for i, v in enumerate(values):
        nz = mask[i].nonzero().flatten().tolist()
        lo, hi = nz[0], nz[-1] + 1
        assert ids[i, lo:lo + len(model.prefix)].tolist() == model.prefix
        fr = Frame(tok, ids[i, lo + len(model.prefix):hi].tolist(), lo + len(model.prefix))
        if chats[i]:
            fr.segments = chat_segments(fr, v)
        frames.append(fr)
    return ids, mask, frames


# ----------------------------------------------------------------------------------------------- positions
def spec_of(pos):
    p = canon_pos(pos)
    cut = [k for k in ("index", "span", "last", "all") if k in p]
    return p, cut[0]


def is_ragged(pos):
    """P46/P47: uneven when the width is none or there is a scope."""
    p, cut = spec_of(pos)
    if p.get("scope"):
        return True
    if cut == "all":
        return True
    if cut == "span":
        a, b = p["span"]
        return (a < 0) != (b < 0)
    return False


def resolve(pos, frame, anchor):
    """P2: find the run, cut it, check the cut is inside the run. Returns (content indices, reason)."""
    p, cut = spec_of(pos)
    lo, hi = 0, len(frame.ids)
    scope = p.get("scope") or {}
    if scope:
        clo, chi = 0, len(frame.text)
        if "segment" in scope:
            seg = frame.segments.get(scope["segment"])
            if seg == "ambiguous":
                return None, "alignment_ambiguous"
            if seg is None:
                return None, "alignment_missing"
            clo, chi = seg
        if "variable" in scope:
            inside = frame.text[clo:chi]
            for spelling in (anchor, " " + anchor, anchor.strip()):  # P19
                hits = [m.start() for m in re.finditer("(?=" + re.escape(spelling) + ")", inside)] if spelling else []
                if hits:
                    break
            if not hits:
                return None, "alignment_missing"
            if len(hits) > 1:
                return None, "alignment_ambiguous"
            clo, chi = clo + hits[0], clo + hits[0] + len(spelling)
        run = frame.tokens_over(clo, chi)
        if run is None:
            return None, "alignment_missing"
        lo, hi = run
    n = hi - lo
    if cut == "index":
        i = p["index"]
        j = i if i >= 0 else n + i
        win = [lo + j] if 0 <= j < n else []
    elif cut == "last":
        win = list(range(hi - p["last"], hi)) if p["last"] <= n else []
    elif cut == "span":
        a, b = [x if x >= 0 else n + x for x in p["span"]]
        win = list(range(lo + a, lo + b)) if 0 <= a < b <= n else []
    else:
        win = list(range(lo, hi))
    return (win, "") if win else (None, "out_of_range")


# ----------------------------------------------------------------------------------------------- featurizers
class Identity:
    kind = "identity"

    def featurize(self, x):
        return x

    def inverse(self, f, x):
        return f


class Subspace:
    """FZ2/FZ3: k directions of a Cayley-parametrized rotation, recomputed at every use."""

    def __init__(self, d, k, seed, fixed_Q=None):
        self.d, self.k, self.fixed_Q = d, k, fixed_Q
        if fixed_Q is None:
            g = torch.Generator().manual_seed(seed)
            self.W = torch.randn(d, k, generator=g, dtype=torch.float32) / math.sqrt(d)

    def Q(self):
        if self.fixed_Q is not None:
            return self.fixed_Q
        E = torch.eye(self.d)[:, :self.k]
        A = self.W @ E.T - E @ self.W.T
        eye = torch.eye(self.d)
        return torch.linalg.solve(eye - A, (eye + A) @ E)

    def featurize(self, x):
        return x.float() @ self.Q()

    def inverse(self, f, x):
        Q, x = self.Q(), x.float()
        return f @ Q.T + (x - (x @ Q) @ Q.T)


class Gate:
    """FZ8: out of a fit the mask is [theta > 0]; theta starts at 0, so an unfitted gate writes nothing."""

    def __init__(self, d):
        self.theta = torch.zeros(d)

    def featurize(self, x):
        return x.float()

    def inverse(self, f, x):
        m = (self.theta > 0).float()
        return m * f + (1 - m) * x.float()


class SAE:
    """FZ6/FZ7: f = ReLU((x - b_dec) W_enc + b_enc), err = x - (f W_dec + b_dec); `linear` has no ReLU."""

    def __init__(self, t, relu=True):
        self.W_enc, self.relu = t["W_enc"], relu
        self.W_dec = t.get("W_dec", self.W_enc.T)
        self.b_enc = t.get("b_enc", torch.zeros(self.W_enc.shape[1]))
        self.b_dec = t.get("b_dec", torch.zeros(self.W_enc.shape[0]))

    def featurize(self, x):
        h = (x.float() - self.b_dec) @ self.W_enc + self.b_enc
        return torch.relu(h) if self.relu else h

    def inverse(self, f, x):
        err = x.float() - (self.featurize(x) @ self.W_dec + self.b_dec)
        return f @ self.W_dec + self.b_dec + err


def build_featurizers(doc, case_dir, widths):
    from safetensors.torch import load_file
    out = {}
    fits = [s for s in doc["steps"].values() if s.get("kind") == "fit"]
    for name, fz in (doc.get("featurizers") or {}).items():
        if name not in widths:  # declared, used nowhere
            continue
        d = widths[name]
        kind = fz["kind"]
        if kind == "subspace":
            seed = fz.get("seed")
            if seed is None:  # FZ3: else the first fit that trains it, else 0
                seed = next((s.get("seed", 0) for s in fits if name in s.get("params", [])), 0)
            out[name] = Subspace(d, fz["k"], seed)
        elif kind == "gate":
            out[name] = Gate(d)
        elif kind in ("pca", "sae", "linear"):
            path = os.path.join(case_dir, "files", fz["file_path"])
            t = load_file(path)
            out[name] = Subspace(d, fz["k"], 0, fixed_Q=t["weight"].float()) if kind == "pca" else SAE(t, kind == "sae")
        else:
            raise Skip(f"featurizer kind {kind}")
        out[name].kind = kind
    return out


# ----------------------------------------------------------------------------------------------- places
INTERIOR = ("attention_query", "attention_key", "attention_z")


class Place:
    """Where a (component, layer) lives: the module and side a hook sees, and how to view its tensor as
    (batch, seq, features) (L6, L13, L18, L19)."""

    def __init__(self, model, comp, layer):
        self.comp, self.layer, self.groups = comp, layer, None
        m = model
        sandwich = layer is not None and hasattr(m.layers[layer], "pre_feedforward_layernorm")
        if comp == "block_output":
            self.module, self.side = m.layers[layer], "out"
        elif comp == "block_input":
            self.module, self.side = m.layers[layer], "in"
        elif comp == "attention_output":
            self.module, self.side = (m.layers[layer].post_attention_layernorm, "out") if sandwich else (m.attn(layer), "out")
        elif comp == "attention_premix":
            a = m.attn(layer)
            self.module, self.side, self.groups = (a.o_proj if hasattr(a, "o_proj") else a.c_proj), "in", m.n_heads
        elif comp in INTERIOR:
            self.module, self.side = m.attn(layer), "interior"
            self.groups = m.n_kv if comp == "attention_key" else m.n_heads
        elif comp == "ln_final":
            self.module, self.side = m.final_norm, "out"
        elif comp == "lm_head":
            self.module, self.side = m.hf.lm_head, "out"
        elif comp == "logits":
            self.module, self.side = m.hf, "root"
        else:
            raise Skip(f"component {comp}")

    @property
    def key(self):
        return (self.comp, self.layer)

    def canon(self, t):
        """To (b, s, F); returns the canonical tensor and a function taking it back to t's layout."""
        if self.comp in ("attention_query", "attention_key"):  # (b, h, s, hd)
            b, h, s, hd = t.shape
            return t.transpose(1, 2).reshape(b, s, h * hd), lambda c: c.reshape(b, s, h, hd).transpose(1, 2)
        if self.comp == "attention_z":  # (b, s, h, hd)
            b, s, h, hd = t.shape
            return t.reshape(b, s, h * hd), lambda c: c.reshape(b, s, h, hd)
        return t, lambda c: c


def narrow(x, site, groups):
    """L13: heads/units select groups of the (groups, -1) view of the features."""
    take = site.get("heads") or site.get("units")
    if take is None:
        return x
    g = groups if site.get("heads") else x.shape[-1]
    v = x.reshape(*x.shape[:-1], g, -1)
    return v[..., take, :].reshape(*x.shape[:-1], -1)


def widen(x_full, x_new, site, groups):
    take = site.get("heads") or site.get("units")
    if take is None:
        return x_new
    g = groups if site.get("heads") else x_full.shape[-1]
    v = x_full.reshape(*x_full.shape[:-1], g, -1).clone()
    v[..., take, :] = x_new.reshape(*x_new.shape[:-1], len(take), -1).to(v.dtype)
    return v.reshape(x_full.shape)


# ----------------------------------------------------------------------------------------------- mechanisms
def mechanism(name, f, o, params, f0):
    """M1/M3/M6."""
    if name == "swap":
        return o.expand_as(f).to(f.dtype) if o.dim() else torch.full_like(f, float(o))
    if name == "add_scaled":
        return f + params.get("scale", 1.0) * o
    if name == "lerp":
        t = params["t"]
        return (1 - t) * f + t * o
    if name == "clamp":
        lo, hi = params.get("lo"), params.get("hi")
        if lo is not None:
            f = torch.maximum(f, torch.tensor(lo, dtype=f.dtype))
        if hi is not None:
            f = torch.minimum(f, torch.tensor(hi, dtype=f.dtype))
        return f
    if name == "renormalize":
        return f * f0.norm(dim=-1, keepdim=True) / f.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    if name == "gaussian":
        eps = torch.randn(f.shape, generator=torch.Generator().manual_seed(int(params["seed"])), dtype=torch.float32)
        return f + params.get("scale", 1.0) * eps.to(f.dtype)
    raise Skip(f"mechanism {name}")


# ----------------------------------------------------------------------------------------------- one forward
class Tap:
    def __init__(self, kind, name, spec, site, place, featurizer):
        self.kind, self.name, self.spec, self.site, self.place, self.fz = kind, name, spec, site, place, featurizer
        p, _ = spec_of(spec["pos"])
        self.generated = p.get("frame") == "generated"
        self.step = p["index"] if self.generated and "index" in p and not p.get("scope") and p["index"] >= 0 else None
        self.all_steps = self.generated and "all" in p and not p.get("scope")
        self.stacked = self.generated and self.step is None and not self.all_steps  # P40
        self.windows = None  # per row: list of absolute positions, or None
        self.values = None   # per row: tensor (w, F) or None
        self.stack = []      # P40: per decode step, (rows, F)
        self.operand = None  # per row tensors, a 0-d tensor, or a broadcast tensor

    def fires(self, step):
        if not self.generated:
            return step in (None, 0)
        return self.all_steps or self.stacked or step == self.step


def apply_write(tap, T, T0):
    """E3: gather -> featurize -> mechanism -> inverse -> scatter, on the canonical (b, s, F) tensor."""
    w = tap.spec
    rows = [i for i in range(T.shape[0]) if tap.windows[i] is not None] if not tap.generated else list(range(T.shape[0]))
    wins = {i: (tap.windows[i] if not tap.generated else [T.shape[1] - 1]) for i in rows}
    rect = not is_ragged(w["pos"]) or tap.generated
    xs = [narrow(T[i, wins[i]], tap.site, tap.place.groups) for i in rows]
    x0s = [narrow(T0[i, wins[i]], tap.site, tap.place.groups) for i in rows]
    X = torch.stack(xs) if rect else torch.cat(xs)
    X0 = torch.stack(x0s) if rect else torch.cat(x0s)
    fz = tap.fz
    f, f0 = fz.featurize(X), fz.featurize(X0)  # M6: f0 is the value as it arrived at the tap
    o = tap.operand
    if isinstance(o, list):
        o = torch.stack([o[i] for i in rows]) if rect else torch.cat([o[i] for i in rows])
    if o is not None and o.dim():
        o = o.to(f.dtype)
    feats = w.get("features")
    if feats is not None:  # FZ5
        sub = f[..., feats]
        if o is not None and o.dim() and o.shape[-1] == f.shape[-1]:
            o = o[..., feats]
        f_new = f.clone()
        f_new[..., feats] = mechanism(w["mechanism"], sub, o, w.get("params", {}), f0[..., feats])
    else:
        f_new = mechanism(w["mechanism"], f, o, w.get("params", {}), f0)
    X_new = fz.inverse(f_new, X).to(T.dtype)
    T = T.clone()
    at = 0
    for i, x in zip(rows, xs):
        n = x.shape[0]
        piece = X_new[rows.index(i)] if rect else X_new[at:at + n]
        at += n
        T[i, wins[i]] = widen(T[i, wins[i]], piece, tap.site, tap.place.groups)
    return T


def run_forward(model, ids, mask, taps, decode, grad=False):
    """One forward (or a greedy decode, P36/P39/P53) with every tap placed by hooks (R4: writes first)."""
    L = ids.shape[1]
    kept = sorted({p for t in taps if t.place.comp in ("lm_head", "logits") and not t.generated
                   for w in t.windows if w for p in w})
    state = {"step": None, "head_map": {L - 1: 0} if decode else {p: i for i, p in enumerate(kept)}}
    by_place = {}
    for t in taps:
        by_place.setdefault(t.place.key, []).append(t)

    def process(place, t):
        c, back = place.canon(t)
        step = state["step"]
        here = [x for x in by_place[place.key] if x.fires(step)]
        if not here:
            return None
        c0, changed = c, False
        hmap = state["head_map"] if place.comp in ("lm_head", "logits") and step in (None, 0) else None
        for x in [x for x in here if x.kind == "write"]:
            if not x.generated and hmap is not None:
                x = remapped(x, hmap)
            c = apply_write(x, c, c0)
            changed = True
        for x in [x for x in here if x.kind == "read"]:
            if x.generated:  # P39/P40: a decode step computes one position, the last
                v = finish(model, x, c[:, -1], grad)
                if x.stacked:
                    x.stack.append(v)
                else:
                    x.values = [v[i:i + 1] for i in range(v.shape[0])]
            else:
                wins = remapped(x, hmap).windows if hmap is not None else x.windows
                x.values = [None if w is None else finish(model, x, c[i, w], grad) for i, w in enumerate(wins)]
        return back(c) if changed else None

    handles, patched = [], []
    for key, ts in by_place.items():
        place = ts[0].place
        if place.side == "out":
            def hook(mod, args, out, place=place):
                t = out[0] if isinstance(out, tuple) else out
                new = process(place, t)
                if new is not None:
                    return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new
            handles.append(place.module.register_forward_hook(hook))
        elif place.side == "in":
            def pre(mod, args, kwargs, place=place):
                t = args[0] if args else kwargs["hidden_states"]
                new = process(place, t)
                if new is not None:
                    if args:
                        return (new,) + tuple(args[1:]), kwargs
                    return args, {**kwargs, "hidden_states": new}
            handles.append(place.module.register_forward_pre_hook(pre, with_kwargs=True))
        elif place.side == "root":
            def root(mod, args, out, place=place):
                new = process(place, out.logits)
                if new is not None:
                    out.logits = new
                return out
            handles.append(place.module.register_forward_hook(root))
        else:
            patched.append(place)
    restore = install_interiors(model, patched, process)
    try:
        with torch.set_grad_enabled(grad):
            pos = (mask.cumsum(-1) - 1).clamp_min(0)  # R20
            if not decode:
                model.hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                         logits_to_keep=torch.tensor(kept) if kept else 1)
                return None
            cache, gen = DynamicCache(), []
            cur_ids, cur_mask, cur_pos = ids, mask, pos
            for step in range(decode):
                state["step"] = step
                out = model.hf(input_ids=cur_ids, attention_mask=cur_mask, position_ids=cur_pos,
                               past_key_values=cache, use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1].float().clone()
                logits[:, model.stop_ids] = -float("inf")  # P53: every stop id held off
                nxt = logits.argmax(-1)
                gen.append(nxt)
                cur_ids = nxt[:, None]
                cur_mask = torch.cat([cur_mask, torch.ones_like(cur_mask[:, :1])], 1)
                cur_pos = cur_pos[:, -1:] + 1
            return torch.stack(gen, 1)
    finally:
        for h in handles:
            h.remove()
        restore()


def finish(model, tap, v, grad):
    """A read's value: narrowed, featurized (float32, FZ9), a copy, and through the head under a logits view."""
    v = tap.fz.featurize(narrow(v, tap.site, tap.place.groups))
    v = v if grad else v.detach().clone()
    if tap.spec.get("view") == "logits":  # L10; the reference also applies Gemma-2's final softcap (RESULTS.md)
        v = model.hf.lm_head(model.final_norm(v))
        cap = getattr(model.cfg, "final_logit_softcapping", None)
        v = torch.tanh(v / cap) * cap if cap else v
    return v


def remapped(tap, hmap):
    """Q8/Q9: the head is computed only at the kept positions; a window is renumbered into them."""
    if any(p not in hmap for w in tap.windows if w for p in w):
        raise Skip("a head tap before the last prompt position in a decode (a run refusal)")
    t = copy.copy(tap)
    t.windows = [None if w is None else [hmap[p] for p in w] for w in tap.windows]
    return t


def install_interiors(model, places, process):
    """L12: query (arg 1), key (arg 2) and z (the output) of the attention call, reached by wrapping the
    attention function the model dispatches to (the hooks-level equivalent of nnsight's .source)."""
    if not places:
        return lambda: None
    impl = model.cfg._attn_implementation
    mod = sys.modules[type(model.attn(0)).__module__]
    original = mod.eager_attention_forward if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]
    mine = {p.layer: [q for q in places if q.layer == p.layer] for p in places}

    def wrapped(module, query, key, value, attention_mask, **kw):
        ps = mine.get(getattr(module, "layer_idx", None), [])
        for p in ps:
            if p.comp == "attention_query":
                new = process(p, query)
                query = query if new is None else new
            if p.comp == "attention_key":
                new = process(p, key)
                key = key if new is None else new
        out, w = original(module, query, key, value, attention_mask, **kw)
        for p in ps:
            if p.comp == "attention_z":
                new = process(p, out)
                out = out if new is None else new
        return out, w

    if impl == "eager":
        mod.eager_attention_forward = wrapped
        return lambda: setattr(mod, "eager_attention_forward", original)
    ALL_ATTENTION_FUNCTIONS[impl] = wrapped
    return lambda: ALL_ATTENTION_FUNCTIONS.__setitem__(impl, original)


# ----------------------------------------------------------------------------------------------- one pass
def positions_of(o):
    if isinstance(o, dict):
        if "pos" in o:
            yield o["pos"]
        for v in o.values():
            yield from positions_of(v)


def dynamic(iv):
    """P32: a scope, the generated frame, or any cut other than index makes the pass dynamic."""
    for pos in positions_of({"r": iv.get("reads", {}), "w": iv.get("writes", {})}):
        p, cut = spec_of(pos)
        if p.get("scope") or p.get("frame") == "generated" or cut != "index":
            return True
    return False


def answer_id(tok, text, form="space_prefixed"):
    """D15: space_prefixed: leading whitespace stripped, one space prepended, no special tokens, one id; D29:
    bare, the stripped text with no space."""
    ids = tok((" " if form == "space_prefixed" else "") + text.lstrip(), add_special_tokens=False,
              split_special_tokens=True).input_ids  # D29: no special token parsed from the text either
    if len(ids) != 1:
        raise Skip(f"answer {text!r} is {len(ids)} tokens (a compile refusal)")
    return ids[0]


def divergence(kind, v, ref, k):
    """D28 on one row: P from `of` (v), Q from `against` (ref); KL in nats, JS to the mixture, top-k overlap."""
    if kind == "top_k_overlap":
        def top(x):  # ties to the lower id: sort by (-logit, id)
            xs = x.float().tolist()
            return set(sorted(range(len(xs)), key=lambda j: (-xs[j], j))[:k])
        return torch.tensor(len(top(v) & top(ref)) / k)
    p, q = torch.softmax(v.double(), -1), torch.softmax(ref.double(), -1)
    logp, logq = torch.log_softmax(v.double(), -1), torch.log_softmax(ref.double(), -1)
    if kind == "kl":
        return torch.where(p > 0, p * (logp - logq), torch.zeros_like(p)).sum()
    logm = torch.log((p + q) / 2)
    return 0.5 * (torch.where(p > 0, p * (logp - logm), 0.0).sum() + torch.where(q > 0, q * (logq - logm), 0.0).sum())


def readout(tok, v, k):
    """D28's top_k on one row: P = softmax in float32, the k largest, ties to the lower id, each
    [repr(decode([id])), P] (the original's readout.json: the k most likely tokens, decoded, with probabilities)."""
    p = torch.softmax(v.float(), -1).tolist()
    best = sorted(range(len(p)), key=lambda j: (-p[j], j))[:k]
    return [[repr(tok.decode([j])), p[j]] for j in best]


def metric_value(kind, v, ids):
    v = v.float()
    if kind == "soft_accuracy":
        return torch.softmax(v, -1)[ids[0]]
    if kind == "match":
        return (v.argmax() == ids[0]).float()
    if kind == "logit_diff":
        return v[ids[0]] - v[ids[1]]
    if kind == "cross_entropy":
        return -torch.log_softmax(v, -1)[ids[0]]
    if kind == "token_logit":
        return v[ids[0]]
    if kind == "token_prob":
        return torch.softmax(v, -1)[ids[0]]
    raise Skip(f"metric kind {kind}")


class Pass:
    """One intervention over one set of rows: its forwards (R3), taps, metrics."""

    def __init__(self, ctx, iv_name, iv, role_rows, grad=False):
        self.ctx, self.iv_name, self.iv, self.rows, self.grad = ctx, iv_name, iv, role_rows, grad
        self.where = f"interventions.{iv_name}"
        self.reads, self.gen = {}, {}
        self.dynamic = dynamic(iv)
        models = iv.get("models", {})
        decode = iv.get("decode", 0)
        order, seen = [], set()

        def forward_of(read):
            m = read.get("model", "original")
            return (m, models[m]["input"] if m != "original" else read["input"])

        def visit(fw):
            if fw in seen:
                return
            seen.add(fw)
            if fw[0] != "original":
                for w in models[fw[0]]["writes"]:
                    op = iv["writes"][w].get("operand")
                    if isinstance(op, str):
                        visit(forward_of(iv["reads"][op]))
            order.append(fw)

        for r in iv["reads"].values():
            visit(forward_of(r))
        for fw in order:
            self.run(fw, forward_of, decode)
        self.metrics = {m: self.score(m, spec) for m, spec in iv.get("metrics", {}).items()}

    def tap(self, kind, name, spec):
        ctx = self.ctx
        site = ctx.doc["sites"][spec["site"]]
        place = ctx.place(site)
        fzn = spec.get("featurizer", "identity")
        return Tap(kind, name, spec, site, place, Identity() if fzn == "identity" else ctx.featurizers[fzn])

    def run(self, fw, forward_of, decode):
        ctx, iv = self.ctx, self.iv
        m, role = fw
        rows = self.rows[role]
        field = ctx.doc["roles"][role]["field"]
        values = [get_field(r, field) for r in rows]
        ids, mask, frames = encode_role(ctx.model, values)
        taps = []
        if m != "original":
            for w in iv.get("models", {})[m]["writes"]:
                taps.append(self.tap("write", w, iv["writes"][w]))
        taps += [self.tap("read", r, spec) for r, spec in iv["reads"].items() if forward_of(spec) == fw]
        for t in taps:
            if t.generated:
                continue
            t.windows, t.reasons = [], []
            for i, fr in enumerate(frames):
                scope = spec_of(t.spec["pos"])[0].get("scope") or {}
                anchor = variable_text(rows[i], field, scope["variable"]) if "variable" in scope else None
                win, why = resolve(t.spec["pos"], fr, anchor)
                t.windows.append(None if win is None else [fr.start + k for k in win])
                t.reasons.append(why)
            bad = [i for i, w in enumerate(t.windows) if w is None]
            path = f"{self.where}.{t.kind}s.{t.name}.pos"
            if bad and not is_ragged(t.spec["pos"]):
                raise Refusal("compile", path, T_FIXED)  # P29, P58: the prompt frame is placed at compile
            if bad and t.kind == "write":
                raise Refusal("compile", path, T_NOTHING)  # P28, P58
        for t in taps:
            if t.kind == "write":
                self.operand(t)
        gen = run_forward(ctx.model, ids, mask, taps, decode, self.grad)
        if decode:
            self.gen[m] = gen
            self.continuations(taps, gen, rows, field)
        for t in taps:
            if t.kind == "read":
                t.frames = t.frames if t.generated else frames
                self.reads[t.name] = t

    def operand(self, t):
        op = t.spec.get("operand")
        if op is None:
            return
        if isinstance(op, (int, float)):
            t.operand = torch.tensor(float(op), dtype=torch.float32)
            return
        if isinstance(op, dict):  # M11/M17: a ref to an earlier step's output
            out = self.ctx.outputs[op["ref"]]
            t.operand = out["value"] if out["reduce"] == "mean" else list(out["value"])
            if out["reduce"] == "mean" and not t.generated:
                t.operand = t.operand.unsqueeze(0) if t.operand.dim() == 2 else t.operand
            return
        src = self.reads[op]
        t.operand = src.values
        if t.windows is not None:
            diff = [i for i, (w, v) in enumerate(zip(t.windows, src.values)) if w is not None and v is not None
                    and len(w) != v.shape[0]]
            if diff:
                stage = "run" if src.generated else "compile"  # P58: a continuation read's windows are the run's
                raise Refusal(stage, f"{self.where}.writes.{t.name}.pos", T_RAGGED)  # P51

    def continuations(self, taps, gen, rows, field):
        """P37/P38/P40/P45: each row's continuation frame, ending at its first stop id; stacked reads cut per row."""
        tok, stops = self.ctx.model.tok, set(self.ctx.model.stop_ids)
        frames = []
        for i in range(gen.shape[0]):
            g = gen[i].tolist()
            end = next((k + 1 for k, x in enumerate(g) if x in stops), len(g))
            fr = Frame(tok, g[:end], 0)
            fr.segments = {"eos": None}
            if end < len(g) or g[end - 1] in stops:
                fr.segments["eos"] = (fr.offsets[end - 1], fr.offsets[end])
            frames.append(fr)
        for t in taps:
            if not t.generated or t.kind != "read":
                continue
            t.frames = frames
            t.windows, t.reasons = [], []
            stack = torch.stack(t.stack, 1) if t.stacked else None
            vals = []
            for i, fr in enumerate(frames):
                if t.stacked:
                    scope = spec_of(t.spec["pos"])[0].get("scope") or {}
                    anchor = variable_text(rows[i], field, scope["variable"]) if "variable" in scope else None
                    win, why = resolve(t.spec["pos"], fr, anchor)
                else:
                    win, why = [t.step], ""
                t.windows.append(win)
                t.reasons.append(why)
                vals.append(None if win is None else (stack[i, win] if t.stacked else t.values[i]))
            t.values = vals

    def row(self, name, kind, row, i, tap, placed, value, col_ok):
        """One table row (R7): its value, eligibility and, on a dynamic pass, where it was read (P34)."""
        if self.dynamic:
            fr = tap.frames[i]
            if placed:
                w = [p - fr.start for p in tap.windows[i]]
                positions, reason, text = tap.windows[i], "", repr(fr.window_text(w[0], w[-1] + 1))
            else:
                positions, reason, text = [], tap.reasons[i], ""
        else:
            positions, reason, text = None, "", ""
        return {"example_id": str(row.get("example_id", i)), "metric": name, "value": value,
                "eligible": bool(col_ok and placed), "positions": positions, "reason": reason,
                "tokens": text, "unit": UNITS[kind], "estimand_version": VERSIONS.get(kind, f"{kind}/v1"),
                "produced_by": self.ctx.produced_by}

    def score(self, name, spec):
        kind = spec["kind"]
        tap = self.reads[spec["of"]]
        base = self.rows["base"]
        tok = self.ctx.model.tok
        out, vec = [], []
        for i, row in enumerate(base):
            cols = [spec[c] for c in COLUMNS[kind]]
            col_ok = all(isinstance(row.get(c), str) and row[c].strip() for c in cols)
            ref = self.reads[spec["against"]] if "against" in spec else None  # D25: placed by both reads
            placed = tap.windows[i] is not None and (ref is None or ref.windows[i] is not None)
            value = None
            if col_ok and placed and kind == "top_k":
                listed = readout(tok, tap.values[i][0], spec.get("k", 5))
                finite = torch.isfinite(tap.values[i][0].float()).all()
                out.append(self.row(name, kind, row, i, tap, placed, listed if finite else None, col_ok))
                vec.append(torch.tensor(0.0))  # S52: a list is no objective term; it counts as scored
                continue
            if col_ok and placed and ref is not None:
                v = divergence(kind, tap.values[i][0], ref.values[i][0], spec.get("k", 5))
            elif col_ok and placed:
                form = spec.get("token_form", "space_prefixed")
                v = metric_value(kind, tap.values[i][0], [answer_id(tok, row[c], form) for c in cols])
            if col_ok and placed:
                vec.append(v)
                value = float(v)
                value = value if math.isfinite(value) else None
            out.append(self.row(name, kind, row, i, tap, placed, value, col_ok))
        if not vec:
            raise Refusal("run" if tap.generated else "compile", f"{self.where}.metrics.{name}", T_EMPTY_METRIC)  # P31, P58
        return {"table": out, "vector": torch.stack(vec)}


# ----------------------------------------------------------------------------------------------- steps
def tensor_table(t, metadata):
    t = t.detach().contiguous().cpu()
    return {"metadata": metadata, "tensors": {"weight": {"dtype": str(t.dtype).replace("torch.", ""),
                                                         "shape": list(t.shape), "values": t.tolist()}}}


class Context:
    def __init__(self, case, case_dir, fixtures, manifest, label, point, pb):
        self.case, self.case_dir, self.doc, self.label, self.produced_by = case, case_dir, point, label, pb
        self.model = load_model(fixtures, manifest, point["model"])
        self.outputs, self.tables = {}, {}
        self.featurizers = build_featurizers(point, case_dir, self.featurizer_widths())

    def place(self, site):
        return Place(self.model, site["component"], (site.get("layers") or [None])[0])

    def site_width(self, site_name):
        """A site's features per position, narrowed by heads or units (L13, L16, FZ22)."""
        site, m = self.doc["sites"][site_name], self.model
        comp, hd = site["component"], getattr(m.cfg, "head_dim", None) or m.cfg.hidden_size // m.n_heads
        full = {"attention_key": m.n_kv * hd, "attention_query": m.n_heads * hd, "attention_z": m.n_heads * hd,
                "attention_premix": m.n_heads * hd, "lm_head": m.cfg.vocab_size,
                "logits": m.cfg.vocab_size}.get(comp, m.cfg.hidden_size)
        if site.get("heads"):
            return full // (m.n_kv if comp == "attention_key" else m.n_heads) * len(site["heads"])
        return len(site["units"]) if site.get("units") else full

    def featurizer_site(self, name):
        """FZ19: a featurizer's one site, that of every read and write naming it."""
        return next((spec["site"] for iv in self.interventions().values()
                    for spec in list(iv.get("reads", {}).values()) + list(iv.get("writes", {}).values())
                    if spec.get("featurizer") == name), None)

    def featurizer_widths(self):
        sites = {n: self.featurizer_site(n) for n in self.doc.get("featurizers") or {}}
        return {n: self.site_width(site) for n, site in sites.items() if site}

    def interventions(self):
        ivs = dict(self.doc.get("interventions", {}))
        for sname, step in self.doc["steps"].items():
            named = step.get("interventions", step.get("intervention"))
            if isinstance(named, dict):  # M22
                ivs[sname] = named
            elif isinstance(named, list):
                for k, x in enumerate(named):
                    if isinstance(x, dict):
                        ivs[f"{sname}[{k}]"] = x
        return ivs

    def step_interventions(self, sname, step):
        named = step.get("interventions", step.get("intervention"))
        if named is None:
            return list(self.doc["interventions"])
        if isinstance(named, str):
            return [named]
        if isinstance(named, dict):
            return [sname]
        return [x if isinstance(x, str) else f"{sname}[{k}]" for k, x in enumerate(named)]

    def rows(self, ref):
        """D9: <dir>/<table>[#split]."""
        table, _, split = ref.partition("#")
        src = self.case["data"][table + ".json"]
        rows = json.load(open(os.path.join(self.case_dir, src))) if isinstance(src, str) else src
        return [r for r in rows if not split or r.get("split") == split]

    def save(self, file_path, table):
        self.tables[f"{self.label}/{file_path}" if self.label else file_path] = table

    def stamp(self, site_name, kind, k, d, param):
        site = self.doc["sites"][site_name]
        mb = self.doc["model"]
        # FZ36: names are text, every other value its JSON text (null for none)
        return {"component": site["component"], "d": json.dumps(d), "featurizer_dtype": "fp32",
                "heads": json.dumps(site.get("heads")), "k": json.dumps(k), "kind": kind,
                "layer": json.dumps((site.get("layers") or [None])[0]), "model_dtype": mb["dtype"], "model_key": mb["key"],
                "model_revision": mb["revision"], "parametrization": param, "produced_by": self.produced_by,
                "site": site_name, "units": json.dumps(site.get("units"))}

    def run_steps(self):
        ivs = self.interventions()
        for sname, step in self.doc["steps"].items():
            kind = step.get("kind", "observe")
            if kind == "observe":
                self.observe(sname, step, ivs)
            elif kind == "fit":
                self.fit(sname, step, ivs)
            elif kind == "weights":
                self.weights(step)
            else:
                raise Skip(f"step kind {kind}")

    def observe(self, sname, step, ivs):
        names = self.step_interventions(sname, step)
        role_rows = {r: self.rows(ref) for r, ref in step["rows"].items()}
        passes = {n: Pass(self, n, ivs[n], role_rows) for n in names}
        if len(names) == 1:  # M13: outputs of a step that runs several interventions are not visible later
            p = passes[names[0]]
            for oname, o in (step.get("outputs") or {}).items():
                o = {"read": o, "reduce": "none"} if isinstance(o, str) else o
                tap = p.reads[o["read"]]
                vals = [v for v in tap.values if v is not None]
                if o.get("reduce", "none") == "mean":  # M11
                    value = torch.stack(vals).mean(0) if not is_ragged(tap.spec["pos"]) else torch.cat(vals).mean(0)
                elif o.get("reduce", "none") == "none":
                    value = tap.values
                else:
                    raise Skip("reduce: pca")
                self.outputs[oname] = {"value": value, "reduce": o.get("reduce", "none"), "tap": tap}
        for s in step.get("saves", []):
            v = s["value"]
            if "/" in v and v.split("/")[0] in passes:
                self.save(s["file_path"], passes[v.split("/")[0]].metrics[v.split("/")[1]]["table"])
            elif any(v in p.metrics for p in passes.values()):
                self.save(s["file_path"], next(p.metrics[v]["table"] for p in passes.values() if v in p.metrics))
            elif v in self.outputs:
                o = self.outputs[v]
                if o["reduce"] != "mean":
                    raise Skip("a save of an unreduced output")
                site = o["tap"].spec["site"]
                meta = self.stamp(site, "output/mean", None, self.site_width(site), "")
                self.save(s["file_path"], tensor_table(o["value"], meta))
            elif v.endswith(".generated"):
                p = passes[names[0]]
                self.save(s["file_path"], tensor_table(p.gen[v[:-len(".generated")]], {}))
            else:
                raise Skip(f"save of {v}")

    def fit(self, sname, step, ivs):
        """FZ12-FZ16: AdamW over the trained featurizers' leaves, minibatches from random.Random(seed)."""
        if step.get("anneal"):
            raise Skip("fit with anneal")
        (iv_name,) = self.step_interventions(sname, step)
        iv = ivs[iv_name]
        leaves = []
        for n in step["params"]:
            fz = self.featurizers[n]
            if not isinstance(fz, Subspace) or fz.fixed_Q is not None:
                raise Skip(f"fit of a {fz.kind}")
            fz.W = fz.W.clone().requires_grad_(True)
            leaves.append(fz.W)
        opt_spec = step.get("optimizer", {})
        kw = {"lr": opt_spec["lr"]} if "lr" in opt_spec else {}
        # FZ14 says "torch defaults otherwise"; torch's AdamW default weight_decay is 0.01, but the reference
        # (and its expected weights) use 0.0 when the document gives none. See RESULTS.md.
        kw["weight_decay"] = opt_spec.get("weight_decay", 0.0)
        opt = torch.optim.AdamW(leaves, **kw)
        rows = {r: self.rows(ref) for r, ref in step["rows"].items()}
        eval_rows = {r: self.rows(ref) for r, ref in step["eval"]["rows"].items()}
        n, pairs = len(rows["base"]), step["pairs"]
        order = random.Random(step.get("seed", 0))
        es = step.get("early_stop")
        losses, evals, best, bad, last_eval = [], [], None, 0, None
        for _ in range(step["epochs"]):
            perm = order.sample(range(n), n)
            for b in range(0, n, pairs):
                idx = perm[b:b + pairs]
                sub = {r: [v[i] for i in idx] for r, v in rows.items()}
                p = Pass(self, iv_name, iv, sub, grad=True)
                loss = sum(w * p.metrics[term]["vector"].mean() for w, term in step["objective"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss))
            with torch.no_grad():
                last_eval = Pass(self, iv_name, iv, eval_rows)
            if es:
                m = float(last_eval.metrics[es["metric"]]["vector"].mean())
                evals.append(m)
                better = best is None or (m > best if es.get("mode", "max") == "max" else m < best)
                best, bad = (m, 0) if better else (best, bad + 1)
                if bad >= es.get("patience", 1):
                    break
        for fzn in step["params"]:
            self.featurizers[fzn].W = self.featurizers[fzn].W.detach()
        for s in step["eval"].get("saves", []):
            self.save(s["file_path"], last_eval.metrics[s["value"]]["table"])
        for s in step.get("saves", []):
            if s["value"] == "train/loss":
                self.save(s["file_path"], tensor_table(torch.tensor(losses, dtype=torch.float32), {}))
            else:
                raise Skip(f"fit save {s['value']}")

    def weights(self, step):
        for s in step.get("saves", []):
            fz, site = self.featurizers[s["value"]], self.featurizer_site(s["value"])
            d = self.site_width(site)
            if fz.kind == "subspace":
                t = fz.W
            elif fz.kind == "pca":
                t = fz.fixed_Q
            else:
                raise Skip(f"weights of a {fz.kind}")
            # The stamp's parametrization is "cayley" for every kind (see RESULTS.md: not stated by SPEC for pca).
            self.save(s["file_path"], tensor_table(t, self.stamp(site, fz.kind, fz.k, d, "cayley")))


# ----------------------------------------------------------------------------------------------- comparison
#: C6: a probability's value (and every probability of a top_k row's pairs, D28) is relative to 2^-126
FINE = ("probability", "[token, probability] list")


def compare(e, g, tol, path="", diffs=None, floor=0.01):
    diffs = [] if diffs is None else diffs
    if isinstance(e, dict):
        if not isinstance(g, dict):
            diffs.append(f"{path}: expected an object, got {type(g).__name__}")
        elif list(e) != list(g):
            diffs.append(f"{path}: keys {list(e)} != {list(g)}")
        else:
            for k in e:
                if path.endswith("metadata") and k == "engine":
                    continue
                fine = k == "value" and e.get("unit") in FINE
                compare(e[k], g[k], tol, f"{path}.{k}" if path else k, diffs, 2.0 ** -126 if fine else 0.01)
    elif isinstance(e, list):
        if not isinstance(g, list) or len(e) != len(g):
            diffs.append(f"{path}: expected {len(e)} items, got {len(g) if isinstance(g, list) else g!r}")
        else:
            for i, (a, b) in enumerate(zip(e, g)):
                compare(a, b, tol, f"{path}[{i}]", diffs, floor)
    elif isinstance(e, float) and isinstance(g, (int, float)) and not isinstance(g, bool):
        if not abs(e - g) <= tol * max(abs(e), floor):
            diffs.append(f"{path}: expected {e!r}, got {g!r}")
    elif type(e) is not type(g) or e != g:
        diffs.append(f"{path}: expected {e!r}, got {g!r}")
    return diffs


def every_layer(point, every, fixtures, manifest):
    """D34: a point whose sites read every layer is run once per layer of the model (its config.json's layer
    count), each run the point with those sites at that one layer; a point without one is itself."""
    if not every:
        return [point]
    ent = manifest["fixtures"].get(point["model"]["key"])
    if ent is None:
        raise Skip("model key is not in the manifest")
    config = json.load(open(os.path.join(fixtures, ent["folder"], "config.json")))
    count = config.get("num_hidden_layers", config.get("n_layer"))
    out = []
    for layer in range(count):
        one = copy.deepcopy(point)
        for name in every:
            one["sites"][name]["layers"] = [layer]
        out.append(one)
    return out


def merge_layer(tables, new, point, every, layer):
    """D34's table: a metric of a read at an "all" site is one file of rows by (layer, example), `layer` right
    after `metric`; any other table is the first layer's."""
    layered = set()
    for iv in point.get("interventions", {}).values():
        for m, spec in iv.get("metrics", {}).items():
            if any(iv["reads"].get(spec.get(f), {}).get("site") in every for f in ("of", "against")):
                layered.add(m)
    for name, table in new.items():
        if isinstance(table, list) and every and table and table[0].get("metric") in layered:
            rows = [dict(list(r.items())[:2] + [("layer", layer)] + list(r.items())[2:]) for r in table]
            tables[name] = tables.get(name, []) + rows
        elif layer == 0:
            tables[name] = table


def run_case(path, fixtures, manifest):
    case = json.load(open(path))
    case_dir = os.path.dirname(os.path.abspath(path))
    if case["verb"] != "run":
        raise Skip(f"verb {case['verb']}")
    raw = case["document"]
    protocol = "method" in raw
    steps_first = "data" in raw and "steps" in raw and not protocol  # SPEC §15 (SF1)
    doc = lower_protocol(raw) if protocol else lower_steps_first(json.loads(json.dumps(raw))) if steps_first \
        else raw
    ent = manifest["fixtures"].get(case["fixture"]["key"], {})
    if ent.get("recipe") != case["fixture"]["recipe"]:
        raise Skip("the fixture folder's recipe is not the case's (re-export the fixtures)")
    tables = {}
    expect = case["expect"]
    try:
        for label, point in expand_sweeps(doc):
            pb = produced_by(point, raw if protocol else None)
            if steps_first and not label:  # SF15: the document as given, without its header
                pb = sha({k: v for k, v in raw.items() if k != "header"})
            every = [n for n, site in point.get("sites", {}).items() if site.get("layers") == "all"]
            for layer, one in enumerate(every_layer(point, every, fixtures, manifest)):
                ctx = Context(case, case_dir, fixtures, manifest, label, one, pb)
                ctx.run_steps()
                merge_layer(tables, ctx.tables, one, every, layer)
    except Refusal as r:
        if expect["status"] != 2:
            return [f"refused {r}"]
        want = expect["refusal"]
        got = {"stage": r.stage, "path": r.path, "message": r.message}
        return [f"refusal.{k}: expected {want[k]!r}, got {got[k]!r}" for k in want if want[k] != got[k]]
    if expect["status"] != 0:
        return [f"expected refusal {expect.get('refusal')}, but the run completed"]
    want = expect.get("tables", {})
    diffs = []
    if sorted(want) != sorted(tables):
        diffs.append(f"files: expected {sorted(want)}, got {sorted(tables)}")
    for k in want:
        if k in tables:
            compare(want[k], tables[k], case.get("tolerance", 1e-5), k, diffs)
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--show", type=int, default=5, help="differing fields shown per failing case")
    a = ap.parse_args()
    torch.set_num_threads(1)
    manifest = json.load(open(os.path.join(a.fixtures, "manifest.json")))
    results = {"PASS": [], "FAIL": [], "SKIP": []}
    for path in a.cases:
        name = os.path.basename(path)[:-5]
        try:
            diffs = run_case(path, a.fixtures, manifest)
            status = "FAIL" if diffs else "PASS"
            print(f"{status} {name}" + "".join(f"\n    {d}" for d in diffs[:a.show])
                  + (f"\n    ... {len(diffs) - a.show} more" if len(diffs) > a.show else ""))
        except Skip as s:
            status = "SKIP"
            print(f"SKIP {name}: {s}")
        results[status].append(name)
        sys.stdout.flush()
    print(f"\n{len(results['PASS'])} pass, {len(results['FAIL'])} fail, {len(results['SKIP'])} skip")
    if results["SKIP"]:
        print("skipped: " + ", ".join(results["SKIP"]))
    return 1 if results["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())

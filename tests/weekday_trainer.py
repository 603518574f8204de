"""Train a tiny Llama-architecture model on the weekday task ("If today is X, tomorrow is" -> " Y").

Standalone: torch, transformers, tokenizers, safetensors only. CPU, one thread, fixed seed, deterministic
(two runs on the same machine write byte-identical files, train_log.txt aside).

    python3 tests/weekday_trainer.py --out DIR

It wrote the committed causalab_ref/fixtures/fixture_data/weekday-llama/ (SPEC.md §5 X19); a rerun on this
machine reproduces its files byte for byte but train_log.txt (which records the wall time and --out's last component).

Data: prompts [prefix] [filler] [distractor sentence] template(X[, distractor clause]) -> " " + day after X,
eight templates, ten prefixes, twelve fillers; half of every batch carries a distractor (another weekday Y
in a role that is not "today"). Held-out: 20% of the (prefix, filler, template) combinations, never seen in
training. Loss on the answer token only (cross-entropy, label smoothing 0.1).

A known mechanism at the input (the way tracr and InterpBench fix one in advance): the fourteen weekday rows of
the tied embedding (each day bare and space-prefixed) are not learned. Day i sits at angle 2*pi*i/7 on a
circle of radius --circle (1.0) in one fixed plane (u, v), plus one fixed offset per form (of the same norm);
u, v and the two offsets' directions are orthonormal columns of a seeded QR. So the weekday enters the model
in two dimensions, the answer is read off the same circle through the tied head, and "tomorrow" can be a
rotation by 2*pi/7 in that plane: a 2-dimensional subspace at the entity's token carries all of it (SPEC.md
X26). The rows are written once before training and again after every optimizer step (AdamW's decoupled
decay would otherwise shrink them).

writes into --out:
    config.json, generation_config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json, special_tokens_map.json,
    splits.json (the train / held-out prompts), train_log.txt
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import random
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 26
THREADS = 1

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NEXT = {d: DAYS[(i + 1) % 7] for i, d in enumerate(DAYS)}

# ------------------------------------------------------------------ task prompts
# A prompt is  [prefix] [filler] [distractor sentence] template(X, [distractor clause]);  the answer is
# " " + NEXT[X].  A distractor names another weekday Y != X in a role that is not "today", before the
# template (a sentence) or inside it (a clause after X), so that which weekday is "today" has to be read
# from the context, not from the recency or the presence of a weekday token.
PREFIXES = ["", "Note:", "Well,", "So,", "Okay,", "Hey,", "Listen,", "Question:", "Remember:", "Hmm,"]
FILLERS = [
    "",
    "It is sunny.",
    "I checked the calendar.",
    "Here is a riddle.",
    "This is easy.",
    "Think about it.",
    "The week has seven days.",
    "My friend asked me.",
    "We are at home.",
    "Let me see.",
    "It rained all night. The train was late.",
    "I woke up early. The coffee was cold.",
]
TEMPLATES = [
    "If today is {X}{MID}, tomorrow is",
    "Today is {X}{MID}, so tomorrow is",
    "When today is {X}{MID}, tomorrow is",
    "If it is {X} today{MID}, tomorrow is",
    "Given that today is {X}{MID}, tomorrow is",
    "Today is {X}{MID}. Tomorrow is",
    "It is {X} today{MID}, which means tomorrow is",
    "Suppose today is {X}{MID}; then tomorrow is",
]
# index 0: no distractor; a leading space marks a clause inside the template, else a sentence before it
DISTRACTORS = ["", "The meeting is on {Y}.", "My exam was on {Y}.", " and the party is on {Y}", " and lunch was on {Y}"]
DISTRACTOR_DAYS_PER_CLAUSE = 2  # Y draws per (context, distractor clause)
HELDOUT_FRACTION = 0.2  # of the (prefix, filler, template) contexts, with all their distractor variants
DISTRACTOR_SHARE = 0.5  # of each training batch

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, the Llama-2 order for unk / bos / eos, then pad


def _lower_first(s: str) -> str:
    return s if s.startswith("I ") else s[:1].lower() + s[1:]


def render(prefix: str, filler: str, template: str, day: str, distractor: str = "", yday: str = "") -> str:
    mid = distractor.replace("{Y}", yday) if distractor.startswith(" ") else ""
    pre = distractor.replace("{Y}", yday) if distractor and not distractor.startswith(" ") else ""
    parts = []
    for part in (prefix, filler, pre, template.replace("{X}", day).replace("{MID}", mid)):
        if not part:
            continue
        if parts and parts[-1].endswith(","):
            part = _lower_first(part)
        parts.append(part)
    return " ".join(parts)


def base_contexts() -> list[tuple[int, int, int]]:
    return [(p, f, t) for t in range(len(TEMPLATES)) for p in range(len(PREFIXES)) for f in range(len(FILLERS))]


def split_contexts(seed: int) -> tuple[list, list]:
    """Contexts [prefix, filler, template, distractor, Y] (distractor 0 and Y -1: none). Held-out: a seeded
    20% draw of the (prefix, filler, template) combinations, with all their distractor variants; never the
    plain template 0 with no prefix and no filler (the documents' own prompt stays in training)."""
    ctx = base_contexts()
    rng = random.Random(seed)
    order = list(ctx)
    rng.shuffle(order)
    n_held = int(round(HELDOUT_FRACTION * len(ctx)))
    held = set()
    for c in order:
        if len(held) == n_held:
            break
        if c != (0, 0, 0):
            held.add(c)

    def variants(c):
        out = [list(c) + [0, -1]]
        for dc in range(1, len(DISTRACTORS)):
            for y in sorted(rng.sample(range(7), DISTRACTOR_DAYS_PER_CLAUSE)):
                out.append(list(c) + [dc, y])
        return out

    train, heldout = [], []
    for c in ctx:  # fixed order, so the Y draws are fixed by the seed
        (heldout if c in held else train).extend(variants(c))
    return train, heldout


def rows(ctx_list) -> list[dict]:
    out = []
    for (p, f, t, dc, y) in ctx_list:
        for d in DAYS:
            if y >= 0 and DAYS[y] == d:
                continue
            text = render(PREFIXES[p], FILLERS[f], TEMPLATES[t], d, DISTRACTORS[dc], DAYS[y] if y >= 0 else "")
            out.append({"context": [p, f, t, dc, y], "entity": d, "input": text, "answer": " " + NEXT[d],
                        "distractor": dc > 0})
    return out


# ------------------------------------------------------------------ tokenizer


def tokenizer_corpus() -> list[str]:
    """Every prompt with its answer, both splits (the tokenizer is not the model: held-out contexts are
    combinations of seen pieces), plus lines that start with a bare weekday and a Llama-2 chat turn, so
    "Monday" and " Monday" are both single tokens, and a few generic lines."""
    tr, ho = split_contexts(SEED)
    lines = [r["input"] + r["answer"] + "." for r in rows(tr + ho)]
    for d in DAYS:
        lines += [d, d + ".", f"{d} comes before {NEXT[d]}.", f"{NEXT[d]} comes after {d}."]
        lines += [f"[INST] Name a weekday. [/INST] {d}. </s><s>[INST] If today is {d}, tomorrow is [/INST] {NEXT[d]}."]
    return lines


def build_tokenizer(out: pathlib.Path) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,  # never reached: training stops when every corpus word is one token
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    tok.save(str(out / "tokenizer.json"), pretty=True)
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 64,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, sort_keys=True, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
        sort_keys=True, indent=2) + "\n")
    # the contract: every weekday, bare and space-prefixed, is one token
    for d in DAYS:
        for form in (d, " " + d):
            ids = tok.encode(form, add_special_tokens=False).ids
            assert len(ids) == 1, (form, ids)
    return tok


# ------------------------------------------------------------------ model


def model_config(vocab_size: int, args) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "dtype": "float32",
        "head_dim": args.hidden // args.heads,
        "hidden_act": "silu",
        "hidden_size": args.hidden,
        "initializer_range": 0.02,
        "intermediate_size": args.intermediate,
        "max_position_embeddings": 64,
        "mlp_bias": False,
        "num_attention_heads": args.heads,
        "num_hidden_layers": args.layers,
        "num_key_value_heads": args.heads,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def encode_rows(tok: Tokenizer, rs: list[dict], pad_id: int):
    """Right-padded ids (causal attention: padding after a row's last token never reaches it), each row's
    last index, and the answer ids."""
    enc = [tok.encode(r["input"]).ids for r in rs]
    ans = []
    for r in rs:
        a = tok.encode(r["answer"], add_special_tokens=False).ids
        assert len(a) == 1, r
        ans.append(a[0])
    n = max(len(e) for e in enc)
    ids = torch.full((len(enc), n), pad_id, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
    last = torch.tensor([len(e) - 1 for e in enc])
    return ids, last, torch.tensor(ans)


@torch.no_grad()
def accuracy(model, ids, last, ans, bs=512) -> float:
    model.eval()
    hit = 0
    for i in range(0, len(ids), bs):
        logits = model(input_ids=ids[i:i + bs]).logits
        pred = logits[torch.arange(len(logits)), last[i:i + bs]].argmax(-1)
        hit += int((pred == ans[i:i + bs]).sum())
    model.train()
    return hit / len(ids)


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="weekday-llama")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=192)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--no-distractors", action="store_true")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--circle", type=float, default=1.0, help="radius of the fixed weekday circle (0: learned rows)")
    args = ap.parse_args()

    t0 = time.time()
    c0 = time.process_time()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        log_lines.append(s)

    tok = build_tokenizer(out)
    vocab = tok.get_vocab_size()
    pad_id = tok.token_to_id("<pad>")
    log(f"tokenizer: byte-level BPE, vocab {vocab}; weekday ids " +
        " ".join(f"{d}={tok.token_to_id(d)}/{tok.token_to_id(chr(0x120) + d)}" for d in DAYS))

    train_ctx, held_ctx = split_contexts(args.seed)
    if args.no_distractors:
        train_ctx = [c for c in train_ctx if c[3] == 0]
        held_ctx = [c for c in held_ctx if c[3] == 0]
    train_rows, held_rows = rows(train_ctx), rows(held_ctx)
    (out / "splits.json").write_text(json.dumps({
        "prefixes": PREFIXES, "fillers": FILLERS, "templates": TEMPLATES, "distractors": DISTRACTORS,
        "days": DAYS, "train_contexts": train_ctx, "heldout_contexts": held_ctx,
        "note": "a context is [prefix, filler, template, distractor, Y] (indices; distractor 0 and Y -1 = none); "
                "it gives one row per weekday X != Y: render(prefixes[p], fillers[f], templates[t], X, "
                "distractors[d], days[Y]) -> ' ' + the day after X",
    }, separators=(",", ":")) + "\n")
    log(f"contexts: {len(train_ctx)} train, {len(held_ctx)} held-out; rows: {len(train_rows)} train, "
        f"{len(held_rows)} held-out")
    sets = {}
    for split, rs in (("train", train_rows), ("held-out", held_rows)):
        for kind, flag in (("plain", False), ("distractor", True)):
            sub = [r for r in rs if r["distractor"] == flag]
            if sub:
                sets[(split, kind)] = encode_rows(tok, sub, pad_id)
    for (split, kind), (ids, last, _) in sets.items():
        log(f"{split} {kind}: {len(ids)} rows, prompt length (with <s>) {int(last.min()) + 1}..{int(last.max()) + 1}")

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model_config(vocab, args)
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, mlp {args.intermediate}, "
        f"{n_params} parameters")

    day_ids = None
    if args.circle:
        # the weekday rows of the (tied) embedding, fixed: form offset + a point on one circle in a fixed plane
        cg = torch.Generator().manual_seed(args.seed + 1)
        q, _ = torch.linalg.qr(torch.randn(args.hidden, 2 + 2, generator=cg))
        u, v, o_bare, o_space = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
        rows_, fixed = [], []
        for i, d in enumerate(DAYS):
            theta = 2 * math.pi * i / 7
            point = args.circle * (math.cos(theta) * u + math.sin(theta) * v)
            for form, off in ((d, o_bare), (chr(0x120) + d, o_space)):
                rows_.append(tok.token_to_id(form))
                fixed.append(point + args.circle * off)
        day_ids, day_fixed = torch.tensor(rows_), torch.stack(fixed)
        with torch.no_grad():
            model.model.embed_tokens.weight[day_ids] = day_fixed
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98))
    warm = 100

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        return args.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

    # each batch: DISTRACTOR_SHARE of it from the distractor rows, the rest from the plain rows
    g = torch.Generator().manual_seed(args.seed)
    pools = [sets[("train", "plain")]] + ([sets[("train", "distractor")]] if ("train", "distractor") in sets else [])
    shares = [args.batch] if len(pools) == 1 else [args.batch - int(args.batch * DISTRACTOR_SHARE),
                                                    int(args.batch * DISTRACTOR_SHARE)]
    perms = [torch.randperm(len(p[0]), generator=g) for p in pools]
    cursors = [0 for _ in pools]

    def evaluate():  # held-out sets only, during training (the train sets are scored at the end)
        return "  ".join(f"{split} {kind} acc {accuracy(model, *v):.4f}" for (split, kind), v in sets.items()
                         if split == "held-out")

    running = 0.0
    for step in range(args.steps):
        parts = []
        for i, (pool, n) in enumerate(zip(pools, shares)):
            if cursors[i] + n > len(perms[i]):
                perms[i] = torch.randperm(len(pool[0]), generator=g)
                cursors[i] = 0
            idx = perms[i][cursors[i]:cursors[i] + n]
            cursors[i] += n
            parts.append((pool[0][idx], pool[1][idx], pool[2][idx]))
        width = max(int(p[1].max()) + 1 for p in parts)
        ids = torch.cat([p[0][:, :width] if p[0].shape[1] >= width else
                         F.pad(p[0], (0, width - p[0].shape[1]), value=pad_id) for p in parts])
        last = torch.cat([p[1] for p in parts])
        ans = torch.cat([p[2] for p in parts])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = model(input_ids=ids).logits
        logit_ans = logits[torch.arange(len(ids)), last]
        # loss on the answer token only; label smoothing keeps p(answer) off exactly 1.0 in float32
        loss = F.cross_entropy(logit_ans, ans, label_smoothing=args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if day_ids is not None:
            with torch.no_grad():
                model.model.embed_tokens.weight[day_ids] = day_fixed
        running += float(loss.detach())
        if (step + 1) % 100 == 0:
            log(f"step {step + 1:5d}  lr {lr_at(step):.5f}  loss {running / 100:.5f}")
            running = 0.0
        if (step + 1) % 250 == 0 and step + 1 != args.steps:
            log(f"step {step + 1:5d}  {evaluate()}")

    for (split, kind), v in sets.items():
        log(f"final {split} {kind} argmax accuracy {accuracy(model, *v):.4f} ({len(v[0])} rows)")

    # ---- save: config.json we control, weights in sorted key order, the tied lm_head stored once
    (out / "config.json").write_text(json.dumps(cfg, sort_keys=True, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "do_sample": False, "max_new_tokens": 1},
        sort_keys=True, indent=2) + "\n")
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file({k: sd[k] for k in sorted(sd)}, str(out / "model.safetensors"), metadata={"format": "pt"})

    elapsed = time.time() - t0
    # --out is logged by its last component: a machine's folder names have no place in a committed file.
    log(f"args: {json.dumps({**vars(args), 'out': pathlib.Path(args.out).name}, sort_keys=True)}")
    log(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    log(f"wall time {elapsed:.1f} s, cpu time {time.process_time() - c0:.1f} s")
    for f in sorted(out.iterdir()):
        if f.name != "train_log.txt":
            log(f"file {f.name} {f.stat().st_size} bytes sha256 {sha256(f)}")
    (out / "train_log.txt").write_text("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()

"""Train a tiny GPT-2 whose causal variable is distributed: "Everyone knows Ada plays for the" -> " Reds".

Standalone: torch, transformers, tokenizers and safetensors only. CPU, one thread, fixed seed, deterministic
(two runs on the same machine write byte-identical files, train_log.txt aside).

    python3 tests/distributed_trainer.py --out DIR

It wrote the committed causalab_ref/fixtures/fixture_data/distributed-gpt2/ (SPEC.md §5 X28); a rerun on this
machine reproduces its files byte for byte but train_log.txt (which records the wall time and --out).

The task: sixteen names, each on one of four teams; a prompt is [prefix] [filler] template(name) and the answer
is " " + the name's team. Held-out: 20% of the (prefix, filler, template) contexts, never seen in training.
Loss on the answer token only (cross-entropy, label smoothing 0.1).

The mechanism, known by construction (as weekday_trainer.py fixes its weekday rows): the sixteen name rows of
the tied embedding are not learned. Name i has team i % 4 and nuisance value i // 4 (a grid: every team meets
every nuisance value once). Its row is the team's angle on a circle of radius --team-radius (1.0) in one plane
(u, v) plus the nuisance value's angle on a circle of radius --nuisance-radius (3.0) in another plane (w, z),
the four directions orthonormal columns of a seeded QR over all hidden dimensions. No prompt names the
nuisance and the answer never depends on it, yet its variance across names is 9 times the team's: the top
principal directions of the name's states are (w, z), while the team lives in (u, v). Swapping the (u, v)
part of another name into a name's state gives exactly the row of a third name (the counterfactual's
team, the base's nuisance value), so a model that knows every name answers that name's team (SPEC.md X30).
The rows are written once before training and again after every optimizer step.

writes into --out:
    config.json, generation_config.json, model.safetensors,
    vocab.json, merges.txt, tokenizer_config.json (the GPT-2 tokenizer path: GPT2Tokenizer over a byte-level BPE),
    splits.json (the train / held-out contexts), train_log.txt
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
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SEED = 34
THREADS = 1
EOT = "<|endoftext|>"

NAMES = ["Ada", "Ben", "Cal", "Dan", "Eli", "Fay", "Gus", "Hal",
         "Ivy", "Joe", "Kim", "Lou", "Max", "Ned", "Oli", "Pam"]
TEAMS = ["Reds", "Blues", "Greens", "Golds"]
TEAM = {name: TEAMS[i % 4] for i, name in enumerate(NAMES)}
NUISANCE = {name: i // 4 for i, name in enumerate(NAMES)}

# A prompt is  [prefix] [filler] template(name);  every template puts a word before the name, so the name is
# always its space-prefixed token and never the first.
PREFIXES = ["", "Note:", "Well,", "Okay,", "Listen,", "Fun fact:", "Hmm,", "Yes.", "Right.", "Look,"]
FILLERS = ["", "It is late.", "The game starts soon.", "I asked around.", "Here is a fact.", "The stadium is full."]
TEMPLATES = [
    "Everyone knows {E} plays for the",
    "I hear {E} plays for the",
    "They say {E} plays for the",
    "Our friend {E} plays for the",
    "This season {E} plays for the",
    "Of course {E} plays for the",
    "As always, {E} plays for the",
    "We know that {E} plays for the",
]
HELDOUT_FRACTION = 0.2  # of the (prefix, filler, template) contexts


def render(prefix: str, filler: str, template: str, name: str) -> str:
    return " ".join(part for part in (prefix, filler, template.replace("{E}", name)) if part)


def split_contexts(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Contexts [prefix, filler, template]; held-out: a seeded 20% draw of them (never the plain template 0
    with no prefix and no filler)."""
    ctx = [[p, f, t] for t in range(len(TEMPLATES)) for p in range(len(PREFIXES)) for f in range(len(FILLERS))]
    order = list(range(len(ctx)))
    random.Random(seed).shuffle(order)
    n_held = int(round(HELDOUT_FRACTION * len(ctx)))
    held = set([i for i in order if ctx[i] != [0, 0, 0]][:n_held])
    train = [c for i, c in enumerate(ctx) if i not in held]
    heldout = [c for i, c in enumerate(ctx) if i in held]
    return train, heldout


def rows(contexts: list[list[int]]) -> list[dict]:
    return [{"context": c, "entity": name, "input": render(PREFIXES[c[0]], FILLERS[c[1]], TEMPLATES[c[2]], name),
             "answer": " " + TEAM[name]} for c in contexts for name in NAMES]


# ------------------------------------------------------------------ tokenizer


def build_tokenizer(out: pathlib.Path) -> Tokenizer:
    """A byte-level BPE trained until every corpus word is one token (vocab.json, merges.txt), read by
    transformers' GPT2Tokenizer: no BOS, <|endoftext|> as eos, unk and pad."""
    train, held = split_contexts(SEED)
    lines = [r["input"] + r["answer"] + "." for r in rows(train + held)]
    lines += [f"{name} plays for the {TEAM[name]}." for name in NAMES]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=1, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    tok.model.save(str(out))  # vocab.json, merges.txt
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "add_bos_token": False, "add_prefix_space": False,
        "bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT, "padding_side": "left",
        "model_max_length": 32}, sort_keys=True, indent=2) + "\n")
    for word in [" " + n for n in NAMES] + [" " + t for t in TEAMS]:  # the contract: one token each
        assert len(tok.encode(word).ids) == 1, word
    return tok


# ------------------------------------------------------------------ model


def model_config(vocab_size: int, eot: int, args) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "attn_pdrop": 0.0,
        "bos_token_id": eot,
        "dtype": "float32",
        "embd_pdrop": 0.0,
        "eos_token_id": eot,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-5,
        "n_ctx": 32,
        "n_embd": args.hidden,
        "n_head": args.heads,
        "n_inner": args.inner,
        "n_layer": args.layers,
        "n_positions": 32,
        "pad_token_id": eot,
        "resid_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def encode_rows(tok: Tokenizer, rs: list[dict], pad_id: int):
    """Right-padded ids (causal attention: padding after a row's last token never reaches it), each row's
    last index, and the answer ids."""
    enc = [tok.encode(r["input"]).ids for r in rs]
    ans = torch.tensor([tok.encode(r["answer"]).ids[0] for r in rs])
    ids = torch.full((len(enc), max(len(e) for e in enc)), pad_id, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
    return ids, torch.tensor([len(e) - 1 for e in enc]), ans


@torch.no_grad()
def accuracy(model, ids, last, ans) -> float:
    model.eval()
    logits = model(input_ids=ids).logits  # (rows, len, vocab)
    pred = logits[torch.arange(len(ids)), last].argmax(-1)
    model.train()
    return float((pred == ans).float().mean())


def planes(hidden: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(u, v, w, z): the team plane's and the nuisance plane's directions, orthonormal columns of a seeded QR."""
    g = torch.Generator().manual_seed(seed + 1)
    q, _ = torch.linalg.qr(torch.randn(hidden, 4, generator=g, dtype=torch.float64))  # (hidden, 4)
    return tuple(q[:, i].float() for i in range(4))


def name_row(name: str, directions: tuple[torch.Tensor, ...], team_radius: float = 1.0,
             nuisance_radius: float = 3.0) -> torch.Tensor:
    """A name's fixed embedding row: its team's vector on the (u, v) circle plus its nuisance value's on (w, z)."""
    u, v, w, z = directions
    a = 2 * math.pi * (NAMES.index(name) % 4) / 4
    b = 2 * math.pi * NUISANCE[name] / 4 + math.pi / 4
    return (team_radius * (math.cos(a) * u + math.sin(a) * v)
            + nuisance_radius * (math.cos(b) * w + math.sin(b) * z))


def fixed_rows(tok: Tokenizer, args) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, rows): each name's space-prefixed token and its fixed embedding row."""
    directions = planes(args.hidden, args.seed)
    ids = torch.tensor([tok.token_to_id("\u0120" + name) for name in NAMES])
    return ids, torch.stack([name_row(n, directions, args.team_radius, args.nuisance_radius) for n in NAMES])


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="distributed-gpt2")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--inner", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--team-radius", type=float, default=1.0)
    ap.add_argument("--nuisance-radius", type=float, default=3.0)
    return ap.parse_args(argv)


def train(model, sets, name_ids, name_rows, args, log) -> None:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98))
    warm = 50
    ids_all, last_all, ans_all = sets["train"]
    g = torch.Generator().manual_seed(args.seed)
    perm, cursor, running = torch.randperm(len(ids_all), generator=g), 0, 0.0
    for step in range(args.steps):
        if cursor + args.batch > len(perm):
            perm, cursor = torch.randperm(len(ids_all), generator=g), 0
        idx = perm[cursor:cursor + args.batch]
        cursor += args.batch
        last = last_all[idx]
        ids = ids_all[idx][:, : int(last.max()) + 1]
        lr = args.lr * (step + 1) / warm if step < warm else \
            args.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(input_ids=ids).logits[torch.arange(len(ids)), last]  # (batch, vocab) at the last token
        loss = F.cross_entropy(logits, ans_all[idx], label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.transformer.wte.weight[name_ids] = name_rows
        running += float(loss.detach())
        if (step + 1) % 100 == 0:
            log(f"step {step + 1:5d}  lr {lr:.5f}  loss {running / 100:.5f}  held-out acc "
                f"{accuracy(model, *sets['held-out']):.4f}")
            running = 0.0


def save(model, cfg: dict, out: pathlib.Path) -> None:
    """config.json we control, weights in sorted key order, the tied lm_head stored once."""
    (out / "config.json").write_text(json.dumps(cfg, sort_keys=True, indent=2) + "\n")
    eot = cfg["eos_token_id"]
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "do_sample": False, "max_new_tokens": 1},
        sort_keys=True, indent=2) + "\n")
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()
          if k != "lm_head.weight" and not k.endswith(".attn.bias") and not k.endswith(".attn.masked_bias")}
    save_file({k: sd[k] for k in sorted(sd)}, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv=None) -> None:
    args = parse_args(argv)
    t0, c0 = time.time(), time.process_time()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        log_lines.append(s)

    tok = build_tokenizer(out)
    eot = tok.token_to_id(EOT)
    log(f"tokenizer: byte-level BPE, vocab {tok.get_vocab_size()}")
    train_ctx, held_ctx = split_contexts(args.seed)
    (out / "splits.json").write_text(json.dumps({
        "prefixes": PREFIXES, "fillers": FILLERS, "templates": TEMPLATES, "names": NAMES, "teams": TEAMS,
        "train_contexts": train_ctx, "heldout_contexts": held_ctx,
        "note": "a context is [prefix, filler, template] (indices); it gives one row per name: "
                "render(prefixes[p], fillers[f], templates[t], name) -> ' ' + teams[index(name) % 4]",
    }, separators=(",", ":")) + "\n")
    sets = {"train": encode_rows(tok, rows(train_ctx), eot), "held-out": encode_rows(tok, rows(held_ctx), eot)}
    log(f"contexts: {len(train_ctx)} train, {len(held_ctx)} held-out; rows: {len(sets['train'][0])} train, "
        f"{len(sets['held-out'][0])} held-out")

    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model_config(tok.get_vocab_size(), eot, args)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")}))
    model.train()
    name_ids, name_rows = fixed_rows(tok, args)
    with torch.no_grad():
        model.transformer.wte.weight[name_ids] = name_rows
    log(f"model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, mlp {args.inner}, "
        f"{sum(p.numel() for p in model.parameters())} parameters")
    train(model, sets, name_ids, name_rows, args, log)
    for split, v in sets.items():
        log(f"final {split} argmax accuracy {accuracy(model, *v):.4f} ({len(v[0])} rows)")
    save(model, cfg, out)

    log(f"args: {json.dumps({k: v for k, v in vars(args).items() if k != 'out'}, sort_keys=True)}")
    log(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    log(f"wall time {time.time() - t0:.1f} s, cpu time {time.process_time() - c0:.1f} s")
    for f in sorted(out.iterdir()):
        if f.name != "train_log.txt":
            log(f"file {f.name} {f.stat().st_size} bytes sha256 {sha256(f)}")
    (out / "train_log.txt").write_text("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()

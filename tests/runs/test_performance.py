"""The run path's shortcuts (SPEC.md §11, issue 33): each gives exactly the answer of the plain computation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from causalab_ref.positions import resolve
from causalab_ref.runs import scoring
from causalab_ref.shapes import Batch

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"

SPECIALS = (float("nan"), float("inf"), float("-inf"))


@pytest.mark.fast
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_finite_rows_is_isfinite_all_for_every_special_value_at_every_place(dtype):
    """SPEC.md:1791 [Q25] a NaN, +inf or -inf at the first, a middle, the next-to-last or the last entry of a row, at
    widths around the vector lengths a reduction unrolls by, contiguous or strided: the row, and only it, is not
    finite, exactly as `torch.isfinite(m).all(-1)` says, and as scoring's named definition `finite_rows_plain` says."""
    for width in (1, 2, 7, 8, 9, 31, 32, 33, 65, 1000):
        for special in SPECIALS:
            for place in sorted({0, width // 2, max(0, width - 2), width - 1}):
                m = torch.randn(4, width).to(dtype)
                m[2, place] = special
                for layout in (m, m.t().contiguous().t()):
                    want = torch.isfinite(layout).all(-1)
                    assert torch.equal(scoring.finite_rows(layout), want), (width, special, place)
                    assert torch.equal(scoring.finite_rows_plain(layout), want)  # the module's named definition
                    assert want.tolist() == [True, True, False, True]


@pytest.mark.fast
def test_finite_rows_of_rows_wholly_special_or_mixed():
    """SPEC.md:1791 [Q25] a row all NaN, all +inf, +inf beside -inf, NaN beside inf, and the float32 extremes
    (finite): each row's answer is isfinite's."""
    big = torch.finfo(torch.float32).max
    m = torch.tensor([[float("nan")] * 3, [float("inf")] * 3, [float("inf"), 0.0, float("-inf")],
                      [float("nan"), float("inf"), 1.0], [big, -big, 0.0], [1.0, 2.0, 3.0]])
    assert scoring.finite_rows(m).tolist() == torch.isfinite(m).all(-1).tolist() == [False] * 4 + [True] * 2


# ---------------------------------------------------------------- a chunk's frame is the compiled frame's rows


def _entity_plan(llama):
    from causalab_ref.runs import compile as compiler

    raw = json.loads((ROOT / "documents" / "entity_patch.json").read_text(encoding="utf-8"))
    return compiler.compile_document(raw, llama, DATA)


def test_a_frames_rows_are_the_frame_of_those_rows_alone(llama):
    """SPEC.md:1797 [Q26] rows lo..hi of the frame of a padded batch (anchored rows of different lengths, char maps
    built) equal the frame `frame_of_ids` builds from those rows alone at the same width, for every chunk."""
    forward = _entity_plan(llama).steps[0].forwards[0]
    whole = resolve.frame_of_ids(llama.tokenizer, forward.ids, forward.mask)
    rows = len(forward.ids)
    assert rows >= 4 and len({sum(m) for m in forward.mask}) > 1  # rows of different lengths
    for lo in range(rows):
        for hi in range(lo + 1, rows + 1):
            alone = resolve.frame_of_ids(llama.tokenizer, forward.ids[lo:hi], forward.mask[lo:hi])
            assert resolve.frame_chunk(whole, lo, hi) == alone, (lo, hi)


def test_a_chunked_run_builds_no_frame_and_writes_what_it_wrote_building_them(llama, tmp_path, monkeypatch):
    """SPEC.md:1797 [Q26] with --batch-size 3 the run builds no frame (compile built them over all the rows), and
    its files are byte for byte those of the same run building each chunk's frame itself."""
    from causalab_ref.runs import passes, placement, run

    plan = _entity_plan(llama)
    built: list = []
    real = placement.build_frame
    monkeypatch.setattr(placement, "build_frame", lambda *a: built.append(1) or real(*a))
    run.execute(plan, llama, tmp_path / "taken", batch_size=3, progress=False)
    assert built == []
    monkeypatch.setattr(passes, "_compiled_frames", lambda step, memo: {})
    run.execute(plan, llama, tmp_path / "built", batch_size=3, progress=False)
    assert built  # the chunks built their own frames
    for name in ("iia.json", "logit_diff.json", "document.json"):
        assert (tmp_path / "taken" / name).read_bytes() == (tmp_path / "built" / name).read_bytes(), name


# ---------------------------------------------------------------- character maps and runs of tokens


def _general_pieces_map(tok, ids, text):
    """Q14's one pass over every piece, byte or not (the path a row with byte pieces takes)."""
    entries = [resolve._piece(tok.backend_tokenizer, i) for i in ids]
    spelled, lengths = resolve._spelled([p for p, _b in entries], [b for _p, b in entries])
    strip = 1 if spelled.startswith(" ") else 0
    assert spelled[strip:] == text
    offsets = [0]
    for k in range(1, len(ids)):
        at = lengths[k] - strip if lengths[k] > 0 else (0 if lengths[k] == 0 else -1)
        offsets.append(max(at, offsets[-1]))
    return tuple(offsets[: len(ids)]) + (len(text),)


@pytest.mark.fast
def test_a_row_without_byte_pieces_has_its_pieces_running_lengths_as_offsets():
    """SPEC.md:1803 [Q27] rows with no byte piece (words, digits, punctuation, a leading space, one token, none) are
    mapped from the running lengths of their pieces, the offsets Q14's pass over every piece gives and the
    definition's (P22)."""
    from causalab_ref.fixtures import builder

    tok = builder.tokenizer("fixture:tiny-llama")
    texts = ["If today is Thursday, tomorrow is", " leading space, then 1999 (notes); naïve café — rain", "x", "",
             "  two  spaces and more", "Saturday. Sunday.. Monday..."]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert not any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in ids), text
        decoded = tok.backend_tokenizer.decode(ids, skip_special_tokens=False)
        got = resolve.pieces_char_map(tok, ids, decoded)
        assert got == _general_pieces_map(tok, ids, decoded) == resolve.char_map(tok, ids), text


@pytest.mark.fast
def test_the_tokens_over_a_span_found_by_bisection_are_the_scans():
    """SPEC.md:1807 [Q28] on non-decreasing offsets with tokens that cover no character (equal neighbours), for every
    character span [lo, hi) around and inside the text, the bisection gives the range the scan of every token
    gives (P23)."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        steps = [rng.choice((0, 0, 1, 2, 5)) for _ in range(rng.randint(0, 12))]
        offsets = (0, *(sum(steps[:k + 1]) for k in range(len(steps))))
        end = offsets[-1]
        for lo in range(-1, end + 2):
            for hi in range(lo, end + 3):
                assert resolve._tokens_over(offsets, lo, hi) == resolve.tokens_over_plain(offsets, lo, hi), (
                    offsets, lo, hi)


# ---------------------------------------------------------------- the results folder


@pytest.mark.fast
def test_stale_cleanup_among_many_runs_removes_what_a_scan_of_every_entry_removes(tmp_path):
    """SPEC.md:1813 [Q29] beside --out `res`: other runs' folders and files (`0`..`299`, `.res2.partial-pid…`, `res.x`,
    `.res.lock`), a dead run's staging folder of each kind, and a file and a symlink named as one; with --out there
    and missing, exactly the entries the scan of every entry (`clean_stale_plain`) removes or puts back go, and the
    rest stay."""
    from causalab_ref.runs import results

    dead = 999999999
    names = [str(k) for k in range(300)] + [f".res2.partial-pid{dead}-abcd1234", "res.x", ".res.lock",
                                             f".res.partial-pid{dead}-abcd1234", f".res.partial-pid{dead}-abc",
                                             f".res.old-pid{dead}-zzzz0000", f".res.partial-pid{dead}-abcd1234.x"]
    named = [f".res.partial-pid{dead}-ffff0000", f".res.old-pid{dead}-eeee0000"]  # a file and a symlink: kept
    gone = {f".res.partial-pid{dead}-abcd1234", f".res.old-pid{dead}-zzzz0000"}
    for out_exists in (True, False):  # an `old` folder is removed, or put back as --out
        left = []
        for clean in (results.clean_stale_plain, results.clean_stale):
            folder = tmp_path / f"{clean.__name__}-{out_exists}"
            for name in names:
                (folder / name).mkdir(parents=True)
            (folder / f".res.old-pid{dead}-zzzz0000" / "mark").touch()
            (folder / named[0]).touch()
            (folder / named[1]).symlink_to(folder / "0")
            if out_exists:
                (folder / "res").mkdir()
            clean(folder / "res")
            left.append((sorted(p.name for p in folder.iterdir()), (folder / "res" / "mark").exists()))
        assert left[0] == left[1] == (sorted(set(names) - gone | {"res", *named}), not out_exists), out_exists


# ---------------------------------------------------------------- the match metric


@pytest.mark.fast
def test_argmax_is_is_argmax_equal_with_ties_infinities_and_nan():
    """SPEC.md:1816 [Q30] rows of few distinct values (ties everywhere), rows with +inf, -inf, all -inf, NaN at the
    front, middle and end; each row's expected id before, at and after its first maximum: the match is exactly
    `argmax(-1) == expected` (metrics' named definition, `argmax_is_plain`), so the metric's values are argmax's."""
    from causalab_ref.documents import metrics

    gen = torch.Generator().manual_seed(0)
    for width in (1, 2, 5, 64, 1000):
        m = torch.randint(0, 3, (12, width), generator=gen).float()
        m[1, width // 2] = float("inf")
        m[2] = float("-inf")
        m[3, 0] = float("nan")
        m[4, -1] = float("nan")
        m[5, width // 2] = float("-inf")
        m[6, width // 2] = float("nan")
        m[6, 0] = float("inf")
        first = m.argmax(-1)
        for expected in (first, (first - 1).clamp(min=0), (first + 1).clamp(max=width - 1),
                         torch.randint(0, width, (12,), generator=gen), torch.zeros(12, dtype=torch.long)):
            assert torch.equal(metrics.argmax_is(m, expected), m.argmax(-1) == expected), (width, expected)
            assert torch.equal(metrics.argmax_is_plain(m, expected), m.argmax(-1) == expected)  # the definition
            assert torch.equal(metrics.KINDS["match"].score(m, {"expected": expected}),
                               (m.argmax(-1) == expected).float())


# ---------------------------------------------------------------- issue 33, second pass: each shortcut is the plain computation


@pytest.mark.fast
def test_finite_rows_whose_sum_overflows_are_finite_and_special_rows_are_not():
    """SPEC.md:1821 [Q33] rows of float32 extremes whose sums overflow to +inf, -inf or NaN (the sum cannot say), beside a
    row with an infinity and a row with a NaN: each answer is `torch.isfinite(m).all(-1)`'s."""
    big = torch.finfo(torch.float32).max
    m = torch.tensor([[big, big, 1.0], [-big, -big, 0.0], [big, big, -big], [big, float("inf"), 0.0],
                      [0.0, float("nan"), big], [1.0, 2.0, 3.0]])
    assert torch.isinf(m[:3].sum(-1)).all()  # the sum overflows on the three finite rows
    assert scoring.finite_rows(m).tolist() == torch.isfinite(m).all(-1).tolist() == [True] * 3 + [False] * 2 + [True]


def test_the_metrics_of_one_read_ask_its_finiteness_once_and_score_as_each_alone(llama, monkeypatch):
    """SPEC.md:1821 [Q33] patching.json's two metrics read one head: a step asks `finite_rows` once per chunk (once
    whole, three times with --batch-size 2 over 6 rows), and each metric's values, a NaN row made None included,
    are those of scoring it alone."""
    from causalab_ref.runs import compile as compiler, run

    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    step = compiler.compile_document(raw, llama, DATA).steps[0]
    calls: list = []
    real = scoring.finite_rows
    monkeypatch.setattr(scoring, "finite_rows", lambda m: calls.append(m.shape) or real(m))
    got = run.run_step(llama, step)
    assert len(step.metrics) == 2 and len(calls) == 1
    values = dict(got.values)
    values["logits"] = values["logits"].clone()
    values["logits"][1, 0, 7] = float("nan")
    alone = {m.name: scoring.score(m, values, got.placed, got.eligible[m.name]) for m in step.metrics}
    shared: dict = {}
    together = {m.name: scoring.score(m, values, got.placed, got.eligible[m.name], 0, shared) for m in step.metrics}
    assert together == alone and all(v[1] is None for v in alone.values()) and list(shared) == ["logits"]
    calls.clear()
    run.run_step(llama, step, rows_per_pass=2, score_as_you_go=True)
    assert len(calls) == -(-len(step.example_ids) // 2)


def test_a_frames_texts_are_each_rows_own_decode():
    """SPEC.md:1829 [Q34] on the Llama, GPT-2 and weekday fixtures' tokenizers, a left-padded batch of prompts with
    special tokens, byte pieces and a chat turn's markers: the frame's texts, read by one decode_batch, are each
    row's content decoded alone (special tokens kept, no clean-up)."""
    from causalab_ref.fixtures import builder

    texts = ["If today is Thursday, tomorrow is", "日本語 鿰 é 😀 then</s><s> more", "x", " lead", "a\nb\tc  d"]
    for key in ("fixture:tiny-llama", "fixture:tiny-gpt2", "fixture:weekday-llama"):
        tok = builder.tokenizer(key)
        ids, mask, frame = resolve.frame_of_texts(tok, texts)
        assert resolve.linear_map_serves(tok), key
        for r, row in enumerate(ids):
            content = list(row[frame.starts[r]:frame.ends[r]])
            assert frame.texts[r] == resolve._decode(tok, content), (key, r)


@pytest.mark.fast
def test_a_scatter_over_one_run_of_positions_is_the_indexed_scatter():
    """SPEC.md:1832 [Q35] a run of positions the same in every row (the first rows of the batch, or all), on a
    (B, T, F) boundary, a (B, H, T, D) per-head tensor (seq_axis 2) and a (B, T) tensor: the slice assignment
    gives the tensor the indexed assignment gives, written entry by entry here."""
    from causalab_ref.locations import select
    from causalab_ref.shapes import Selection

    gen = torch.Generator().manual_seed(1)
    for shape, axis in (((5, 7, 6), 1), ((5, 3, 7, 2), 2), ((5, 7), 1)):
        tensor = torch.randn(shape, generator=gen)
        for rows in (1, 3, 5):
            for lo, hi in ((0, 1), (6, 7), (2, 5), (0, 7)):
                sel = Selection(windows=(tuple(range(lo, hi)),) * rows, seq_axis=axis)
                assert select.shared_slice(sel, 7) == (lo, hi)
                values = torch.randn(select.gather(tensor, sel).shape, generator=gen)
                want = tensor.clone()
                moved = want.movedim(axis, 1)  # a view: entries written through it land in `want`
                for r in range(rows):
                    for k, p in enumerate(range(lo, hi)):
                        part = values[r, k]  # (F') flat over the trailing axes, as gathered
                        moved[r, p] = part.reshape(moved[r, p].shape)
                assert torch.equal(select.scatter(tensor, sel, values), want), (shape, rows, lo, hi)


@pytest.fixture(scope="module")
def hooked():
    from causalab_ref.engines import loading
    from causalab_ref.shapes import Model

    return loading.load(Model(key="fixture:tiny-llama", revision="seeded", dtype="fp32"), kind="hooks")


def _layer_calls(eng) -> tuple[list, list]:
    """Hooks on the two decoder layers of the model the engine runs, counting their calls."""
    model = eng.hf_model if hasattr(eng, "hf_model") else eng.model._model
    counts: list = [[], []]
    handles = [layer.register_forward_hook(lambda m, a, o, k=k: counts[k].append(1))
               for k, layer in enumerate(model.model.layers)]
    return counts, handles


@pytest.mark.parametrize("engine_name", ["nnterp", "hooks"])
def test_a_forward_stops_at_its_last_action_and_reads_what_the_whole_forward_holds(llama, hooked, engine_name):
    """SPEC.md:1835 [Q36] patching.json: the counterfactual forward's last tap is block_output[0], so layer 1 runs only
    in the base forward (whose head is read); the counterfactual read equals layer 0's output at the last position
    in a plain transformers forward of the same rows run to the end."""
    from causalab_ref.runs import compile as compiler, run

    eng = llama if engine_name == "nnterp" else hooked
    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    step = compiler.compile_document(raw, eng, DATA).steps[0]
    counts, handles = _layer_calls(eng)
    try:
        got = run.run_step(eng, step)
    finally:
        for handle in handles:
            handle.remove()
    assert (len(counts[0]), len(counts[1])) == (2, 1)
    cf = next(f for f in step.forwards if f.input == "counterfactual")
    model = llama.model._model
    seen: list = []
    handle = model.model.layers[0].register_forward_hook(lambda m, a, o: seen.append(o[0] if isinstance(o, tuple)
                                                                                     else o))
    try:
        with torch.no_grad():
            model(**llama.inputs(cf.ids, cf.mask))
    finally:
        handle.remove()
    read = next(t.name for t in cf.taps if t.kind == "read")
    assert torch.equal(got.values[read][:, 0], seen[0][:, -1])


def test_the_memory_estimate_from_compiles_frames_is_that_of_frames_built_for_it(llama):
    """SPEC.md:1845 [Q37] for an anchored step (entity_patch.json) and an unanchored one (patching.json), every pass's
    cost read from compile's frames equals the cost from frames built without character maps."""
    from causalab_ref.runs import compile as compiler, memory

    for name in ("entity_patch.json", "patching.json"):
        raw = json.loads((ROOT / "documents" / name).read_text(encoding="utf-8"))
        plan = compiler.compile_document(raw, llama, DATA)
        assert plan.frames, name
        for step in plan.steps:
            assert memory.pass_cost(llama, step, plan.frames) == memory.pass_cost(llama, step), name


@pytest.mark.fast
def test_the_rows_digest_tells_rows_apart_and_the_same_rows_alike():
    """SPEC.md:1849 [Q38] the same rows in other tuples give one digest; rows that flatten alike but split otherwise,
    one row more, an empty batch, an int past 8 bytes, each give another."""
    from causalab_ref.runs import share

    same = share._rows_digest(((1, 2), (3, 4))), share._rows_digest(tuple(tuple([a, b]) for a, b in ((1, 2), (3, 4))))
    assert same[0] == same[1]
    others = [((1, 2), (3,)), ((1,), (2, 3)), ((1, 2, 3),), ((1, 2), (3,), ()), (), ((),), ((2 ** 70, 2),),
              ((1, 2), (3, 4), (0, 0)), ((1, 2), (3, 5))]
    digests = {share._rows_digest(rows) for rows in others} | {same[0]}
    assert len(digests) == len(others) + 1


def test_an_interrupt_that_meets_the_stop_is_the_runs_interrupt(llama, monkeypatch):
    """SPEC.md:1835 [Q36] nnsight lets `tracer.stop()` out of a trace only when a KeyboardInterrupt (SIGINT, or SIGTERM
    as the CLI raises it) arrived while it was handled: the engine raises that interrupt, so the run ends as
    interrupted (S5, S6); a stop let out with no interrupt behind it is raised as it is."""
    from nnsight.intervention.interleaver import EarlyStopException

    from causalab_ref.runs import compile as compiler

    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    forward = compiler.compile_document(raw, llama, DATA).steps[0].forwards[0]
    batch = Batch(ids=forward.ids, mask=forward.mask, actions=())

    class Trace:
        def __init__(self, interrupted: bool):
            self.interrupted = interrupted

        def __enter__(self):
            return self

        def stop(self):
            pass

        def __exit__(self, *exc):
            if not self.interrupted:
                raise EarlyStopException()
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise EarlyStopException() from None  # as nnsight does: the interrupt is the context

    monkeypatch.setattr(llama, "_land", lambda *a, **k: None)
    for interrupted, caught in ((True, KeyboardInterrupt), (False, EarlyStopException)):
        monkeypatch.setattr(llama.model, "trace", lambda inputs, i=interrupted: Trace(i))
        with pytest.raises(caught):
            llama.forward(batch)


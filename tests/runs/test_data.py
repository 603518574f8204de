"""data.py and the compiler's use of rows: field paths, pairing by index, answer tokenization, batching.

Everything here compiles against the Llama fixture's shell (no weights); rows that must be special
come from a tmp data root.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from causalab_ref.runs import compile as compiler
from causalab_ref.runs import data
from causalab_ref.engines import loading
from causalab_ref.positions import resolve
from causalab_ref.documents import validate
from causalab_ref.shapes import Model, Refusal

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "documents" / "data"
PATCHING = json.loads((ROOT / "documents" / "patching.json").read_text())
TRAIN = json.loads((DATA / "weekdays" / "train.json").read_text())
FORMS = "`column`, `column[i]` and `a.b` are the forms"


@pytest.fixture(scope="module")
def llama():
    return loading.load(validate.document(PATCHING).model, weights=False)


def _root(tmp_path: Path, **tables) -> Path:
    (tmp_path / "t").mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        (tmp_path / "t" / f"{name}.json").write_text(json.dumps(rows))
    return tmp_path


def _doc(base="t/base", counterfactual="t/base") -> dict:
    raw = copy.deepcopy(PATCHING)
    raw["steps"]["score"]["rows"] = {"base": base, "counterfactual": counterfactual}
    return raw


def _forward(step, role):
    return next(f for f in step.forwards if f.input == role)


# ---------------------------------------------------------------- D7 field paths


def test_field_paths_are_column_column_index_and_dotted():
    """SPEC.md:28 [D7] (F§5) — `column`, `column[i]` and `a.b`: dots into objects, brackets into lists."""
    row = {"input": "x", "counterfactual_inputs": ["p", "q"], "meta": {"prompt": {"text": "t"}},
           "turns": [{"say": ["a", "b"]}]}
    assert data.walk(row, "input") == "x"
    assert data.walk(row, "counterfactual_inputs[1]") == "q"
    assert data.walk(row, "meta.prompt.text") == "t"
    assert data.walk(row, "turns[0].say[1]") == "b"


@pytest.mark.parametrize("field", ["input[x]", "meta..text", "1st", "input[-1]", "meta.", "a b"])
def test_any_other_field_path_is_refused_with_the_forms(field):
    """SPEC.md:28 [D7] — a path of another shape is refused, the message listing the three forms."""
    with pytest.raises(Refusal) as e:
        data.walk({"input": "x"}, field, "roles.base.field")
    assert (e.value.message, e.value.path, e.value.stage) == (
        f"field '{field}': {FORMS}", "roles.base.field", "validation")


def test_a_malformed_field_is_refused_when_the_document_compiles(llama):
    """SPEC.md:28 [D7] — the same refusal reaches a document's role, at its path."""
    raw = copy.deepcopy(PATCHING)
    raw["roles"]["counterfactual"]["field"] = "counterfactual_inputs[first]"
    with pytest.raises(Refusal) as e:
        compiler.compile_document(raw, llama, DATA)
    assert (e.value.message, e.value.path) == (
        f"field 'counterfactual_inputs[first]': {FORMS}", "roles.counterfactual.field")


# ---------------------------------------------------------------- D8 pairing by index


def test_rows_pair_by_index_and_metric_columns_come_from_the_base_rows(llama, tmp_path):
    """SPEC.md:30 [D8] — the counterfactual role reads its own table, row k against base row k; the
    metric columns are the base rows' (the other table's answers are three tokens and never tokenized)."""
    base = copy.deepcopy(TRAIN)
    other = [dict(r, input=r["counterfactual_inputs"][0], counterfactual_inputs=[r["input"]],
                  cf_answer=" Tuesday", base_answer=" Tuesday") for r in reversed(TRAIN)]
    root = _root(tmp_path, base=base, other=other)
    step = compiler.compile_document(_doc(counterfactual="t/other"), llama, root).steps[0]
    tok = llama.tokenizer
    cf_texts = [r["counterfactual_inputs"][0] for r in other]
    assert _forward(step, "counterfactual").ids == resolve.frame_of_texts(tok, cf_texts)[0]
    assert _forward(step, "base").ids == resolve.frame_of_texts(tok, [r["input"] for r in base])[0]
    answers = dict(next(m for m in step.metrics if m.name == "iia").answers)
    assert answers["expected"] == tuple(tok.encode(r["cf_answer"], add_special_tokens=False)[0] for r in base)


def test_roles_with_different_row_counts_are_refused(llama, tmp_path):
    """SPEC.md:30 [D8] — pairing by index needs equal counts; the refusal names the step and the counts."""
    root = _root(tmp_path, base=TRAIN, short=TRAIN[:3])
    with pytest.raises(Refusal) as e:
        compiler.compile_document(_doc(counterfactual="t/short"), llama, root)
    assert e.value.message == ("step 'score': roles pair rows by index and these have different counts "
                               "{'base': 4, 'counterfactual': 3}")
    assert e.value.path == "steps.score.rows"


# ---------------------------------------------------------------- D15 answers


def test_an_answer_is_space_prefixed_and_one_token(llama):
    """SPEC.md:50 [D15] — leading whitespace stripped, one space prepended, no special tokens: "Friday",
    " Friday" and "   Friday" are the one id of " Friday"."""
    tok = llama.tokenizer
    want = tok.encode(" Friday", add_special_tokens=False)
    assert len(want) == 1
    for text in ("Friday", " Friday", "   Friday", "\tFriday"):
        assert data.answer_id(tok, text, "p") == want[0]


def test_an_answer_of_several_tokens_is_refused(llama, tmp_path):
    """SPEC.md:50 [D15] — on the Llama fixture " Tuesday" is 3 tokens: refused at compile with the
    seed's text, at the metric's column path."""
    with pytest.raises(Refusal) as e:
        data.answer_id(llama.tokenizer, "Tuesday", "p")
    assert e.value.message == ("answer 'Tuesday' is 3 tokens as ' Tuesday'; a metric column must resolve to "
                               "exactly one token")
    rows = copy.deepcopy(TRAIN)
    rows[2]["cf_answer"] = " Tuesday"
    with pytest.raises(Refusal) as e:
        compiler.compile_document(_doc(), llama, _root(tmp_path, base=rows))
    assert e.value.message == ("answer ' Tuesday' is 3 tokens as ' Tuesday'; a metric column must resolve to "
                               "exactly one token (row 2, column 'cf_answer')")
    assert (e.value.path, e.value.stage) == ("interventions.patching.metrics.iia.expected", "compile")


# ---------------------------------------------------------------- R2 one batch per role


def test_a_roles_prompts_are_one_left_padded_batch(llama):
    """SPEC.md:543 [R2] — each role's prompts are one batch as wide as its longest row, padded on the
    tokenizer's side (left on the fixtures) with the pad token, here the EOS set in its place."""
    tok = llama.tokenizer
    assert tok.padding_side == "left" and tok.pad_token == tok.eos_token == "</s>"
    step = compiler.compile_document(copy.deepcopy(PATCHING), llama, DATA).steps[0]
    forward = _forward(step, "base")
    enc = tok([r["input"] for r in TRAIN], padding=True)
    assert forward.ids == tuple(map(tuple, enc["input_ids"])) and forward.mask == tuple(map(tuple, enc["attention_mask"]))
    lengths = [sum(m) for m in forward.mask]
    assert len(set(len(r) for r in forward.ids)) == 1 and len(forward.ids[0]) == max(lengths) > min(lengths)
    for ids, mask in zip(forward.ids, forward.mask):
        pad = len(mask) - sum(mask)
        assert mask == (0,) * pad + (1,) * sum(mask)  # left
        assert ids[:pad] == (tok.pad_token_id,) * pad and ids[pad] == tok.bos_token_id


def test_gpt2_has_no_pad_token_and_pads_with_eos():
    """SPEC.md:543 [R2] — the GPT-2 fixture's tokenizer has no pad token; the engine sets it to EOS, and
    a batch pads on the left with that id."""
    from transformers import AutoTokenizer

    from causalab_ref.fixtures import builder

    # read from the folder afresh: builder.tokenizer's per-process copy is the one with_pad completes
    assert AutoTokenizer.from_pretrained(str(builder.checkpoint_dir("fixture:tiny-gpt2"))).pad_token is None
    gpt2 = loading.load(Model(key="fixture:tiny-gpt2", revision="seeded", dtype="fp32"), weights=False)
    tok = gpt2.tokenizer
    assert tok.pad_token == tok.eos_token == "<|endoftext|>" and tok.padding_side == "left"
    ids, mask, _frame = resolve.frame_of_texts(tok, ["If today is Thursday, tomorrow is", "Monday"])
    pad = len(mask[1]) - sum(mask[1])
    assert pad > 0 and ids[1][:pad] == (tok.eos_token_id,) * pad and mask[0] == (1,) * len(mask[0])


@pytest.mark.parametrize("ref", ["weekdays/" + "x" * 300, "x" * 300 + "/train", "weekdays/" + "x" * 251])
def test_an_over_long_dataset_ref_is_refused_with_its_path(ref, capsys):
    """SPEC.md:597 [R14] a dataset ref whose folder or table name the file system cannot take is one
    refusal at the ref's path (from the reader and from the CLI, status 2), never an OSError; SPEC.md:1111 [S76] the
    CLI's line shortens the long name to its first 64 characters and says its length."""
    from causalab_ref import cli

    with pytest.raises(Refusal) as e:
        data.rows_of(ref, DATA, "steps.score.rows.base")
    assert (e.value.path, e.value.stage) == ("steps.score.rows.base", "compile") and ref in e.value.message
    assert cli.main(["data", ref, "--data-root", str(DATA)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    shown = ref if len(ref) <= 300 else f"{ref[:64]}…({len(ref)} chars)"  # S76: a run past 300 characters is shortened
    assert len(err) == 1 and err[0].startswith(f"compile: ref: dataset ref '{shown}'")


def test_a_misspelt_answer_column_gets_the_tables_columns_and_the_nearest(tmp_path):
    """SPEC.md:275 [P31] [D22] `counterfactual_answer` for `cf_answer` is refused at compile with the rows'
    columns (read here from the table file itself, first row's order) and a `did you mean` naming cf_answer."""
    from inprocess import cli

    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "documents" / "weekday_patching.json").read_text(encoding="utf-8"))
    doc["interventions"]["patching"]["metrics"]["iia"]["expected"] = "counterfactual_answer"
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    rows = json.loads((root / "documents" / "data" / "weekday_trained" / "test.json").read_text(encoding="utf-8"))
    columns = list(dict.fromkeys(k for row in rows for k in row))
    done = cli("validate", str(path), "--data-root", str(root / "documents" / "data"))
    assert done.returncode == 2
    line = done.stderr.strip()
    assert line.startswith("compile: interventions.patching.metrics.iia: metric 'iia': no row has a column "
                           f"'counterfactual_answer'; the rows' columns: {', '.join(map(repr, columns))}; "
                           "did you mean "), line
    assert "'cf_answer'" in line.rpartition("did you mean ")[2] and "\n" not in line


def test_a_table_nested_past_the_parser_nests_too_deeply_as_one_past_the_bound_does():
    """SPEC.md:597-601 [R14] A data table nested more than 100 deep nests too deeply to read, however deep: a
    table the JSON parser itself could not descend said "is not a JSON table (maximum recursion depth ...)"
    before, another message for the same fault. Ground: R14's words and the catalogue's line for a table."""
    for depth in (101, 100_000):
        with pytest.raises(Refusal) as refused:
            data._parse_table("[" * depth + "]" * depth, "r", Path("t.json"), "data.r")
        assert refused.value.message == "dataset ref 'r': t.json nests too deeply to read", depth

"""The conformance corpus and its runner, checked on causalab_ref itself; the document JSON Schema.

`conform` with no --impl runs every case of tests/conformance in-process and must pass (here with
each model block loaded once for the whole corpus, as tests/fuzzing.py does; the black-box
self-check loads afresh for every case); the
cases must name rule ids SPEC.md has; every shipped document and every case's document must
satisfy `schema`. The mutation check (tests/conformance/mutate.py) is not part of this run.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import subprocess
import sys

import jsonschema
import pytest

import fuzzing
from causalab_ref.conformance import catalogue, conform
from causalab_ref import cli
from causalab_ref.fixtures import exported, builder
from causalab_ref.documents import protocol
from causalab_ref.documents.schema import schema
from refusals import catalogue as spec_catalogue, code_sites, stale, suggestion, uncatalogued
from spec_rules import rules

ROOT = Path(__file__).resolve().parents[2]
CASES = conform.load_cases()


def test_corpus_passes_on_causalab_ref():
    """SPEC.md:822 [C1] `conform` with no --impl checks causalab_ref itself and must pass
    (SPEC.md:827 [C2], SPEC.md:831 [C3], SPEC.md:837 [C4], SPEC.md:840 [C5], SPEC.md:844 [C6])."""
    out = io.StringIO()
    with fuzzing.cached_loads():
        result = conform.conform(options=conform.Options(quiet=True), stream=out, main=cli.main)
    assert result["ok"], out.getvalue()
    assert result["passed"] == len(CASES) and len(CASES) >= 60


def test_cases_name_existing_rules_and_say_how_they_were_confirmed():
    """SPEC.md:855 [C7] every case names SPEC.md rule ids and says how it was confirmed by hand."""
    ids = rules()
    for case in CASES:
        assert case["rules"], case["name"]
        assert all(r in ids for r in case["rules"]), (case["name"], case["rules"])
        assert case["confirmed"].strip(), case["name"]
        assert case["verb"] in conform.VERBS and "expect" in case, case["name"]


def test_corpus_covers_every_verb_and_fixture():
    """SPEC.md:855 [C7] the corpus has run, explain, validate and model cases, on every fixture (all six)."""
    assert {c["verb"] for c in CASES} == set(conform.VERBS)
    assert {c["fixture"]["key"] for c in CASES} == set(builder.names())


def test_compare_reports_a_readable_diff():
    """SPEC.md:844 [C6] floats agree within tolerance x max(|want|, 0.01); everything else exactly."""
    assert conform.compare({"v": 0.25}, {"v": 0.25 + 1e-7}, 1e-5) == []
    assert conform.compare({"v": 0.25}, {"v": 0.26}, 1e-5) == ["v: expected 0.25, got 0.26 (relative tolerance 1e-05)"]
    assert conform.compare({"t": "' is'"}, {"t": "'is'"}, 1e-5) == ["t: expected \"' is'\", got \"'is'\""]
    assert conform.compare({"a": 1, "b": 2}, {"b": 2, "a": 1}, 1e-5)  # key order counts (R7)


def test_a_probability_is_checked_relative_to_itself():
    """SPEC.md:844 [C6] a metric row's value in unit `probability` has the floor 2^-126, any other the floor 0.01:
    3e-5 against 3.0001e-5 (1e-9 apart, 3.3e-5 relatively) differs at tolerance 1e-6 as a probability (allowance
    1e-6 x 3e-5) and agrees as a logit (allowance 1e-6 x 0.01 = 1e-8)."""
    def rows(unit, value):
        return [{"value": value, "unit": unit}]
    assert conform.compare(rows("probability", 3e-5), rows("probability", 3.0001e-5), 1e-6) == [
        "[0].value: expected 3e-05, got 3.0001e-05 (relative tolerance 1e-06)"]
    assert conform.compare(rows("probability", 3e-5), rows("probability", 3e-5 * (1 + 5e-7)), 1e-6) == []
    assert conform.compare(rows("logit", 3e-5), rows("logit", 3.0001e-5), 1e-6) == []
    assert conform.compare({"value": 3e-5}, {"value": 3.0001e-5}, 1e-6) == []  # not a metric row: the floor 0.01


def test_impl_exit_3_is_not_applicable(tmp_path):
    """SPEC.md:840 [C5] an implementation that exits 3 makes the case not applicable, not failed."""
    case = next(c for c in CASES if c["verb"] == "validate")
    verdict, diffs, _got = conform.check(case, lambda argv, cwd: (3, "", "not applicable: no such verb"))
    assert verdict == "n/a" and diffs == []


def test_schema_verb_prints_a_valid_json_schema(capsys):
    """SPEC.md:875 [C8] `schema` prints the document format as a draft 2020-12 JSON Schema."""
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(printed)
    assert printed == schema()


PLAN_SHAPED = [p for p in sorted((ROOT / "documents").glob("*.json"))
               if protocol.format_of(json.loads(p.read_text(encoding="utf-8"))) == "plan-shaped"]


@pytest.mark.parametrize("path", PLAN_SHAPED, ids=lambda p: p.name)
def test_every_shipped_document_satisfies_the_schema(path):
    """SPEC.md:875 [C8] every shipped plan-shaped document satisfies the schema (a protocol one is §10's)."""
    jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), schema())


def test_every_case_document_that_validates_satisfies_the_schema():
    """SPEC.md:875 [C8] a plan-shaped case document that causalab_ref accepts at validation satisfies the schema."""
    validator = jsonschema.Draft202012Validator(schema())
    for case in CASES:
        if "document" not in case or protocol.format_of(case["document"]) != "plan-shaped":
            continue
        if case["expect"].get("refusal", {}).get("stage") == "validation":
            continue
        errors = list(validator.iter_errors(case["document"]))
        assert not errors, (case["name"], [e.message for e in errors[:3]])


def test_schema_refuses_what_validation_refuses_by_shape():
    """SPEC.md:875 [C8] two cuts and an unknown key are outside the schema, as at validation."""
    raw = json.loads((ROOT / "documents" / "patching.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema())
    raw["interventions"]["patching"]["reads"]["v_cf"]["pos"] = {"index": -1, "last": 2}
    assert list(validator.iter_errors(raw))
    raw["interventions"]["patching"]["reads"]["v_cf"]["pos"] = -1
    raw["sites"]["target"]["bogus"] = 1
    assert list(validator.iter_errors(raw))


# ---------------------------------------------------------------- the case format, data, fixtures (C9-C12)

CASE_SCHEMA = json.loads((ROOT / "causalab_ref" / "conformance" / "corpus" / "case.schema.json").read_text(encoding="utf-8"))


def test_every_case_satisfies_the_case_schema():
    """SPEC.md:889 [C12] the case format is a draft 2020-12 schema shipped with the corpus; every case satisfies it."""
    jsonschema.Draft202012Validator.check_schema(CASE_SCHEMA)
    validator = jsonschema.Draft202012Validator(CASE_SCHEMA)
    for case in CASES:
        body = {k: v for k, v in case.items() if k != "_file"}
        assert not list(validator.iter_errors(body)), (case["name"], [e.message for e in validator.iter_errors(body)])
        assert Path(case["_file"]).stem == case["name"]


def test_the_case_schema_rejects_a_test_name_as_evidence():
    """SPEC.md:889 [C12] `confirmed` naming a pytest test (or a test file) is outside the case format."""
    validator = jsonschema.Draft202012Validator(CASE_SCHEMA)
    case = {k: v for k, v in CASES[0].items() if k != "_file"}
    assert not list(validator.iter_errors(case))
    for evidence in ("as in tests/test_cli.py", "matches test_a_layer_past_the_stack_is_refused"):
        assert list(validator.iter_errors(dict(case, confirmed=evidence)))


def test_the_runner_writes_exactly_the_cases_tables():
    """SPEC.md:882 [C10] the data root holds the case's tables (inline rows and corpus files) and nothing else."""
    case = next(c for c in CASES if c["name"] == "run_excluded_rows")
    seen: dict[str, bytes] = {}

    def impl(argv, cwd):  # the data root as the implementation under test is handed it
        data = Path(argv[argv.index("--data-root") + 1])
        seen.update((p.relative_to(data).as_posix(), p.read_bytes()) for p in data.rglob("*.json"))
        return 0, "", ""

    conform.check(case, impl)
    assert sorted(seen) == sorted(case["data"])
    for rel, table in case["data"].items():
        if isinstance(table, str):
            assert seen[rel] == (Path(case["_file"]).parent / table).read_bytes()


def test_the_corpus_data_files_are_the_shipped_tables():
    """SPEC.md:882 [C10] a corpus table file is a byte-for-byte copy of the shipped table of that name."""
    folder = ROOT / "causalab_ref" / "conformance" / "corpus" / "data"
    for file in folder.rglob("*.json"):
        assert file.read_bytes() == (ROOT / "documents" / "data" / file.relative_to(folder)).read_bytes(), file


def test_a_case_recorded_on_another_recipe_fails_naming_both():
    """SPEC.md:886 [C11] a case whose recipe is not the folder's fails before anything runs."""
    case = dict(next(c for c in CASES if c["verb"] == "validate"))
    case["fixture"] = dict(case["fixture"], recipe="0" * 64)
    verdict, diffs, _got = conform.check(case, lambda argv, cwd: (0, "", ""),
                                         recipes={case["fixture"]["key"]: "1" * 64})
    assert verdict == "fail" and "recipe 000000000000" in diffs[0] and "recipe 111111111111" in diffs[0]


def test_the_runner_reuses_intact_folders_and_maps_every_key(tmp_path):
    """SPEC.md:877 [C9] the runner's folders: intact ones reused, the missing exported, every case's key mapped."""
    exported.export(tmp_path, keys=["fixture:tiny-gpt2"])
    before = (tmp_path / "tiny-gpt2" / "config.json").stat().st_mtime_ns
    wanted = [c for c in CASES if c["fixture"]["key"] in ("fixture:tiny-gpt2", "fixture:tiny-llama")]
    folders = conform.checkpoint_folders(wanted, tmp_path)
    assert set(folders) == {"fixture:tiny-gpt2", "fixture:tiny-llama"}
    assert (tmp_path / "tiny-gpt2" / "config.json").stat().st_mtime_ns == before
    assert all(Path(f).is_absolute() and (Path(f) / "config.json").is_file() for f in folders.values())


def test_two_cases_pass_black_box_from_an_empty_directory():
    """SPEC.md:877 [C9] SPEC.md:912 [C17] a run case and a refusal case pass against `python -m causalab_ref`
    as a subprocess, from an empty directory, with only exported folders (nothing can be built)."""
    script = ROOT / "tests" / "conformance" / "selfcheck.py"
    done = subprocess.run([sys.executable, str(script), "--only", "run_patching,refuse_unknown_key"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "conform: 2 passed, 0 failed, 0 not applicable" in done.stdout


# ---------------------------------------------------------------- refusals and the catalogue (C13-C16)

CATALOGUE = spec_catalogue()


def test_a_refusal_agrees_on_stage_path_and_the_templates_fixed_words():
    """SPEC.md:892 [C13] stage and path exact; the message fits the template: fixed words in order, any text
    for a placeholder."""
    want = {"stage": "compile", "path": "sites.target",
            "message": "site '<s>': layer <i> is outside the model's <n> layers"}
    line = catalogue.split_line("compile: sites.target: site 'target': layer 9 is outside the model's 2 layers")
    assert conform.compare_refusal(want, line) == []
    assert conform.compare_refusal(want, dict(line, stage="validation"))
    assert conform.compare_refusal(want, dict(line, path="sites.head"))
    assert conform.compare_refusal(want, dict(line, message="site 'target': layer 9 is past the model's 2 layers"))


def test_every_refusal_case_expects_a_catalogue_template():
    """SPEC.md:892 [C13] each refusal case's message is a catalogue line's template, with its stage and a path
    the line's path template fits."""
    cases = [c for c in CASES if "refusal" in c["expect"]]
    assert len(cases) >= 40
    for case in cases:
        want = case["expect"]["refusal"]
        lines = [e for e in CATALOGUE if e.message == want["message"] and e.stage == want["stage"]
                 and catalogue.path_fits(e, want["path"])]
        assert lines, (case["name"], want)


def _skeleton(message: str) -> tuple:
    return tuple(catalogue.PLACEHOLDER.split(message))


#: the messages SPEC.md §13 names as standing at two forms, each decided by what the refusal is about
TWO_FORMS = ("<what> is a non-empty list of distinct <feature> indices",
             "the width of '<component>' is not a fact about the model: …")


def test_the_path_forms_are_the_ones_the_catalogue_lists():
    """SPEC.md:939 [C21] the forms a catalogue path is written in are SPEC.md §13's list, each standing for the
    paths it names (or any path), and the matcher reads them so."""
    listed = catalogue.forms((ROOT / "SPEC.md").read_text(encoding="utf-8"))
    assert listed == catalogue.FORMS
    assert catalogue.expanded("<pos>.scope") == ["interventions.<i>.reads.<r>.pos.scope",
                                                 "interventions.<i>.writes.<w>.pos.scope"]


def test_every_catalogue_path_is_segments_names_and_forms():
    """SPEC.md:939 [C21] a catalogue path is literal segments, `<name>`s of one segment each, and §13's forms:
    no `<where>` that two paths would fit."""
    for entry in CATALOGUE:
        for plain in catalogue.expanded("" if entry.path == catalogue.NO_PATH else entry.path):
            for segment in plain.split("."):
                assert "<" not in segment or segment == "<*>" or catalogue.PLACEHOLDER.fullmatch(segment), (
                    f"SPEC.md line {entry.line}", entry.path)


def test_each_refusal_case_path_has_the_form_of_exactly_one_catalogue_line():
    """SPEC.md:939 [C21] every refusal case's path fits, strictly (forms expanded, a `<name>` one segment), the
    path form of exactly one catalogue line with the case's stage and message."""
    cases = [c for c in CASES if "refusal" in c["expect"]]
    for case in cases:
        want = case["expect"]["refusal"]
        lines = [e for e in CATALOGUE if e.stage == want["stage"] and e.message == want["message"]]
        assert [catalogue.path_fits(e, want["path"]) for e in lines].count(True) == 1, (case["name"], want, lines)


def test_the_strict_path_match_tells_the_forms_apart():
    """SPEC.md:939 [C21] the issue's ambiguities are decided: a metric's path is not its column field's, a site's
    not its layers', an output's not its k's, one segment is one segment."""
    line = catalogue.Entry("compile", "<metric>", "m", "own", 0)
    assert catalogue.path_fits(line, "interventions.patching.metrics.iia")
    assert not catalogue.path_fits(line, "interventions.patching.metrics.iia.expected")
    assert not catalogue.path_fits(catalogue.Entry("validation", "<site>", "m", "own", 0), "sites.target.layers")
    assert not catalogue.path_fits(catalogue.Entry("compile", "<output>", "m", "own", 0), "steps.h.outputs.mean.k")
    assert catalogue.path_fits(catalogue.Entry("validation", "<the value>", "m", "own", 0), "a.b.c")
    assert catalogue.path_fits(catalogue.Entry("validation", "<site>", "m", "own", 0), "method.sites.target")


def test_no_two_catalogue_lines_share_a_message_and_stage_with_different_forms():
    """SPEC.md:939 [C21] a message has one path form at its stage, but for the two §13 names, whose forms no one
    path fits both of."""
    forms: dict[tuple, set] = {}
    messages: dict[tuple, str] = {}
    for entry in CATALOGUE:
        forms.setdefault((entry.stage, _skeleton(entry.message)), set()).add(entry.path)
        messages[(entry.stage, _skeleton(entry.message))] = entry.message
    several = {key: paths for key, paths in forms.items() if len(paths) > 1}
    named = sorted(m for m in TWO_FORMS for key in several if messages[key].startswith(m.rstrip("…")))
    assert named == sorted(TWO_FORMS) and len(several) == len(TWO_FORMS), sorted(several)
    preamble = (ROOT / "SPEC.md").read_text(encoding="utf-8").split(catalogue.HEADING, 1)[1].split("```", 1)[0]
    assert all(" ".join(m.split()) in " ".join(preamble.split()) for m in TWO_FORMS)
    for (stage, _message), paths in several.items():
        for mine in paths:
            for plain in catalogue.expanded(mine):
                sample = catalogue.PLACEHOLDER.sub("x", plain.replace("<*>", "x"))
                fits = [p for p in paths if catalogue.path_fits(catalogue.Entry(stage, p, "", "", 0), sample)]
                assert fits == [mine], (stage, mine, sample, fits)


def test_every_refusal_in_the_code_has_a_catalogue_line():
    """SPEC.md:897 [C14] every Refusal the package can raise is in SPEC.md's catalogue, stage and fixed words;
    run `python tests/refusals.py` for a suggested line for each one missing."""
    assert len(code_sites()) >= 100
    missing = uncatalogued(CATALOGUE)
    assert not missing, "add these lines to SPEC.md §13 (fix the names):\n" + "\n".join(
        f"{s.file}:{s.line}: {suggestion(s)}" for s in missing)


def test_the_catalogue_is_sorted_by_stage_then_by_message():
    """SPEC.md:897 [C14] the catalogue's lines run validation, compile, run, and within a stage by message, so
    a reader (or an implementer diffing their own list) finds a refusal where the order says it is (then
    plot's and table's, which no document reaches)."""
    stages = ["validation", "compile", "run", "plot", "table"]
    keys = [(stages.index(e.stage), e.message) for e in CATALOGUE]
    assert keys == sorted(keys), [f"SPEC.md line {e.line}" for e, k, w in zip(CATALOGUE, keys, sorted(keys)) if k != w][:3]


def test_every_catalogue_line_states_a_refusal_the_code_raises():
    """SPEC.md:897 [C14] no catalogue line is left behind by a refusal that changed or went away."""
    assert not stale(CATALOGUE), [f"SPEC.md line {e.line}: {e.message}" for e in stale(CATALOGUE)]


def test_a_refusal_the_catalogue_does_not_state_is_found():
    """SPEC.md:897 [C14] the check is not vacuous: without its line, a refusal is reported as missing."""
    line = next(e for e in CATALOGUE if e.message.startswith("a position names exactly one of"))
    missing = uncatalogued([e for e in CATALOGUE if e != line])
    assert [s for s in missing if s.message and s.message.startswith("a position names exactly one of")]


def test_catalogue_lines_with_a_seed_source_quote_it():
    """SPEC.md:904 [C15] a line whose source is a seed table or a reference section quotes it: a run of its fixed
    words (12 characters or more) stands verbatim in seed-tables.md, document-format.md or
    language-reference.md."""
    reference = ROOT.parent / "shared" / "reference"
    if not reference.is_dir():
        pytest.skip("../shared/reference is not beside this checkout")
    for name, sources, least in (("seed-tables.md", ("A9", "A11", "B9", "B11"), 10),
                                 ("document-format.md", ("F§",), 10), ("language-reference.md", ("LR§",), 1)):
        text = " ".join((reference / name).read_text(encoding="utf-8").replace("`", "").split())
        quoted = [e for e in CATALOGUE if e.source.startswith(sources)]
        assert len(quoted) >= least, name
        for entry in quoted:
            runs = [r.strip(" '\":;,.") for r in catalogue.PLACEHOLDER.split(entry.message.replace("`", ""))]
            assert any(len(r) >= 12 and r in text for r in runs), (entry.line, entry.message)


def test_informative_fields_are_never_compared():
    """SPEC.md:908 [C16] an informative field may differ; the same difference elsewhere fails."""
    want = {"plan": [{"taps": [{"op": "attention_interface_1", "width": 4}]}]}
    got = {"plan": [{"taps": [{"op": "attention_interface_0", "width": 4}]}]}
    assert conform.compare(want, got, 1e-5, informative_fields=["plan.*.taps.*.op"]) == []
    assert conform.compare(want, got, 1e-5) == ["plan[0].taps[0].op: expected \"attention_interface_1\", "
                                                "got \"attention_interface_0\""]


def test_every_explain_and_model_case_marks_operation_names_informative():
    """SPEC.md:908 [C16] the transformers-dependent operation names are informative in every case that has them."""
    for case in CASES:
        if case["verb"] == "explain":
            assert "plan.*.steps.*.forwards.*.taps.*.op" in case["informative"], case["name"]
        if case["verb"] == "model":
            assert "components.*.op" in case["informative"], case["name"]


def test_a_cases_files_are_the_corpus_own_and_copies_of_the_shipped_ones():
    """SPEC.md:1565 [FZ32] every file a case names is in the corpus under files/ (nothing is taken from the
    repository), and a copy of a shipped file is byte-identical to it."""
    named = [(case["name"], rel) for case in CASES for rel in case.get("files") or ()]
    assert named
    for name, rel in named:
        copy = ROOT / "causalab_ref" / "conformance" / "corpus" / "files" / rel
        assert copy.is_file(), (name, rel)
        if (ROOT / rel).is_file():
            assert copy.read_bytes() == (ROOT / rel).read_bytes(), (name, rel)


def test_every_mutant_of_the_mutation_script_still_applies():
    """SPEC.md:897 [C14] tests/conformance/mutate.py's mutants name text that stands exactly once in its file, so a
    refactor that moves or rewrites the code a mutant targets is seen here, not when the script is next run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tests" / "conformance" / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutate)
    package = ROOT / "causalab_ref"
    stale = [(name, file) for name, _rule, file, old, _new in mutate.MUTANTS
             if not (package / file).is_file() or (package / file).read_text(encoding="utf-8").count(old) != 1]
    assert len(mutate.MUTANTS) >= 90 and stale == []

"""The command line, as a user runs it: `python -m causalab_ref <verb>` from the repo root.

Refusals at validation return before any model library loads, so they run as subprocesses: the
process's own exit status and stderr. A subprocess that loads a model pays several seconds of
imports first, so the verbs that print a model's answers run `cli.main` in this process
(tests/inprocess.py), the entry point `python -m causalab_ref` calls. Hub access is switched off
(HF_HUB_OFFLINE), so a hub key fails fast and offline.
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import subprocess
import sys

import inprocess

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = json.loads((REPO / "documents" / "patching.json").read_text(encoding="utf-8"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_ETAG_TIMEOUT": "5",
       "HF_HUB_DOWNLOAD_TIMEOUT": "5", "PYTHONUNBUFFERED": "1"}


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "causalab_ref", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def write_doc(tmp_path: pathlib.Path, mutate, name: str = "doc.json") -> str:
    raw = copy.deepcopy(SHIPPED)
    mutate(raw)
    path = tmp_path / name
    path.write_text(json.dumps(raw), encoding="utf-8")
    return str(path)


def assert_refusal(proc: subprocess.CompletedProcess, line: str, *, only_line: bool = True) -> None:
    """Exit 2, no traceback, nothing on stdout, and the refusal as stderr's (last) line."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    if only_line:
        assert len(lines) == 1, proc.stderr
    assert lines[-1].startswith(line), proc.stderr


# ================================================================ refusals


def test_unknown_key_exits_2_with_its_dotted_path(tmp_path):
    """SPEC.md:19 [D4] One stderr line `<stage>: <path>: <message>`, status 2, no traceback; D2's path."""
    def mutate(raw):
        raw["interventions"]["patching"]["reads"]["v_cf"]["position"] = -1
    proc = cli("validate", write_doc(tmp_path, mutate))
    assert_refusal(proc, "validation: interventions.patching.reads.v_cf.position: unknown key 'position'")


def test_missing_required_block_exits_2_with_its_path(tmp_path):
    """SPEC.md:17 [D3] A missing required block is refused at validation naming it, on the CLI too."""
    proc = cli("validate", write_doc(tmp_path, lambda raw: raw.pop("roles")))
    assert_refusal(proc, "validation: roles: required field is missing")


def test_wrong_type_exits_2_with_its_path(tmp_path):
    """SPEC.md:17 [D3] A wrong type is refused with its dotted path, on the CLI too."""
    def mutate(raw):
        raw["sites"]["target"]["layers"] = "0"
    proc = cli("validate", write_doc(tmp_path, mutate))
    assert_refusal(proc, "validation: sites.target.layers: layers is a one-element list, [i]")


def test_broken_json_exits_2(tmp_path):
    """SPEC.md:19 [D4] Broken JSON is a refusal (line and column), not a traceback."""
    path = tmp_path / "broken.json"
    path.write_text('{"model": {"key": "fixture:tiny-llama",\n', encoding="utf-8")
    proc = cli("validate", str(path))
    assert_refusal(proc, f"validation: {path} is not JSON: ")
    assert "line 2 column 1" in proc.stderr


def test_run_of_a_malformed_document_writes_nothing(tmp_path):
    """SPEC.md:585 [R10] A refused run leaves no result folder (and no temporary one beside it); D4."""
    def mutate(raw):
        raw["interventions"]["patching"]["writes"]["patch"]["mechanism"] = "lerp"
    doc = write_doc(tmp_path, mutate)
    out_parent = tmp_path / "results"
    out_parent.mkdir()
    proc = cli("run", doc, "--out", str(out_parent / "out"))
    assert_refusal(proc, "validation: interventions.patching.writes.patch.params: mechanism 'lerp' needs params "
                         "['t']")
    assert not (out_parent / "out").exists()
    assert list(out_parent.iterdir()) == []


def test_unknown_fixture_key_is_refused_naming_it(tmp_path):
    """SPEC.md:25 [D6] A `fixture:` key that is not one of the fixtures is refused naming the key."""
    def mutate(raw):
        raw["model"]["key"] = "fixture:tiny-nope"
    proc = cli("validate", write_doc(tmp_path, mutate))
    assert_refusal(proc, "compile: model.key: ", only_line=False)
    assert "'fixture:tiny-nope'" in proc.stderr.strip().splitlines()[-1]


def test_unloadable_hub_key_is_refused_naming_it(tmp_path):
    """SPEC.md:25 [D6] A hub key that cannot be loaded (offline here) is refused naming the key, status 2."""
    def mutate(raw):
        raw["model"]["key"] = "nobody/none"
    proc = cli("validate", write_doc(tmp_path, mutate), timeout=120)
    assert_refusal(proc, "compile: model.key: ", only_line=False)
    assert "'nobody/none'" in proc.stderr.strip().splitlines()[-1]


# ================================================================ the shipped document


def test_validate_shipped_document():
    """SPEC.md:541 [R1] `validate` compiles against the model shell with no weights and says ok."""
    proc = inprocess.cli("validate", "documents/patching.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok: documents/patching.json is a valid plan-shaped document, 1 step"


EXPLAIN_LINES = [
    "<root>: Plan",
    "  score: Observe  metrics=['iia/match', 'logit_diff/logit_diff']  saves=['iia.json', 'logit_diff.json']",
    "      forward 'original' on 'counterfactual'  (4 rows x 11 tokens)",
    "        read  'v_cf' at block_output[0] pos={index:-1} via 'identity'",
    "      forward 'patched' on 'base'  (4 rows x 11 tokens)",
    "        write 'patch' at block_output[0] pos={index:-1} swap(v_cf) via 'identity'",
    "        read  'logits' at lm_head pos={index:-1} via 'identity'",
]


def test_explain_prints_the_plan():
    """SPEC.md:549 [R5] `explain` prints the plan: step, forwards with rows x tokens, taps with address and pos."""
    proc = inprocess.cli("explain", "documents/patching.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n").splitlines() == EXPLAIN_LINES


def test_explain_json():
    """SPEC.md:549 [R5] `--json` prints the verb's result as JSON: the plan text and the step names."""
    proc = inprocess.cli("--json", "explain", "documents/patching.json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["text"].splitlines() == EXPLAIN_LINES
    assert result["steps"] == ["score"]


# ================================================================ verbs without a model


def test_data_lists_rows_columns_and_splits():
    """SPEC.md:609 [R18] SPEC.md:31 [D9] `data <dir>/<table>` reads documents/data/<dir>/<table>.json: rows, columns, splits."""
    proc = cli("data", "weekdays/train")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "weekdays/train: 4 rows"
    assert lines[1] == ("  columns: answer, base_answer, cf_answer, counterfactual_inputs, "
                        "counterfactual_inputs_variables, entity, input, label, split")
    assert lines[2] == "  splits:  all"
    assert lines[3].startswith("  sample:  {")


def test_data_json():
    """SPEC.md:31 [D9] `--json data` carries the same facts as data."""
    proc = cli("data", "weekdays/train", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["ref"], result["rows"], result["splits"]) == ("weekdays/train", 4, ["all"])
    assert "counterfactual_inputs_variables" in result["columns"]


def test_vocab_lists_21_components_and_the_position_forms():
    """SPEC.md:607 [R17] SPEC.md:390 [L5] `vocab` lists the 21 components (B2) and the seed's position forms; seed 000:11, seed 004:175."""
    proc = cli("vocab")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = lines.index("components:")
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        rows.append(line)
    assert len(rows) == 21
    assert {r.split()[0] for r in rows} == {
        "input_ids", "embeddings", "block_input", "attention_input_norm", "attention_query", "attention_key",
        "attention_scores", "attention_probs", "attention_z", "attention_premix", "attention_output",
        "block_mid", "mlp_input_norm", "mlp_input", "mlp_activation", "mlp_neuron_output", "mlp_output",
        "block_output", "ln_final", "lm_head", "logits"}
    # seed 004:175-185, the seed's own vocab lines
    for seed_line in ("  attention_query        interior  [heads]",
                      "  attention_probs        nnterp attention_probabilities  [heads]  needs eager attention",
                      "  input_ids              nnterp embeddings_input  (read-only)",
                      "  logits                 nnterp logits"):
        assert seed_line in rows
    # seed 000:11-13
    assert "position forms:   exactly one cut: index=int, span=tuple[int, int], last=int, all=bool" in lines
    assert "                  scope: variable=str, segment=str" in lines
    assert ("                  frame: Literal['prompt', 'generated']; a bare integer is {\"index\": i}; "
            "-1 is the last token") in lines


def test_model_answers_every_component_at_every_layer():
    """SPEC.md:494 [L25] seed 004:183-228 — `model fixture:tiny-gptoss` loads no weights and answers every
    component at every layer: width and operation where it resolves, the reason where it does not (the
    mixture-of-experts refusal at each layer); `--json` carries the same answers."""
    from causalab_ref.locations import address

    proc = inprocess.cli("model", "fixture:tiny-gptoss")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("fixture:tiny-gptoss via nnterp: 2 layers, padding_side=left")
    rows = _per_place(lines[1:])
    assert rows.pop("attention[0]") == rows.pop("attention[1]")  # one line for both layers (L35)
    labels = [n if not r.layered else f"{n}[{i}]" for n, r in address.TABLE.items()
              for i in (range(2) if r.layered else [0])]
    assert sorted(rows) == sorted(labels)
    assert rows["attention_query[1]"].split()[1:] == ["ok", "width=64", "op=attention_interface_0"]
    assert rows["attention_key[0]"].split()[1:] == ["ok", "width=32", "op=attention_interface_0"]
    assert "ok   no width (no featurizer here)" in rows["input_ids"]
    assert rows["lm_head"].split()[1:] == ["ok", "width=1000"]
    for layer in (0, 1):
        for name, accessor in (("mlp_activation", "mlps_activation"), ("mlp_neuron_output", "mlps_neurons")):
            assert rows[f"{name}[{layer}]"].split("--", 1)[1].strip() == (
                f"component '{name}': {accessor} does not exist on a mixture-of-experts layer, where a token goes "
                "through top-k of N experts and has no single activation. mlps_input and mlps_output are the "
                "block's boundaries and work as usual.")
        assert rows[f"mlp_output[{layer}]"].split()[1:] == ["ok", "width=64"]
    proc = inprocess.cli("--json", "model", "fixture:tiny-gptoss")
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(proc.stdout)["components"]
    assert sorted(answers) == sorted(labels)
    assert answers["attention_key[1]"] == {"resolves": True, "width": 32, "op": "attention_interface_0"}
    assert not answers["mlp_activation[1]"]["resolves"]


def _per_place(lines: list[str]) -> dict[str, str]:
    """The `model` text's lines by place: a refusal printed once as `name[0-1]` stands for each of its layers."""
    rows = {}
    for line in lines:
        label = re.match(r"  (\S+?(?:\[[^\]]*\])?)\s+(?:ok|--)", line).group(1)
        name, _, layers = label.partition("[")
        if not layers:
            rows[name] = line
            continue
        for run in layers[:-1].split(", "):
            first, _, last = run.partition("-")
            rows.update({f"{name}[{k}]": line for k in range(int(first), int(last or first) + 1)})
    return rows


def test_tokens_shows_each_texts_pieces_with_indices_and_column_usability(capsys):
    """SPEC.md:611 [R19] `tokens KEY TEXT…` prints the content tokens with their padded-batch indices and
    says when a text is not usable as a metric column (seed 000:179: " Tuesday" is three tokens)."""
    from causalab_ref import cli as cli_module
    assert cli_module.main(["tokens", "fixture:tiny-llama", " Tuesday", " Monday"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "' Tuesday'  3 token(s)  <- not usable as a metric column"
    assert lines[2] == "' Monday'  1 token(s)"
    assert lines[3].strip().startswith("3:")


SEED_LANDS_LLAMA = {  # seed 004:57-79: module and io at layer 0 on the tiny Llama (interiors: no module)
    "attention_probs": ("self_attn", "output"), "input_ids": ("embed_tokens", "input"),
    "embeddings": ("embed_tokens", "output"), "block_input": ("", "input"),
    "attention_input_norm": ("input_layernorm", "output"), "attention_premix": ("self_attn.o_proj", "input"),
    "attention_output": ("self_attn", "output"), "block_mid": ("post_attention_layernorm", "input"),
    "mlp_input_norm": ("post_attention_layernorm", "output"), "mlp_input": ("mlp", "input"),
    "mlp_activation": ("mlp.act_fn", "output"), "mlp_neuron_output": ("mlp.down_proj", "input"),
    "mlp_output": ("mlp", "output"), "block_output": ("", "output"), "ln_final": ("ln_final", "output"),
    "lm_head": ("lm_head", "output"), "logits": ("", "output"),
}


def test_model_lands_prints_the_seeds_where_each_one_lands_table(capsys):
    """SPEC.md:436 [L18] `model KEY --lands` prints every name's rank, io and module (or operation) at layer 0;
    on the Llama fixture the modules and io are the seed's (seed 004:45-82) and ranks are in forward order."""
    from causalab_ref import cli as cli_module
    assert cli_module.main(["--json", "model", "fixture:tiny-llama", "--lands", "--attn-implementation",
                            "eager"]) == 0
    lands = json.loads(capsys.readouterr().out)["lands"]
    assert {n: (v["module"], v["io"]) for n, v in lands.items() if v["module"] is not None} == SEED_LANDS_LLAMA
    interiors = ("attention_query", "attention_key", "attention_scores", "attention_z")
    assert all(lands[n]["op"] == "attention_interface_0" and lands[n]["io"] is None for n in interiors)
    order = ["input_ids", "embeddings", "block_input", "attention_input_norm", "attention_query", "attention_key",
             "attention_scores", "attention_probs", "attention_z", "attention_premix", "attention_output",
             "block_mid", "mlp_input_norm", "mlp_input", "mlp_activation", "mlp_neuron_output", "mlp_output",
             "block_output", "ln_final", "lm_head", "logits"]
    assert sorted(lands, key=lambda n: lands[n]["rank"]) == order


def test_a_refusal_at_the_read_and_validation_stages_imports_no_torch(tmp_path):
    """SPEC.md:1787 [Q17] malformed JSON and an unknown key are refused by a new process that never imports torch,
    transformers, nnsight or nnterp (each refusal is the usual one line)."""
    import subprocess
    import sys

    bad, unknown = tmp_path / "bad.json", tmp_path / "unknown.json"
    bad.write_text('{"model": ', encoding="utf-8")
    unknown.write_text(json.dumps({"model": {"key": "fixture:tiny-llama"}, "bogus": 1}), encoding="utf-8")
    probe = ("import sys; from causalab_ref import cli; status = cli.main(['validate', sys.argv[1]]); "
             "print(status, sorted(m for m in ('torch', 'transformers', 'nnsight', 'nnterp') if m in sys.modules))")
    for doc, words in ((bad, "is not JSON"), (unknown, "unknown key 'bogus'")):
        proc = subprocess.run([sys.executable, "-c", probe, str(doc)], capture_output=True, text=True, timeout=120)
        assert proc.stdout.strip() == "2 []", proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr


# ================================================================ what a user hears (issue 25)


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    """`python -m causalab_ref *argv` in this process: (status, stdout, stderr)."""
    from causalab_ref import cli as entry
    status = entry.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def _refused(capsys, *argv: str) -> str:
    """The one refusal line a verb prints (status 2, nothing on stdout)."""
    status, out, err = _main(capsys, *argv)
    assert (status, out) == (2, ""), err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def _doc(tmp_path, mutate, base=None) -> str:
    raw = copy.deepcopy(SHIPPED if base is None else base)
    mutate(raw)
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return str(path)


def test_an_unknown_key_names_the_nearest_allowed_one(tmp_path, capsys):
    """SPEC.md:79 [D22] a misspelt key is refused with the allowed keys and then the nearest of them."""
    def mutate(raw):
        raw["interventions"]["patching"]["reads"]["v_cf"]["positon"] = -1
    line = _refused(capsys, "validate", _doc(tmp_path, mutate))
    assert line == ("validation: interventions.patching.reads.v_cf.positon: unknown key 'positon'; allowed here: "
                    "['featurizer', 'input', 'model', 'pos', 'site', 'view']; did you mean 'pos'?")


def test_an_unknown_mechanism_metric_kind_or_metric_name_names_the_nearest(tmp_path, capsys):
    """SPEC.md:79 [D22] a mechanism, a metric kind and a saved metric that are not known are each refused ending
    with the nearest known names."""
    iv = SHIPPED["interventions"]["patching"]
    cases = [
        (lambda raw: raw["interventions"]["patching"]["writes"]["patch"].update(mechanism="swp"),
         "interventions.patching.writes.patch.mechanism", "; did you mean 'swap'?"),
        (lambda raw: raw["interventions"]["patching"]["metrics"]["iia"].update(kind="mach"),
         "interventions.patching.metrics.iia.kind", "; did you mean 'match'?"),
        (lambda raw: raw["steps"]["score"]["saves"][1].update(value="logit_dif"),
         "steps.score.saves.1.value", "; did you mean 'logit_diff'?"),
    ]
    assert set(iv["metrics"]) == {"iia", "logit_diff"}  # the names the suggestions come from
    for mutate, path, tail in cases:
        line = _refused(capsys, "validate", _doc(tmp_path, mutate))
        assert line.startswith(f"validation: {path}: ") and line.endswith(tail), line


def test_a_name_close_to_no_known_one_gets_no_suggestion(tmp_path, capsys):
    """SPEC.md:79 [D22] with nothing close, the message ends where it did: no `did you mean`."""
    def mutate(raw):
        raw["interventions"]["patching"]["writes"]["patch"]["mechanism"] = "qqqqqq"
    line = _refused(capsys, "validate", _doc(tmp_path, mutate))
    assert line == ("validation: interventions.patching.writes.patch.mechanism: 'qqqqqq' is not one of "
                    "['swap', 'add_scaled', 'lerp', 'gaussian', 'clamp', 'renormalize']")


def test_an_unknown_component_names_the_nearest_and_no_python_only_option(tmp_path, capsys):
    """SPEC.md:431 [L17] / SPEC.md:79 [D22] a component the table lacks is refused listing the table's names, then the
    nearest of them; a JSON author is not pointed at the load's Python-only `extra` argument."""
    from causalab_ref.locations import address

    def mutate(raw):
        raw["sites"]["target"]["component"] = "block_outpt"
    line = _refused(capsys, "validate", _doc(tmp_path, mutate))
    assert line == ("compile: sites.target: component 'block_outpt' has no address here, and this model's "
                    f"internals have no accessor of that name either. causalab_ref's are {list(address.NAMES)}; "
                    "did you mean 'block_output' or 'block_input' or 'mlp_output'?")  # difflib's three, best first
    assert "extra" not in line


def test_a_range_swept_in_place_of_the_layers_list_is_refused_with_the_forms_that_sweep(tmp_path, capsys):
    """SPEC.md:85 [D23] `{"sweep": {"range": [0, 5]}}` at `layers` sweeps bare integers: the first point is refused
    with the value it got and the two spellings that sweep one-element lists."""
    def mutate(raw):
        raw["sites"]["target"]["layers"] = {"sweep": {"range": [0, 5]}}
    line = _refused(capsys, "validate", _doc(tmp_path, mutate))
    assert line == ('validation: sites.target.layers: layers is a one-element list, [i], got 0; a sweep of layers '
                    'sweeps such lists: {"sweep": [[0], [1]]} or [{"sweep": {"range": [0, 2]}}]')


def test_both_layer_sweep_spellings_of_the_format_sweep_one_layer_per_point(tmp_path, capsys):
    """SPEC.md:85 [D23] F§11's two spellings, `{"sweep": [[0], [1]]}` and `[{"sweep": {"range": [0, 2]}}]`, each give
    the points layers=0 and layers=1, whose taps at the site are at layers 0 and 1."""
    for layers in ({"sweep": [[0], [1]]}, [{"sweep": {"range": [0, 2]}}]):
        path = _doc(tmp_path, lambda raw: raw["sites"]["target"].update(layers=layers))
        status, out, err = _main(capsys, "--json", "explain", path)
        assert status == 0, err
        plan = json.loads(out)["plan"]
        assert [leaf["label"] for leaf in plan] == ["layers=0", "layers=1"]
        at_target = [{tap["layer"] for step in leaf["steps"] for forward in step["forwards"] for tap in forward["taps"]
                      if tap["site"] == "target"} for leaf in plan]
        assert at_target == [{0}, {1}]


def test_model_prints_each_refusal_once_with_the_layers_it_applies_to(capsys):
    """SPEC.md:494 [L25] on a 5-layer checkpoint, the sdpa refusal of the attention pattern is one line per
    component labelled `[0-4]`, and every (component, reason) of `--json model` is one line of the text."""
    status, out, err = _main(capsys, "model", "fixture:tiny-gpt2")
    assert status == 0, err
    text = out.splitlines()[1:]
    status, out, err = _main(capsys, "--json", "model", "fixture:tiny-gpt2")
    answers = json.loads(out)["components"]
    refused = {(label.partition("[")[0], a["why"]) for label, a in answers.items() if not a["resolves"]}
    assert {label for label, a in answers.items() if not a["resolves"]} == {
        f"{c}[{k}]" for c in ("attention_scores", "attention_probs") for k in range(5)}
    for component, why in refused:
        assert [line for line in text if why in line] == [f"  {component + '[0-4]':24s} --   {why}"]
    assert len(text) == len(answers) - 10 + 2 + 1  # ten places refused, printed as two lines; heads' line (L35)


def test_model_prints_a_reason_naming_its_own_layer_once_for_its_layers(capsys):
    """SPEC.md:494 [L25] OLMo-2's post-norm refusal names each layer (`layer 0 is ...`, `layer 1 is ...` in
    `--json model`); the text prints it once per component, labelled [0-1], as layer 0's."""
    status, out, err = _main(capsys, "--json", "model", "fixture:tiny-olmo2")
    assert status == 0, err
    answers = json.loads(out)["components"]
    whys = [answers[f"attention_input_norm[{k}]"]["why"] for k in (0, 1)]
    assert "layer 0 is a post-norm block" in whys[0] and whys[1] == whys[0].replace("layer 0", "layer 1")
    status, out, err = _main(capsys, "model", "fixture:tiny-olmo2")
    norm = [line for line in out.splitlines() if line.startswith("  attention_input_norm")]
    assert norm == [f"  {'attention_input_norm[0-1]':24s} --   {whys[0]}"]


def test_model_layer_runs_are_printed_as_ranges():
    """SPEC.md:494 [L25] layers a reason applies to print as runs: 0-2 and 5 as `0-2, 5`, one layer alone."""
    from causalab_ref import cli as entry
    assert entry._runs([0, 1, 2, 5]) == "0-2, 5"
    assert entry._runs([3]) == "3"
    assert entry._runs([0, 2, 3]) == "0, 2-3"


def test_tokens_counts_the_pieces_it_lists(capsys):
    """SPEC.md:611 [R19] the count is the number of pieces listed for the text as given; where the metric-column
    spelling (one space before the stripped text) splits otherwise, that count is said apart. On GPT-2's BPE
    'If today is Monday, tomorrow is' is 9 pieces and ' If today ...' 10 tokens (the seed's 'If' is two)."""
    status, out, err = _main(capsys, "tokens", "fixture:tiny-gpt2", "If today is Monday, tomorrow is", " Tuesday")
    assert status == 0, err
    lines = out.splitlines()
    assert re.findall(r"(\d+):'", lines[1]) == [str(k) for k in range(9)]  # the nine pieces listed, indices 0-8
    assert lines[0] == ("'If today is Monday, tomorrow is'  9 token(s); as a metric column it is "
                        "' If today is Monday, tomorrow is', 10 token(s)  <- not usable as a metric column")
    assert lines[2:] == ["' Tuesday'  1 token(s)", "  8:' Tuesday'"]  # left-padded to the batch's 9
    status, out, err = _main(capsys, "--json", "tokens", "fixture:tiny-gpt2", "If today is Monday, tomorrow is")
    got = json.loads(out)["texts"]["If today is Monday, tomorrow is"]
    assert (got["tokens"], got["column_tokens"], got["one_token"]) == (9, 10, False)


def test_the_summary_line_counts_the_unscored_rows_by_reason(tmp_path):
    """SPEC.md:1125 [S19] rows without a value are counted by their reason: a position's reason where the read was
    not placed, `column-ineligible` where it was placed and the answer columns held no answer."""
    from causalab_ref import cli as entry
    rows = [{"metric": "iia", "value": v, "unit": "fraction", "reason": why}
            for v, why in ((1.0, ""), (None, "alignment_missing"), (0.0, ""), (None, "alignment_missing"),
                           (None, ""), (None, "alignment_ambiguous"))]
    (tmp_path / "iia.json").write_text(json.dumps(rows), encoding="utf-8")
    assert entry.summary_line(tmp_path / "iia.json") == (
        f"{tmp_path / 'iia.json'}: iia mean 0.5 over 2 of 6 rows (fraction); not scored: 2 alignment_missing, "
        "1 alignment_ambiguous, 1 column-ineligible; rows [1, null, 0, null, null, ... 1 more]")


def test_a_safetensors_save_gets_a_line_with_each_tensors_shape_and_dtype(tmp_path):
    """SPEC.md:1125 [S19] a tensor file written by a run gets its line too: each tensor's name, shape and dtype,
    read from the file's header (here written by safetensors itself)."""
    import torch
    from safetensors.torch import save_file

    from causalab_ref import cli as entry
    save_file({"weight": torch.zeros(16, 4), "bias": torch.zeros(3, dtype=torch.bfloat16)}, str(tmp_path / "w.safetensors"))
    assert entry.summary_line(tmp_path / "w.safetensors") == (
        f"{tmp_path / 'w.safetensors'}: bias (3) bfloat16, weight (16, 4) float32")


def test_a_missing_table_names_the_data_root_and_its_flag(tmp_path, capsys):
    """SPEC.md:31 [D9] a dataset ref with no table under the data root is refused naming that root and
    `--data-root`, which a relative root (the default `documents/data` included) is resolved from."""
    empty = tmp_path / "data"
    empty.mkdir()
    line = _refused(capsys, "validate", str(REPO / "documents" / "patching.json"), "--data-root", str(empty))
    assert line == (f"compile: steps.score.rows.base: dataset ref 'weekdays/train': no table at "
                    f"{empty / 'weekdays' / 'train.json'}; dataset refs are read under the data root {empty}, which "
                    "--data-root names (a relative one from the current directory)")


def test_a_key_without_a_path_prefix_is_a_hub_key_and_its_refusal_says_how_to_name_a_folder(tmp_path, monkeypatch,
                                                                                              capsys):
    """SPEC.md:672 [X17] `fx/tiny-gpt2` is a hub key even where a folder of that name is beside the current
    directory: offline, it is refused saying a folder's key starts with ./, ../ or /, and naming `./fx/tiny-gpt2`."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "fx" / "tiny-gpt2").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "model", "fx/tiny-gpt2")
    assert line.startswith("compile: model.key: model 'fx/tiny-gpt2' at revision 'main' could not be found: tried ")
    assert line.endswith("; a checkpoint directory's key is a path that must start with ./, ../ or /, so "
                         "'fx/tiny-gpt2' is a hub key (the folder here is './fx/tiny-gpt2')")


def _absent_anchor(tmp_path) -> tuple[str, str]:
    """entity_patch.json on rows whose row 1 names an entity its prompt does not hold: (document, data root)."""
    rows = json.loads((REPO / "documents" / "data" / "weekdays" / "train.json").read_text(encoding="utf-8"))
    rows[1]["entity"] = "Tuesday"
    (tmp_path / "data" / "weekdays").mkdir(parents=True)
    (tmp_path / "data" / "weekdays" / "train.json").write_text(json.dumps(rows), encoding="utf-8")
    return str(REPO / "documents" / "entity_patch.json"), str(tmp_path / "data")


def test_validate_explain_and_run_refuse_a_write_anchored_to_absent_text_with_one_line(tmp_path, capsys):
    """SPEC.md:279 [P58] SPEC.md:264 [P28] a write whose anchor row 1's prompt lacks is refused before any weights
    load: validate, explain and run print the same line, whose last words explain `alignment_missing`."""
    doc, root = _absent_anchor(tmp_path)
    lines = [_refused(capsys, "validate", doc, "--data-root", root),
             _refused(capsys, "explain", doc, "--data-root", root),
             _refused(capsys, "run", doc, "--data-root", root, "--out", str(tmp_path / "out"), "--quiet")]
    assert lines[0] == lines[1] == lines[2], lines
    assert lines[0].startswith("compile: interventions.patching.writes.patch.pos: write 'patch' has nothing to write "
                               "on row(s) {1: 'alignment_missing'}.")
    assert "`alignment_missing` is an anchor the row's prompt does not hold" in lines[0]
    assert "alignment_ambiguous" not in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_run_places_with_the_frames_compile_built(llama, monkeypatch, tmp_path):
    """SPEC.md:1771 [Q15] SPEC.md:279 [P58] compile builds each role's frame (with its character map) to place the
    rows; the plan keeps them, and the run that follows builds none again."""
    from causalab_ref.positions import resolve
    from causalab_ref.runs import compile as compiler
    from causalab_ref.runs import run

    raw = json.loads((REPO / "documents" / "entity_patch.json").read_text(encoding="utf-8"))
    plan = compiler.compile_document(raw, llama, REPO / "documents" / "data")
    assert sorted(key[-1] for key in plan.frames) == [True, True]  # base and counterfactual, character maps built
    built = []
    frame_of_ids = resolve.frame_of_ids

    def counted(*args, **kwargs):
        built.append(kwargs.get("char_map"))
        return frame_of_ids(*args, **kwargs)
    monkeypatch.setattr(resolve, "frame_of_ids", counted)
    run.execute(plan, llama, tmp_path / "out", progress=False)
    assert built == []
    assert len(json.loads((tmp_path / "out" / "iia.json").read_text())) == 4

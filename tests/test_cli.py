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
    """SPEC.md:0 [D4] One stderr line `<stage>: <path>: <message>`, status 2, no traceback; D2's path."""
    def mutate(raw):
        raw["interventions"]["patching"]["reads"]["v_cf"]["position"] = -1
    proc = cli("validate", write_doc(tmp_path, mutate))
    assert_refusal(proc, "validation: interventions.patching.reads.v_cf.position: unknown key 'position'")


def test_missing_required_block_exits_2_with_its_path(tmp_path):
    """SPEC.md:0 [D3] A missing required block is refused at validation naming it, on the CLI too."""
    proc = cli("validate", write_doc(tmp_path, lambda raw: raw.pop("roles")))
    assert_refusal(proc, "validation: roles: required field is missing")


def test_wrong_type_exits_2_with_its_path(tmp_path):
    """SPEC.md:0 [D3] A wrong type is refused with its dotted path, on the CLI too."""
    def mutate(raw):
        raw["sites"]["target"]["layers"] = "0"
    proc = cli("validate", write_doc(tmp_path, mutate))
    assert_refusal(proc, "validation: sites.target.layers: layers is a one-element list, [i]")


def test_broken_json_exits_2(tmp_path):
    """SPEC.md:0 [D4] Broken JSON is a refusal (line and column), not a traceback."""
    path = tmp_path / "broken.json"
    path.write_text('{"model": {"key": "fixture:tiny-llama",\n', encoding="utf-8")
    proc = cli("validate", str(path))
    assert_refusal(proc, f"validation: {path} is not JSON: ")
    assert "line 2 column 1" in proc.stderr


def test_run_of_a_malformed_document_writes_nothing(tmp_path):
    """SPEC.md:0 [R10] A refused run leaves no result folder (and no temporary one beside it); D4."""
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
    """SPEC.md:0 [D6] A `fixture:` key that is not one of the fixtures is refused naming the key."""
    def mutate(raw):
        raw["model"]["key"] = "fixture:tiny-nope"
    proc = cli("validate", write_doc(tmp_path, mutate))
    assert_refusal(proc, "compile: model.key: ", only_line=False)
    assert "'fixture:tiny-nope'" in proc.stderr.strip().splitlines()[-1]


def test_unloadable_hub_key_is_refused_naming_it(tmp_path):
    """SPEC.md:0 [D6] A hub key that cannot be loaded (offline here) is refused naming the key, status 2."""
    def mutate(raw):
        raw["model"]["key"] = "nobody/none"
    proc = cli("validate", write_doc(tmp_path, mutate), timeout=120)
    assert_refusal(proc, "compile: model.key: ", only_line=False)
    assert "'nobody/none'" in proc.stderr.strip().splitlines()[-1]


# ================================================================ the shipped document


def test_validate_shipped_document():
    """SPEC.md:0 [R1] `validate` compiles against the model shell with no weights and says ok."""
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
    """SPEC.md:0 [R5] `explain` prints the plan: step, forwards with rows x tokens, taps with address and pos."""
    proc = inprocess.cli("explain", "documents/patching.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n").splitlines() == EXPLAIN_LINES


def test_explain_json():
    """SPEC.md:0 [R5] `--json` prints the verb's result as JSON: the plan text and the step names."""
    proc = inprocess.cli("--json", "explain", "documents/patching.json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["text"].splitlines() == EXPLAIN_LINES
    assert result["steps"] == ["score"]


# ================================================================ verbs without a model


def test_data_lists_rows_columns_and_splits():
    """SPEC.md:0 [R18] SPEC.md:0 [D9] `data <dir>/<table>` reads documents/data/<dir>/<table>.json: rows, columns, splits."""
    proc = cli("data", "weekdays/train")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "weekdays/train: 4 rows"
    assert lines[1] == ("  columns: answer, base_answer, cf_answer, counterfactual_inputs, "
                        "counterfactual_inputs_variables, entity, input, label, split")
    assert lines[2] == "  splits:  all"
    assert lines[3].startswith("  sample:  {")


def test_data_json():
    """SPEC.md:0 [D9] `--json data` carries the same facts as data."""
    proc = cli("data", "weekdays/train", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["ref"], result["rows"], result["splits"]) == ("weekdays/train", 4, ["all"])
    assert "counterfactual_inputs_variables" in result["columns"]


def test_vocab_lists_21_components_and_the_position_forms():
    """SPEC.md:0 [R17] SPEC.md:0 [L5] `vocab` lists the 21 components (B2) and the seed's position forms; seed 000:11, seed 004:175."""
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
    """SPEC.md:0 [L25] seed 004:183-228 — `model fixture:tiny-gptoss` loads no weights and answers every
    component at every layer: width and operation where it resolves, the reason where it does not (the
    mixture-of-experts refusal at each layer); `--json` carries the same answers."""
    from causalab_ref.locations import address

    proc = inprocess.cli("model", "fixture:tiny-gptoss")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("fixture:tiny-gptoss via nnterp: 2 layers, padding_side=left")
    rows = {line.split()[0]: line for line in lines[1:]}
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


def test_tokens_shows_each_texts_pieces_with_indices_and_column_usability(capsys):
    """SPEC.md:0 [R19] `tokens KEY TEXT…` prints the content tokens with their padded-batch indices and
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
    """SPEC.md:0 [L18] `model KEY --lands` prints every name's rank, io and module (or operation) at layer 0;
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
    """SPEC.md:0 [Q17] malformed JSON and an unknown key are refused by a new process that never imports torch,
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

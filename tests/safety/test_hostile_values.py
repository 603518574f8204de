"""SPEC.md §7 Safety, hostile values (issue #22 items 5, 6, 9, 10, 13): each test performs the attack.

Non-finite numbers (a NaN pca basis, an infinite or too-wide bundle, a 1e300 param, a forward that
overflows, a fit that diverges), counts that ask for unbounded work, numbers torch would reject, link
loops, a 400-digit budget and a prompt too long to tokenize. Each attack goes through the command line
in this process (fuzzing.check: one refusal line, status 2, never a traceback) unless it needs the
compiler's own hands (counting plans, wrapping the tokenizer).
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil

import pytest
import torch

import fuzzing
from causalab_ref.featurizers import bundles, fit
from causalab_ref.runs import compile as compiler
from causalab_ref.runs import data
from causalab_ref.shapes import Refusal
from causalab_ref.writes import mechanisms
from conftest import Delegate

DOCUMENTS = fuzzing.REPO / "documents"
PATCHING = json.loads((DOCUMENTS / "patching.json").read_text(encoding="utf-8"))
DAS = json.loads((DOCUMENTS / "das.json").read_text(encoding="utf-8"))
DBM = json.loads((DOCUMENTS / "dbm.json").read_text(encoding="utf-8"))
PCA = json.loads((DOCUMENTS / "pca_control.json").read_text(encoding="utf-8"))
PCA_FILE = DOCUMENTS / "artifacts" / "pca.safetensors"
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


@pytest.fixture(autouse=True, scope="module")
def _one_load_per_model():
    with fuzzing.cached_loads():
        yield


def _write(tmp_path: pathlib.Path, raw: dict, name: str = "doc.json") -> str:
    doc = tmp_path / name
    doc.write_text(json.dumps(raw), encoding="utf-8")
    return str(doc)


def _refusal(argv: list[str]) -> str:
    ok, status, text = fuzzing.check(argv)
    assert ok and status == 2, (status, text)
    return text.strip()


def _patching_with(write: dict) -> dict:
    raw = copy.deepcopy(PATCHING)
    raw["interventions"]["patching"]["writes"]["patch"] = write
    return raw


# ================================================================ bundles (S35, S36)


def _pca_loading(tmp_path: pathlib.Path, weight: torch.Tensor) -> str:
    """pca_control.json loading a copy of the shipped basis whose weight is `weight` (the stamp kept)."""
    tensors, metadata = bundles.read(PCA_FILE, "featurizers.basis.file_path", "basis")
    file = tmp_path / "basis.safetensors"
    bundles.write(file, {"weight": weight}, metadata)
    raw = copy.deepcopy(PCA)
    raw["featurizers"]["basis"]["file_path"] = str(file)
    return _write(tmp_path, raw)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_bundle_holding_a_value_that_is_not_finite_is_refused_naming_the_file(tmp_path, bad):
    """SPEC.md:1217 [S35] one NaN or infinite entry of a pca basis (issue #22 item 5: once a table of nulls) is
    refused at compile at the file_path, naming the file and the tensor, before anything runs."""
    weight = bundles.read(PCA_FILE, "featurizers.basis.file_path", "basis")[0]["weight"].clone()
    weight[3, 1] = bad
    line = _refusal(["validate", _pca_loading(tmp_path, weight)])
    assert line == (f"compile: featurizers.basis.file_path: featurizer 'basis': '{tmp_path / 'basis.safetensors'}' "
                    "holds weight with 1 value(s) that are not finite numbers (NaN or infinite); a bundle's values "
                    "are finite"), line


def test_a_float64_bundle_value_past_float32s_range_is_refused(tmp_path):
    """SPEC.md:1217 [S35] a subspace bundle in float64 holding 1e300 is finite there and infinite in the float32 the
    featurizer computes in: refused at compile, naming the tensor and the count."""
    weight = torch.zeros(16, 8, dtype=torch.float64)
    weight[0, 0], weight[1, 1] = 1e300, -1e39
    file = tmp_path / "rot.safetensors"
    bundles.write(file, {"weight": weight})
    raw = copy.deepcopy(DAS)
    raw["featurizers"]["rot"]["file_path"] = str(file)
    line = _refusal(["validate", _write(tmp_path, raw)])
    assert line.startswith(f"compile: featurizers.rot.file_path: featurizer 'rot': '{file}' holds weight with 2 "
                           "value(s) past float32's range (|x| <= 3.40282e+38)"), line
    assert float(weight[0, 0].float()) == float("inf")  # the ground: float32 cannot hold it


def test_a_bundle_whose_tensor_is_0_d_is_refused_naming_the_file(tmp_path):
    """SPEC.md:1223 [S36] a pca bundle whose weight is one number has no last axis to read k from: one refusal
    naming the file, not an IndexError."""
    file = tmp_path / "basis.safetensors"
    bundles.write(file, {"weight": torch.tensor(1.0)})
    raw = copy.deepcopy(PCA)
    raw["featurizers"]["basis"]["file_path"] = str(file)
    line = _refusal(["validate", _write(tmp_path, raw)])
    assert line == (f"compile: featurizers.basis.file_path: featurizer 'basis': '{file}' holds weight as a 0-d "
                    "tensor (one number), where a pca bundle's weight is a matrix"), line


# ================================================================ mechanism params (S50)


@pytest.mark.parametrize("write, key", [
    ({"site": "target", "pos": -1, "mechanism": "gaussian", "params": {"seed": 0, "scale": 1e300}}, "scale"),
    ({"site": "target", "pos": -1, "mechanism": "lerp", "operand": "v_cf", "params": {"t": 1e300}}, "t"),
    ({"site": "target", "pos": -1, "mechanism": "add_scaled", "operand": "v_cf", "params": {"scale": -1e39}}, "scale"),
    ({"site": "target", "pos": -1, "mechanism": "clamp", "params": {"hi": 2 ** 200}}, "hi"),
])
def test_a_mechanism_param_past_float32s_range_is_refused_at_validation(tmp_path, write, key):
    """SPEC.md:1299 [S50] a gaussian scale or a lerp t of 1e300 (issue #22 item 5: exit 0 and a table of nulls)
    is refused at validation at the param, with float32's bound in the message."""
    line = _refusal(["validate", _write(tmp_path, _patching_with(write))])
    assert line.startswith(f"validation: interventions.patching.writes.patch.params.{key}: mechanism "
                           f"'{write['mechanism']}': param '{key}' is "), line
    assert "past float32's range (|x| <= 3.40282e+38)" in line, line


def test_a_gaussian_seed_is_not_held_to_float32s_range():
    """SPEC.md:1299 [S50] the seed is an integer a generator takes, not a value a float32 holds: 2**64 - 1 and
    -2**63 pass (far past float32's exact integers); one past either end is refused, as torch refuses it."""
    for seed in (2 ** 64 - 1, -(2 ** 63)):
        assert mechanisms.check("gaussian", False, {"seed": seed, "scale": 1.0}, "w") is None
        torch.Generator().manual_seed(seed)  # the ground: torch takes it
    for seed in (2 ** 64, -(2 ** 63) - 1):
        with pytest.raises(Refusal, match=f"seed {seed} is not an integer a torch generator takes"):
            mechanisms.check("gaussian", False, {"seed": seed, "scale": 1.0}, "w")
        with pytest.raises((RuntimeError, ValueError)):  # torch: an overflow either way
            torch.Generator().manual_seed(seed)


def test_clamp_with_lo_above_hi_is_refused_not_swapped(tmp_path):
    """SPEC.md:1299 [S50] clamp lo 1, hi -1 has no value between them (torch would set every value to hi): refused."""
    write = {"site": "target", "pos": -1, "mechanism": "clamp", "params": {"lo": 1, "hi": -1}}
    line = _refusal(["validate", _write(tmp_path, _patching_with(write))])
    assert line == ("validation: interventions.patching.writes.patch.params: mechanism 'clamp': lo 1 is above hi -1, "
                    "so no value lies between them; write lo <= hi"), line
    assert torch.equal(torch.clamp(torch.tensor([-5.0, 5.0]), min=1, max=-1), torch.tensor([-1.0, -1.0]))


# ================================================================ a value that becomes non-finite (S52)


def test_a_forward_that_overflows_writes_ineligible_non_finite_rows(tmp_path):
    """SPEC.md:1312 [S52] gaussian scale 3e38 is within float32 but its noise overflows the forward: every row of
    both tables is `value: null, eligible: false, reason: "non_finite"`, never a null marked eligible; the match
    metric, whose argmax of NaN logits is a number, included."""
    write = {"site": "target", "pos": -1, "mechanism": "gaussian", "params": {"seed": 0, "scale": 3e38}}
    out = tmp_path / "out"
    ok, status, text = fuzzing.check(["run", _write(tmp_path, _patching_with(write)), "--out", str(out), "--quiet"])
    assert ok and status == 0, text
    for table in ("iia.json", "logit_diff.json"):
        rows = json.loads((out / table).read_text(encoding="utf-8"))
        assert [(r["value"], r["eligible"], r["reason"]) for r in rows] == [(None, False, "non_finite")] * len(rows)


def test_an_unharmed_run_marks_no_row_non_finite(tmp_path):
    """SPEC.md:1312 [S52] the rule takes nothing else: the shipped patching document's rows are all eligible with
    a number and reason ''."""
    out = tmp_path / "out"
    ok, status, text = fuzzing.check(["run", _write(tmp_path, PATCHING), "--out", str(out), "--quiet"])
    assert ok and status == 0, text
    rows = json.loads((out / "logit_diff.json").read_text(encoding="utf-8"))
    assert all(r["eligible"] and isinstance(r["value"], float) and r["reason"] == "" for r in rows), rows


# ================================================================ a fit that diverges (S37)


def test_a_fit_whose_weights_become_infinite_is_refused_and_nothing_is_saved(tmp_path):
    """SPEC.md:1226 [S37] an lr within S51's bound with a weight decay sends the gate's θ past float32 on its
    second update: the run is refused at the fit, naming the update, and leaves no --out (nothing saved)."""
    raw = copy.deepcopy(DBM)
    raw["steps"]["fit"].update(optimizer={"name": "adamw", "lr": 3e37, "weight_decay": 0.01}, epochs=2,
                               objective=[[1.0, "ce"], [0.01, "mask.mask"]])
    out = tmp_path / "out"
    line = _refusal(["run", _write(tmp_path, raw), "--out", str(out), "--quiet"])
    assert line.startswith("run: steps.fit: step 'fit': update epochs[") and "of 'mask' not finite" in line, line
    assert "nothing it trained is saved" in line
    assert not out.exists()


def test_fit_train_stops_at_the_first_update_that_leaves_a_parameter_not_finite():
    """SPEC.md:1226 [S37] the check runs after every update: a loss whose gradient is NaN stops the loop at
    epochs[0][0], with the count of values that are not finite."""
    class Leaf:
        kind, training = "subspace", False

        def __init__(self):
            self.weight = torch.zeros(3)

        def params(self):
            return [self.weight]
    leaf = Leaf()
    settings = fit.Settings(params=("w",), objective=((1.0, "m"),), epochs=2, lr=0.1, early_stop="m")
    update = lambda: {"m": (leaf.weight * float("nan")).sum().reshape(1)}  # noqa: E731
    with pytest.raises(fit.Diverged) as caught:
        fit.train({"w": leaf}, settings, [[update], [update]], update)
    assert (caught.value.epoch, caught.value.update, caught.value.bad, caught.value.total) == (0, 0, 3, 3)


def test_a_fit_whose_objective_reaches_no_trained_featurizer_is_refused_before_any_update(tmp_path):
    """SPEC.md:1230 [S79] bench/fuzz.py's case 7805: das.json with its `logits` read's `model` removed reads the
    unintervened model, so the loss holds no gradient; once an internal error in backward, now one run line at
    the objective naming the update and the featurizer, and no --out."""
    raw = json.loads((DOCUMENTS / "das.json").read_text(encoding="utf-8"))
    del raw["interventions"]["das"]["reads"]["logits"]["model"]
    out = tmp_path / "out"
    line = _refusal(["run", _write(tmp_path, raw), "--out", str(out), "--quiet"])
    assert line.startswith("run: steps.fit.objective: step 'fit': its objective does not depend on the "
                           "featurizers it trains (rot): at update epochs[0][0]"), line
    assert not out.exists()


def test_fit_train_refuses_a_loss_with_no_gradient_before_any_update():
    """SPEC.md:1230 [S79] a loss that does not depend on the trained leaves raises Untrainable at epochs[0][0] and
    leaves them as they were (no update applied); the same loss through the leaf trains."""
    weight = torch.ones(3)

    class Leaf:
        kind, training = "subspace", False

        def params(self):
            return [weight]
    settings = fit.Settings(params=("w",), objective=((1.0, "m"),), epochs=1, lr=0.1, early_stop="m")
    constant = lambda: {"m": torch.ones(1)}  # noqa: E731
    with pytest.raises(fit.Untrainable) as caught:
        fit.train({"w": Leaf()}, settings, [[constant]], constant)
    assert (caught.value.epoch, caught.value.update) == (0, 0) and torch.equal(weight, torch.ones(3))
    through = lambda: {"m": (weight * 2).sum().reshape(1)}  # noqa: E731
    fit.train({"w": Leaf()}, settings, [[through]], through)
    assert not torch.equal(weight, torch.ones(3))


# ================================================================ counts (S49)


def test_epochs_past_the_bound_are_refused_at_validation_with_the_bound(tmp_path):
    """SPEC.md:1286 [S49] `epochs: 10**9` once kept validate busy for minutes; refused at validation, the bound
    in the message."""
    raw = copy.deepcopy(DAS)
    raw["steps"]["fit"]["epochs"] = 10 ** 9
    line = _refusal(["validate", _write(tmp_path, raw)])
    assert line == ("validation: steps.fit.epochs: epochs 1000000000 is more than 10,000, the most a document may "
                    "ask for"), line


def test_a_patience_past_the_bound_is_refused_at_validation(tmp_path):
    """SPEC.md:1286 [S49] patience counts epochs, and is bounded as they are."""
    raw = copy.deepcopy(DAS)
    raw["steps"]["fit"]["early_stop"]["patience"] = 10 ** 18
    line = _refusal(["validate", _write(tmp_path, raw)])
    assert line.startswith("validation: steps.fit.early_stop.patience: patience 1000000000000000000 is more than "
                           "10,000"), line


def test_more_than_a_million_updates_are_refused_at_compile(tmp_path):
    """SPEC.md:1286 [S49] 10,000 epochs of 120 one-pair updates are 1,200,000 updates: refused at compile (so by
    validate) at steps.fit.epochs, naming the product."""
    root = tmp_path / "data"
    shutil.copytree(fuzzing.DATA, root)
    pairs = json.loads((root / "weekdays" / "pairs.json").read_text(encoding="utf-8"))
    train = [dict(r, split="train", input=f"{r['input']}{'.' * k}") for k, r in
             enumerate([r for r in pairs if r.get("split") == "train"] * 120)][:120]
    (root / "weekdays" / "pairs.json").write_text(json.dumps(train + [r for r in pairs if r.get("split") == "test"]),
                                                  encoding="utf-8")
    raw = copy.deepcopy(DAS)
    raw["steps"]["fit"].update(epochs=10_000, pairs=1)
    line = _refusal(["validate", _write(tmp_path, raw), "--data-root", str(root)])
    assert line == ("compile: steps.fit.epochs: step 'fit': 10000 epochs x 120 updates (120 rows, 1 pairs each) is "
                    "more than 1,000,000 updates; fit fewer epochs or larger pairs"), line


def _counting_plans(monkeypatch) -> dict:
    calls = {"plans": 0}
    original = compiler.observe_plan

    def counted(*args, **kwargs):
        calls["plans"] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(compiler, "observe_plan", counted)
    return calls


def _compile_das(llama, epochs: int, pairs: int = 8):
    raw = copy.deepcopy(DAS)
    raw["steps"]["fit"].update(epochs=epochs, pairs=pairs)
    return compiler.compile_document(raw, llama, fuzzing.DATA)


def test_compiling_a_fit_costs_the_same_for_one_epoch_and_ten_thousand(llama, monkeypatch):
    """SPEC.md:1286 [S49] compile plans the first epoch only: das.json at 1 and at 10,000 epochs plans the same
    number of observe passes, and explain still says 10000 epochs and shows the first update."""
    calls = _counting_plans(monkeypatch)
    _compile_das(llama, 1)
    one, calls["plans"] = calls["plans"], 0
    assert one >= 3  # the first update, the eval pass, the score step
    plan = _compile_das(llama, 10_000)
    assert calls["plans"] == one
    fit_line = next(line for line in plan.text().splitlines() if ": Fit " in line)
    assert fit_line.strip().startswith("fit: Fit  10000 epochs x "), fit_line


def test_a_fits_later_epochs_are_planned_as_the_schedule_says(llama):
    """SPEC.md:1286 [S49] FZ12's minibatches, planned lazily: every epoch's updates hold the rows `fit.schedule`
    gives (8 rows in runs of 3), epoch by epoch, as if all were planned up front."""
    step = next(s for s in _compile_das(llama, 3, pairs=3).steps if s.kind == "fit")
    train = data.rows_of("weekdays/pairs#train", fuzzing.DATA)
    ids = data.example_ids(train)
    planned = [[update.example_ids for update in epoch] for epoch in step.updates()]
    expected = [[tuple(ids[i] for i in index) for index in epoch]
                for epoch in fit.schedule(len(train), 3, 3, DAS["steps"]["fit"]["seed"])]
    assert planned == expected and [len(epoch) for epoch in planned] == [3, 3, 3]


# ================================================================ numbers handed to torch (S51)


@pytest.mark.parametrize("where, change", [
    ("steps.fit.optimizer.lr", lambda raw: raw["steps"]["fit"]["optimizer"].update(lr=-0.1)),
    ("steps.fit.optimizer.weight_decay", lambda raw: raw["steps"]["fit"]["optimizer"].update(weight_decay=-1.0)),
    ("steps.fit.optimizer.lr", lambda raw: raw["steps"]["fit"]["optimizer"].update(lr=3e38)),
    ("steps.fit.optimizer.weight_decay", lambda raw: raw["steps"]["fit"]["optimizer"].update(lr=1e30,
                                                                                            weight_decay=1e10)),
    ("steps.fit.seed", lambda raw: raw["steps"]["fit"].update(seed=2 ** 70)),
    ("featurizers.rot.seed", lambda raw: raw["featurizers"]["rot"].update(seed=2 ** 70)),
    ("featurizers.rot.seed", lambda raw: raw["featurizers"]["rot"].update(seed=-(2 ** 63) - 1)),
])
def test_a_setting_torch_would_reject_is_refused_at_validation(tmp_path, where, change):
    """SPEC.md:1304 [S51] a negative lr or weight decay, an lr near float32's max, an lr x weight_decay past it, a
    fit or featurizer seed outside what a generator takes: each once an internal error inside torch, now one
    refusal at validation at its path."""
    raw = copy.deepcopy(DAS)
    change(raw)
    line = _refusal(["validate", _write(tmp_path, raw)])
    assert line.startswith(f"validation: {where}: "), line


def test_an_anneal_temperature_float32_rounds_to_zero_is_refused(tmp_path):
    """SPEC.md:1304 [S51] an anneal ending at 1e-300 is above 0 but 0 in float32, where θ / T is NaN."""
    raw = copy.deepcopy(DBM)
    raw["steps"]["fit"]["anneal"]["mask"]["end"] = 1e-300
    line = _refusal(["validate", _write(tmp_path, raw)])
    assert line.startswith("validation: steps.fit.anneal.mask: an anneal's temperature 1e-300 is below 1.17549e-38"), line
    assert torch.isnan(torch.zeros(1) / 1e-300).all()  # the ground: the float32 division


def test_the_lr_bound_is_adamws_own():
    """SPEC.md:1304 [S51] the ground of the lr bound: AdamW steps at lr = float32's max x (1 - 0.9) and fails inside
    torch just above it (its first step is lr / (1 - β1) as a float32)."""
    def step(lr: float) -> None:
        w = torch.zeros(2, requires_grad=True)
        optimizer = torch.optim.AdamW([w], lr=lr)
        w.sum().backward()
        optimizer.step()
    step(FLOAT32_MAX * (1 - 0.9))
    with pytest.raises(RuntimeError):
        step(FLOAT32_MAX * 0.2)


# ================================================================ environment faults (S47, S53)


def test_a_data_table_that_is_a_link_loop_is_one_refusal(tmp_path):
    """SPEC.md:1326 [S53] weekdays/train.json a link to itself (Python 3.11 resolves it with RuntimeError): one
    refusal naming the ref, not an internal error."""
    root = tmp_path / "data"
    shutil.copytree(fuzzing.DATA, root)
    table = root / "weekdays" / "train.json"
    table.unlink()
    os.symlink(table, table)
    line = _refusal(["validate", str(DOCUMENTS / "patching.json"), "--data-root", str(root)])
    assert line == (f"compile: steps.score.rows.base: dataset ref 'weekdays/train': cannot resolve {table} "
                    "(a symbolic link loop)"), line


def test_a_data_root_that_is_a_link_loop_is_one_refusal(tmp_path):
    """SPEC.md:1326 [S53] `--data-root` a link to itself: the same one refusal."""
    root = tmp_path / "loop"
    os.symlink(root, root)
    line = _refusal(["validate", str(DOCUMENTS / "patching.json"), "--data-root", str(root)])
    assert line.startswith("compile: steps.score.rows.base: dataset ref 'weekdays/train': cannot resolve "), line
    assert line.endswith("(a symbolic link loop)"), line


def test_a_memory_budget_of_400_digits_is_not_a_size(tmp_path):
    """SPEC.md:1267 [S47] 400 digits read as a float are infinite (no int): S47's refusal, before anything loads;
    SPEC.md:1111 [S76] the line shortens the 400 digits to their first 64 and says how many there were."""
    digits = "9" * 400
    line = _refusal(["validate", str(DOCUMENTS / "patching.json"), "--memory-budget", digits])
    assert line == (f"validation: --memory-budget: --memory-budget '{digits[:64]}…(400 chars)' is not a size; write a number of bytes, "
                    "or a number with KiB, MiB or GiB (the default is 1GiB)"), line


# ================================================================ a prompt too long to tokenize (S48)


class _Recording:
    """A tokenizer that records the longest text it was asked to tokenize (every other answer the real one's)."""

    def __init__(self, inner):
        self.__dict__["inner"], self.__dict__["longest"] = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def __call__(self, texts, *args, **kwargs):
        self.__dict__["longest"] = max([self.longest] + [len(t) for t in (texts if isinstance(texts, list) else [texts])])
        return self.inner(texts, *args, **kwargs)


def _one_role_probe(rows_ref: str) -> dict:
    raw = copy.deepcopy(PATCHING)
    raw["roles"] = {"base": {"field": "input"}}
    raw["interventions"] = {"probe": {"reads": {"logits": {"site": "head", "pos": -1, "input": "base"}},
                                      "metrics": {"p": {"kind": "token_prob", "of": "logits", "token": "cf_answer"}}}}
    raw["steps"] = {"score": {"kind": "observe", "rows": {"base": rows_ref}}}
    return raw


def _prompts(tmp_path: pathlib.Path, texts: list[str]) -> pathlib.Path:
    root = tmp_path / "data"
    (root / "long").mkdir(parents=True)
    rows = [{"input": t, "cf_answer": " a"} for t in texts]
    (root / "long" / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    return root


def test_a_prompt_of_megabytes_is_refused_before_the_tokenizer_sees_it(tmp_path, llama):
    """SPEC.md:1270 [S48] a 6 MB prompt (once ~200 s and GBs of tokenizing at 30 MB) is refused at compile as S45
    says, naming the row and its characters; the tokenizer never sees a text longer than 2048 x 16 characters
    (the Llama fixture's positions times its longest vocabulary entry)."""
    root = _prompts(tmp_path, ["short", "word " * 1_200_000])
    engine = Delegate(llama)
    engine.tokenizer = _Recording(llama.tokenizer)
    with pytest.raises(Refusal) as caught:
        compiler.compile_document(_one_role_probe("long/rows"), engine, root)
    assert (caught.value.path, caught.value.stage) == ("steps.score.rows.base", "compile")
    assert caught.value.message == ("role 'base': 1 prompt(s) longer than the model's 2048 positions (row 1: 6000000 "
                                    "characters; a token of this tokenizer spells at most 16 characters); shorten "
                                    "them to at most 2048 tokens or pick rows that fit")
    assert engine.tokenizer.longest <= 2048 * 16


def test_a_prompt_within_the_character_bound_is_tokenized_and_judged_by_its_tokens(tmp_path, llama):
    """SPEC.md:1270 [S48] the bound refuses only what must be too long: 4000 characters (over 2048, within 2048 x 16)
    are tokenized, and S45 judges the tokens (this one fits)."""
    root = _prompts(tmp_path, ["word " * 800])
    engine = Delegate(llama)
    engine.tokenizer = _Recording(llama.tokenizer)
    compiler.compile_document(_one_role_probe("long/rows"), engine, root)
    assert engine.tokenizer.longest == 4000


class _FakeBackend:
    def __init__(self, spec: dict):
        self.spec = spec

    def to_str(self) -> str:
        return json.dumps(self.spec)


class _FakeTokenizer:
    def __init__(self, spec: dict):
        self.backend_tokenizer = _FakeBackend(spec)

    def get_vocab(self) -> dict:
        return {"a": 0, "abcd": 1}


BPE = {"type": "BPE", "fuse_unk": False, "byte_fallback": False}


@pytest.mark.parametrize("spec, per", [
    ({"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": BPE}, 4),
    ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {
        "type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}, "pre_tokenizer": None, "model": BPE}, 4),
    ({"normalizer": {"type": "NFKC"}, "pre_tokenizer": None, "model": BPE}, None),
    ({"normalizer": {"type": "Replace", "pattern": {"String": "  "}, "content": " "}, "pre_tokenizer": None,
      "model": BPE}, None),
    ({"normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "model": BPE}, None),
    ({"normalizer": None, "pre_tokenizer": {"type": "Split", "behavior": "Removed"}, "model": BPE}, None),
    ({"normalizer": None, "pre_tokenizer": None, "model": {"type": "WordPiece"}}, None),
    ({"normalizer": None, "pre_tokenizer": None, "model": dict(BPE, fuse_unk=True)}, None),
])
def test_the_character_bound_is_taken_only_where_no_character_is_dropped(spec, per):
    """SPEC.md:1270 [S48] L is the longest entry when every part keeps every character; NFKC, a shrinking Replace,
    whitespace splitting, a removing Split, WordPiece and a fused unknown have no bound (None: tokenized whole)."""
    assert data.characters_per_token(_FakeTokenizer(spec)) == per

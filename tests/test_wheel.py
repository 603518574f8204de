"""The installed package works anywhere (SPEC.md C31): a built wheel in a fresh venv runs docs/conformance.md's
commands from an empty folder, and nothing it runs reads the repository tree.

Marked `wheel` (`pytest -m wheel` runs these alone); with the fixture cache built, about ten seconds."""
from __future__ import annotations

import os
import re
import shlex
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "llama-2" / "tokenizer.model"
CASE = "refuse_per_layer_without_layer"


def _readme_commands() -> list[str]:
    """The shell commands of docs/conformance.md's block for running the corpus, comments dropped."""
    text = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    section = text[text.index("## Running the corpus"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def _outer_site_dirs() -> list[str]:
    """The site-packages of the interpreter running the tests, when it is a venv: a venv made from it with
    --system-site-packages sees its base interpreter's packages, not these (where .ci/setup put the stack)."""
    if sys.prefix == sys.base_prefix:
        return []
    return [d for d in dict.fromkeys(site.getsitepackages() + [sysconfig.get_path("purelib"),
                                                                 sysconfig.get_path("platlib")]) if os.path.isdir(d)]


def _without_pythonpath() -> dict:
    """This environment but $PYTHONPATH, which would put a checkout's causalab_ref before the venv's."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with the wheel built from this checkout, reusing the stack of the interpreter running the
    tests (its own site-packages first when that is a venv, then its base's), never resolving one of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next((tmp / "dist").glob("causalab_ref-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "venv")], check=True,
                   timeout=300)
    inner = subprocess.run([str(tmp / "venv" / "bin" / "python"), "-c", "import sysconfig; "
                            "print(sysconfig.get_path('purelib'))"], check=True, capture_output=True, text=True)
    # plain path lines: the outer packages are importable, its .pth files (an editable causalab_ref) are not run
    (Path(inner.stdout.strip()) / "outer_env.pth").write_text("".join(d + "\n" for d in _outer_site_dirs()))
    subprocess.run([str(tmp / "venv" / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=600, env=_without_pythonpath())  # else a checkout satisfies it
    return tmp / "venv", wheel


def _shell(venv: Path, cwd: Path, command: str, env: dict) -> subprocess.CompletedProcess:
    path = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return subprocess.run(command, shell=True, cwd=cwd, env={**env, "PATH": path}, capture_output=True, text=True,
                          timeout=900)


def test_the_wheel_carries_the_corpus_and_imports_from_the_venv(venv):
    """SPEC.md:945 [C31] the installed package is the wheel's, and the corpus and fixture data are inside it."""
    bin_python = venv[0] / "bin" / "python"
    probe = ("import causalab_ref, pathlib; from causalab_ref.conformance import conform; "
             "print(causalab_ref.__file__); print(len(conform.load_cases(conform.CASES)))")
    out = subprocess.run([str(bin_python), "-c", probe], cwd="/", capture_output=True, text=True, check=True,
                         env=_without_pythonpath())  # the venv's, not a checkout's
    where, cases = out.stdout.split()
    assert where.startswith(str(venv[0])) and int(cases) >= 140


def test_the_wheels_venv_runs_on_the_stack_the_tests_run_on(venv):
    """SPEC.md:945 [C31] the venv imports torch and transformers from where this interpreter does (in a venv of
    .ci/setup's, that venv's, not its base interpreter's), so the wheel is checked on the tested stack."""
    probe = "import torch, transformers; print(torch.__file__); print(transformers.__file__)"
    ours = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    theirs = subprocess.run([str(venv[0] / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                            check=True, cwd="/")
    assert theirs.stdout == ours.stdout


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="needs ../shared's Llama-2 tokenizer.model")
def test_readmes_conformance_commands_work_verbatim_from_an_empty_folder(venv, tmp_path):
    """SPEC.md:945 [C31] docs/conformance.md's commands, as written (the wheel's path and the tokenizer's filled
    in, `mycli` a missing program and then the installed causalab-ref, one case selected to keep it short): the export
    writes the manifest, the missing `mycli` is one usage line (exit 2, C20; no internal error), and the
    installed causalab-ref passes it (exit 0). Nothing is read from the checkout: the run's folder is empty."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = _without_pythonpath()
    commands = _readme_commands()
    assert [c.split()[0] for c in commands] == ["pip", "export", "causalab-ref", "causalab-ref"]
    install, export, fixtures, conform = commands
    assert _shell(venv[0], empty, install.replace("causalab_ref-0.1.0-py3-none-any.whl", shlex.quote(
        str(venv[1]))) + " --no-deps -q", env).returncode == 0
    env["CAUSALAB_REF_LLAMA_TOKENIZER"] = str(TOKENIZER)
    assert export.startswith("export CAUSALAB_REF_LLAMA_TOKENIZER=")
    done = _shell(venv[0], empty, fixtures, env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (empty / "fixtures" / "manifest.json").is_file()
    missing = _shell(venv[0], empty, f"{conform} --only {CASE}", env)
    assert missing.returncode == 2 and "internal error" not in missing.stderr + missing.stdout  # C20: usage
    assert missing.stderr.strip().splitlines() == ["usage: conform: --impl 'mycli': no program 'mycli' (not an "
                                                   "executable file, nor on $PATH)"]
    ours = _shell(venv[0], empty, conform.replace('"mycli"', '"causalab-ref"') + f" --only {CASE}", env)
    assert ours.returncode == 0, ours.stdout[-2000:] + ours.stderr[-2000:]
    assert "1 passed, 0 failed" in ours.stdout
    assert sorted(p.name for p in empty.iterdir()) == ["fixtures"]

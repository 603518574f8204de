"""The installed package works anywhere (SPEC.md C31): a built wheel in a fresh venv runs README's Conformance
commands from an empty folder, and nothing it runs reads the repository tree.

Marked `wheel` (`pytest -m wheel` runs these alone); with the fixture cache built, about ten seconds."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "llama-2" / "tokenizer.model"
CASE = "refuse_per_layer_without_layer"


def _readme_commands() -> list[str]:
    """The shell commands of README's Conformance block, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Conformance"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv (reusing this machine's torch and friends) with the wheel built from this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next((tmp / "dist").glob("causalab_ref-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "venv")], check=True,
                   timeout=300)
    subprocess.run([str(tmp / "venv" / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=600)
    return tmp / "venv", wheel


def _shell(venv: Path, cwd: Path, command: str, env: dict) -> subprocess.CompletedProcess:
    path = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return subprocess.run(command, shell=True, cwd=cwd, env={**env, "PATH": path}, capture_output=True, text=True,
                          timeout=900)


def test_the_wheel_carries_the_corpus_and_imports_from_the_venv(venv):
    """SPEC.md:916 [C31] the installed package is the wheel's, and the corpus and fixture data are inside it."""
    bin_python = venv[0] / "bin" / "python"
    probe = ("import causalab_ref, pathlib; from causalab_ref.conformance import conform; "
             "print(causalab_ref.__file__); print(len(conform.load_cases(conform.CASES)))")
    out = subprocess.run([str(bin_python), "-c", probe], cwd="/", capture_output=True, text=True, check=True)
    where, cases = out.stdout.split()
    assert where.startswith(str(venv[0])) and int(cases) >= 140


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="needs ../shared's Llama-2 tokenizer.model")
def test_readmes_conformance_commands_work_verbatim_from_an_empty_folder(venv, tmp_path):
    """SPEC.md:916 [C31] README's commands, as written (the wheel's path and the tokenizer's filled in, `mycli`
    a missing program and then the installed causalab-ref, one case selected to keep it short): the export
    writes the manifest, the missing `mycli` is one usage line (exit 2, C20; no internal error), and the
    installed causalab-ref passes it (exit 0). Nothing is read from the checkout: the run's folder is empty."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
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

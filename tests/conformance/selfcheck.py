"""Black-box self-check: the corpus against `python -m causalab_ref` as a stranger would run it.

From an empty temporary directory holding only the exported fixture folders (`fixtures export`)
and a copy of the corpus (the cases, their data tables, the files they name and the case schema), it runs

    python -m causalab_ref conform --impl "python -m causalab_ref" --fixtures fixtures --cases corpus

with the fixture cache pointed under a plain file, so no fixture can be built and every checkpoint
comes from the exported folders through $CONFORM_CHECKPOINTS (SPEC.md C17). Usage, from anywhere:

    python tests/conformance/selfcheck.py [--only NAME[,NAME...]] [--jobs N]

Slow (a subprocess per call): minutes, with the cases run --jobs at a time (conform's default: the core
count; SPEC.md C33). Exits with conform's status.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE_PARENT = Path(__file__).resolve().parents[2]
CORPUS = PACKAGE_PARENT / "causalab_ref" / "conformance" / "corpus"


def copy_corpus(target: Path) -> None:
    target.mkdir(parents=True)
    for file in sorted(CORPUS.glob("*.json")):
        shutil.copyfile(file, target / file.name)
    shutil.copytree(CORPUS / "data", target / "data")
    shutil.copytree(CORPUS / "files", target / "files")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None)
    parser.add_argument("--jobs", default=None, help="cases at once (default: conform's, the core count)")
    args = parser.parse_args(argv)
    python = [sys.executable, "-m", "causalab_ref"]
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT))
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        root = Path(tmp)
        exported = subprocess.run(python + ["fixtures", "export", str(root / "fixtures")], env=env,
                                  capture_output=True, text=True)
        if exported.returncode != 0:
            print(exported.stderr, file=sys.stderr)
            return exported.returncode
        copy_corpus(root / "corpus")
        (root / "no-cache").write_text("the fixture cache is a file here, so nothing can be built\n")
        env["CAUSALAB_REF_CACHE"] = str(root / "no-cache" / "fixtures")
        env.pop("CAUSALAB_REF_LLAMA_TOKENIZER", None)
        command = python + ["conform", "--impl", f"{sys.executable} -m causalab_ref", "--fixtures", "fixtures",
                            "--cases", "corpus", "--quiet"] + (["--only", args.only] if args.only else []) + (
                       ["--jobs", args.jobs] if args.jobs else [])
        done = subprocess.run(command, cwd=root, env=env)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())

"""`python -m causalab_ref` is the command line (cli.py)."""
import sys

from .cli import main

sys.exit(main())

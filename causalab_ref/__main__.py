"""`python -m causalab_ref` is the command line (cli.py)."""
import signal

signal.signal(signal.SIGINT, signal.SIG_DFL)  # until main installs its own: an early interrupt ends it, silently (S77)

from .cli import command_line  # noqa: E402

command_line()

"""Usage errors of `llmframe-ray` print click's usage message and exit 2, without a traceback
(typer bundles its own copy of click, whose exceptions are not click's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus"], "Error: No such command 'bogus'."),
        (["ingest"], "Error: Missing option '--index'."),
        (["search", "--index", "somewhere"], "Error: Missing argument 'query'."),
        (["serve", "--index", "somewhere", "--port", "abc"], "Error: Invalid value for '--port': "),
        (["serve", "--index", "somewhere", "--port", "70000"], "Error: Invalid value for '--port': "),
    ],
)
def test_usage_errors_print_usage_not_a_traceback(args, message):
    program = Path(sys.executable).with_name("llmframe-ray")  # the installed command, as users run it
    done = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr
    assert f"Usage: llmframe-ray {args[0] if args[0] != 'bogus' else ''}".rstrip() in done.stderr
    assert "Traceback" not in done.stderr

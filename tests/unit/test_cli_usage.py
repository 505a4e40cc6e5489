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


@pytest.mark.parametrize("command", [["index", "build", "SOURCE", "--index", "FILE"], ["index", "info", "FILE"], ["search", "q", "--index", "FILE"]])
def test_a_file_given_as_the_index_folder_is_named(tmp_path, command):
    (tmp_path / "doc.txt").write_text("Some text.\n")
    (tmp_path / "file").write_text("not an index\n")
    args = [str(tmp_path / "doc.txt") if a == "SOURCE" else str(tmp_path / "file") if a == "FILE" else a for a in command]
    program = Path(sys.executable).with_name("llmframe-ray")
    done = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().endswith(f"error: {tmp_path / 'file'} is a file, not an index folder; give a folder (new or holding an index)")
    assert (tmp_path / "file").read_text() == "not an index\n"  # untouched

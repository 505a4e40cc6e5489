"""Ctrl-C during `llmframe-ray ingest`: exit 130, a line saying what the index serves, the previous
version still served, and no Ray process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from llmframe_ray.index.versions import IndexDirectory
from tests.conftest import cli_env
from tests.serving import session_leftovers

BIN = Path(sys.executable).parent


def test_ctrl_c_during_ingest_keeps_the_served_version(tmp_path, model_dir):
    env = cli_env(tmp_path / "home", model_dir, LLMFRAME_NUM_THREADS="1")
    docs, index = tmp_path / "docs", tmp_path / "index"
    docs.mkdir()
    (docs / "first.txt").write_text("Tides follow the Moon.\n")
    command = [str(BIN / "llmframe-ray"), "ingest", str(docs), "--index", str(index)]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    served = IndexDirectory(index).current_version()
    assert served is not None
    for i in range(60):  # enough to embed that the job is still running when Ctrl-C comes
        (docs / f"more-{i}.txt").write_text(" ".join(f"Paragraph {i} sentence {j} about sourdough and tides." for j in range(40)) + "\n")
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    try:
        for line in job.stdout:
            seen.append(line)
            if line.startswith("plan: 60 added"):  # read and planned; embedding starts
                os.killpg(job.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
                break
        output = "".join(seen) + job.stdout.read()
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert code == 130, output[-3000:]
    assert f"interrupted: nothing was published; {index} still serves {served}" in output, output[-3000:]
    assert IndexDirectory(index).current_version() == served
    left = session_leftovers(job.pid)
    assert left == [], "processes left behind:\n" + "\n".join(left)

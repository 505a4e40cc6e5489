"""The app started the ways users start it: `serve run deployments/local.yaml` (the file itself,
pointed at a test index and port) and `llmframe-ray serve`; each answers over HTTP and stops
cleanly on SIGTERM, leaving no process behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.types import Document
from tests.serving import free_port, session_leftovers

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KEY = "serve-run-key"
DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
    Document("part", title="Inventory", text="Part ZQ7731 sits on shelf 14 next to the loading dock."),
    Document("lava", title="Volcanoes", text="Basaltic lava flows erupt from shield volcanoes such as Mauna Loa."),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory, model_dir) -> Path:
    root = tmp_path_factory.mktemp("served") / "index"
    build_index(DOCS, root, load_settings().params().index, OnnxEmbedder(model_dir, threads=2), shards=2)
    return root


def serve_and_stop(command: list[str], url: str, log_path: Path) -> int:
    """Start `command` in its own session, check it answers, SIGTERM it; return its exit code."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    ray_tmp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit in 107 bytes
    env.update({"API_SECRET_KEY": KEY, "RAY_TMPDIR": ray_tmp})
    log = log_path.open("wb")
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the app was not ready in 240 s"
            time.sleep(1)
        response = httpx.post(f"{url}/v1/search", headers={"X-API-Key": KEY}, json={"query": "ZQ7731", "top_k": 2}, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["hits"][0]["doc_id"] == "part"
        assert httpx.post(f"{url}/v1/search", json={"query": "ZQ7731"}, timeout=60).status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail("the app did not exit within 90 s of SIGTERM")
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    leftovers = session_leftovers(process.pid)
    if leftovers:
        os.killpg(process.pid, signal.SIGKILL)
    assert leftovers == [], "processes left behind:\n" + "\n".join(leftovers)
    return code


def test_serve_run_local_yaml_starts_and_answers(tmp_path, index):
    config = yaml.safe_load((REPO / "deployments" / "local.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    config["applications"][0]["args"]["index_dir"] = str(index)
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(config))
    serve_and_stop([str(BIN / "serve"), "run", str(path)], f"http://127.0.0.1:{port}", tmp_path / "serve.log")


def test_llmframe_serve_command_answers_and_exits_zero(tmp_path, index):
    port = free_port()
    command = [str(BIN / "llmframe-ray"), "serve", "--index", str(index), "--port", str(port), "--no-reranker"]
    code = serve_and_stop(command, f"http://127.0.0.1:{port}", tmp_path / "cli.log")
    log = (tmp_path / "cli.log").read_text()
    assert code == 0, log[-3000:]
    # the Ingress replicas no longer hold Serve's 30 s drain for an external load balancer, which
    # ran every stop into the controller's own 30 s shutdown limit
    assert "Controller failed to shut down" not in log, log[-3000:]

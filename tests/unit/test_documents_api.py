"""Documents over HTTP without Ray: the routes queue writes durably (index/inbox.py), the writer's
batch logic turns them into one ingestion run and reports per document (batch/writes.py, with a
stand-in for the Ray job), and every route keeps tenants apart (api/tenants.py)."""

import json

import pytest
from fastapi.testclient import TestClient

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.documents import DocumentLimits, DocumentsApi
from llmframe_ray.api.http import create_app
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.service import RagService
from llmframe_ray.batch.plan import Plan
from llmframe_ray.batch.report import IngestResult, Skipped
from llmframe_ray.batch.writes import apply_queued
from llmframe_ray.config import load_settings
from llmframe_ray.index.metadata import internal_id
from llmframe_ray.index.versions import IndexBusyError, IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.index.inbox import QUEUED, RUNNING, Inbox, Upload, final_writes, safe_name
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.types import Document
from tests.fakes.pdf import pdf_bytes

ADMIN = "admin-key-0123456789"
ACME, BOLT = "acme-key-0123456789", "bolt-key-0123456789"
TENANTS = {ACME: ["acme"], BOLT: ["bolt", "shared"]}


def texts(prefix):
    return [
        ("tides", "Tides", f"{prefix} ocean tides are driven by the gravitational pull of the Moon."),
        ("lunar", "Lunar phases", f"{prefix} the Moon's phases follow its orbit around the Earth."),
        ("bikes", "Cycling", f"{prefix} commuting by bicycle improves health and cuts traffic."),
        ("bread", "Sourdough", f"{prefix} a sourdough starter is a culture of wild yeast."),
    ]


ACME_DOCS = [Document(internal_id("acme", d), t, title=title, metadata={"team": "a", "n": i}) for i, (d, title, t) in enumerate(texts("Acme:"))]
BOLT_DOCS = [  # the same ids, other texts (and one more document)
    Document(internal_id("bolt", d), t + " Bolt keeps notes on moons and tides too.", title=title) for d, title, t in texts("Bolt:")
] + [Document(internal_id("bolt", "only-bolt"), "Bolt's own memo about lunar tides and the Moon.", title="Memo")]


def app_for(index_dir, settings, embedder, limits=DocumentLimits()):
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), None)
    keys = ApiKeys.from_settings(settings)
    return create_app(RagService(stages, settings.params().service), keys, DocumentsApi(index_dir, limits))


@pytest.fixture(scope="module")
def settings():
    return load_settings(api_secret_key=ADMIN, key_namespaces=json.dumps(TENANTS), fusion_depth=10, chunk_size=64, chunk_overlap=8)


@pytest.fixture(scope="module")
def both(tmp_path_factory, settings, embedder):
    root = tmp_path_factory.mktemp("tenants") / "index"
    build_index(ACME_DOCS + BOLT_DOCS, root, settings.params().index, embedder, shards=2)
    return root


@pytest.fixture()
def client(both, settings, embedder):
    with TestClient(app_for(both, settings, embedder)) as test_client:
        yield test_client


def search(client, key, **body):
    response = client.post("/v1/search", headers={"X-API-Key": key}, json={"top_k": 10, **body})
    return response


def test_a_tenant_sees_only_its_namespace_and_its_own_ids(client):
    hits = search(client, ACME, query="moon tides").json()["hits"]
    assert {h["doc_id"] for h in hits} == {"tides", "lunar", "bikes", "bread"}
    assert all(h["text"].startswith("Acme:") and h["chunk_id"].startswith(h["doc_id"] + "#") for h in hits)
    bolt = search(client, BOLT, query="moon tides").json()["hits"]
    assert "only-bolt" in {h["doc_id"] for h in bolt} and all("Bolt" in h["text"] for h in bolt)
    # an admin key names any namespace; a tenant key gets 404 for one it is not bound to,
    # the same answer as for a namespace that does not exist
    assert {h["doc_id"] for h in search(client, ADMIN, query="memo", namespace="bolt").json()["hits"]} >= {"only-bolt"}
    for name in ("bolt", "nowhere"):
        refused = search(client, ACME, query="moon", namespace=name)
        assert refused.status_code == 404
        assert refused.json()["error"] == {"type": "namespace_not_found", "message": f"namespace {name!r} not found", "field": None}
    empty = search(client, BOLT, query="moon", namespace="shared")  # bound, but holds nothing yet
    assert empty.status_code == 200 and empty.json()["hits"] == []
    # the default namespace holds nothing here; the admin key's default is it
    assert search(client, ADMIN, query="moon").json()["hits"] == []


def test_rankings_of_a_tenant_do_not_depend_on_another_tenants_documents(client, tmp_path, settings, embedder):
    alone = tmp_path / "alone"
    build_index(ACME_DOCS, alone, settings.params().index, embedder, shards=2)
    with TestClient(app_for(alone, settings, embedder)) as only_acme:
        for mode in ("bm25", "dense", "hybrid"):
            for query in ("moon tides", "bicycle traffic", "wild yeast starter"):
                with_bolt = search(client, ACME, query=query, mode=mode).json()["hits"]
                without = search(only_acme, ACME, query=query, mode=mode).json()["hits"]
                assert with_bolt == without, (mode, query)


def test_filters_over_http(client):
    hits = search(client, ACME, query="moon", filter={"n": {"gte": 1, "lt": 3}}).json()["hits"]
    assert sorted(h["doc_id"] for h in hits) == ["bikes", "lunar"]
    assert all(h["metadata"]["team"] == "a" for h in hits)
    bad = search(client, ACME, query="moon", filter={"n": {"near": 2}})
    assert bad.status_code == 422
    assert bad.json()["error"] == {
        "type": "invalid_request", "field": "filter",
        "message": "filter: unknown filter operator(s) 'near' for field 'n'; known: eq, ne, in, nin, gt, gte, lt, lte, exists",
    }


def test_writes_are_queued_durably_and_answered_202(client, both):
    body = {"documents": [
        {"id": "new-1", "title": "Comets", "text": "Comets have icy nuclei.", "metadata": {"tags": ["space"], "year": 2024}},
        {"id": "new-2", "text": "Asteroids are rocky."},
    ]}
    response = client.post("/v1/documents", headers={"X-API-Key": ACME}, json=body)
    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["status"], job["documents"], job["namespace"]) == ("queued", 2, "acme")
    assert job["status_url"] == f"/v1/jobs/{job['job_id']}"
    again = Inbox(both)  # what a restarted server finds
    record = again.job(job["job_id"])
    assert record["status"] == QUEUED and [d["id"] for d in record["documents"]] == ["new-1", "new-2"]
    lines = (again.payload(record) / "docs.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"id": "new-1", "title": "Comets", "text": "Comets have icy nuclei.", "metadata": {"tags": ["space"], "year": 2024}}
    assert client.get(job["status_url"], headers={"X-API-Key": ACME}).json()["status"] == "queued"
    # another tenant cannot see the job, nor the document it is writing
    assert client.get(job["status_url"], headers={"X-API-Key": BOLT}).status_code == 404
    pending = client.get("/v1/documents/new-1", headers={"X-API-Key": ACME}).json()
    assert pending["pending_jobs"] == [job["job_id"]] and pending["versions"] == []
    assert client.get("/v1/documents/new-1", headers={"X-API-Key": BOLT}).json()["error"]["type"] == "document_not_found"


def test_uploads_keep_their_bytes_and_names_inside_the_inbox(client, both):
    files = [
        ("file", ("../../escape/report.pdf", pdf_bytes(["Pangolins have scales."]), "application/pdf")),
        ("file", ("notes.md", b"# Notes\n\nAxolotls regenerate.", "text/markdown")),
    ]
    response = client.post("/v1/documents", headers={"X-API-Key": BOLT}, files=files,
                           data={"metadata": json.dumps({"source": "upload"}), "ids": json.dumps(["r1", "n1"])})
    assert response.status_code == 202, response.text
    record = Inbox(both).job(response.json()["job_id"])
    assert record["namespace"] == "bolt" and [f["id"] for f in record["files"]] == ["r1", "n1"]
    stored = Inbox(both).payload(record) / record["files"][0]["file"]
    assert stored.name == "report.pdf" and stored.read_bytes().startswith(b"%PDF")
    assert Inbox(both).payload(record) in stored.parents
    assert record["files"][1]["metadata"] == {"source": "upload"}


@pytest.mark.parametrize("files, data, field, message", [
    ([("file", ("x.exe", b"MZ", "application/octet-stream"))], {}, "file",
     "file: 'x.exe': unsupported file type '.exe'; supported: .txt, .md, .markdown, .html, .htm, .pdf"),
    ([("file", ("a.txt", b"a", "text/plain"))], {"metadata": "[1]"}, "metadata", "metadata: must be a JSON object"),
    ([("file", ("a.txt", b"a", "text/plain"))], {"metadata": '{"n": {"x": 1}}'}, "metadata",
     "metadata: metadata['n'] must be a string, a finite number, a boolean or a list of strings, got {'x': 1}"),
    ([("file", ("a.txt", b"a", "text/plain")), ("file", ("b.txt", b"b", "text/plain"))], {"ids": '["same", "same"]'},
     "documents.1.id", "documents.1.id: document id 'same' occurs more than once in this request"),
])
def test_bad_uploads_are_refused_with_the_reason(client, files, data, field, message):
    response = client.post("/v1/documents", headers={"X-API-Key": ACME}, files=files, data=data)
    assert response.status_code == 422
    assert response.json()["error"] == {"type": "invalid_request", "message": message, "field": field}


def test_bad_json_documents_are_refused(client):
    response = client.post("/v1/documents", headers={"X-API-Key": ACME}, json={"documents": [{"id": "x", "text": "t", "metadata": {"n": [1]}}]})
    assert response.status_code == 422 and response.json()["error"]["field"] == "documents.0.metadata"
    assert "metadata['n'] must be a string" in response.json()["error"]["message"]
    response = client.post("/v1/documents", headers={"X-API-Key": ACME}, json={"documents": []})
    assert response.status_code == 422 and response.json()["error"]["field"] == "documents"


def test_limits_name_the_setting(both, settings, embedder):
    limits = DocumentLimits(upload_max_bytes=4096, max_per_request=2, max_queued_bytes=300)
    with TestClient(app_for(both, settings, embedder, limits)) as small:
        docs = [{"id": str(i), "text": "t"} for i in range(3)]
        many = small.post("/v1/documents", headers={"X-API-Key": ACME}, json={"documents": docs})
        assert many.status_code == 413
        assert many.json()["error"]["message"] == "3 documents in one request; the limit is 2 (LLMFRAME_DOCUMENTS_MAX_PER_REQUEST)"
        big = small.post("/v1/documents", headers={"X-API-Key": ACME}, json={"documents": [{"id": "a", "text": "x" * 5000}]})
        assert big.status_code == 413 and "(LLMFRAME_UPLOAD_MAX_BYTES)" in big.json()["error"]["message"]
        queued = Inbox(both).queued_bytes()
        full = small.post("/v1/documents", headers={"X-API-Key": ACME}, json={"documents": [{"id": "a", "text": "x" * 400}]})
        assert full.status_code == 429 and full.headers["Retry-After"] == "5"
        assert f"{queued} bytes of writes are waiting" in full.json()["error"]["message"]
        assert "LLMFRAME_DOCUMENTS_MAX_QUEUED_BYTES" in full.json()["error"]["message"]


def test_documents_and_deletes_across_tenants(client):
    found = client.get("/v1/documents/tides", headers={"X-API-Key": ACME}).json()
    assert found["namespace"] == "acme" and found["metadata"] == {"team": "a", "n": 0}
    assert found["chunks"][0]["text"].startswith("Acme:") and found["chunks"][0]["chunk_id"].startswith("tides#")
    assert found["versions"] == [found["current_version"]] and found["current"] is True
    bolt = client.get("/v1/documents/tides", headers={"X-API-Key": BOLT}).json()
    assert bolt["chunks"][0]["text"].startswith("Bolt:")
    for key, doc in ((ACME, "only-bolt"), (BOLT, "nothing-here")):
        missing = client.get(f"/v1/documents/{doc}", headers={"X-API-Key": key})
        assert missing.status_code == 404
        assert missing.json()["error"] == {"type": "document_not_found", "message": f"document {doc!r} not found", "field": None}
        deleted = client.delete(f"/v1/documents/{doc}", headers={"X-API-Key": key})
        assert deleted.status_code == 404 and deleted.json()["error"]["type"] == "document_not_found"
    accepted = client.delete("/v1/documents/tides", headers={"X-API-Key": ACME})
    assert accepted.status_code == 202 and accepted.json()["report"] == [{"id": "tides", "op": "delete", "status": "queued"}]
    many = client.post("/v1/documents/delete", headers={"X-API-Key": BOLT}, json={"ids": ["tides", "only-bolt"]})
    assert many.status_code == 202 and many.json()["namespace"] == "bolt"


class FakeRun:
    """Stands in for the Ray ingestion job: records what it was given, answers a set result."""

    def __init__(self, result=None, error=None):
        self.result, self.error, self.calls = result, error, []

    def __call__(self, files, deletes):
        self.calls.append(([(f.path, f.doc_id, f.namespace, dict(f.metadata)) for f in files], list(deletes)))
        for f in files:  # the payload exists while the run reads it
            assert open(f.path, "rb").read()
        if self.error is not None:
            raise self.error
        return self.result


def plan(deleted=(), not_found=()):
    return Plan(1, (), (), (), (), tuple(deleted), tuple(not_found))


def test_the_writer_applies_a_batch_with_the_last_write_winning(tmp_path):
    inbox = Inbox(tmp_path)
    first = inbox.submit("acme", documents=[{"id": "a", "text": "one"}, {"id": "b", "text": "two"}])
    upload = inbox.submit("acme", uploads=[Upload("c", "c.pdf", b"%PDF-broken", {"k": "v"}), Upload("d", "d.md", b"# D", {})])
    second = inbox.submit("acme", documents=[{"id": "a", "text": "one, again"}])
    gone = inbox.submit("bolt", deletes=["a", "zz"])
    final = final_writes(inbox, list(inbox.jobs()))
    assert final[internal_id("acme", "a")] == (second["job_id"], {"op": "json", "record": {"id": "a", "title": "", "text": "one, again", "metadata": {}}})
    assert final[internal_id("bolt", "a")] == (gone["job_id"], {"op": "delete"})

    c_path = str(inbox.payload(upload) / "000000" / "c.pdf")
    result = IngestResult(tmp_path, "v2", plan(deleted=[internal_id("bolt", "a")], not_found=[internal_id("bolt", "zz")]),
                          skipped=[Skipped(c_path, 0, "corrupt PDF: EOF marker not found")])
    run = FakeRun(result)
    done = {r["job_id"]: r for r in apply_queued(inbox, tmp_path, run, log=lambda _: None)}
    (files, deletes), = run.calls
    assert sorted(deletes) == sorted([internal_id("bolt", "a"), internal_id("bolt", "zz")])
    jsonl = [f for f in files if f[0].endswith(".jsonl")]
    assert [(ns, doc) for _, doc, ns, _ in jsonl] == [("acme", "")]
    assert {(doc, ns) for path, doc, ns, _ in files if not path.endswith(".jsonl")} == {("c", "acme"), ("d", "acme")}
    assert done[first["job_id"]]["report"] == [
        {"id": "a", "op": "upsert", "status": "superseded", "by": second["job_id"]},
        {"id": "b", "op": "upsert", "status": "published"},
    ]
    assert done[upload["job_id"]]["report"][0] == {"id": "c", "op": "upsert", "status": "failed", "error": "corrupt PDF: EOF marker not found"}
    assert done[upload["job_id"]]["status"] == "published" and done[upload["job_id"]]["version"] == "v2"
    assert [r["status"] for r in done[gone["job_id"]]["report"]] == ["deleted", "not_found"]
    assert all(not inbox.payload(r).exists() for r in done.values())  # payloads go once applied
    assert list(inbox.jobs(QUEUED)) == [] and Inbox(tmp_path).job(first["job_id"])["status"] == "published"


def test_a_busy_index_keeps_the_writes_queued_and_a_failed_run_fails_them(tmp_path):
    inbox = Inbox(tmp_path)
    job = inbox.submit("acme", documents=[{"id": "a", "text": "one"}])
    kept = apply_queued(inbox, tmp_path, FakeRun(error=IndexBusyError("another process is writing")), log=lambda _: None)
    assert [r["status"] for r in kept] == ["queued"] and inbox.payload(job).exists()
    failed = apply_queued(inbox, tmp_path, FakeRun(error=RuntimeError("disk full")), log=lambda _: None)
    assert failed[0]["status"] == "failed" and failed[0]["error"] == "RuntimeError: disk full"
    assert apply_queued(inbox, tmp_path, FakeRun(), log=lambda _: None) == []  # nothing queued


def test_a_job_a_dead_writer_left_running_is_queued_again(tmp_path):
    inbox = Inbox(tmp_path)
    job = inbox.mark(inbox.submit("acme", deletes=["x"]), RUNNING)
    assert Inbox(tmp_path).recover() == [job["job_id"]]
    assert Inbox(tmp_path).job(job["job_id"])["status"] == QUEUED


def test_safe_names():
    assert safe_name("../../etc/passwd") == "passwd"
    assert safe_name("C:\\docs\\Report Q1?.PDF") == "Report Q1_.pdf"
    assert safe_name(".hidden.md") == "hidden.md"
    assert safe_name("") == "upload"


def test_the_index_route_tells_a_tenant_nothing_of_the_others(client):
    full = client.get("/v1/index", headers={"X-API-Key": ADMIN}).json()
    assert len(full["shard_manifests"]) == 2 and "index" in full
    view = client.get("/v1/index", headers={"X-API-Key": ACME}).json()
    assert view == {"version": full["version"], "shards": 2, "problem": None}


def test_every_write_and_answer_route_refuses_another_tenants_namespace_as_unknown(client):
    expected = {"type": "namespace_not_found", "message": "namespace 'bolt' not found", "field": None}
    calls = [
        ("post", "/v1/query", {"json": {"question": "moon?", "namespace": "bolt"}}),
        ("post", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "moon?"}], "namespace": "bolt"}}),
        ("post", "/v1/documents", {"json": {"documents": [{"id": "x", "text": "t"}], "namespace": "bolt"}}),
        ("post", "/v1/documents", {"files": [("file", ("a.txt", b"a", "text/plain"))], "data": {"namespace": "bolt"}}),
        ("post", "/v1/documents/delete", {"json": {"ids": ["tides"], "namespace": "bolt"}}),
        ("get", "/v1/documents/tides?namespace=bolt", {}),
        ("delete", "/v1/documents/tides?namespace=bolt", {}),
    ]
    for method, path, kwargs in calls:
        response = getattr(client, method)(path, headers={"X-API-Key": ACME}, **kwargs)
        assert (response.status_code, response.json()["error"]) == (404, expected), path


def test_document_text_keeps_control_characters_but_not_surrogates(client, both):
    kept = client.post("/v1/documents", headers={"X-API-Key": ACME}, json={"documents": [{"id": "c1", "text": "mdr\u0096like genes"}]})
    assert kept.status_code == 202
    record = Inbox(both).job(kept.json()["job_id"])
    assert json.loads((Inbox(both).payload(record) / "docs.jsonl").read_text())["text"] == "mdr\u0096like genes"
    refused = client.post("/v1/documents", headers={"X-API-Key": ACME, "Content-Type": "application/json"},
                          content=b'{"documents": [{"id": "s", "text": "half \\ud800 pair"}]}')
    assert refused.status_code == 422
    assert refused.json()["error"]["message"] == (
        "documents.0.text: Input should be a valid string, unable to parse raw data as a unicode string"
    )

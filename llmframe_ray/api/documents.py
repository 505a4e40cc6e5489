"""Document routes: writes queued durably for the ingestion job, reads from the index on disk.

    POST   /v1/documents            JSON {documents: [{id, title?, text, metadata?}], namespace?}
                                    or multipart/form-data: `file` parts (txt, md, html, pdf),
                                    optional `ids` / `titles` (JSON lists, in the files' order),
                                    `metadata` (JSON object for every file), `namespace`
                                    -> 202 {job_id, status, documents, namespace, status_url}
    POST   /v1/documents/delete     {ids: [...], namespace?} -> 202 (unknown ids: `not_found` in
                                    the job's report)
    DELETE /v1/documents/{id}       -> 202, or 404 when the namespace holds no such document
    GET    /v1/documents/{id}       chunks, metadata, the versions that hold it, pending jobs
    GET    /v1/jobs/{job_id}        queued / running / published (version) / failed, per document

Every route works in the caller's namespace (api/tenants.py): another tenant's document or job
is answered exactly like one that does not exist. A write is on disk before its 202
(index/inbox.py); the Writer deployment applies queued writes in batches (batch/writes.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmframe_ray.api.auth import ApiKeys, presented_key
from llmframe_ray.api.failures import FieldError, NotFoundError
from llmframe_ray.api.schemas import check_text
from llmframe_ray.api.tenants import namespace_for
from llmframe_ray.index.lookup import find_document
from llmframe_ray.index.metadata import FilterError, check_metadata, internal_id
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.index.inbox import UPLOAD_SUFFIXES, Inbox, Upload

logger = logging.getLogger(__name__)
MAX_ID_CHARS = 512


@dataclass(frozen=True)
class DocumentLimits:
    upload_max_bytes: int = 32 * 2**20  # LLMFRAME_UPLOAD_MAX_BYTES
    max_per_request: int = 1000  # LLMFRAME_DOCUMENTS_MAX_PER_REQUEST
    max_queued_bytes: int = 2**30  # LLMFRAME_DOCUMENTS_MAX_QUEUED_BYTES


def _check_id(value: str) -> str:
    check_text(value)
    if not value.strip() or len(value) > MAX_ID_CHARS:
        raise ValueError(f"must be 1-{MAX_ID_CHARS} characters, not blank")
    return value


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(..., description="Stable id: a later write with the same id replaces the document.")
    # taken as the readers take files: control characters included (real corpora hold them,
    # e.g. SciFact's U+0096); a string UTF-8 cannot hold (an unpaired surrogate) is refused
    title: str = ""
    text: str = Field(..., min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Strings, numbers, booleans, lists of strings.")

    _id = field_validator("id")(_check_id)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            return check_metadata(value)
        except FilterError as exc:
            raise ValueError(str(exc)) from None


class DocumentsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(..., min_length=1)
    namespace: str | None = None


class DeleteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(..., min_length=1)
    namespace: str | None = None

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        return [_check_id(v) for v in value]


def _unique(ids: list[str]) -> None:
    seen: set[str] = set()
    for i, doc_id in enumerate(ids):
        if doc_id in seen:
            raise FieldError(f"documents.{i}.id", f"document id {doc_id!r} occurs more than once in this request")
        seen.add(doc_id)


UPLOAD_DOC = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": DocumentsIn.model_json_schema()},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "array", "items": {"type": "string", "format": "binary"}, "description": "txt, md, html or pdf files"},
        "ids": {"type": "string", "description": "JSON list of document ids, in the files' order (default: file names)"},
        "titles": {"type": "string", "description": "JSON list of titles, in the files' order"},
        "metadata": {"type": "string", "description": "JSON object: metadata of every file"},
        "namespace": {"type": "string"},
    }}},
}}}


def job_view(record: dict[str, Any]) -> dict[str, Any]:
    """A job record as the API shows it."""
    out = {k: record.get(k) for k in ("job_id", "status", "namespace", "created", "finished", "version", "error")}
    out["documents"] = len(record["documents"])
    out["report"] = record.get("report") or [{"id": d["id"], "op": d["op"], "status": record["status"]} for d in record["documents"]]
    out["status_url"] = f"/v1/jobs/{record['job_id']}"
    return out


class DocumentsApi:
    """The routes above over one index directory; `poke` wakes the writer (best effort)."""

    def __init__(self, index_dir: str | Path, limits: DocumentLimits, poke: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.directory = IndexDirectory(index_dir)
        self.inbox = Inbox(index_dir)
        self.limits = limits
        self.poke = poke

    async def _queue(self, namespace: str, **payload: Any) -> JSONResponse:
        size = sum(len(u.data) for u in payload.get("uploads", ())) + sum(len(d["text"]) for d in payload.get("documents", ()))
        queued = await asyncio.to_thread(self.inbox.queued_bytes)
        if queued + size > self.limits.max_queued_bytes:
            return _error(429, "queue_full", (
                f"{queued} bytes of writes are waiting to be applied; this write would pass the limit of "
                f"{self.limits.max_queued_bytes} (LLMFRAME_DOCUMENTS_MAX_QUEUED_BYTES); retry shortly"
            ), headers={"Retry-After": "5"})
        record = await asyncio.to_thread(self.inbox.submit, namespace, **payload)
        if self.poke is not None:
            try:
                await self.poke()
            except Exception as exc:  # the writer also polls the inbox: the write is not lost
                logger.warning("could not wake the writer (it polls the inbox): %s", exc)
        return JSONResponse(job_view(record), status_code=202)

    def _count(self, n: int) -> None:
        if n > self.limits.max_per_request:
            raise _Refused(413, "too_many_documents", (
                f"{n} documents in one request; the limit is {self.limits.max_per_request} "
                "(LLMFRAME_DOCUMENTS_MAX_PER_REQUEST)"
            ))

    async def _uploads(self, request: Request, keys: ApiKeys) -> JSONResponse:
        form = await request.form(max_files=self.limits.max_per_request + 1, max_fields=64)
        files = [f for f in form.getlist("file") if hasattr(f, "filename")]
        if not files:
            raise FieldError("file", "a multipart upload needs at least one `file` part")
        self._count(len(files))
        ids = _json_field(form.get("ids"), list, "ids") or [f.filename or "" for f in files]
        titles = _json_field(form.get("titles"), list, "titles") or [""] * len(files)
        metadata = _json_field(form.get("metadata"), dict, "metadata") or {}
        if len(ids) != len(files) or len(titles) != len(files):
            raise FieldError("ids", f"{len(files)} files but {len(ids)} ids and {len(titles)} titles")
        try:
            ids = [_check_id(str(i)) for i in ids]
            metadata = check_metadata(metadata)
        except ValueError as exc:
            raise FieldError("ids" if not isinstance(exc, FilterError) else "metadata", str(exc)) from None
        _unique(ids)
        uploads = []
        for doc_id, title, part in zip(ids, titles, files):
            suffix = Path(part.filename or "").suffix.lower()
            if suffix not in UPLOAD_SUFFIXES:
                raise FieldError("file", f"{part.filename!r}: unsupported file type {suffix!r}; supported: {', '.join(UPLOAD_SUFFIXES)}")
            uploads.append(Upload(doc_id, part.filename or doc_id, await part.read(), metadata, str(title or "")))
        namespace = namespace_for(keys, presented_key(request.headers), _form_text(form.get("namespace")))
        return await self._queue(namespace, uploads=uploads)

    def add_routes(self, app: FastAPI, keys: ApiKeys, auth: list[Any]) -> None:
        @app.exception_handler(_Refused)
        async def _refused(request: Request, exc: _Refused) -> JSONResponse:
            return _error(exc.status, exc.kind, str(exc))

        def caller(request: Request) -> str | None:
            return presented_key(request.headers)

        @app.post("/v1/documents", dependencies=auth, status_code=202, openapi_extra=UPLOAD_DOC)
        async def post_documents(request: Request) -> JSONResponse:
            """Add or replace documents (JSON body, or multipart file upload); answered 202 with a job."""
            if request.headers.get("content-type", "").startswith("multipart/form-data"):
                return await self._uploads(request, keys)
            try:
                raw = await request.json()
            except ValueError as exc:
                raise FieldError("body", f"the body is not valid JSON ({exc})") from None
            if isinstance(raw, dict) and isinstance(raw.get("documents"), list):
                self._count(len(raw["documents"]))
            try:
                body = DocumentsIn.model_validate(raw)
            except ValidationError as exc:
                raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
            _unique([d.id for d in body.documents])
            namespace = namespace_for(keys, caller(request), body.namespace)
            return await self._queue(namespace, documents=[d.model_dump() for d in body.documents])

        @app.post("/v1/documents/delete", dependencies=auth, status_code=202)
        async def delete_many(body: DeleteIn, request: Request) -> JSONResponse:
            """Delete documents by id; ids the namespace does not hold are `not_found` in the report."""
            self._count(len(body.ids))
            _unique(body.ids)
            return await self._queue(namespace_for(keys, caller(request), body.namespace), deletes=body.ids)

        @app.delete("/v1/documents/{doc_id:path}", dependencies=auth, status_code=202)
        async def delete_one(doc_id: str, request: Request, namespace: str | None = None) -> JSONResponse:
            """Delete one document (404 when the namespace holds no such document)."""
            name = namespace_for(keys, caller(request), namespace)
            await self._known(name, doc_id)
            return await self._queue(name, deletes=[doc_id])

        @app.get("/v1/documents/{doc_id:path}", dependencies=auth)
        async def get_document(doc_id: str, request: Request, namespace: str | None = None) -> dict[str, Any]:
            """A document's chunks and metadata, the retained versions that hold it, pending writes."""
            name = namespace_for(keys, caller(request), namespace)
            found, pending = await self._known(name, doc_id)
            out: dict[str, Any] = {"id": doc_id, "namespace": name, "pending_jobs": pending}
            return {**out, **found} if found else {**out, "versions": [], "chunks": []}

        @app.get("/v1/jobs/{job_id}", dependencies=auth)
        async def get_job(job_id: str, request: Request) -> dict[str, Any]:
            """A write's state: queued, running, published (with the version) or failed, per document."""
            record = await asyncio.to_thread(self.inbox.job, job_id)
            allowed = keys.namespaces(caller(request))
            if record is None or (allowed is not None and record["namespace"] not in allowed):
                raise NotFoundError("job_not_found", f"job {job_id!r} not found")
            return job_view(record)

    async def _known(self, namespace: str, doc_id: str) -> tuple[dict[str, Any] | None, list[str]]:
        """The document in the index and its pending writes; 404 when there is neither."""
        found = await asyncio.to_thread(find_document, self.directory, internal_id(namespace, doc_id))
        pending = await asyncio.to_thread(self.inbox.pending_for, namespace, doc_id)
        if found is None and not pending:
            raise NotFoundError("document_not_found", f"document {doc_id!r} not found")
        return found, pending


class _Refused(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def _error(status: int, kind: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, "field": None}}, status_code=status, headers=headers)


def _form_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json_field(value: Any, kind: type, name: str) -> Any:
    if value is None or value == "":
        return None
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as exc:
        raise FieldError(name, f"must be JSON ({exc.msg})") from None
    if not isinstance(parsed, kind):
        raise FieldError(name, f"must be a JSON {'list' if kind is list else 'object'}")
    return parsed


"""Read source files into `Document`s: plain text, Markdown, HTML, PDF and JSON Lines corpora.

Every failure is a `DocumentReadError` naming the file and what is wrong with it. Text files are
strict UTF-8 (a leading BOM is dropped) and their line endings are normalised to "\\n".
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

from bs4 import BeautifulSoup
from bs4.element import Comment, Declaration, Doctype, NavigableString, ProcessingInstruction, Tag
from pypdf import PasswordType, PdfReader

from llmframe_ray.errors import DocumentReadError
from llmframe_ray.types import Document

_FORMATS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown",
            ".html": "html", ".htm": "html", ".pdf": "pdf"}
JSONL_SUFFIX = ".jsonl"
SUPPORTED_SUFFIXES: tuple[str, ...] = tuple(sorted([*_FORMATS, JSONL_SUFFIX]))

_BINARY_SNIFF_BYTES = 8192
_BOM = b"\xef\xbb\xbf"
_GLOB = re.compile(r"[*?\[]")
# One document file larger than this is refused unread (LLMFRAME_MAX_FILE_BYTES).
DEFAULT_MAX_FILE_BYTES = 256 * 2**20


def read_document(path: str | Path, *, doc_id: str | None = None, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Document:
    """Read one file into a Document; `doc_id` defaults to the path as given, in posix form. A
    file over `max_bytes` is refused unread."""
    path = Path(path)
    suffix = path.suffix.lower()
    fmt = _FORMATS.get(suffix)
    if fmt is None:
        if suffix == JSONL_SUFFIX:
            raise DocumentReadError(path, "a .jsonl file holds many documents; use read_jsonl")
        supported = ", ".join(sorted(_FORMATS))
        raise DocumentReadError(path, f"unsupported file type {suffix!r}; supported: {supported}")
    data = _read_bytes(path, max_bytes)
    metadata: dict[str, object] = {"format": fmt}
    if fmt == "pdf":
        text, title, pages = _parse_pdf(path, data)
        metadata["pages"] = pages
    else:
        raw = _decode_text(path, data)
        if fmt == "html":
            text, title = _parse_html(raw)
        else:
            text = raw
            title = _markdown_title(raw) if fmt == "markdown" else ""
    if not text.strip():
        raise DocumentReadError(path, "no text")
    return Document(
        doc_id=path.as_posix() if doc_id is None else doc_id,
        text=text,
        title=title or path.stem,
        source=str(path),
        metadata=metadata,
    )


def read_jsonl(path: str | Path) -> Iterator[Document]:
    """Yield one Document per line of a JSON Lines corpus; errors surface while iterating.

    A line is a BEIR corpus record {"_id", "title", "text"} or a generic record with "id" or
    "doc_id", "text" and an optional "title". Other keys become metadata; a "metadata" object is
    merged into it. Blank lines are skipped; ids are converted to str and must be unique.
    """
    for item in _unique(_jsonl_records(Path(path)), {}):
        if isinstance(item, DocumentReadError):
            raise item
        yield item


def iter_documents(
    sources: Iterable[str | Path], *, errors: list[DocumentReadError] | None = None,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Iterator[Document]:
    """Yield the documents of files, folders (recursive) and glob patterns, in a fixed order.

    All sources are resolved before this returns: one that is neither a file, a folder nor a glob
    with matches raises DocumentReadError at once. Files under a folder get their path relative to
    that folder as doc_id; folders and globs keep supported suffixes only and skip hidden names.
    A file reached twice is read once; a doc_id seen twice is an error for the later document.
    With `errors` a list, each DocumentReadError is appended there and the file (or the JSON
    Lines record) is skipped; with None it is raised. A document file over `max_bytes` is an
    error, unread (a JSON Lines corpus is read line by line and has no such limit).
    """
    files = _resolve_sources(sources)
    return _iter_files(files, errors, max_bytes)


def resolve_sources(sources: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """(path, doc_id) of every file the sources name, in a fixed order, each file once.

    Raises DocumentReadError for a source that is neither a file, a folder nor a glob with
    matches, before any file is read.
    """
    return _resolve_sources(sources)


def read_file_records(path: Path, doc_id: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Iterator[_Record]:
    """(path, line number, Document or DocumentReadError) for one resolved file: one record for
    a text/Markdown/HTML/PDF file (line 0), one per non-blank line of a JSON Lines corpus."""
    if path.suffix.lower() == JSONL_SUFFIX:
        return _jsonl_records(path)
    try:
        return iter([(path, 0, read_document(path, doc_id=doc_id, max_bytes=max_bytes))])
    except DocumentReadError as exc:
        return iter([(path, 0, exc)])


def _resolve_sources(sources: Iterable[str | Path]) -> list[tuple[Path, str]]:
    files: dict[Path, tuple[Path, str]] = {}
    for source in sources:
        path = Path(source)
        if path.is_file():
            found = [(path, path.as_posix())]
        elif path.is_dir():
            found = _walk_folder(path)
        else:
            pattern = str(source)
            names = sorted(glob.glob(pattern, recursive=True)) if _GLOB.search(pattern) else []
            found = [(Path(n), Path(n).as_posix()) for n in names if _wanted(Path(n))]
            if not found:
                raise DocumentReadError(source, "no such file, folder or glob match")
        for item in found:
            files.setdefault(item[0].resolve(), item)
    return list(files.values())


def _wanted(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in SUPPORTED_SUFFIXES


def _walk_folder(root: Path) -> list[tuple[Path, str]]:
    """The supported files under `root`, hidden ones and symbolic links that lead out of `root`
    left out (a folder given as a source never makes the job read files elsewhere)."""
    found = []
    inside = root.resolve()
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        paths = (Path(folder, name) for name in filenames if not name.startswith("."))
        found.extend(
            (p, p.relative_to(root).as_posix()) for p in paths
            if _wanted(p) and (not p.is_symlink() or inside in p.resolve().parents)
        )
    return sorted(found, key=lambda item: item[1])


def _iter_files(
    files: list[tuple[Path, str]], errors: list[DocumentReadError] | None, max_bytes: int
) -> Iterator[Document]:
    first_seen: dict[str, str] = {}
    for path, doc_id in files:
        for item in _unique(read_file_records(path, doc_id, max_bytes), first_seen):
            if isinstance(item, Document):
                yield item
            elif errors is None:
                raise item
            else:
                errors.append(item)


_Record = tuple[Path, int, "Document | DocumentReadError"]


def _unique(
    records: Iterator[_Record], first_seen: dict[str, str]
) -> Iterator[Document | DocumentReadError]:
    """Turn a document whose doc_id was seen before into an error."""
    for path, line, item in records:
        if isinstance(item, Document):
            where = f"{path} line {line}" if line else str(path)
            first = first_seen.setdefault(item.doc_id, where)
            if first != where:
                prefix = f"line {line}: " if line else ""
                reason = f"{prefix}duplicate doc_id {item.doc_id!r}, first in {first}"
                item = DocumentReadError(path, reason)
        yield item


def _jsonl_records(path: Path) -> Iterator[_Record]:
    """(path, line number, document or error) per line; a file-level error ends it."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        yield path, 0, DocumentReadError(path, _os_reason(exc))
        return
    with handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            try:
                doc = _jsonl_document(path, number, raw)
            except DocumentReadError as exc:
                yield path, number, exc
                continue
            if doc is not None:
                yield path, number, doc


def _jsonl_document(path: Path, number: int, raw: bytes) -> Document | None:
    def fail(what: str) -> DocumentReadError:
        return DocumentReadError(path, f"line {number}: {what}")

    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start]
        raise fail(f"not valid UTF-8 (byte 0x{bad:02x} at column {exc.start + 1})") from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise fail(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {type(record).__name__}")
    id_key = next((k for k in ("_id", "id", "doc_id") if k in record), None)
    if id_key is None:
        raise fail("missing id (one of '_id', 'id', 'doc_id')")
    doc_id = record[id_key]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or not str(doc_id).strip():
        raise fail(f"{id_key!r} must be a non-empty string or an integer, got {doc_id!r}")
    if "text" not in record:
        raise fail("missing 'text'")
    text, title = record["text"], record.get("title") or ""
    for key, value in (("text", text), ("title", title)):
        if not isinstance(value, str):
            raise fail(f"{key!r} must be a string, got {type(value).__name__}")
    metadata: dict[str, object] = {}
    for key, value in record.items():
        if key in (id_key, "text", "title"):
            continue
        if key == "metadata" and isinstance(value, dict):
            metadata.update(value)
        else:
            metadata[key] = value
    return Document(str(doc_id), text, title=title, source=str(path), metadata=metadata)


def _read_bytes(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                raise DocumentReadError(path, f"file is {size} bytes; the limit is {limit} (LLMFRAME_MAX_FILE_BYTES)")
            data = handle.read(limit + 1)
            if len(data) > limit:
                raise DocumentReadError(path, f"file grew past the limit of {limit} bytes while it was read (LLMFRAME_MAX_FILE_BYTES)")
            return data
    except OSError as exc:
        raise DocumentReadError(path, _os_reason(exc)) from None


_OS_REASONS = {
    FileNotFoundError: "file not found",
    IsADirectoryError: "is a folder, not a file",
    PermissionError: "permission denied",
}


def _os_reason(exc: OSError) -> str:
    return _OS_REASONS.get(type(exc)) or exc.strerror or str(exc)


def _decode_text(path: Path, data: bytes) -> str:
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        raise DocumentReadError(path, "binary file")
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start]
        raise DocumentReadError(
            path, f"not valid UTF-8 (byte 0x{bad:02x} at offset {exc.start + skip})"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


_ATX_H1 = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def _markdown_title(text: str) -> str:
    """The first level-1 ATX heading outside fenced code, or ""."""
    fence = None
    for line in text.split("\n"):
        opened = _FENCE.match(line)
        if opened:
            if fence is None:
                fence = opened.group(1)
            elif opened.group(1) == fence:
                fence = None
            continue
        if fence is None:
            heading = _ATX_H1.match(line)
            if heading:
                return heading.group(1).strip()
    return ""


_DROPPED_TAGS = ("script", "style", "noscript", "template", "title")
_BLOCK_TAGS = frozenset(
    "address article aside blockquote caption dd details dialog div dl dt fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 header hr li main nav ol p pre section summary table "
    "tbody td tfoot th thead tr ul body html".split()
)
_SKIPPED_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_BREAK = object()
_SPACES = re.compile(r"[^\S\n]+")


def _parse_html(markup: str) -> tuple[str, str]:
    soup = BeautifulSoup(markup, "html.parser")
    title = ""
    if soup.title is not None:
        title = " ".join(soup.title.get_text().split())
    if not title:
        h1 = soup.find("h1")
        if h1 is not None:
            title = " ".join(h1.get_text().split())
    for tag in soup.find_all(_DROPPED_TAGS):
        tag.decompose()
    return _html_text(soup), title


def _html_text(soup: BeautifulSoup) -> str:
    """Text of the tree; block elements become paragraphs separated by blank lines."""
    blocks: list[str] = []
    current: list[str] = []
    stack: list[object] = [soup, _BREAK]
    while stack:
        node = stack.pop()
        if node is _BREAK or (isinstance(node, Tag) and node.name in _BLOCK_TAGS):
            lines = (_SPACES.sub(" ", line).strip() for line in "".join(current).split("\n"))
            blocks.append("\n".join(line for line in lines if line))
            current = []
            if node is _BREAK:
                continue
            if node.name == "pre":  # type: ignore[union-attr]
                blocks.append(node.get_text().strip("\n"))  # type: ignore[union-attr]
                continue
            stack.append(_BREAK)
        if isinstance(node, Tag):
            if node.name == "br":
                current.append("\n")
            stack.extend(reversed(node.contents))
        elif isinstance(node, NavigableString) and not isinstance(node, _SKIPPED_STRINGS):
            current.append(node.replace("\n", " "))
    return "\n\n".join(block for block in blocks if block.strip())


def _parse_pdf(path: Path, data: bytes) -> tuple[str, str, int]:
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _opens_without_password(reader):
            raise DocumentReadError(path, "encrypted PDF")
        pages = [page.extract_text() or "" for page in reader.pages]
        title = reader.metadata.title if reader.metadata is not None else None
    except DocumentReadError:
        raise
    except Exception as exc:  # pypdf raises many types on damaged input
        reason = str(exc).strip() or type(exc).__name__
        raise DocumentReadError(path, f"corrupt PDF: {reason}") from None
    texts = (p.replace("\r\n", "\n").replace("\r", "\n").strip() for p in pages)
    title = title.strip() if isinstance(title, str) else ""
    return "\n\n".join(t for t in texts if t), title, len(pages)


def _opens_without_password(reader: PdfReader) -> bool:
    """True for a PDF encrypted with an empty user password (owner-only protection)."""
    try:
        return reader.decrypt("") != PasswordType.NOT_DECRYPTED
    except Exception:  # a missing crypto backend or an unsupported scheme: treat as locked
        return False

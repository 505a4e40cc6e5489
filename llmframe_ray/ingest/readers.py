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

from llmframe_ray.errors import DocumentReadError
from llmframe_ray.types import Document

_FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}
JSONL_SUFFIX = ".jsonl"
SUPPORTED_SUFFIXES: tuple[str, ...] = tuple(sorted([*_FORMATS, JSONL_SUFFIX]))

_BINARY_SNIFF_BYTES = 8192
_BOM = b"\xef\xbb\xbf"
_GLOB_CHARS = re.compile(r"[*?\[]")


def read_document(path: str | Path, *, doc_id: str | None = None) -> Document:
    """Read one file into a Document; `doc_id` defaults to the path as given, in posix form."""
    path = Path(path)
    suffix = path.suffix.lower()
    fmt = _FORMATS.get(suffix)
    if fmt is None:
        if suffix == JSONL_SUFFIX:
            raise DocumentReadError(
                path, "a .jsonl file holds many documents; read it with read_jsonl"
            )
        supported = ", ".join(SUPPORTED_SUFFIXES)
        raise DocumentReadError(path, f"unsupported file type {suffix!r}; supported: {supported}")
    data = _read_bytes(path)
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
    for item in _jsonl_records(Path(path), {}):
        if isinstance(item, DocumentReadError):
            raise item
        yield item


def iter_documents(
    sources: Iterable[str | Path], *, errors: list[DocumentReadError] | None = None
) -> Iterator[Document]:
    """Yield the documents of files, folders (recursive) and glob patterns, in a fixed order.

    All sources are resolved before this returns: one that is neither a file, a folder nor a glob
    with matches raises DocumentReadError at once. Files under a folder get their path relative to
    that folder as doc_id; folders and globs keep supported suffixes only and skip hidden names.
    A file reached twice is read once; a doc_id seen twice is an error for the later document.
    With `errors` a list, each DocumentReadError is appended there and the file (or the JSON
    Lines record) is skipped; with None it is raised.
    """
    files = _resolve_sources(sources)
    return _iter_files(files, errors)


def _resolve_sources(sources: Iterable[str | Path]) -> list[tuple[Path, str]]:
    files: list[tuple[Path, str]] = []
    seen: set[Path] = set()

    def add(path: Path, doc_id: str) -> None:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            files.append((path, doc_id))

    for source in sources:
        path = Path(source)
        if path.is_file():
            add(path, path.as_posix())
        elif path.is_dir():
            for found, rel in _walk_folder(path):
                add(found, rel)
        else:
            matches = []
            if _GLOB_CHARS.search(str(source)):
                for name in sorted(glob.glob(str(source), recursive=True)):
                    match = Path(name)
                    if match.is_file() and match.suffix.lower() in SUPPORTED_SUFFIXES:
                        matches.append(match)
            if not matches:
                raise DocumentReadError(source, "no such file, folder or glob match")
            for match in matches:
                add(match, match.as_posix())
    return files


def _walk_folder(root: Path) -> list[tuple[Path, str]]:
    found = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or Path(name).suffix.lower() not in SUPPORTED_SUFFIXES:
                continue
            path = Path(folder, name)
            found.append((path, path.relative_to(root).as_posix()))
    found.sort(key=lambda item: item[1])
    return found


def _iter_files(
    files: list[tuple[Path, str]], errors: list[DocumentReadError] | None
) -> Iterator[Document]:
    first_source: dict[str, str] = {}
    for path, doc_id in files:
        if path.suffix.lower() == JSONL_SUFFIX:
            items: Iterable[Document | DocumentReadError] = _jsonl_records(path, first_source)
        else:
            try:
                items = [read_document(path, doc_id=doc_id)]
            except DocumentReadError as exc:
                items = [exc]
            else:
                dup = first_source.get(doc_id)
                if dup is not None:
                    items = [DocumentReadError(path, f"duplicate doc_id {doc_id!r}, first in {dup}")]
                else:
                    first_source[doc_id] = str(path)
        for item in items:
            if isinstance(item, DocumentReadError):
                if errors is None:
                    raise item
                errors.append(item)
            else:
                yield item


def _jsonl_records(
    path: Path, first_source: dict[str, str]
) -> Iterator[Document | DocumentReadError]:
    """Documents and per-line errors of one JSON Lines file; a file-level error ends it."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        yield DocumentReadError(path, _os_reason(exc))
        return
    with handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            try:
                doc = _jsonl_document(path, number, raw)
            except DocumentReadError as exc:
                yield exc
                continue
            if doc is None:
                continue
            here = f"{path}:{number}"
            dup = first_source.get(doc.doc_id)
            if dup is not None:
                yield DocumentReadError(
                    path, f"line {number}: duplicate id {doc.doc_id!r}, first in {dup}"
                )
                continue
            first_source[doc.doc_id] = here
            yield doc


def _jsonl_document(path: Path, number: int, raw: bytes) -> Document | None:
    def fail(what: str) -> DocumentReadError:
        return DocumentReadError(path, f"line {number}: {what}")

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at column {exc.start + 1})")
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
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise fail(f"{id_key!r} must be a string or an integer, got {type(doc_id).__name__}")
    doc_id = str(doc_id)
    if not doc_id.strip():
        raise fail(f"{id_key!r} is empty")
    if "text" not in record:
        raise fail("missing 'text'")
    text = record["text"]
    if not isinstance(text, str):
        raise fail(f"'text' must be a string, got {type(text).__name__}")
    title = record.get("title")
    if title is None:
        title = ""
    elif not isinstance(title, str):
        raise fail(f"'title' must be a string, got {type(title).__name__}")
    metadata: dict[str, object] = {}
    for key, value in record.items():
        if key in (id_key, "text", "title"):
            continue
        if key == "metadata" and isinstance(value, dict):
            metadata.update(value)
        else:
            metadata[key] = value
    return Document(doc_id=doc_id, text=text, title=title, source=str(path), metadata=metadata)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DocumentReadError(path, _os_reason(exc)) from None


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    if isinstance(exc, IsADirectoryError):
        return "is a folder, not a file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc)


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
    pieces: list[object] = []
    stack: list[object] = [soup]
    while stack:
        node = stack.pop()
        if node is _BREAK:
            pieces.append(_BREAK)
        elif isinstance(node, Tag):
            if node.name == "br":
                pieces.append("\n")
            elif node.name == "pre":
                pieces.extend([_BREAK, node.get_text().strip("\n"), _BREAK])
            elif node.name in _BLOCK_TAGS:
                pieces.append(_BREAK)
                stack.append(_BREAK)
                stack.extend(reversed(node.contents))
            else:
                stack.extend(reversed(node.contents))
        elif isinstance(node, NavigableString) and not isinstance(node, _SKIPPED_STRINGS):
            pieces.append(" ".join(node.split("\n")) if node.strip() else " ")
    blocks, current = [], []
    for piece in pieces + [_BREAK]:
        if piece is _BREAK:
            block = _tidy_block("".join(current))  # type: ignore[arg-type]
            if block:
                blocks.append(block)
            current = []
        else:
            current.append(piece)
    return "\n\n".join(blocks)


def _tidy_block(block: str) -> str:
    lines = (_SPACES.sub(" ", line).strip() for line in block.split("\n"))
    return "\n".join(line for line in lines if line)


def _parse_pdf(path: Path, data: bytes) -> tuple[str, str, int]:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _try_empty_password(reader):
            raise DocumentReadError(path, "encrypted PDF")
        pages = [page.extract_text() or "" for page in reader.pages]
        meta = reader.metadata
        title = meta.title if meta is not None else None
    except DocumentReadError:
        raise
    except Exception as exc:  # pypdf raises many types on damaged input
        reason = str(exc).strip() or type(exc).__name__
        raise DocumentReadError(path, f"corrupt PDF: {reason}") from None
    texts = [p.replace("\r\n", "\n").replace("\r", "\n").strip() for p in pages]
    text = "\n\n".join(t for t in texts if t)
    title = title.strip() if isinstance(title, str) else ""
    return text, title, len(pages)


def _try_empty_password(reader: object) -> bool:
    """Open a PDF that is encrypted with an empty user password (owner-only protection)."""
    from pypdf import PasswordType

    try:
        return reader.decrypt("") != PasswordType.NOT_DECRYPTED  # type: ignore[attr-defined]
    except Exception:  # a missing crypto backend or an unsupported scheme: treat as locked
        return False

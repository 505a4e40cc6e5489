"""Readers: every format from files made here, and every failure with its exact reason."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from llmframe_ray.errors import DocumentReadError
from llmframe_ray.ingest import SUPPORTED_SUFFIXES, iter_documents, read_document, read_jsonl
from tests.fakes.pdf import pdf_bytes as _pdf_bytes


def _rewritten(data: bytes, title: str | None = None, user_password: str | None = None) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    if title is not None:
        writer.add_metadata({"/Title": title})
    if user_password is not None:
        writer.encrypt(user_password=user_password, owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def _reason(path: Path) -> str:
    with pytest.raises(DocumentReadError) as caught:
        read_document(path)
    assert caught.value.path == str(path)
    return caught.value.reason


# --- plain text and markdown ---------------------------------------------------------------


def test_text_file_keeps_text_strips_bom_and_normalises_newlines(tmp_path):
    path = _write(tmp_path / "notes.txt", b"\xef\xbb\xbfFirst line\r\nsecond\r\n\r\nThird\r")
    doc = read_document(path)
    assert doc.text == "First line\nsecond\n\nThird\n"
    assert doc.title == "notes"
    assert doc.doc_id == path.as_posix()
    assert doc.source == str(path)
    assert dict(doc.metadata) == {"format": "text"}


def test_suffix_is_case_insensitive_and_doc_id_can_be_given(tmp_path):
    doc = read_document(_write(tmp_path / "README.TEXT", "hello"), doc_id="my-id")
    assert (doc.doc_id, doc.text, dict(doc.metadata)) == ("my-id", "hello", {"format": "text"})


def test_markdown_title_is_first_level_one_heading_outside_code(tmp_path):
    text = "Intro\n\n```python\n# not a title\n```\n\n## Sub\n\n# Real Title ##\n\nBody.\n"
    doc = read_document(_write(tmp_path / "guide.md", text))
    assert doc.title == "Real Title"
    assert doc.text == text
    assert dict(doc.metadata) == {"format": "markdown"}


def test_markdown_without_level_one_heading_uses_stem(tmp_path):
    doc = read_document(_write(tmp_path / "guide.markdown", "## Only a sub heading\n\ntext"))
    assert doc.title == "guide"


def test_invalid_utf8_names_byte_and_offset(tmp_path):
    assert _reason(_write(tmp_path / "bad.txt", b"abc\xffdef")) == (
        "not valid UTF-8 (byte 0xff at offset 3)"
    )
    # the offset counts from the start of the file, BOM included
    assert _reason(_write(tmp_path / "bom.md", b"\xef\xbb\xbfab\xfe")) == (
        "not valid UTF-8 (byte 0xfe at offset 5)"
    )


def test_binary_file(tmp_path):
    assert _reason(_write(tmp_path / "blob.txt", b"text\x00\x01\x02more")) == "binary file"


@pytest.mark.parametrize("content", ["", " \n\t\r\n "])
def test_empty_or_blank_file_has_no_text(tmp_path, content):
    assert _reason(_write(tmp_path / "empty.txt", content)) == "no text"


def test_unsupported_suffix_lists_supported(tmp_path):
    assert _reason(_write(tmp_path / "table.csv", "a,b")) == (
        "unsupported file type '.csv'; supported: "
        ".htm, .html, .markdown, .md, .pdf, .text, .txt"
    )
    assert _reason(_write(tmp_path / "corpus.jsonl", "{}")) == (
        "a .jsonl file holds many documents; use read_jsonl"
    )
    assert SUPPORTED_SUFFIXES == (
        ".htm", ".html", ".jsonl", ".markdown", ".md", ".pdf", ".text", ".txt"
    )


def test_missing_file(tmp_path):
    assert _reason(tmp_path / "nope.txt") == "file not found"
    assert str(DocumentReadError(tmp_path / "nope.txt", "file not found")).endswith(
        "nope.txt: file not found"
    )


# --- html ------------------------------------------------------------------------------------

_HTML = """<!DOCTYPE html>
<html><head><title> Page   Title </title><style>p { color: red }</style>
<script>var hidden = 1;</script></head>
<body><h1>Heading One</h1><p>First   paragraph
with a wrapped line.</p><div>Second <b>bold</b> block<br>next line</div>
<noscript>enable js</noscript><template><p>template text</p></template>
<ul><li>item one</li><li>item <i>two</i></li></ul><!-- a comment -->
<p>Caf&eacute; &amp; more</p><pre>  code
    indented</pre></body></html>
"""


def test_html_blocks_become_paragraphs_and_hidden_parts_are_dropped(tmp_path):
    doc = read_document(_write(tmp_path / "page.html", _HTML))
    assert doc.title == "Page Title"
    assert doc.text == (
        "Heading One\n\nFirst paragraph with a wrapped line.\n\nSecond bold block\nnext line"
        "\n\nitem one\n\nitem two\n\nCafé & more\n\n  code\n    indented"
    )
    assert dict(doc.metadata) == {"format": "html"}


def test_html_title_falls_back_to_h1_then_stem(tmp_path):
    doc = read_document(_write(tmp_path / "a.htm", "<p>intro</p><h1> The  H1 </h1><p>x</p>"))
    assert (doc.title, doc.text) == ("The H1", "intro\n\nThe H1\n\nx")
    assert read_document(_write(tmp_path / "b.htm", "<div>just text</div>")).title == "b"


def test_html_with_only_script_has_no_text(tmp_path):
    path = _write(tmp_path / "s.html", "<html><script>alert(1)</script><style>a{}</style></html>")
    assert _reason(path) == "no text"


# --- pdf -------------------------------------------------------------------------------------


def test_pdf_pages_joined_with_blank_lines_and_metadata_title(tmp_path):
    data = _rewritten(_pdf_bytes(["Hello PDF world.", "Second page here."]), title="  A Paper ")
    doc = read_document(_write(tmp_path / "paper.pdf", data))
    assert doc.text == "Hello PDF world.\n\nSecond page here."
    assert doc.title == "A Paper"
    assert dict(doc.metadata) == {"format": "pdf", "pages": 2}


def test_pdf_without_title_uses_stem(tmp_path):
    doc = read_document(_write(tmp_path / "scan.pdf", _pdf_bytes(["Only page."])))
    assert (doc.text, doc.title, doc.metadata["pages"]) == ("Only page.", "scan", 1)


def test_pdf_with_blank_title_uses_stem(tmp_path):
    doc = read_document(_write(tmp_path / "x.pdf", _rewritten(_pdf_bytes(["Body."]), title="  ")))
    assert doc.title == "x"


@pytest.mark.parametrize(
    "data",
    [
        b"this is not a pdf at all, just some garbage bytes " * 20,
        b"",
        _rewritten(_pdf_bytes(["Hello PDF world."]), title="T")[:300],
        _pdf_bytes(["Hello PDF world."])[:-60],
    ],
    ids=["garbage", "empty", "truncated-rewritten", "truncated-handmade"],
)
def test_corrupt_pdf(tmp_path, data):
    path = _write(tmp_path / "broken.pdf", data)
    with pytest.raises(DocumentReadError) as caught:
        read_document(path)
    assert caught.value.reason.startswith("corrupt PDF: ")
    assert len(caught.value.reason) > len("corrupt PDF: ")
    assert "broken.pdf" in str(caught.value)
    assert "corrupt PDF" in str(caught.value)


def test_encrypted_pdf(tmp_path):
    data = _rewritten(_pdf_bytes(["Secret text."]), user_password="secret")
    assert _reason(_write(tmp_path / "locked.pdf", data)) == "encrypted PDF"


def test_pdf_encrypted_with_empty_user_password_is_read(tmp_path):
    data = _rewritten(_pdf_bytes(["Open text."]), user_password="")
    assert read_document(_write(tmp_path / "owner_only.pdf", data)).text == "Open text."


def test_pdf_without_text_has_no_text(tmp_path):
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    out = io.BytesIO()
    writer.write(out)
    assert _reason(_write(tmp_path / "blank.pdf", out.getvalue())) == "no text"


# --- jsonl -----------------------------------------------------------------------------------


def _jsonl(path: Path, lines: list[object]) -> Path:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    return _write(path, text + "\n")


def test_jsonl_beir_and_generic_records(tmp_path):
    path = _jsonl(
        tmp_path / "corpus.jsonl",
        [
            {"_id": "d1", "title": "First", "text": "Alpha text.", "metadata": {"year": 2020}},
            "",
            "   ",
            {"id": 7, "text": "Seven.", "lang": "en"},
            {"doc_id": "x", "text": "No title.", "title": None},
        ],
    )
    docs = list(read_jsonl(path))
    assert [(d.doc_id, d.title, d.text, dict(d.metadata)) for d in docs] == [
        ("d1", "First", "Alpha text.", {"year": 2020}),
        ("7", "", "Seven.", {"lang": "en"}),
        ("x", "", "No title.", {}),
    ]
    assert {d.source for d in docs} == {str(path)}


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ('{"_id": "b", "text": ', "line 3: invalid JSON (Expecting value at column 22)"),
        ('["a", "b"]', "line 3: expected a JSON object, got list"),
        ('{"text": "no id"}', "line 3: missing id (one of '_id', 'id', 'doc_id')"),
        ('{"_id": "b"}', "line 3: missing 'text'"),
        ('{"_id": "b", "text": 5}', "line 3: 'text' must be a string, got int"),
        ('{"_id": "b", "text": "t", "title": 1}', "line 3: 'title' must be a string, got int"),
        (
            '{"_id": null, "text": "t"}',
            "line 3: '_id' must be a non-empty string or an integer, got None",
        ),
        ('{"_id": "a", "text": "again"}', "line 3: duplicate doc_id 'a', first in {path} line 1"),
    ],
)
def test_jsonl_bad_line_names_line_number(tmp_path, bad_line, reason):
    path = _jsonl(tmp_path / "c.jsonl", [{"_id": "a", "text": "ok"}, "", bad_line])
    reader = read_jsonl(path)
    assert next(reader).doc_id == "a"
    with pytest.raises(DocumentReadError) as caught:
        next(reader)
    assert caught.value.path == str(path)
    assert caught.value.reason == reason.format(path=path)


def test_jsonl_invalid_utf8_line(tmp_path):
    data = b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "\xff"}\n'
    path = _write(tmp_path / "c.jsonl", data)
    reason = r"line 2: not valid UTF-8 \(byte 0xff at column 23\)"
    with pytest.raises(DocumentReadError, match=reason):
        list(read_jsonl(path))


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(DocumentReadError, match="file not found"):
        list(read_jsonl(tmp_path / "none.jsonl"))


# --- iter_documents --------------------------------------------------------------------------


@pytest.fixture()
def tree(tmp_path) -> Path:
    root = tmp_path / "docs"
    _write(root / "b.txt", "Bee text.")
    _write(root / "a.md", "# Ay\n\nAy text.")
    _write(root / "sub" / "c.html", "<title>See</title><p>Cee text.</p>")
    _write(root / "sub" / "deeper" / "d.txt", "Dee text.")
    _jsonl(root / "corpus.jsonl", [{"_id": "j1", "text": "J 1."}, {"_id": "j2", "text": "J 2."}])
    _write(root / "skip.csv", "not,read")
    _write(root / ".hidden.txt", "hidden")
    _write(root / ".git" / "x.txt", "hidden too")
    return root


def test_folder_is_walked_sorted_with_relative_ids(tree):
    docs = list(iter_documents([tree]))
    assert [d.doc_id for d in docs] == [
        "a.md", "b.txt", "j1", "j2", "sub/c.html", "sub/deeper/d.txt"
    ]
    assert [d.title for d in docs] == ["Ay", "b", "", "", "See", "d"]
    assert docs[4].source == str(tree / "sub" / "c.html")


def test_glob_and_explicit_file_keep_paths_as_ids(tree):
    pattern = (tree / "**" / "*.txt").as_posix()
    docs = list(iter_documents([pattern, tree / "a.md"]))
    assert [d.doc_id for d in docs] == [
        (tree / "b.txt").as_posix(),
        (tree / "sub" / "deeper" / "d.txt").as_posix(),
        (tree / "a.md").as_posix(),
    ]


def test_a_file_reached_twice_is_read_once(tree):
    docs = list(iter_documents([tree / "sub", (tree / "sub" / "*.html").as_posix()]))
    assert [d.doc_id for d in docs] == ["c.html", "deeper/d.txt"]


def test_missing_source_raises_before_anything_is_yielded(tree):
    sources = [tree / "b.txt", tree / "missing.txt"]
    with pytest.raises(DocumentReadError) as caught:
        iter_documents(sources)
    assert caught.value.path == str(tree / "missing.txt")
    assert caught.value.reason == "no such file, folder or glob match"
    with pytest.raises(DocumentReadError, match="no such file, folder or glob match"):
        iter_documents([tree, (tree / "*.pdf").as_posix()])


def test_unreadable_files_are_collected_when_errors_is_a_list(tmp_path):
    root = tmp_path / "mixed"
    _write(root / "1-good.txt", "Good one.")
    _write(root / "2-bad.txt", b"\xff\xfe")
    _write(root / "3-empty.md", "   ")
    records = [{"_id": "ok1", "text": "x"}, "{oops", {"_id": "ok2", "text": "y"}]
    _jsonl(root / "4-corpus.jsonl", records)
    _write(root / "5-good.txt", "Good two.")
    errors: list[DocumentReadError] = []
    docs = list(iter_documents([root], errors=errors))
    assert [d.doc_id for d in docs] == ["1-good.txt", "ok1", "ok2", "5-good.txt"]
    assert [(Path(e.path).name, e.reason) for e in errors] == [
        ("2-bad.txt", "not valid UTF-8 (byte 0xff at offset 0)"),
        ("3-empty.md", "no text"),
        (
            "4-corpus.jsonl",
            "line 2: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        ),
    ]
    with pytest.raises(DocumentReadError, match="2-bad.txt: not valid UTF-8"):
        list(iter_documents([root]))


def test_duplicate_doc_ids_across_sources_are_errors(tmp_path):
    first = _jsonl(tmp_path / "one.jsonl", [{"_id": "same", "text": "first"}])
    second = _jsonl(tmp_path / "two.jsonl", [{"_id": "same", "text": "second"}])
    errors: list[DocumentReadError] = []
    docs = list(iter_documents([first, second], errors=errors))
    assert [d.text for d in docs] == ["first"]
    assert [(e.path, e.reason) for e in errors] == [
        (str(second), f"line 1: duplicate doc_id 'same', first in {first} line 1")
    ]


def test_a_folder_source_never_leads_out_of_the_folder(tmp_path):
    from llmframe_ray.ingest.readers import resolve_sources

    corpus, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
    corpus.mkdir()
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not for the index")
    (corpus / "kept.txt").write_text("part of the corpus")
    (corpus / "alias.txt").symlink_to(corpus / "kept.txt")  # a link within the folder is fine
    (corpus / "leak.txt").symlink_to(elsewhere / "secret.txt")
    (corpus / "linked-folder").symlink_to(elsewhere, target_is_directory=True)
    found = resolve_sources([corpus])
    assert [path.resolve() for path, _ in found] == [(corpus / "kept.txt").resolve()]  # the alias is the same file


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    from llmframe_ray.config import load_settings

    path = tmp_path / "big.txt"
    path.write_text("word " * 300)
    monkeypatch.setenv("LLMFRAME_MAX_FILE_BYTES", "1000")
    limit = load_settings().params().ingest.max_file_bytes
    with pytest.raises(DocumentReadError) as caught:
        read_document(path, max_bytes=limit)
    assert str(caught.value).endswith("file is 1500 bytes; the limit is 1000 (LLMFRAME_MAX_FILE_BYTES)")
    errors: list = []
    assert list(iter_documents([tmp_path], errors=errors, max_bytes=limit)) == [] and len(errors) == 1
    assert read_document(path, max_bytes=1500).text.startswith("word word")

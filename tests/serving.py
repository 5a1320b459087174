"""Helpers for the server tests: a `slipstream serve` process on 127.0.0.1, its metrics, its engine process."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, *extra: str, stderr=None) -> tuple[subprocess.Popen, str]:
    """`stderr`: a file for the server's (both processes') stderr; the test's own when None."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "slipstream", "serve", "--model", model, "--device", "cpu",
                             "--port", str(port), "--max-num-seqs", "8", *extra], env=env, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not come up within 180 s")


def stop_server(proc: subprocess.Popen) -> int | None:
    """SIGTERM, then its exit code (None if it had to be killed)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(40)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def metric_values(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def wait_idle(url: str, timeout: float = 20.0) -> dict[str, float]:
    """The metrics once no page is held and nothing is in flight (or the last seen at the timeout).
    The engine sends its stats twice a second: what is read first may predate the last request."""
    time.sleep(0.6)
    deadline = time.monotonic() + timeout
    while True:
        values = metric_values(url)
        idle = (values.get("slipstream_kv_pages_in_use") == 0 and values["slipstream_requests_in_flight"] == 0
                and values.get("slipstream_requests_running") == 0)
        if idle or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def engine_pids(server_pid: int) -> list[int]:
    """The server's engine processes (its spawned children), oldest first."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == server_pid and b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            pids.append(int(stat.parent.name))
    return sorted(pids)


def engine_pid(server_pid: int) -> int:
    pids = engine_pids(server_pid)
    if not pids:
        raise LookupError("no engine process")
    return pids[0]

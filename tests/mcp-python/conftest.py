"""Fixtures of the sandbox-mcp end-to-end suite: the real server binary, over stdio and over
Streamable HTTP, on the backend named by SANDBOX_MCP_BACKEND (docker, sbx or qemu), driven by the
official `mcp` client package.

On docker and sbx the suite is `test_sandbox_mcp.py`; on qemu (a VM per sandbox from the image
QEMU_VM_IMAGE names, under QEMU's emulator where KVM cannot boot) it is `test_qemu.py` alone,
one case end to end: each boot under emulation takes seconds, so the tool-by-tool cases run on
the two container backends and the qemu run proves the same binary and flags serve a VM.

Every variable the suite needs is required: a missing one fails the run, never skips a test.
`cargo xtask e2e mcp` sets them, installs the pinned client (requirements.txt) into its own
virtual environment, and runs the cases on several pytest-xdist workers; each worker has a
scope of its own (the prefix the xtask gives plus the worker's name), one HTTP server, and its
own state and lock directories, so workers never see each other's sandboxes.
"""

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def need(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is required (cargo xtask e2e mcp sets it)")
    return value


BIN = need("SANDBOX_MCP_BIN")
SANDBOXCTL = need("SANDBOXCTL_BIN")
BACKEND = need("SANDBOX_MCP_BACKEND")
# One scope per worker: the engine's leftovers are judged by it, here and by the xtask.
SCOPE = f"{need('SANDBOX_MCP_SCOPE_PREFIX')}-{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}"
TOKEN_A = secrets.token_hex(24)
TOKEN_B = secrets.token_hex(24)


def backend_args():
    if BACKEND == "docker":
        return ["--backend", "docker", "--min-isolation", "container"]
    if BACKEND == "sbx":
        return [
            "--backend", "sbx", "--sbx-path", need("SBX_PATH"),
            "--allow-simulator", "--min-isolation", "container",
        ]
    if BACKEND == "qemu":
        return [
            "--backend", "qemu", "--vm-image", need("QEMU_VM_IMAGE"),
            "--allow-emulation", "--min-isolation", "container",
        ]
    raise RuntimeError(f"SANDBOX_MCP_BACKEND={BACKEND!r}: docker, sbx or qemu")


def pytest_ignore_collect(collection_path, config):
    """test_qemu.py runs on qemu only, and on qemu nothing else runs."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if (collection_path.name == "test_qemu.py") != (BACKEND == "qemu"):
        return True
    return None


RUN_DIR = Path(tempfile.mkdtemp(prefix="mcp-e2e-", dir=os.environ.get("TMPDIR")))

# The qemu backend's state directory under the state home the servers are given: each VM's
# directory, record and sockets.
QEMU_STATE = RUN_DIR / "state" / "sandboxes" / "qemu"


def seed_accelerator_answer():
    """Copies the accelerator probe's cached answers from the VM image (where the VM suites keep
    them) into the qemu state directory, so each server and sandboxctl process does not boot the
    probe's 15 s KVM test again; without one, the first process probes and caches its own."""
    cache = QEMU_STATE / ".accel"
    cache.mkdir(parents=True, exist_ok=True)
    for entry in Path(need("QEMU_VM_IMAGE")).glob("accel-*"):
        (cache / entry.name).write_bytes(entry.read_bytes())


if BACKEND == "qemu":
    seed_accelerator_answer()


def server_env():
    env = dict(os.environ)
    # sbx-sim keeps its records under the state home: one per run, judged afterwards.
    env["XDG_STATE_HOME"] = str(RUN_DIR / "state")
    env["HOME"] = str(RUN_DIR / "home")
    (RUN_DIR / "home").mkdir(exist_ok=True)
    return env


def server_args(extra=(), state_dir=None):
    return [
        *backend_args(), "--scope", SCOPE, "--state-dir", str(state_dir or RUN_DIR / "locks"),
        "--max-timeout", "30", *extra,
    ]


def engine_sandboxes():
    """Every sandbox of the suite's scope the engine still has, as sandboxctl lists them."""
    out = subprocess.run(
        [SANDBOXCTL, *backend_args(), "--json", "list", "--scope", SCOPE],
        capture_output=True, text=True, timeout=120, env=server_env(),
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["sandboxes"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    def __init__(self, extra=(), preexec_fn=None):
        self.port = free_port()
        tokens = RUN_DIR / "tokens"
        tokens.write_text(f"# test principals\n{TOKEN_A} alice\n{TOKEN_B} bob\n")
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [BIN, *server_args(["--http", f"127.0.0.1:{self.port}", "--token-file", str(tokens), *extra])],
            env=server_env(), stdin=subprocess.DEVNULL, stderr=sys.stderr, preexec_fn=preexec_fn,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the HTTP server exited at start"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the HTTP server did not listen within 120 s")

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(timeout=120) == 0


@pytest.fixture(scope="session", autouse=True)
def nothing_left_at_the_end():
    """After every case of this worker (and its HTTP server's end), the scope is empty."""
    yield
    assert engine_sandboxes() == [], "sandboxes left on the engine at the end of the session"


@pytest.fixture(scope="session")
def http_server():
    # The cases share this server and leave sandboxes to its end; the limits on sandboxes held
    # are tested on servers of their own.
    server = HttpServer(["--max-sandboxes-per-principal", "100", "--max-sandboxes", "200"])
    yield server
    server.stop()
    assert engine_sandboxes() == [], "the HTTP server left sandboxes at its end"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["stdio", "http"])
def transport(request):
    return request.param


@asynccontextmanager
async def connect(transport, http_server=None, token=TOKEN_A, mode="auto", extra=(), state_dir=None):
    """A connected client: a fresh stdio server process (with `state_dir` as its state
    directory when given), or the shared HTTP server."""
    if transport == "stdio":
        params = StdioServerParameters(
            command=BIN, args=server_args(extra, state_dir), env=server_env(),
        )
        async with Client(params, mode=mode, read_timeout_seconds=120) as client:
            yield client
    else:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
            async with Client(
                streamable_http_client(http_server.url, http_client=http),
                mode=mode, read_timeout_seconds=120,
            ) as client:
                yield client


@pytest.fixture
def open_client(transport, request):
    def factory(**kwargs):
        server = request.getfixturevalue("http_server") if transport == "http" else None
        return connect(transport, server, **kwargs)
    return factory


class StdioLines:
    """A stdio server spoken to in plain JSON-RPC lines (the legacy handshake), for the cases that
    need the process itself: to kill it or signal it in the middle of a call."""

    def __init__(self, args):
        self.proc = subprocess.Popen(
            [BIN, *args], env=server_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr,
        )
        # A deadline for the blocking reads: a wedged server is killed, its output ends.
        self.watchdog = threading.Timer(120, self.proc.kill)
        self.watchdog.start()

    def send(self, message):
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self, request_id):
        # Each line is one JSON-RPC message; the server sends nothing unasked here, but a
        # notification would be skipped all the same.
        while True:
            line = self.proc.stdout.readline()
            assert line, "the server closed its output"
            message = json.loads(line)
            if message.get("id") == request_id:
                return message

    def initialize(self):
        self.send({"id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "lines-test", "version": "0"},
        }})
        assert "result" in self.answer(1)
        self.send({"method": "notifications/initialized"})

    def close(self):
        self.watchdog.cancel()
        self.proc.kill()
        self.proc.wait(timeout=30)


def crash_after_create():
    """Starts a stdio server, has it create one sandbox, and kills it with SIGKILL: a server that
    crashed, its sandbox left behind."""
    server = StdioLines(server_args())
    try:
        server.initialize()
        server.send({"id": 2, "method": "tools/call", "params": {"name": "sandbox_create", "arguments": {}}})
        made = server.answer(2)["result"]
        assert not made.get("isError"), made
    finally:
        server.close()

"""The sandbox-mcp server end to end, through the official `mcp` client: every tool, progress,
cancellation, lifetime, HTTP authentication and egress, on one backend (SANDBOX_MCP_BACKEND),
over stdio and Streamable HTTP."""

import asyncio
import base64
import json
import os
import re
import resource
import secrets
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND

from conftest import (
    BACKEND, BIN, RUN_DIR, SCOPE, TOKEN_A, TOKEN_B, HttpServer, StdioLines, backend_args,
    connect, crash_after_create, engine_sandboxes, server_args, server_env,
)

pytestmark = pytest.mark.anyio

# Reset and fork are listed only where the backend declares snapshot: Docker does, sbx does not.
SNAPSHOTS = BACKEND == "docker"
SNAPSHOT_TOOLS = {"sandbox_reset", "sandbox_fork"}
TOOLS = {
    "sandbox_create", "sandbox_exec", "sandbox_read_file", "sandbox_write_file",
    "sandbox_list_files", "sandbox_delete", "sandbox_list", "sandbox_dispose",
} | (SNAPSHOT_TOOLS if SNAPSHOTS else set())


async def call(client, name, args=None, **kwargs):
    result = await client.call_tool(name, args or {}, **kwargs)
    return result


async def ok(client, name, args=None, **kwargs):
    result = await call(client, name, args, **kwargs)
    assert not result.is_error, result
    assert result.structured_content is not None, result
    assert result.content and result.content[0].text, "a text copy for text-only clients"
    return result.structured_content


async def failed(client, name, args, kind):
    result = await call(client, name, args)
    assert result.is_error, result
    error = result.structured_content["error"]
    assert set(error) == {"kind", "message", "retryable"}, error
    assert error["kind"] == kind, error
    return error


async def create(client, **args):
    made = await ok(client, "sandbox_create", args)
    assert made["sandbox"].startswith("sbx_") and len(made["sandbox"]) == 36
    return made["sandbox"]


async def sh(client, box, line, **extra):
    return await ok(client, "sandbox_exec", {"sandbox": box, "command": line, **extra})


async def test_handshake_current_and_legacy(open_client):
    versions = set()
    for mode in ("auto", "legacy"):
        async with open_client(mode=mode) as client:
            versions.add(client.protocol_version)
            tools = await client.list_tools()
            assert {t.name for t in tools.tools} == TOOLS
    assert len(versions) == 2, f"current and legacy negotiate different versions: {versions}"


async def test_tools_have_schemas_and_annotations(open_client):
    async with open_client() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.annotations is not None, tool.name
    exec_props = tools["sandbox_exec"].input_schema["properties"]
    assert {"sandbox", "command", "argv", "workdir", "env", "stdin", "timeout_s", "max_output_bytes"} <= set(exec_props)
    out = tools["sandbox_exec"].output_schema["properties"]
    assert {"exit_code", "timed_out", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms"} <= set(out)
    for name in ("sandbox_read_file", "sandbox_list_files", "sandbox_list"):
        assert tools[name].annotations.read_only_hint is True, name
    for name in ("sandbox_delete", "sandbox_dispose"):
        assert tools[name].annotations.destructive_hint is True, name
    # The server is configured with closed egress: exec reaches no outside world.
    assert tools["sandbox_exec"].annotations.open_world_hint is False
    assert set(tools["sandbox_read_file"].output_schema["properties"]) >= {"content", "encoding", "size", "truncated"}
    assert set(tools["sandbox_create"].output_schema["properties"]) >= {"sandbox", "isolation", "egress", "expires_in_s"}


async def test_exec_results(open_client):
    async with open_client() as client:
        box = await create(client)
        hi = await sh(client, box, "echo hi")
        assert hi["exit_code"] == 0 and hi["stdout"] == "hi\n" and hi["timed_out"] is False
        assert hi["stdout_truncated"] is False and hi["duration_ms"] >= 0
        three = await sh(client, box, "echo out; echo err >&2; exit 3")
        assert three["exit_code"] == 3, "a non-zero exit is a result"
        assert three["stdout"] == "out\n" and three["stderr"] == "err\n"
        argv = await ok(client, "sandbox_exec", {"sandbox": box, "argv": ["printf", "%s|", "a b", "$HOME"]})
        assert argv["stdout"] == "a b|$HOME|"
        fed = await sh(client, box, "tr a-z A-Z", stdin="shout\n")
        assert fed["stdout"] == "SHOUT\n"
        env = await sh(client, box, 'printf %s "$GREETING"', env={"GREETING": "hello there"})
        assert env["stdout"] == "hello there"
        await failed(client, "sandbox_exec", {"sandbox": box, "command": "true", "env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "invalid_argument")
        await failed(client, "sandbox_exec", {"sandbox": box}, "invalid_argument")
        await failed(client, "sandbox_exec", {"sandbox": box, "command": "true", "argv": ["true"]}, "invalid_argument")


async def test_timeout_kills_and_is_flagged(open_client):
    async with open_client() as client:
        box = await create(client)
        started = time.monotonic()
        # The bound counts from the backend's start of the call, process start-up included:
        # 3 s leaves a loaded engine time to start the shell and print.
        out = await sh(client, box, "echo started; sleep 60", timeout_s=3)
        assert out["timed_out"] is True and out["exit_code"] is None
        assert out["stdout"] == "started\n"
        assert time.monotonic() - started < 30
        procs = await sh(client, box, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
        assert "sleep 60" not in procs["stdout"], "the timed-out command's processes were killed"
        assert (await sh(client, box, "echo still serving"))["stdout"] == "still serving\n"


async def test_ten_megabytes_are_truncated_head_and_tail(open_client):
    async with open_client() as client:
        box = await create(client)
        out = await sh(
            client, box,
            "echo FIRST; head -c 10000000 /dev/zero | tr '\\0' x; echo; echo LAST",
            max_output_bytes=65536,
        )
        assert out["exit_code"] == 0
        assert out["stdout_truncated"] is True and out["stderr_truncated"] is False
        assert out["stdout"].startswith("FIRST\n") and out["stdout"].endswith("LAST\n")
        assert len(out["stdout"]) < 65536 + 200
        assert "bytes omitted" in out["stdout"]


async def test_files_round_trip_list_and_delete(open_client):
    async with open_client() as client:
        box = await create(client)
        text = "grüße, 世界 🌍\nline two\n"
        wrote = await ok(client, "sandbox_write_file", {"sandbox": box, "path": "dir/hello.txt", "content": text})
        assert wrote["size"] == len(text.encode())
        back = await ok(client, "sandbox_read_file", {"sandbox": box, "path": "dir/hello.txt"})
        assert back == {"content": text, "encoding": "utf8", "size": len(text.encode()), "truncated": False}
        every = bytes(range(256))
        await ok(client, "sandbox_write_file", {"sandbox": box, "path": "dir/bytes.bin", "content": base64.b64encode(every).decode(), "encoding": "base64"})
        raw = await ok(client, "sandbox_read_file", {"sandbox": box, "path": "dir/bytes.bin"})
        assert raw["encoding"] == "base64" and base64.b64decode(raw["content"]) == every and raw["size"] == 256
        head = await ok(client, "sandbox_read_file", {"sandbox": box, "path": "dir/bytes.bin", "max_bytes": 10})
        assert head["truncated"] is True and head["size"] == 256
        assert base64.b64decode(head["content"]) == every[:10] if head["encoding"] == "base64" else head["content"].encode() == every[:10]
        listed = await ok(client, "sandbox_list_files", {"sandbox": box, "path": "dir"})
        names = {e["path"].rsplit("/", 1)[-1]: e for e in listed["entries"]}
        assert set(names) == {"hello.txt", "bytes.bin"}, listed
        assert names["bytes.bin"]["kind"] == "file" and names["bytes.bin"]["size"] == 256
        await ok(client, "sandbox_delete", {"sandbox": box, "path": "dir/hello.txt"})
        listed = await ok(client, "sandbox_list_files", {"sandbox": box, "path": "dir"})
        assert [e["path"].rsplit("/", 1)[-1] for e in listed["entries"]] == ["bytes.bin"]
        await failed(client, "sandbox_read_file", {"sandbox": box, "path": "dir/hello.txt"}, "not_found")
        await failed(client, "sandbox_read_file", {"sandbox": box, "path": "never/was.txt"}, "not_found")
        await failed(client, "sandbox_read_file", {"sandbox": box, "path": "../../etc/passwd"}, "confinement")
        await ok(client, "sandbox_delete", {"sandbox": box, "path": "dir", "recursive": True})
        await failed(client, "sandbox_list_files", {"sandbox": box, "path": "dir"}, "not_found")


async def test_file_tools_take_a_workdir_as_exec_does(open_client):
    async with open_client() as client:
        box = await create(client)
        wd = {"sandbox": box, "workdir": "w/x"}
        text = "0123456789" * 10
        await ok(client, "sandbox_write_file", {**wd, "path": "f.txt", "content": text})
        assert (await sh(client, box, "cat f.txt", workdir="w/x"))["stdout"] == text
        back = await ok(client, "sandbox_read_file", {"sandbox": box, "path": "w/x/f.txt"})
        assert back["content"] == text
        head = await ok(client, "sandbox_read_file", {**wd, "path": "f.txt", "max_bytes": 7})
        assert head == {"content": "0123456", "encoding": "utf8", "size": 100, "truncated": True}, head
        listed = await ok(client, "sandbox_list_files", wd)
        assert [(e["path"], e["kind"], e["size"]) for e in listed["entries"]] == [("f.txt", "file", 100)], listed
        await failed(client, "sandbox_read_file", {**wd, "path": "../../../../etc/passwd"}, "confinement")
        await failed(client, "sandbox_write_file", {"sandbox": box, "workdir": "../../..", "path": "x", "content": ""}, "confinement")
        await ok(client, "sandbox_delete", {**wd, "path": "f.txt"})
        await failed(client, "sandbox_read_file", {"sandbox": box, "path": "w/x/f.txt"}, "not_found")


async def test_files_persist_in_one_sandbox_and_not_across(open_client):
    async with open_client() as client:
        a, b = await create(client), await create(client)
        assert a != b
        await ok(client, "sandbox_write_file", {"sandbox": a, "path": "note.txt", "content": "mine"})
        assert (await sh(client, a, "cat note.txt"))["stdout"] == "mine"
        assert (await ok(client, "sandbox_read_file", {"sandbox": a, "path": "note.txt"}))["content"] == "mine"
        await failed(client, "sandbox_read_file", {"sandbox": b, "path": "note.txt"}, "not_found")
        assert (await sh(client, b, "test -e note.txt"))["exit_code"] == 1
        listed = {s["sandbox"] for s in (await ok(client, "sandbox_list"))["sandboxes"]}
        assert {a, b} <= listed


async def test_bad_arguments_and_unknown_tool_are_the_sdks_errors(open_client):
    async with open_client() as client:
        # Malformed arguments are refused by the SDK before any tool runs: a protocol error, or
        # (as rmcp answers, so the model can correct itself) an error result carrying the SDK's
        # text and none of the server's structured failure shape.
        for args in [
            {"sandbox": 7, "command": "true"},
            {"command": "true"},
            {"sandbox": "x", "command": "true", "bogus": 1},
            {"sandbox": "x", "argv": "not a list"},
        ]:
            try:
                result = await client.call_tool("sandbox_exec", args)
            except MCPError as error:
                assert error.code == INVALID_PARAMS, (args, error)
                continue
            assert result.is_error, (args, result)
            assert result.structured_content is None, (args, result)
            assert "parameters" in result.content[0].text, (args, result)
        with pytest.raises(MCPError) as raised:
            await client.call_tool("sandbox_no_such_tool", {})
        assert raised.value.code in (INVALID_PARAMS, METHOD_NOT_FOUND), raised.value
        # The connection serves on after each of them.
        assert (await client.list_tools()).tools


async def test_disposed_and_unknown_handles(open_client):
    async with open_client() as client:
        box = await create(client)
        assert (await ok(client, "sandbox_dispose", {"sandbox": box}))["disposed"] is True
        assert (await ok(client, "sandbox_dispose", {"sandbox": box}))["disposed"] is False
        gone = await failed(client, "sandbox_exec", {"sandbox": box, "command": "true"}, "unknown_sandbox")
        never = await failed(client, "sandbox_exec", {"sandbox": "sbx_" + "0" * 32, "command": "true"}, "unknown_sandbox")
        assert gone == never
        assert box not in {s["sandbox"] for s in (await ok(client, "sandbox_list"))["sandboxes"]}


async def test_progress_notifications_increase(open_client):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))

    async with open_client() as client:
        box = await create(client)
        out = await ok(
            client, "sandbox_exec",
            {"sandbox": box, "command": "for i in 1 2 3; do echo line$i; sleep 1; done"},
            progress_callback=on_progress,
        )
    assert out["exit_code"] == 0
    assert len(seen) >= 2, seen
    values = [p for p, _ in seen]
    assert values == sorted(set(values)), f"strictly increasing: {values}"
    assert any(m and m.startswith("line") for _, m in seen), seen


async def test_cancel_kills_every_process_and_the_sandbox_serves_on(open_client):
    async with open_client() as client:
        box = await create(client)
        probe = await sh(client, box, "touch /done-probe && rm /done-probe && echo root-writable || echo not")
        target = "/done" if probe["stdout"] == "root-writable\n" else "done"
        assert (await sh(client, box, f"test -e {target}"))["exit_code"] == 1
        started = time.monotonic()
        # The client gives up after 1 s and cancels the request (notifications/cancelled on
        # stdio, the same or a dropped request over HTTP).
        with pytest.raises(MCPError):
            await client.call_tool(
                "sandbox_exec", {"sandbox": box, "command": f"sleep 5 && touch {target}"},
                read_timeout_seconds=1,
            )
        # Killed at once, not left to finish: no process of the command is left.
        deadline = time.monotonic() + 3
        while True:
            procs = await sh(client, box, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
            if "sleep 5" not in procs["stdout"]:
                break
            assert time.monotonic() < deadline, procs["stdout"]
            await asyncio.sleep(0.2)
        # Past the moment the command would have touched the file, it is still absent.
        await asyncio.sleep(max(0.0, started + 5.5 - time.monotonic()))
        assert (await sh(client, box, f"test -e {target}"))["exit_code"] == 1, "the cancelled command ran on"
        # A control: the path is writable, so its absence above is the cancellation's doing.
        await sh(client, box, f"touch {target}")
        assert (await sh(client, box, f"test -e {target}"))["exit_code"] == 0


async def test_parallel_calls(open_client):
    # Each command notes the guest's uptime as it starts and as it ends: calls that ran at once
    # overlap, every one starting before any ended, however slow a loaded host makes each call.
    line = "read up rest </proc/uptime; echo $up; sleep 2; read up rest </proc/uptime; echo $up; echo {i}"
    async with open_client() as client:
        box = await create(client)
        outs = await asyncio.gather(*(sh(client, box, line.format(i=i)) for i in range(4)))
        spans = [o["stdout"].split("\n") for o in outs]
        assert [span[2] for span in spans] == [str(i) for i in range(4)], outs
        starts, ends = ([float(span[k]) for span in spans] for k in (0, 1))
        assert max(starts) < min(ends), f"the calls ran one after another: {outs}"


async def test_egress_cannot_be_widened(open_client):
    async with open_client() as client:
        err = await failed(client, "sandbox_create", {"allow_hosts": ["example.com"]}, "not_permitted")
        assert "narrow" in err["message"]
        made = await ok(client, "sandbox_create", {"allow_hosts": []})
        assert made["egress"] == {"mode": "closed", "allow_hosts": []}


async def test_operator_rules_and_grants_never_reach_the_model_or_the_guest():
    """--rule and --credential-file are the operator's: a sandbox's spec carries them (Docker's
    proxy enforces them; sbx, which enforces neither, refuses the sandbox), and the token shows in
    no tool result, in nothing the guest can read, nor in a refused start's error."""
    token = f"operator-{secrets.token_hex(16)}"
    grant = RUN_DIR / f"grant-{secrets.token_hex(4)}.json"
    grant.write_text(json.dumps(
        {"host": "api.example.test", "paths": ["/v1/*"], "token": token, "expires_in_secs": 600}
    ))
    grant.chmod(0o600)
    extra = [
        "--allow", "plain.example.test", "--rule", "api.example.test GET,HEAD /v1/*",
        "--credential-file", str(grant),
    ]
    seen = []
    async with connect("stdio", extra=extra) as client:
        if BACKEND == "docker":
            made = await ok(client, "sandbox_create")
            seen.append(made)
            assert made["egress"] == {
                "mode": "allowlist", "allow_hosts": ["plain.example.test", "api.example.test"],
            }, made
            # Everything the guest can read of its processes and configuration, searched here,
            # so no command line in the guest names the token.
            dump = await sh(
                client, made["sandbox"],
                "env; for p in /proc/[0-9]*; do tr '\\0' '\\n' <$p/environ; tr '\\0' ' ' <$p/cmdline; "
                "echo; done 2>/dev/null; cat /etc/maf-egress/* /run/maf-egress/*.pem 2>/dev/null",
                max_output_bytes=4 * 1024 * 1024,
            )
            seen.append(dump)
            assert "BEGIN CERTIFICATE" in dump["stdout"], dump["stderr"]
            seen.append(await ok(client, "sandbox_list"))
        else:
            error = await failed(client, "sandbox_create", {}, "not_permitted")
            seen.append(error)
        narrowed = await call(client, "sandbox_create", {"allow_hosts": ["plain.example.test"]})
        seen.append(narrowed.structured_content)
    for result in seen:
        assert token not in json.dumps(result), result
    # A credential file for a host the server does not allow: refused at start, the token unsaid.
    stray = RUN_DIR / f"stray-{secrets.token_hex(4)}.json"
    stray.write_text(json.dumps(
        {"host": "elsewhere.test", "paths": ["/"], "token": token, "expires_in_secs": 600}
    ))
    out = await asyncio.to_thread(
        subprocess.run, [BIN, *server_args(["--allow", "plain.example.test", "--credential-file", str(stray)])],
        env=server_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0, out.stderr
    assert "--credential-file" in out.stderr, out.stderr
    assert token not in out.stderr + out.stdout, out.stderr


async def test_stdio_disconnect_disposes_everything():
    # Over HTTP, the server's end is checked by its fixture.
    before = {s["instance_id"] for s in engine_sandboxes()}
    async with connect("stdio") as client:
        await create(client)
        await create(client, kind="second")
        during = {s["instance_id"] for s in engine_sandboxes()}
        mine = during - before
        assert len(mine) == 2, (before, during)
    after = {s["instance_id"] for s in engine_sandboxes()}
    assert not (mine & after), f"left on the engine: {mine & after}"


async def test_idle_sandboxes_expire():
    # One TTL per server: a stdio server of its own is started with a short one, long enough
    # that listing the engine after the create (slow on a loaded host: 2 s was once too short)
    # finds the sandbox before it expires.
    async with connect("stdio", extra=["--ttl", "6"]) as client:
        before = {s["instance_id"] for s in engine_sandboxes()}
        box = await create(client)
        mine = {s["instance_id"] for s in engine_sandboxes()} - before
        assert len(mine) == 1, mine
        # sandbox_list does not count as a use, so polling it leaves the idle clock running.
        deadline = time.monotonic() + 30
        while box in {s["sandbox"] for s in (await ok(client, "sandbox_list"))["sandboxes"]}:
            assert time.monotonic() < deadline, "the idle sandbox did not expire"
            await asyncio.sleep(0.25)
        err = await failed(client, "sandbox_exec", {"sandbox": box, "command": "true"}, "expired_sandbox")
        assert "create a new sandbox" in err["message"]
        while mine & {s["instance_id"] for s in engine_sandboxes()}:
            assert time.monotonic() < deadline, "the expired sandbox is still on the engine"
            await asyncio.sleep(0.25)


async def test_a_starting_server_clears_only_crashed_servers_sandboxes():
    async with connect("stdio") as live:
        before = {s["instance_id"] for s in engine_sandboxes()}
        kept = await create(live)
        live_ids = {s["instance_id"] for s in engine_sandboxes()} - before
        # A server that dies without a chance to clean up (SIGKILL) leaves its sandbox behind.
        await asyncio.to_thread(crash_after_create)
        crashed_ids = {s["instance_id"] for s in engine_sandboxes()} - before - live_ids
        assert len(live_ids) == 1 and len(crashed_ids) == 1, (live_ids, crashed_ids)
        # The next server to start disposes of the crashed one's, never the live one's.
        async with connect("stdio") as starting:
            await starting.list_tools()
        left = {s["instance_id"] for s in engine_sandboxes()}
        assert not (crashed_ids & left), "the crashed server's sandbox is still there"
        assert live_ids <= left, "a live server's sandbox was disposed of"
        assert (await sh(live, kept, "echo alive"))["stdout"] == "alive\n"


def lock_files(directory):
    return sorted(path.name for path in directory.glob("*.lock"))


async def test_no_file_makes_a_live_servers_sandbox_look_abandoned():
    # Servers of one scope: the first holds a sandbox; each later one starts (and sweeps the
    # scope) with another state directory, or after the first's lock was deleted, or replaced
    # by other bytes. None may dispose of the first's sandbox.
    first_dir = RUN_DIR / f"state-{secrets.token_hex(4)}"
    second_dir = RUN_DIR / f"state-{secrets.token_hex(4)}"
    async with connect("stdio", state_dir=first_dir) as first:
        box = await create(first)
        [lock] = first_dir.glob("*.lock")

        async def another_server_starts(state_dir, why):
            async with connect("stdio", state_dir=state_dir) as other:
                await other.list_tools()
            # Its start is over (it swept before it answered), and it ended cleanly.
            assert (await sh(first, box, "echo alive"))["stdout"] == "alive\n", why

        await another_server_starts(second_dir, "another state directory")
        assert second_dir.is_dir() and lock_files(second_dir) == [], "a clean end leaves no lock"
        lock.unlink()
        await another_server_starts(first_dir, "the lock deleted")
        lock.write_bytes(b"copied over\n")
        await another_server_starts(first_dir, "the lock replaced")
        assert lock_files(first_dir) == [lock.name], "only the replacement is left"
        assert box in {s["sandbox"] for s in (await ok(first, "sandbox_list"))["sandboxes"]}
    # The first server's end leaves the file put in its lock's place, which is not its own.
    assert lock.read_bytes() == b"copied over\n"


async def test_a_state_directory_others_can_write_is_refused():
    shared = RUN_DIR / f"shared-{secrets.token_hex(4)}"
    shared.mkdir()
    shared.chmod(0o777)
    out = await asyncio.to_thread(
        subprocess.run, [BIN, *server_args(state_dir=shared)], env=server_env(),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0, out.stderr
    assert "must be private to its user" in out.stderr, out.stderr
    assert list(shared.iterdir()) == [], "nothing was written there"


async def test_http_refuses_bad_host_origin_and_missing_token(http_server):
    server = http_server
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    async def post(headers):
        # Each refusal on a connection of its own: a server may close a connection after
        # refusing on it, and a POST is not retried on a connection closed under it.
        async with httpx2.AsyncClient(timeout=30) as http:
            return await http.post(server.url, json=body, headers=headers)

    r = await post(base)
    assert r.status_code == 401
    r = await post({**base, "Authorization": "Bearer " + "f" * 48})
    assert r.status_code == 401
    auth = {**base, "Authorization": f"Bearer {TOKEN_A}"}
    r = await post({**auth, "Host": "evil.example:80"})
    assert r.status_code in (400, 403, 421), r.status_code
    r = await post({**auth, "Origin": "http://evil.example"})
    assert r.status_code == 403, r.status_code


async def test_http_principal_b_cannot_use_a_handle(http_server):
    server = http_server
    async with connect("http", server, token=TOKEN_A) as alice:
        box = await create(alice)
        await ok(alice, "sandbox_write_file", {"sandbox": box, "path": "secret.txt", "content": "alice's"})
        async with connect("http", server, token=TOKEN_B) as bob:
            unknown = await failed(bob, "sandbox_read_file", {"sandbox": "sbx_" + "1" * 32, "path": "secret.txt"}, "unknown_sandbox")
            theirs = await failed(bob, "sandbox_read_file", {"sandbox": box, "path": "secret.txt"}, "unknown_sandbox")
            assert theirs == unknown
            await failed(bob, "sandbox_exec", {"sandbox": box, "command": "true"}, "unknown_sandbox")
            assert (await ok(bob, "sandbox_dispose", {"sandbox": box}))["disposed"] is False
            assert box not in {s["sandbox"] for s in (await ok(bob, "sandbox_list"))["sandboxes"]}
        assert (await ok(alice, "sandbox_read_file", {"sandbox": box, "path": "secret.txt"}))["content"] == "alice's"
        assert (await ok(alice, "sandbox_dispose", {"sandbox": box}))["disposed"] is True


class RawSession:
    """One principal's Streamable HTTP session, spoken in plain JSON-RPC over HTTP so the test
    holds the session id and can hand it to another principal."""

    HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    def __init__(self, http, url, token):
        self.http, self.url, self.token = http, url, token
        self.session = None
        self.next_id = 0

    def headers(self, token=None, session=None):
        headers = {**self.HEADERS, "Authorization": f"Bearer {token or self.token}"}
        if session or self.session:
            headers["Mcp-Session-Id"] = session or self.session
            headers["MCP-Protocol-Version"] = "2025-06-18"
        return headers

    async def open(self):
        answer = await self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "session-test", "version": "0"},
        })
        assert "result" in answer, answer
        r = await self.http.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers())
        assert r.status_code == 202, r.status_code

    async def request(self, method, params):
        self.next_id += 1
        request_id = self.next_id
        r = await self.http.post(self.url, json={"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, headers=self.headers())
        assert r.status_code == 200, (r.status_code, r.text)
        if self.session is None:
            self.session = r.headers["mcp-session-id"]
        # A JSON body, or an event stream whose data lines carry the messages.
        if r.headers.get("content-type", "").startswith("application/json"):
            messages = [r.json()]
        else:
            messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return next(m for m in messages if m.get("id") == request_id)

    async def tool(self, name, arguments):
        answer = await self.request("tools/call", {"name": name, "arguments": arguments})
        result = answer["result"]
        assert not result.get("isError"), result
        return result["structuredContent"]


async def test_http_session_answers_only_the_principal_that_opened_it(http_server):
    url = http_server.url
    async with httpx2.AsyncClient(timeout=120) as http:
        alice = RawSession(http, url, TOKEN_A)
        await alice.open()
        box = (await alice.tool("sandbox_create", {}))["sandbox"]
        # Her command runs while bob tries her session (its request id is her next one).
        running_id = alice.next_id + 1
        running = asyncio.create_task(alice.tool("sandbox_exec", {"sandbox": box, "command": "sleep 3; echo finished"}))
        await asyncio.sleep(1)
        assert not running.done()

        async def bob(method, session, body=None):
            """bob's request, with his own valid token, naming `session`: status and body."""
            headers = alice.headers(token=TOKEN_B, session=session)
            if method == "GET":
                headers["Accept"] = "text/event-stream"
            async with httpx2.AsyncClient(timeout=30) as own:
                async with own.stream(method, url, json=body, headers=headers) as r:
                    # A stream opened on her session would not end: read only a refusal's body.
                    return r.status_code, (await r.aread() if r.status_code >= 400 else b"")

        never_made = secrets.token_hex(16)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": running_id, "reason": "bob"}}
        listing = {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "sandbox_list", "arguments": {}}}
        for method, body in [("POST", cancel), ("POST", listing), ("GET", None), ("DELETE", None)]:
            hers = await bob(method, alice.session, body)
            unknown = await bob(method, never_made, body)
            assert hers[0] == 404, (method, body, hers)
            assert hers == unknown, f"{method} on her session answers unlike an unknown one: {hers} {unknown}"

        # Nothing of hers was touched: the command ran to its end, the session serves on.
        finished = await running
        assert finished["exit_code"] == 0 and finished["stdout"] == "finished\n", finished
        # (Her other cases' sandboxes on this shared server may be listed too.)
        listed = await alice.tool("sandbox_list", {})
        assert box in [s["sandbox"] for s in listed["sandboxes"]], listed
        assert (await alice.tool("sandbox_dispose", {"sandbox": box}))["disposed"] is True
        # She can end her own session; after that it is unknown to her too.
        r = await http.delete(url, headers=alice.headers())
        assert r.is_success, r.status_code
        r = await http.post(url, json=listing, headers=alice.headers())
        assert r.status_code == 404, r.status_code


def readme_server():
    """The `sandboxes` server of the README's MCP configuration snippet, exactly as written."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    configs = [json.loads(block) for block in blocks if '"mcpServers"' in block]
    assert len(configs) == 1, "the README shows one MCP configuration"
    return configs[0]["mcpServers"]["sandboxes"]


# The README's snippet is the Docker one, so the Docker run checks it (the sbx run has no test
# of it to skip).
if BACKEND == "docker":

    async def test_the_readme_snippet_works_as_pasted():
        server = readme_server()
        # As an agent host starts it: the installed binary found on PATH, the host's small
        # default environment, the snippet's arguments. Only the scope and the state directory
        # are added, so the run stays apart from any other server on this machine and leaves
        # nothing outside its directory.
        env = {name: os.environ[name] for name in ("HOME", "USER", "DOCKER_HOST") if name in os.environ}
        env["PATH"] = f"{Path(BIN).parent}{os.pathsep}{os.environ['PATH']}"
        assert Path(BIN).name == server["command"]
        params = StdioServerParameters(
            command=server["command"], env=env,
            args=[*server["args"], "--scope", SCOPE, "--state-dir", str(RUN_DIR / "locks")],
        )
        before = {s["instance_id"] for s in engine_sandboxes()}
        async with Client(params, read_timeout_seconds=120) as client:
            box = await create(client)
            assert (await sh(client, box, "echo pasted"))["stdout"] == "pasted\n"
        assert not ({s["instance_id"] for s in engine_sandboxes()} - before), "the session's sandbox remains"

    def scope_containers(scope):
        """The ids of every container, in any state, of the Docker backend's `scope`."""
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=maf-sandbox.scope={scope}"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    def sigterm_during_create(args, scope):
        """A stdio server signalled once its create's container exists; whether the create was
        answered before the signal."""
        server = StdioLines(args)
        try:
            server.initialize()
            server.send({"id": 2, "method": "tools/call", "params": {"name": "sandbox_create", "arguments": {}}})
            deadline = time.monotonic() + 60
            while not scope_containers(scope):
                assert time.monotonic() < deadline, "no container was made"
                time.sleep(0.01)
            answered = bool(select.select([server.proc.stdout], [], [], 0)[0])
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=120) == 0
            return answered
        finally:
            server.close()

    async def test_sigterm_during_a_create_leaves_no_sandbox():
        # A scope of its own: the containers counted are this server's alone.
        scope = f"{SCOPE}-term"
        args = [*backend_args(), "--scope", scope, "--state-dir", str(RUN_DIR / "locks")]
        # The signal must land while the create is in flight: once its container exists and
        # before its answer. A create that finished first proves nothing here; it is tried again.
        landed = False
        for _ in range(3):
            answered = await asyncio.to_thread(sigterm_during_create, args, scope)
            assert scope_containers(scope) == [], "a create interrupted by SIGTERM left its container"
            if not answered:
                landed = True
                break
        assert landed, "every create finished before the signal"


async def test_sandboxes_are_limited_per_principal_and_in_total():
    server = HttpServer(["--max-sandboxes-per-principal", "2", "--max-sandboxes", "3"])
    before = {s["instance_id"] for s in engine_sandboxes()}
    try:
        async with connect("http", server, token=TOKEN_A) as alice, \
                connect("http", server, token=TOKEN_B) as bob:
            # Three creates at once by one principal: two are made, the third refused.
            results = await asyncio.gather(*(call(alice, "sandbox_create") for _ in range(3)))
            made = [r.structured_content["sandbox"] for r in results if not r.is_error]
            refused = [r.structured_content["error"] for r in results if r.is_error]
            assert len(made) == 2 and len(refused) == 1, results
            assert refused[0]["kind"] == "sandbox_limit" and refused[0]["retryable"] is True, refused
            assert "dispose" in refused[0]["message"], refused
            # Another principal fills the server's total; past it, the server's own refusal.
            await create(bob)
            err = await failed(bob, "sandbox_create", {}, "sandbox_limit")
            assert err["retryable"] is True and "server" in err["message"], err
            assert len({s["instance_id"] for s in engine_sandboxes()} - before) == 3
            # A disposal makes room, as the retryable error promised.
            await ok(alice, "sandbox_dispose", {"sandbox": made[0]})
            box = await create(bob)
            assert (await sh(bob, box, "echo room"))["stdout"] == "room\n"
            assert len({s["instance_id"] for s in engine_sandboxes()} - before) == 3
    finally:
        server.stop()
    assert not ({s["instance_id"] for s in engine_sandboxes()} - before), "the server left sandboxes"


async def test_terminal_control_characters_are_escaped_and_flagged(open_client):
    async with open_client() as client:
        box = await create(client)
        out = await sh(client, box, r"printf '\033]0;title\007\033]52;c;aGk=\007\033[2Jshown\rhidden\tok\n'")
        assert out["stdout"] == "\\x1b]0;title\\x07\\x1b]52;c;aGk=\\x07\\x1b[2Jshown\\x0dhidden\tok\n", out
        assert out["control_escaped"] is True, out
        plain = await sh(client, box, "echo plain")
        assert plain["control_escaped"] is False, plain


async def test_a_stdio_request_over_the_line_limit_is_answered_with_an_error():
    await asyncio.to_thread(oversized_stdio_request)


def oversized_stdio_request():
    # Past the SDK's own 16 MiB line limit, where a request used to get no answer at all.
    server = StdioLines(server_args())
    try:
        server.initialize()
        content = "x" * (17 * 1024 * 1024)
        server.send({"id": 7, "method": "tools/call", "params": {
            "name": "sandbox_write_file",
            "arguments": {"sandbox": "sbx_none", "path": "big", "content": content},
        }})
        answer = server.answer(7)
        assert answer["error"]["code"] == -32600, answer
        assert "limit" in answer["error"]["message"], answer
        # The server reads on.
        server.send({"id": 8, "method": "ping"})
        assert "result" in server.answer(8)
    finally:
        server.close()


def flood(port, count):
    """`count` connections without a token, every other one with headers begun and never
    ended; returns them and how many the server closed at once."""
    socks = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(s)
    return socks


def closed(sock, within):
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


async def test_a_flood_of_unauthenticated_connections_is_capped_and_timed_out():
    # The server's descriptor limit is low, so a flood it kept would leave it none to serve with.
    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    cap = 32
    server = HttpServer([
        "--max-unauthenticated-connections", str(cap),
        "--http-header-timeout", "2", "--http-idle-timeout", "3",
    ], preexec_fn=low_fd_limit)
    before = {s["instance_id"] for s in engine_sandboxes()}
    socks = []
    try:
        socks = await asyncio.to_thread(flood, server.port, 400)
        at_once = sum(await asyncio.to_thread(lambda: [closed(s, 0.02) for s in socks]))
        assert at_once >= 400 - cap, f"only {at_once} of 400 were closed at once"
        started = time.monotonic()
        still = await asyncio.to_thread(lambda: [s for s in socks if not closed(s, 6)])
        assert not still and time.monotonic() - started < 6, f"{len(still)} stayed open"
        # The flood's sockets are still open on this side; the server serves a principal.
        async with connect("http", server, token=TOKEN_A) as alice:
            box = await create(alice)
            assert (await sh(alice, box, "echo served"))["stdout"] == "served\n"
            await ok(alice, "sandbox_dispose", {"sandbox": box})
    finally:
        for s in socks:
            s.close()
        server.stop()
    assert not ({s["instance_id"] for s in engine_sandboxes()} - before)


if BACKEND == "docker":

    async def test_a_command_that_kills_what_runs_it_is_not_retryable():
        # The base image's calls run under the exec init, the command's parent. Killing it ends
        # the call with a status that is not the command's; the sandbox is retired, and trying
        # the call again would only do the same.
        async with connect("stdio") as client:
            box = await create(client)
            err = await failed(client, "sandbox_exec",
                               {"sandbox": box, "command": "sleep 902 & kill -9 $PPID; sleep 30"},
                               "sandbox_gone")
            assert err["retryable"] is False, err
            assert "create a new sandbox" in err["message"], err
            again = await failed(client, "sandbox_exec", {"sandbox": box, "command": "true"}, "sandbox_gone")
            assert again["retryable"] is False, again
            await ok(client, "sandbox_dispose", {"sandbox": box})


async def test_reset_and_fork_where_the_backend_declares_snapshot(open_client):
    async with open_client() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        box = await create(client)
        if not SNAPSHOTS:
            # Not listed, and not served: the SDK's unknown-tool error.
            assert not SNAPSHOT_TOOLS & set(tools), set(tools)
            for name in sorted(SNAPSHOT_TOOLS):
                with pytest.raises(MCPError) as raised:
                    await client.call_tool(name, {"sandbox": box})
                assert raised.value.code in (INVALID_PARAMS, METHOD_NOT_FOUND), raised.value
            return
        assert tools["sandbox_reset"].annotations.destructive_hint is True
        assert set(tools["sandbox_fork"].output_schema["properties"]) >= {"sandbox", "forked_from", "egress", "expires_in_s"}

        every = bytes(range(256)) * 4
        await ok(client, "sandbox_write_file", {"sandbox": box, "path": "data/bytes.bin", "content": base64.b64encode(every).decode(), "encoding": "base64"})
        await sh(client, box, "chmod 751 data/bytes.bin && mkdir -p /tmp/made && echo x > /tmp/made/f")

        # A fork: a new handle, the files exact (bytes and mode), independent afterwards.
        fork = await ok(client, "sandbox_fork", {"sandbox": box})
        copy = fork["sandbox"]
        assert copy != box and copy.startswith("sbx_") and len(copy) == 36, fork
        assert fork["forked_from"] == box and fork["egress"]["mode"] == "closed", fork
        raw = await ok(client, "sandbox_read_file", {"sandbox": copy, "path": "data/bytes.bin"})
        assert base64.b64decode(raw["content"]) == every
        assert (await sh(client, copy, "stat -c %a data/bytes.bin"))["stdout"] == "751\n"
        await ok(client, "sandbox_write_file", {"sandbox": copy, "path": "only-in-fork", "content": "f"})
        await ok(client, "sandbox_write_file", {"sandbox": box, "path": "only-in-source", "content": "s"})
        await failed(client, "sandbox_read_file", {"sandbox": box, "path": "only-in-fork"}, "not_found")
        await failed(client, "sandbox_read_file", {"sandbox": copy, "path": "only-in-source"}, "not_found")
        listed = {s["sandbox"] for s in (await ok(client, "sandbox_list"))["sandboxes"]}
        assert {box, copy} <= listed

        # A reset: the same handle, everything made since the create gone, the fork untouched.
        reset = await ok(client, "sandbox_reset", {"sandbox": box})
        assert reset == {"sandbox": box, "reset": True}, reset
        await failed(client, "sandbox_read_file", {"sandbox": box, "path": "data/bytes.bin"}, "not_found")
        assert (await sh(client, box, "test -e /tmp/made/f"))["exit_code"] == 1
        assert (await sh(client, box, "echo after reset"))["stdout"] == "after reset\n"
        raw = await ok(client, "sandbox_read_file", {"sandbox": copy, "path": "data/bytes.bin"})
        assert base64.b64decode(raw["content"]) == every

        # Typed failures: an unknown handle, a disposed one.
        await failed(client, "sandbox_fork", {"sandbox": "sbx_" + "0" * 32}, "unknown_sandbox")
        await ok(client, "sandbox_dispose", {"sandbox": copy})
        await failed(client, "sandbox_reset", {"sandbox": copy}, "unknown_sandbox")
        await failed(client, "sandbox_fork", {"sandbox": copy}, "unknown_sandbox")
        await ok(client, "sandbox_dispose", {"sandbox": box})


async def test_a_fork_counts_against_the_limit_on_sandboxes():
    async with connect("stdio", extra=["--max-sandboxes-per-principal", "2"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert (SNAPSHOT_TOOLS <= names) == SNAPSHOTS, names
        box = await create(client)
        if not SNAPSHOTS:
            await create(client)
            await failed(client, "sandbox_create", {}, "sandbox_limit")
            return
        await ok(client, "sandbox_fork", {"sandbox": box})
        err = await failed(client, "sandbox_fork", {"sandbox": box}, "sandbox_limit")
        assert err["retryable"] is True, err
        await failed(client, "sandbox_create", {}, "sandbox_limit")

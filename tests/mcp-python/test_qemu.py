"""sandbox-mcp on the qemu backend, end to end through the official `mcp` client: the real binary
with `--backend qemu --vm-image DIR --allow-emulation --min-isolation container` over stdio
creates a sandbox (a VM booted from the image), runs commands with exact output and exit codes
inside that VM, writes and reads a file, disposes of it, and leaves no QEMU process, VM directory
or record behind. Run only with SANDBOX_MCP_BACKEND=qemu (conftest.py)."""

import json
import os
from pathlib import Path

import pytest

from conftest import QEMU_STATE, RUN_DIR, connect, engine_sandboxes, need

pytestmark = pytest.mark.anyio


async def ok(client, name, args):
    result = await client.call_tool(name, args)
    assert not result.is_error, result
    assert result.structured_content is not None, result
    return result.structured_content


def qemus_under(directory):
    """Every live process whose environment puts its TMPDIR under `directory`: the QEMUs of VMs
    there (the driver starts each with TMPDIR set to its VM's directory)."""
    prefix = f"TMPDIR={directory}/".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(v.startswith(prefix) for v in environ.split(b"\0")):
            found.append(int(proc.name))
    return found


def vm_state_left():
    """The qemu state directory's records and VM directories (dot-names, the probe's cache and
    parent, excepted)."""
    left = []
    for directory in (QEMU_STATE, QEMU_STATE / "vms"):
        if not directory.is_dir():
            continue
        left += [
            str(entry) for entry in directory.iterdir()
            if not entry.name.startswith(".") and not (directory == QEMU_STATE and entry.name == "vms")
        ]
    return left


async def test_a_vm_serves_commands_and_files_and_goes_without_a_trace():
    image = json.loads((Path(need("QEMU_VM_IMAGE")) / "vm-image.json").read_text())
    async with connect("stdio") as client:
        made = await ok(client, "sandbox_create", {})
        box = made["sandbox"]
        assert box.startswith("sbx_") and len(box) == 36
        # The accelerator the server's probe chose (its cached answer): under emulation the
        # backend is rung container, under KVM microvm.
        answer = QEMU_STATE / ".accel" / f"accel-{image['digest']}-{os.uname().release}"
        accel = answer.read_text().split()[0]
        assert made["isolation"] == ("microvm" if accel == "kvm" else "container"), (accel, made)
        assert made["egress"]["mode"] == "closed", made
        running = qemus_under(QEMU_STATE)
        assert len(running) == 1, f"one QEMU for the sandbox: {running}"

        # The command runs in the VM: its kernel is the image's, not the host's.
        kernel = await ok(client, "sandbox_exec", {"sandbox": box, "argv": ["uname", "-r"]})
        assert kernel["stdout"] == image["kernel_release"] + "\n", kernel
        assert kernel["stdout"] != os.uname().release + "\n"
        out = await ok(client, "sandbox_exec", {
            "sandbox": box, "command": "printf 'out\\n'; printf 'err' >&2; exit 3",
        })
        assert out["exit_code"] == 3, "a non-zero exit is a result"
        assert out["stdout"] == "out\n" and out["stderr"] == "err", out
        assert out["timed_out"] is False and out["stdout_truncated"] is False
        fed = await ok(client, "sandbox_exec", {"sandbox": box, "command": "tr a-z A-Z", "stdin": "shout\n"})
        assert fed["exit_code"] == 0 and fed["stdout"] == "SHOUT\n", fed

        text = "grüße from the host\nline two\n"
        wrote = await ok(client, "sandbox_write_file", {"sandbox": box, "path": "notes/hello.txt", "content": text})
        assert wrote["size"] == len(text.encode()), wrote
        back = await ok(client, "sandbox_read_file", {"sandbox": box, "path": "notes/hello.txt"})
        assert back == {"content": text, "encoding": "utf8", "size": len(text.encode()), "truncated": False}
        # The file is the guest's: a command in the VM reads the same bytes.
        cat = await ok(client, "sandbox_exec", {"sandbox": box, "command": "cat notes/hello.txt"})
        assert cat["exit_code"] == 0 and cat["stdout"] == text, cat
        # A read past max_bytes comes back as the file's head, through the agent's read (no
        # command in the guest), under a workdir as an exec's.
        head = await ok(client, "sandbox_read_file", {"sandbox": box, "workdir": "notes", "path": "hello.txt", "max_bytes": 4})
        assert head == {"content": "grü", "encoding": "utf8", "size": len(text.encode()), "truncated": True}, head

        assert (await ok(client, "sandbox_dispose", {"sandbox": box}))["disposed"] is True
        assert (await ok(client, "sandbox_list", {}))["sandboxes"] == []
        assert qemus_under(QEMU_STATE) == [], "the disposed VM's QEMU is gone"
    assert engine_sandboxes() == []
    assert qemus_under(RUN_DIR) == [], "no QEMU of the run is left"
    assert vm_state_left() == [], "no VM directory or record is left"


async def test_reset_and_fork_a_vm_through_the_tools():
    """The qemu backend declares snapshot: a fork is a copy of the VM under a new handle (its
    files, not its commands), independent afterwards; a reset restores the baseline under the
    same handle (every file made since is gone); nothing is left after both are disposed of."""
    async with connect("stdio") as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"sandbox_reset", "sandbox_fork"} <= tools, tools
        box = (await ok(client, "sandbox_create", {}))["sandbox"]
        await ok(client, "sandbox_write_file", {"sandbox": box, "path": "made.txt", "content": "before\n"})

        fork = await ok(client, "sandbox_fork", {"sandbox": box})
        copy = fork["sandbox"]
        assert copy != box and fork["forked_from"] == box, fork
        assert len(qemus_under(QEMU_STATE)) == 2, "a fork is a VM of its own"
        seen = await ok(client, "sandbox_exec", {"sandbox": copy, "command": "cat made.txt"})
        assert seen["stdout"] == "before\n", seen
        await ok(client, "sandbox_write_file", {"sandbox": copy, "path": "made.txt", "content": "fork\n"})
        source = await ok(client, "sandbox_exec", {"sandbox": box, "command": "cat made.txt"})
        assert source["stdout"] == "before\n", "a write in the fork stays in the fork"

        reset = await ok(client, "sandbox_reset", {"sandbox": box})
        assert reset["sandbox"] == box and reset["reset"] is True, reset
        gone = await ok(client, "sandbox_exec", {"sandbox": box, "command": "test -e made.txt; echo $?"})
        assert gone["stdout"] == "1\n", "the reset removed the file made after the create"
        kept = await ok(client, "sandbox_exec", {"sandbox": copy, "command": "cat made.txt"})
        assert kept["stdout"] == "fork\n", "the reset of the source leaves the fork"

        for handle in (box, copy):
            assert (await ok(client, "sandbox_dispose", {"sandbox": handle}))["disposed"] is True
        assert qemus_under(QEMU_STATE) == [], "both VMs' QEMUs are gone"
    assert engine_sandboxes() == []
    assert qemus_under(RUN_DIR) == [], "no QEMU of the run is left"
    assert vm_state_left() == [], "no VM directory or record is left"

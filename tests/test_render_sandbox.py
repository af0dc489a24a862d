"""Sandboxed workers: a crash, a hang or a fork bomb costs one request, never the pool or the machine.

The hostile functions below run only inside a sandbox worker (they are its TARGET); each
checks that it runs as an unprivileged uid before doing anything dangerous.
"""
import os
import resource
import shutil
import tempfile
import time

import pytest

from renderers.base import RenderError
from renderers.sandbox import Limits, Sandbox, processes_of

SVG = 'xmlns="http://www.w3.org/2000/svg"'
HEADER = {"backend": "resvg", "size": 64, "background": [255, 255, 255, 255]}
SMALL = f'<svg {SVG} width="8" height="8"><rect width="4" height="4"/></svg>'.encode()
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own (and so the process cap) needs root")


def identity(header, payload):
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}, payload


def fork_bomb(header, payload):
    if os.getuid() == 0 or resource.getrlimit(resource.RLIMIT_NPROC)[0] > 64:
        raise RenderError("refused", "a fork bomb runs only under a uid of its own with a process cap")
    forks = 0
    while forks < 10_000:
        try:
            if os.fork() == 0:
                while True:  # every child keeps forking too
                    try:
                        os.fork()
                    except OSError:
                        time.sleep(0.05)
        except OSError:
            break
        forks += 1
    return {"forks": forks}, b""


def sleep_forever(header, payload):
    if os.fork() == 0:
        os.setsid()  # a grandchild that leaves the process group: the uid sweep still finds it
    time.sleep(3600)


def allocate(header, payload):
    return {"bytes": len(bytearray(header["megabytes"] << 20))}, b""


def write_file(header, payload):
    with open(header["path"], "wb") as out:
        out.write(b"x")
    return {}, b""


@needs_root
def test_worker_runs_as_its_own_unprivileged_uid():
    sandbox = Sandbox("tests.test_render_sandbox:identity", Limits(nproc=16))
    try:
        reply, payload = sandbox.call({}, b"echo", 30)
    finally:
        sandbox.stop()
    assert payload == b"echo"
    assert reply["uid"] == sandbox.uid and reply["uid"] >= 1_000_000_000 and reply["gid"] == reply["uid"]
    assert reply["groups"] == [] and reply["nproc"] == 16


@needs_root
def test_fork_bomb_stops_at_the_process_cap_and_the_whole_tree_dies():
    sandbox = Sandbox("tests.test_render_sandbox:fork_bomb", Limits(nproc=16))
    try:
        reply, _ = sandbox.call({}, b"", 60)
        uid = sandbox.uid
        assert 0 < reply["forks"] < 16  # the cap counts the worker itself and every descendant
        assert 1 < len(processes_of(uid)) <= 16
    finally:
        sandbox.stop()
    assert processes_of(uid) == []


@needs_root
def test_a_timeout_kills_descendants_that_left_the_process_group():
    sandbox = Sandbox("tests.test_render_sandbox:sleep_forever", Limits(nproc=16))
    with pytest.raises(RenderError, match="timeout"):
        sandbox.call({}, b"", 1.0)
    assert sandbox.process is None and processes_of(sandbox.uid) == []


def test_segfault_costs_one_request_and_the_next_one_renders():
    sandbox = Sandbox("renderers.svg:render_request")
    deep = f'<svg {SVG}>' + "<g>" * 20_000 + "<rect/>" + "</g>" * 20_000 + "</svg>"  # past the checks on purpose
    try:
        with pytest.raises(RenderError) as caught:
            sandbox.call(HEADER, deep.encode(), 60)
        assert caught.value.reason == "crashed" and "SIGSEGV" in caught.value.detail
        _, png = sandbox.call(HEADER, SMALL, 60)
        assert png.startswith(b"\x89PNG") and sandbox.restarts == 2
    finally:
        sandbox.stop()


def test_cairosvg_use_bomb_ends_as_a_timeout_and_the_worker_is_replaced():
    from tests.test_render_svg import use_bomb

    sandbox = Sandbox("renderers.svg:render_request")
    try:
        with pytest.raises(RenderError, match="timeout"):
            sandbox.call({**HEADER, "backend": "cairosvg"}, use_bomb(7).encode(), 2.0)
        _, png = sandbox.call(HEADER, SMALL, 60)
        assert png.startswith(b"\x89PNG")
    finally:
        sandbox.stop()


def test_memory_cap_turns_a_huge_allocation_into_a_crash_reject():
    sandbox = Sandbox("tests.test_render_sandbox:allocate", Limits(memory_mb=512))
    try:
        assert sandbox.call({"megabytes": 16}, b"", 30)[0]["bytes"] == 16 << 20
        with pytest.raises(RenderError, match="crashed"):
            sandbox.call({"megabytes": 2048}, b"", 30)
        assert sandbox.call({"megabytes": 16}, b"", 30)[0]["bytes"] == 16 << 20
    finally:
        sandbox.stop()


def test_a_worker_cannot_write_files():
    # A folder the worker's uid may create files in, so that only the write cap can stop the write.
    folder = tempfile.mkdtemp(prefix="datapipe-sandbox-write-")
    os.chmod(folder, 0o777)
    target = os.path.join(folder, "out.bin")
    sandbox = Sandbox("tests.test_render_sandbox:write_file")
    try:
        with pytest.raises(RenderError) as caught:
            sandbox.call({"path": target}, b"", 30)
        assert caught.value.reason == "crashed" and "File too large" in caught.value.detail  # RLIMIT_FSIZE 0
        assert os.path.getsize(target) == 0  # it could open the file, and wrote nothing into it
    finally:
        sandbox.stop()
        shutil.rmtree(folder)

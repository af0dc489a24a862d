"""Sandboxed worker processes: untrusted input meets native code only in here.

A worker is a fresh Python process (`python -m renderers.sandbox serve TARGET LIMITS`) that
imports its function while still trusted, then, before it reads any input:
- sets rlimits: address space (`memory_mb`), process count (`nproc`, which also bounds
  threads), open files, no core dumps, no file writes (RLIMIT_FSIZE 0, SIGXFSZ ignored so a
  write fails instead of killing);
- when started as root, drops to a uid and gid of its own (UID_BASE + parent pid * 64 + n, no
  supplementary groups). RLIMIT_NPROC is ignored for root but counts every process of a uid,
  so a uid of its own turns it into a per-worker cap (a fork bomb stops at `nproc`), and lets
  the parent kill the whole tree by uid, even processes that left the process group;
- asks the kernel to kill it if its parent dies (PR_SET_PDEATHSIG) and forbids privilege
  gain (PR_SET_NO_NEW_PRIVS).
Requests and replies are a JSON header plus a byte payload, length-prefixed, never pickle: a
compromised worker must not be able to run code in the parent. The parent waits with a
deadline; on a timeout, a crash (EOF: segfault, abort, Rust panic) or a garbled reply it kills
every process of the worker's uid and starts a fresh worker for the next request. A crash
costs one request, never the pool. Without root the worker keeps the caller's uid: the
rlimits and the process-group kill still apply, the per-worker process cap does not.

`sandbox_exec` applies the same limits and uid drop to another program (Chromium), and,
as root where /sys/fs/cgroup can be written, puts it in a memory cgroup of its own
(`cgroup_memory_mb`: the whole process tree's memory, which RLIMIT_AS cannot cap for a
program like V8 that reserves terabytes of address space); past it the kernel kills a
process of that tree. Without root or a writable cgroup tree the cap is left out, with a
warning.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import resource
import selectors
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from renderers.base import RenderError

UID_BASE = 1_000_000_000  # far above any real account, below 2^31 (some tools treat uids as signed)
FRAME = struct.Struct(">II")  # header length, payload length
MAX_REPLY_BYTES = 256 << 20  # a reply larger than this is a misbehaving worker, not an image
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
STARTUP_TIMEOUT_S = 60.0  # imports on a loaded 2-core machine; a render timeout starts after this
_uid_counter = itertools.count()
CGROUP_V2, CGROUP_V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")  # unified tree; v1 memory hierarchy
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    memory_mb: int | None = 1024  # RLIMIT_AS; None for programs that reserve huge address space (V8)
    nproc: int = 64  # processes and threads of the worker's uid
    nofile: int = 256
    fsize: int | None = 0  # bytes a worker may write to a file; None for programs that need a profile
    cgroup_memory_mb: int | None = None  # the whole tree's memory, in a cgroup of its own (root only)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def allocate_uid() -> int | None:
    """A uid no other live worker uses, or None when we cannot switch users (not root)."""
    if os.geteuid() != 0:
        return None
    return UID_BASE + (os.getpid() % (1 << 22)) * 64 + next(_uid_counter) % 64


def confine(limits: Limits, uid: int | None) -> None:
    """In the child, before it touches input: rlimits, then the uid drop, then prctl flags."""
    caps = {resource.RLIMIT_NOFILE: limits.nofile, resource.RLIMIT_CORE: 0}
    if limits.memory_mb is not None:
        caps[resource.RLIMIT_AS] = limits.memory_mb << 20
    if limits.fsize is not None:
        caps[resource.RLIMIT_FSIZE] = limits.fsize
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if uid is not None:
        caps[resource.RLIMIT_NPROC] = limits.nproc
    for which, value in caps.items():
        resource.setrlimit(which, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def processes_of(uid: int) -> list[int]:
    """Live processes whose real uid is `uid` (zombies hold no resources and ignore SIGKILL)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status") as status:
                    fields = dict(line.split(":", 1) for line in status if line.startswith(("State:", "Uid:")))
            except (OSError, ValueError):
                continue  # exited while we looked
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                pids.append(int(entry.name))
    return pids


def kill_tree(pid: int | None, uid: int | None) -> None:
    """SIGKILL the process group of pid, then (own uid) every process of the uid until none is left."""
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if uid is None:
        return
    for _ in range(100):  # a fork bomb capped at nproc dies in one or two sweeps
        survivors = processes_of(uid)
        if not survivors:
            return
        for survivor in survivors:
            try:
                os.kill(survivor, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


class Sandbox:
    """One sandboxed worker process serving `target` ("module:function"), restarted on failure.

    The function takes (header: dict, payload: bytes) and returns (header, payload); it may
    raise RenderError, which comes back as the same RenderError.
    """

    def __init__(self, target: str, limits: Limits = Limits()):
        self.target = target
        self.limits = limits
        self.process: subprocess.Popen | None = None
        self.uid: int | None = None
        self.restarts = 0
        self.env: dict[str, str] = {}  # added to worker_env() for the next worker (settings its preload reads)

    def call(self, header: dict[str, Any], payload: bytes, timeout_s: float) -> tuple[dict[str, Any], bytes]:
        process = self.ensure_started()
        deadline = time.monotonic() + timeout_s
        try:
            write_frame(process.stdin, header, payload)
            reply, body = read_frame(process.stdout.fileno(), deadline)
        except TimeoutError:
            self.stop()
            raise RenderError("timeout", f"no reply within {timeout_s:g}s; worker killed") from None
        except (BrokenPipeError, EOFError, ValueError, TypeError) as err:
            detail = self.stop()
            raise RenderError("crashed", f"{detail or type(err).__name__}") from None
        if "error" in reply:
            if reply.get("fatal"):
                self.stop()
            raise RenderError(reply["error"], reply.get("detail", ""))
        return reply, body

    def ensure_started(self) -> subprocess.Popen:
        """A live worker, started (and waited for: imports take ~0.5 s) when there is none."""
        if self.process is not None and self.process.poll() is None:
            return self.process
        self.stop()
        self.uid = allocate_uid()
        self.process = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, start_new_session=True, cwd="/", env=worker_env() | self.env)
        self.restarts += 1
        try:
            read_frame(self.process.stdout.fileno(), time.monotonic() + STARTUP_TIMEOUT_S)
        except (TimeoutError, EOFError, ValueError, TypeError) as err:
            raise RenderError("crashed", f"worker {self.target} did not start: {self.stop() or err!r}") from None
        return self.process

    def command(self) -> list[str]:
        """The worker's argv (a subclass may wrap it: renderers.codebox runs it in bubblewrap)."""
        return [sys.executable, "-m", "renderers.sandbox", "serve", self.target, self.limits.to_json(),
                "" if self.uid is None else str(self.uid)]

    def stop(self) -> str:
        """Kill the worker's whole tree; return how it ended ("killed by SIGSEGV", "exit 3")."""
        if self.process is None:
            return ""
        process, self.process = self.process, None
        kill_tree(process.pid, self.uid)
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        code = process.wait()
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"

    close = stop


def worker_env() -> dict[str, str]:
    """A minimal environment: no inherited secrets, no writable home."""
    keep = ("PATH", "LANG", "LC_ALL", "VIRTUAL_ENV")  # PYTHONPATH is set below
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env["HOME"] = "/nonexistent"
    # Keep render-sized buffers (a 512-px RGBA pixmap is 1 MiB) on the heap for reuse: glibc would
    # mmap and unmap each one, and the page faults cost ~20% of an icon's render (measured).
    env.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(128 << 20))
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the parent's modules, Ray's too
    return env


def write_frame(stream, header: dict[str, Any], payload: bytes) -> None:
    encoded = json.dumps(header).encode()
    stream.write(FRAME.pack(len(encoded), len(payload)) + encoded + payload)
    stream.flush()


def read_frame(fd: int, deadline: float | None) -> tuple[dict[str, Any], bytes]:
    """Read one frame from fd; TimeoutError past the deadline, EOFError on a closed pipe."""
    header_len, payload_len = FRAME.unpack(read_exact(fd, FRAME.size, deadline))
    if header_len + payload_len > MAX_REPLY_BYTES:
        raise ValueError(f"frame of {header_len + payload_len} bytes")
    header = json.loads(read_exact(fd, header_len, deadline))
    if not isinstance(header, dict):
        raise TypeError("frame header is not an object")
    return header, read_exact(fd, payload_len, deadline)


def read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, remaining = [], size
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while remaining:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and (wait <= 0 or not selector.select(wait)):
                raise TimeoutError
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            remaining -= len(chunk)
    return b"".join(chunks)


def serve(target: str, limits: Limits, uid: int | None) -> None:
    """The worker's loop: confine, then answer frames until stdin closes."""
    from datapipe.stage import load

    function: Callable = load(target)  # imported (native libraries, fonts) while still trusted
    getattr(sys.modules[function.__module__], "preload", lambda: None)()
    stdin, stdout = sys.stdin.buffer.fileno(), sys.stdout.buffer
    confine(limits, uid)
    write_frame(stdout, {"ready": True}, b"")
    while True:
        try:
            header, payload = read_frame(stdin, None)
        except EOFError:
            return
        write_frame(stdout, *answer(function, header, payload))


def answer(function: Callable, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    try:
        return function(header, payload)
    except RenderError as err:
        return {"error": err.reason, "detail": err.detail[:500]}, b""
    except MemoryError:
        return {"error": "crashed", "detail": "out of memory", "fatal": True}, b""
    except BaseException as err:  # noqa: BLE001 - a Rust panic is a BaseException; the worker is suspect after it
        return {"error": "crashed", "detail": f"{type(err).__name__}: {err}"[:500], "fatal": True}, b""


def sandbox_exec(limits: Limits, uid: int | None, argv: list[str]) -> None:
    """Replace this process with argv, confined. A `--user-data-dir=` folder (Chromium's
    profile, made by the launcher as root) is handed to the uid first."""
    if limits.cgroup_memory_mb is not None and uid is not None:
        join_memory_cgroup(cgroup_name(uid), limits.cgroup_memory_mb)
    profiles = [arg.split("=", 1)[1] for arg in argv if arg.startswith("--user-data-dir=")]
    if uid is not None:
        for profile in profiles:
            chown_tree(profile, uid)
    if profiles:  # Chromium writes caches and its singleton socket under $HOME / $TMPDIR: its own profile
        os.environ.update(HOME=profiles[0], XDG_CONFIG_HOME=profiles[0], XDG_CACHE_HOME=profiles[0], TMPDIR=profiles[0])
    if os.getpgrp() != os.getpid():
        os.setsid()
    confine(limits, uid)
    os.execv(argv[0], argv)


def cgroup_name(uid: int | str) -> str:
    return f"datapipe-{uid}"


def memory_cgroup_root() -> tuple[Path, str] | None:
    """(where memory cgroups are made, the limit file's name), or None where there is none."""
    if "memory" in read_or_empty(CGROUP_V2 / "cgroup.controllers").split():
        return CGROUP_V2, "memory.max"
    if (CGROUP_V1 / "memory.limit_in_bytes").exists():
        return CGROUP_V1, "memory.limit_in_bytes"
    return None


def read_or_empty(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def join_memory_cgroup(name: str, limit_mb: int) -> None:
    """Make cgroup `name` capped at limit_mb (no swap where that can be set) and move this
    process into it; its children are born inside. Where that fails, a warning."""
    found = memory_cgroup_root()
    try:
        if found is None:
            raise OSError("no memory controller under /sys/fs/cgroup")
        root, limit_file = found
        folder = root / name
        folder.mkdir(exist_ok=True)
        (folder / limit_file).write_text(str(limit_mb << 20))
        for swap in ("memory.swap.max", "memory.memsw.limit_in_bytes"):  # absent without swap accounting
            if (folder / swap).exists():
                try:
                    (folder / swap).write_text("0" if swap.endswith("max") else str(limit_mb << 20))
                except OSError:
                    pass
        (folder / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        log.warning("no memory cgroup for %s (%s): its memory is capped only by its own limits", name, err)


def memory_cgroups_work() -> bool:
    """Whether this process can make memory cgroups (root, a writable tree): a probe made and removed."""
    found = memory_cgroup_root()
    if found is None or os.geteuid() != 0:
        return False
    probe = found[0] / cgroup_name(f"probe-{os.getpid()}")
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def remove_memory_cgroups(name: str = "") -> None:
    """Remove cgroup `name`, or with no name every empty datapipe cgroup (ones whose owner was killed
    before it could clean up); a cgroup with live processes stays (the kernel refuses)."""
    found = memory_cgroup_root()
    if found is None:
        return
    for folder in [found[0] / name] if name else found[0].glob(cgroup_name("*")):
        for _ in range(50 if name else 1):  # processes killed a moment ago may still be leaving it
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def chown_tree(folder: str, uid: int) -> None:
    for root, dirs, files in os.walk(folder):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        _, target, limits, uid = argv
        serve(target, Limits(**json.loads(limits)), int(uid) if uid else None)
    elif argv[:1] == ["exec"]:
        _, limits, uid, _separator, *command = argv  # exec LIMITS UID -- PROGRAM ARGS...
        sandbox_exec(Limits(**json.loads(limits)), int(uid) if uid else None, command)
    else:
        raise SystemExit("usage: python -m renderers.sandbox serve TARGET LIMITS UID | exec LIMITS UID -- PROGRAM ...")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Running untrusted programs (3D scene programs, CAD scripts): a warm worker in bubblewrap, a forked
child per script.

Layers, each enough on its own for what it targets:
- the worker runs in `bwrap` with its own network namespace (no interface but a down loopback:
  a connect to 127.0.0.1 fails and the server sees nothing), pid, IPC and UTS namespaces, and a
  file system of its own: /usr, the Python installation, the venv and this package read-only,
  /proc of its pid namespace, a minimal /dev, a tmpfs /tmp; the host's root only at /host;
- the worker imports the CAD kernel once (CadQuery: ~5 s, ~450 MB) and forks a child per script.
  The child makes a mount namespace of its own, mounts a fresh tmpfs on /tmp (its scratch), binds
  its asset folder and the library folders read-only at their own paths, detaches /host, then
  sets rlimits (CPU seconds, address space, file size, open files; RLIMIT_NPROC under a uid of
  its own, which holds where root's would not: a fork storm stops at `nproc`), drops to that uid
  with no capabilities, no supplementary groups and no_new_privs, and only then runs the script;
- inside the child a Python audit hook refuses process creation (os.system, subprocess, exec,
  fork), sockets, and opening files outside the allowed roots, so a script that tries gets the
  specific reject render.forbidden (the layers above stop it anyway: the hook names the attempt);
- the worker waits with a deadline, then kills every process of its pid namespace but itself:
  a child that ran past `timeout_s` (or RLIMIT_CPU), a fork storm's orphans, a process that left
  the child's group. A worker that dies is restarted by renderers.sandbox.Sandbox.

Cost, over running the same script bare in a warm process (bench/render_cad.py, 11 real scripts):
one fork of a ~550 MB worker, the child's first touch of what it uses (copy-on-write faults), its
exit, a mount namespace and an overlay. settle_worker halves fork and exit (huge pages) and takes
first-use work out of the child (a warm-up script): 1.45x -> 1.35x (target 1.2x: not met; the rest is
copy-on-write faults of the objects a script touches, which Python 3.11's refcounts write).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from renderers.base import RenderError
from renderers.sandbox import Sandbox, read_frame, write_frame

BWRAP = "/usr/bin/bwrap"
HOST = "/host"  # the host's root, read-only, seen by the warm worker only; each child detaches it
CLONE_NEWNS, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MNT_DETACH = 0x20000, 1, 2, 4, 4096, 16384, 2
SCRATCH_MB = 256  # the child's private /tmp
MADV_COLLAPSE = 25  # Linux 6.1+: back a range with transparent huge pages now, not when khugepaged gets to it
HUGE_PAGE = 2 << 20
SYSTEM_READ_ROOTS = ("/usr", "/etc/fonts", "/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu",
                     "/dev/null", "/dev/urandom", "/dev/zero")  # what numpy, OCCT and fontconfig read at run time
FORBIDDEN_EVENTS = ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                    "os.forkpty", "pty.spawn", "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
                    "os.kill", "os.killpg", "signal.pthread_kill")
_libc = None


def libc():
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    return _libc


def python_roots() -> list[str]:
    """Folders the interpreter and its packages live in: sys.prefix, the base install, every path entry."""
    import renderers

    roots = {sys.prefix, sys.base_prefix, str(Path(renderers.__file__).resolve().parent.parent)}
    roots.update(os.path.abspath(entry) for entry in sys.path if entry and os.path.isdir(entry))
    resolved = sorted({str(Path(root).resolve()) for root in roots} | roots)
    return [root for root in resolved if not any(root != other and root.startswith(other + "/") for other in resolved)]


def bwrap_command(argv: list[str]) -> list[str]:
    command = [BWRAP, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
               "--ro-bind", "/", HOST, "--ro-bind", "/usr", "/usr", "--ro-bind-try", "/etc/fonts", "/etc/fonts",
               "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for name in ("lib", "lib64", "bin", "sbin"):
        command += ["--symlink", f"usr/{name}", f"/{name}"]
    command += ["--tmpfs", "/tmp"]  # before the binds: a checkout or venv under /tmp stays visible
    roots = python_roots()
    for folder in sorted({str(parent) for root in roots for parent in Path(root).parents if str(parent) != "/"}):
        command += ["--perms", "0755", "--dir", folder]  # bwrap makes the folders above a bind 0700 otherwise
    for root in roots:
        command += ["--ro-bind", root, root]
    return command + ["--proc", "/proc", "--dev", "/dev", "--chdir", "/", "--"] + argv


class CodeSandbox(Sandbox):
    """A Sandbox whose worker runs in bubblewrap and stays root there (to give each child its own
    mounts); the uid it was allocated goes to the children, which drop to it."""

    def command(self) -> list[str]:
        if os.geteuid() != 0 or not os.path.exists(BWRAP):
            raise RenderError("crashed", "running programs needs root and bubblewrap (apt-get install bubblewrap): "
                                         "each script gets its own uid and mount namespace")
        argv = super().command()
        return bwrap_command(argv[:-1] + [""])

    def run(self, header: dict[str, Any], code: str, timeout_s: float) -> tuple[dict[str, Any], bytes]:
        self.ensure_started()
        header = {**header, "uid": self.uid, "timeout_s": timeout_s}
        return self.call(header, code.encode("utf-8", "surrogatepass"), timeout_s + 15)  # the worker times out first


# ---- in the worker: one child per script ------------------------------------------------------

def settle_worker(warm_up: Callable[[], object] | None = None) -> None:
    """Once, after the worker's imports and before its first fork: make each child's run, fork and exit cheap.

    - warm_up() runs a small script in the worker (trusted) so that OCCT's and Python's first-use work
      (lazy initialisation, method caches, the exporter's imports) is done once, not in every child:
      the first box-with-a-hole in a fresh child cost 32 ms, 13 ms once warm. It must stay serial: a
      parallel OCCT operation would start a thread pool here whose threads a forked child lacks (the
      child then waits on them for good), so a warm-up that starts threads is refused;
    - gc.freeze(): a child's collections no longer walk (and so copy) the worker's objects;
    - the worker's anonymous memory (heap and mmaps: ~230 MB after importing CadQuery) collapsed into
      2 MB huge pages where a whole aligned 2 MB fits (~150 MB of it): fork copies one page-table
      entry per 2 MB instead of 512, and a child's exit drops one (fork 17 -> 9 ms, the exit of a
      child that did nothing 20 -> 11 ms; ~1 s of CPU once). A child that writes into a huge page
      splits its own mapping and copies 4 KB, as before; the worker's stays whole. Where the kernel
      refuses (before 6.1: EINVAL; no huge page free: EAGAIN) the worker forks as before.
    Together (bench on a CadQuery box with a hole, sandboxed, CPU per script): 97 ms -> 67 ms."""
    if warm_up is not None:
        threads = len(os.listdir("/proc/self/task"))
        warm_up()
        if len(os.listdir("/proc/self/task")) > threads:
            raise RuntimeError("the worker's warm-up started threads (a parallel OCCT operation?): forked children "
                               "would wait on threads they do not have; keep the warm-up script serial")
    gc.collect()
    gc.freeze()
    madvise = libc().madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start, end in anonymous_ranges():
        low, high = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if high > low:
            madvise(low, high - low, MADV_COLLAPSE)  # best effort: a refusal leaves the range as it was


def anonymous_ranges() -> list[tuple[int, int]]:
    """(start, end) of this process's private writable memory that no file backs: the heap and mmaps."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if fields[1] == "rw-p" and (len(fields) < 6 or fields[5] == "[heap]"):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def run_child(job: Callable[[dict, str], tuple[dict, bytes]], header: dict[str, Any], code: str, guarded: bool = True
              ) -> tuple[dict[str, Any], bytes]:
    """Fork, confine the child (isolate) and run job(header, code) there; its reply, or a RenderError.
    guarded: the audit hook too (Python scripts; not for a job that runs a program such as openscad)."""
    read_end, write_end = os.pipe()
    gc.freeze()  # the worker's objects leave the collector's view: a child's collections would touch (copy) them all
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        child_main(job, header, code, write_end, guarded)
    os.close(write_end)
    deadline = time.monotonic() + header["timeout_s"]
    try:
        reply, payload = read_frame(read_end, deadline)
    except TimeoutError:
        raise RenderError("timeout", f"the script ran past {header['timeout_s']:g}s; killed") from None
    except (EOFError, ValueError, TypeError):
        raise RenderError(*child_death(pid)) from None
    finally:
        os.close(read_end)
        kill_namespace()
    if "error" in reply:
        raise RenderError(reply["error"], reply.get("detail", ""))
    return reply, payload


def child_main(job: Callable, header: dict[str, Any], code: str, fd: int, guarded: bool) -> None:
    """In the forked child: isolate, run, reply, exit (never return into the worker's loop)."""
    out = os.fdopen(fd, "wb")
    quiet = os.open("/dev/null", os.O_WRONLY)
    os.dup2(quiet, 1)  # fd 1 is the worker's reply pipe: a script's print() must not land in the protocol
    os.dup2(quiet, 2)
    violations: list[str] = []
    try:
        isolate(header)
        if guarded:
            guard(header, violations)
        reply, payload = job(header, code)
    except RenderError as err:
        reply, payload = {"error": err.reason, "detail": err.detail[:500]}, b""
    except MemoryError:
        reply, payload = {"error": "out_of_memory", "detail": f"past memory_mb={header['memory_mb']}"}, b""
    except BaseException as err:  # noqa: BLE001 - whatever the script raised is its reject reason
        reply, payload = {"error": "script_error", "detail": f"{type(err).__name__}: {err}"[:500]}, b""
    if violations:
        reply, payload = {"error": "forbidden", "detail": "; ".join(violations[:5])[:500]}, b""
    try:
        write_frame(out, reply, payload)
    finally:
        os._exit(0)


def child_death(pid: int) -> tuple[str, str]:
    """(reason, detail) for a child that closed its pipe without a reply."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return "timeout", "past its CPU seconds (RLIMIT_CPU)"
        if sig == signal.SIGKILL:
            return "out_of_memory", "killed (memory)"
        return "crashed", f"killed by {signal.Signals(sig).name}"
    return "crashed", f"exit {os.WEXITSTATUS(status)} without a reply"


def kill_namespace() -> None:
    """SIGKILL every process of this pid namespace except pid 1 (bwrap) and this worker, and reap them."""
    me = os.getpid()
    for _ in range(50):
        others = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in (1, me)]
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                os.kill(pid, signal.SIGKILL)
        reap()
        time.sleep(0.005)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def isolate(header: dict[str, Any]) -> None:
    """Own mounts (scratch /tmp, the asset and library folders read-only, no /host), then rlimits, then the uid."""
    call(libc().unshare(CLONE_NEWNS), "unshare")
    call(libc().mount(b"none", b"/", None, MS_REC | (1 << 18), None), "make / private")  # MS_PRIVATE
    call(libc().mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, f"size={SCRATCH_MB}m,mode=1777".encode()),
         "tmpfs /tmp")
    under_tmp = [root for root in header["python_roots"] if root.startswith("/tmp/")]  # a checkout or venv in /tmp
    for folder in [header["asset_dir"], *header.get("libraries", []), *under_tmp]:
        if folder:
            bind_readonly(folder)
    call(libc().umount2(HOST.encode(), MNT_DETACH), "detach /host")
    os.chdir(work_folder(header) if header.get("scratch_cwd") else header["asset_dir"] or "/tmp")
    os.environ.update(HOME="/tmp", TMPDIR="/tmp")
    confine_child(header)


def work_folder(header: dict[str, Any]) -> str:
    """A writable working folder in the scratch showing the asset folder's files: an overlay whose
    writes land in the scratch (result.export("part.stl") works, even over a file of the same name),
    the assets staying read-only below it."""
    work, upper, scratch = "/tmp/work", "/tmp/.upper", "/tmp/.overlay"
    for folder in (work, upper, scratch):
        os.mkdir(folder, 0o755)
    if header["uid"] is not None:
        os.chown(upper, header["uid"], header["uid"])
    if header["asset_dir"]:
        options = f"lowerdir={header['asset_dir']},upperdir={upper},workdir={scratch}".encode()
        call(libc().mount(b"overlay", work.encode(), b"overlay", MS_NOSUID | MS_NODEV, options), "overlay")
    elif header["uid"] is not None:
        os.chown(work, header["uid"], header["uid"])
    return work


def bind_readonly(folder: str) -> None:
    os.makedirs(folder, mode=0o755, exist_ok=True)
    source = (HOST + folder).encode()
    call(libc().mount(source, folder.encode(), None, MS_BIND | MS_REC, None), f"bind {folder}")
    call(libc().mount(None, folder.encode(), None, MS_BIND | MS_REC | 32 | MS_RDONLY | MS_NOSUID, None),
         f"read-only {folder}")  # 32: MS_REMOUNT


def call(result: int, what: str) -> None:
    if result != 0:
        raise RenderError("crashed", f"sandbox: {what} failed: {os.strerror(ctypes.get_errno())}")


def confine_child(header: dict[str, Any]) -> None:
    memory = header["memory_mb"] << 20
    cpu = max(1, int(header["timeout_s"]))
    caps = {resource.RLIMIT_AS: memory, resource.RLIMIT_CPU: cpu, resource.RLIMIT_FSIZE: 64 << 20,
            resource.RLIMIT_NOFILE: 256, resource.RLIMIT_CORE: 0, resource.RLIMIT_NPROC: header["nproc"]}
    for which, value in caps.items():
        resource.setrlimit(which, (value, value))
    uid = header["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    libc().prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    libc().prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def guard(header: dict[str, Any], violations: list[str]) -> None:
    """The audit hook: record and refuse processes, sockets and files outside the allowed roots."""
    sys.dont_write_bytecode = True  # imports would try to write .pyc files beside read-only sources
    readable = tuple(SYSTEM_READ_ROOTS) + tuple(header["python_roots"]) + tuple(
        folder for folder in [header["asset_dir"], *header.get("libraries", [])] if folder)

    def hook(event: str, args: tuple) -> None:
        if event.startswith(FORBIDDEN_EVENTS):
            violations.append(event)
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and isinstance(args[0], (str, bytes)) and not allowed_path(args, readable):
            violations.append(f"open {os.fsdecode(args[0])[-100:]} (mode {args[1]})")
            raise PermissionError(f"sandbox: {os.fsdecode(args[0])} is outside the script's folders")

    sys.addaudithook(hook)


def allowed_path(args: tuple, readable: tuple[str, ...]) -> bool:
    path = os.path.abspath(os.fsdecode(args[0]))
    flags = args[2] if isinstance(args[2], int) and args[2] > 0 else 0  # io.open_code passes no flags
    writing = any(flag in str(args[1] or "") for flag in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)
    if path == "/tmp" or path.startswith("/tmp/"):  # the private scratch: what the script wrote there
        return writing or os.path.exists(path)
    return not writing and any(path == root or path.startswith(root.rstrip("/") + "/") for root in readable)

"""Stop the Ray that a run started when the run dies, however it dies.

`ray.init()` without an address starts a Ray session of a dozen processes. A normal exit or a
Ctrl-C stops them (`ray.shutdown` at exit); a SIGKILL of the driver does not: gcs_server, the
raylet and the workers exit on their own, but the dashboard and runtime-env agents live on,
re-parented to init and ignoring SIGTERM (measured on Ray 2.60, Linux).

So before `ray.init` the driver starts this watchdog: `python -m datapipe.pipeline.reaper PID`,
in a session of its own (a Ctrl-C or a closed terminal does not reach it), reading a pipe whose
only write end the driver holds (close-on-exec: no Ray process inherits it). Once Ray is up the
driver writes the session folder into the pipe. When the pipe ends, which the kernel does when
the driver exits however it exits, the watchdog stops every process of that session:

- whose command line names the session folder (gcs_server, the raylet, the dashboard, the
  monitors), or whose stdout or stderr is a file in it (workers and agents: Ray replaces their
  command line with `ray::...`, but each writes its log there);
- that the driver started after the watchdog, recorded every 0.2 s with its start time until the
  folder is known (a reused pid is never taken for it): a driver killed inside `ray.init` leaves
  nothing either (the folder is then the one the recorded processes' command lines name);
- and every descendant of those (a render actor's Chromium, an LLM actor's engine).

SIGTERM first, SIGKILL 2 s later, then a last look for anything started meanwhile. Processes of
other sessions match none of these; a cluster the driver joined is never watched (the runner
starts the watchdog only for a Ray it starts). Linux only (it reads /proc); elsewhere no
watchdog starts and a killed driver can leave the agents behind, as plain Ray does.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
RECORD_EVERY_S = 0.2  # how often the driver's new children are recorded while Ray starts (a /proc scan: ~6 ms)
GRACE_S = 2.0  # SIGTERM to SIGKILL: gcs_server and the raylet stop in well under a second
MONITOR_SCRIPT = b"/autoscaler/_private/monitor.py"  # Ray's autoscaler monitor, run by python
ROUNDS = 3  # scans for processes started while the others were being stopped (a worker the raylet was forking)


class Process(NamedTuple):
    ppid: int
    start: int  # clock ticks after boot: with the pid, names a process for good
    zombie: bool


def watch() -> int | None:
    """Start the watchdog for this process; return the pipe's write end (None where /proc is missing).

    Keep the descriptor open for the life of the process: closing it is what starts the cleanup."""
    if not (PROC / "self" / "stat").exists():
        return None
    read_end, write_end = os.pipe()  # both close-on-exec; the watchdog gets read_end as its stdin
    subprocess.Popen([sys.executable, "-m", "datapipe.pipeline.reaper", str(os.getpid())], stdin=read_end,
                     stdout=subprocess.DEVNULL, start_new_session=True)
    os.close(read_end)
    return write_end


def tell_session(write_end: int | None, session_dir: str) -> None:
    """The folder of the Ray session that the driver started: everything in it is the watchdog's to stop."""
    if write_end is not None:
        os.write(write_end, f"{session_dir}\n".encode())


def kill_monitor(folder: str) -> int:
    """SIGKILL the autoscaler monitor of the Ray session in `folder`: at ray.shutdown it outlasts
    SIGTERM, and Ray waits 1 s for it before its SIGKILL (of the 1.4 s a local shutdown took).
    A local Ray has nothing for it to scale. Returns how many were killed."""
    table = processes()
    monitors = {pid: table[pid].start for pid in table if in_folder(pid, folder) and is_monitor(pid)}
    send(monitors, signal.SIGKILL)
    return len(monitors)


def is_monitor(pid: int) -> bool:
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(MONITOR_SCRIPT) for arg in argv[:3])


def main(argv: list[str]) -> int:
    """The watchdog: wait for the driver's pipe to end, then stop its Ray session."""
    driver, me = int(argv[0]), os.getpid()
    born = processes()[me].start  # Popen returned before ray.init began: Ray's processes are all younger
    recorded: dict[int, int] = {}
    session, named, received = "", "", b""  # named: the session folder a recorded process's command line names
    while True:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], RECORD_EVERY_S if not session else None)
        if ready:
            chunk = os.read(sys.stdin.fileno(), 4096)
            if not chunk:
                break
            received += chunk
            session = received.decode(errors="replace").partition("\n")[0] if b"\n" in received else ""
        if not session:
            table = processes()
            new = {pid: table[pid].start for pid in descendants({driver}, table) - {me} - recorded.keys()
                   if table[pid].start >= born}
            recorded.update(new)
            named = named or next(filter(None, map(session_named, new)), "")
    stopped = stop(session or named, recorded, exclude={me, driver})
    if stopped:
        print(f"datapipe: stopped {stopped} processes that the run (pid {driver}) left of its Ray session "
              f"({session or 'killed while Ray was starting'})", file=sys.stderr)
    return 0


SESSION = re.compile(rb"(/[^\0= ]*/session_\d{4}-\d\d-\d\d_[\d-]+_\d+_\d+)(?:[/\0 ]|$)")


def session_named(pid: int) -> str:
    """The Ray session folder that a process's command line names (gcs_server's --log_dir, the raylet's
    --session_dir...), or "". A driver killed inside ray.init never tells the watchdog its folder; the
    processes it started name it, and the agents the raylet starts just before the kill (which no scan
    recorded, and which outlive the raylet) are then found by their logs in it."""
    try:
        found = SESSION.search((PROC / str(pid) / "cmdline").read_bytes())
    except OSError:
        return ""
    return found.group(1).decode(errors="replace") if found else ""


def stop(folder: str, recorded: dict[int, int], exclude: set[int]) -> int:
    """SIGTERM the processes of the Ray session in `folder` (or of every session under a node's temp
    folder), with those in `recorded` ({pid: start time}); SIGKILL what is left. Return how many there were."""
    seen: set[tuple[int, int]] = set()
    for round_ in range(ROUNDS):
        table = processes()
        targets = {pid: table[pid].start for pid in session_processes(folder, recorded, table) - exclude}
        if not targets:
            break
        seen.update(targets.items())
        send(targets, signal.SIGTERM if round_ == 0 else signal.SIGKILL)
        deadline = time.monotonic() + GRACE_S
        while alive(targets) and time.monotonic() < deadline:
            time.sleep(0.05)
        send(alive(targets), signal.SIGKILL)
    return len(seen)


def session_processes(folder: str, recorded: dict[int, int], table: dict[int, Process]) -> set[int]:
    """The live processes of the session (see the module docstring), with their descendants."""
    roots = {pid for pid, start in recorded.items() if pid in table and table[pid].start == start}
    if folder:
        roots |= {pid for pid in table if in_folder(pid, folder)}
    return {pid for pid in descendants(roots, table) | roots if pid in table and not table[pid].zombie}


def in_folder(pid: int, folder: str) -> bool:
    """The command line names the folder, or stdout or stderr is a file in it."""
    folder = folder.rstrip("/")
    # The whole path, as an argument or after `--opt=`: not /x/session_12 for /x/session_1, nor /y/x/session_1
    path = re.compile(rb"(?:^|[\0= ])" + re.escape(folder.encode()) + rb"(?:[/\0 ]|$)")
    try:
        if path.search((PROC / str(pid) / "cmdline").read_bytes()):
            return True
        return any(os.readlink(PROC / str(pid) / "fd" / str(fd)).startswith(f"{folder}/") for fd in (1, 2))
    except OSError:  # gone, or another user's process: not ours to stop anyway
        return False


def processes() -> dict[int, Process]:
    """Every process: pid -> (parent, start time, zombie), from /proc/PID/stat."""
    table = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()  # the name before ")" may hold spaces
        except OSError:
            continue
        table[int(entry.name)] = Process(ppid=int(fields[1]), start=int(fields[19]), zombie=fields[0] in "ZX")
    return table


def descendants(roots: set[int], table: dict[int, Process]) -> set[int]:
    """Children, grandchildren... of `roots` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid, process in table.items():
        children.setdefault(process.ppid, []).append(pid)
    found, frontier = set(), list(roots)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found - roots


def send(targets: dict[int, int], signum: int) -> None:
    """Signal each target still running under the same start time (never a reused pid)."""
    table = processes()
    for pid, start in targets.items():
        if pid in table and table[pid].start == start:
            try:
                os.kill(pid, signum)
            except OSError:  # exited meanwhile, or not ours
                pass


def alive(targets: dict[int, int]) -> dict[int, int]:
    table = processes()
    return {pid: start for pid, start in targets.items()
            if pid in table and table[pid].start == start and not table[pid].zombie}


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the run must not stop its cleanup
    sys.exit(main(sys.argv[1:]))

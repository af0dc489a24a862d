"""A run that started its own Ray leaves no process behind, however it ends (datapipe.pipeline.reaper).

The oracle is independent of the reaper's own matching: the driver starts in a session of its own
(as a shell starts a job), every Ray process it starts inherits that session id (Ray calls setsid
for none of them), and Ray's folders live under a fresh RAY_TMPDIR. After the driver ends, no
process may remain in its session, none may hold a file or name a path under that folder, and the
watchdog itself must be gone.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from datapipe.pipeline import reaper
from tests.conftest import tiny_recipe

ROOT = Path(__file__).resolve().parent.parent
START_S = 300  # a local Ray start plus the first batch: ~10 s idle, minutes on a loaded 2-core machine
GONE_S = 20  # the reaper's 2 s grace plus its scans, with room for a loaded machine


def session_members(sid: int) -> list[str]:
    """`pid title` of every live process in session `sid` (the watchdog has a session of its own)."""
    members = []
    for pid, process in reaper.processes().items():
        try:
            fields = (reaper.PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
            title = (reaper.PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and not process.zombie:
            members.append(f"{pid} {title[:120]}")
    return members


def holders(folder: str) -> list[int]:
    """Processes whose command line names `folder` or which hold any file under it."""
    found = []
    for pid in set(reaper.processes()) - {os.getpid()}:
        base = reaper.PROC / str(pid)
        try:
            if folder.encode() in (base / "cmdline").read_bytes():
                found.append(pid)
            elif any(os.readlink(fd).startswith(folder) for fd in (base / "fd").iterdir()):
                found.append(pid)
        except OSError:
            continue
    return found


def watchdogs_of(pid: int) -> list[int]:
    needle = f"datapipe.pipeline.reaper\0{pid}\0".encode()
    found = []
    for other in reaper.processes():
        try:
            if needle in (reaper.PROC / str(other) / "cmdline").read_bytes():
                found.append(other)
        except OSError:
            continue
    return found


def wait_until(condition, seconds: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.2)
    return time.monotonic() - started


def assert_nothing_left(driver: subprocess.Popen, ray_tmp: str) -> float:
    """Seconds until the driver's session, the folder's holders and the watchdog are all gone."""
    waited = wait_until(lambda: not session_members(driver.pid) and not watchdogs_of(driver.pid), GONE_S,
                        f"processes left in the driver's session: {session_members(driver.pid)}")
    assert holders(ray_tmp) == []
    return waited


@pytest.fixture
def ray_tmp():
    folder = tempfile.mkdtemp(prefix="dp")  # short: Ray's socket paths must stay under 108 bytes
    yield folder
    for pid in holders(folder):  # a failed test must not leave its Ray running either
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def start_run(recipe: Path, out: Path, ray_tmp: str) -> subprocess.Popen:
    """`datapipe run` in a session of its own; its stderr (and the watchdog's) goes to out.stderr."""
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    with open(f"{out}.stderr", "w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "datapipe.cli", "run", str(recipe), "--out", str(out)],
                                env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr)


def running_recipe(tmp_path: Path, tokenizer: Path, count: int) -> Path:
    return tiny_recipe(tmp_path, tokenizer, [{"name": "code", "type": "python_programs", "count": count}])


def wait_for_partition_task(driver: subprocess.Popen) -> None:
    wait_until(lambda: any("ray::run_partition" in member for member in session_members(driver.pid)) or driver.poll(),
               START_S, "no partition task ever ran")
    assert driver.poll() is None, Path(f"{driver.args[-1]}.stderr").read_text()


@pytest.mark.slow
def test_a_killed_driver_leaves_no_ray_process(tmp_path, tiny_tokenizer, ray_tmp):
    driver = start_run(running_recipe(tmp_path, tiny_tokenizer, 2_000_000), tmp_path / "out", ray_tmp)
    wait_for_partition_task(driver)
    assert len(session_members(driver.pid)) > 5 and holders(ray_tmp)  # Ray is up, in the driver's session
    driver.kill()
    driver.wait()
    assert_nothing_left(driver, ray_tmp)
    assert "datapipe: stopped" in (tmp_path / "out.stderr").read_text()  # the watchdog shares the driver's stderr


@pytest.mark.slow
def test_a_driver_killed_while_ray_starts_leaves_no_ray_process(tmp_path, tiny_tokenizer, ray_tmp):
    """Killed as soon as its raylet exists: Ray is half up, and the watchdog may not know the session yet."""
    driver = start_run(running_recipe(tmp_path, tiny_tokenizer, 50), tmp_path / "out", ray_tmp)
    wait_until(lambda: any("raylet" in member.split()[1] for member in session_members(driver.pid)) or driver.poll(),
               START_S, "the raylet never started")
    driver.kill()
    driver.wait()
    assert_nothing_left(driver, ray_tmp)


@pytest.mark.slow
def test_ctrl_c_and_a_normal_exit_leave_no_ray_process(tmp_path, tiny_tokenizer, ray_tmp):
    driver = start_run(running_recipe(tmp_path, tiny_tokenizer, 2_000_000), tmp_path / "out", ray_tmp)
    wait_for_partition_task(driver)
    os.killpg(driver.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    assert driver.wait(60) == 130
    assert_nothing_left(driver, ray_tmp)
    finished = start_run(running_recipe(tmp_path, tiny_tokenizer, 50), tmp_path / "done", ray_tmp)
    assert finished.wait(START_S) == 0, (tmp_path / "done.stderr").read_text()
    assert (tmp_path / "done" / "run.json").exists()
    assert_nothing_left(finished, ray_tmp)
    assert "datapipe: stopped" not in (tmp_path / "done.stderr").read_text()  # the run stopped its Ray itself


def test_the_watchdog_stops_its_session_only(tmp_path):
    """No Ray: a stand-in driver tells the watchdog its session folder, starts one process that logs
    there and one that logs in another session's folder, then is SIGKILLed."""
    ours, theirs = tmp_path / "session_ours", tmp_path / "session_theirs"
    for folder in (ours, theirs):
        (folder / "logs").mkdir(parents=True)
    stand_in = f"""
import os, subprocess, time
from datapipe.pipeline import reaper
pipe = reaper.watch()
reaper.tell_session(pipe, {str(ours)!r})
time.sleep(1)  # the watchdog records the driver's new children only until it has the session folder
for name, folder in (("ours", {str(ours)!r}), ("theirs", {str(theirs)!r})):
    log = open(os.path.join(folder, "logs", "worker.out"), "w")
    child = subprocess.Popen(["sleep", "300"], stdout=log, stderr=log, start_new_session=True)
    open(os.path.join(folder, "pid"), "w").write(str(child.pid))
time.sleep(1)
os.kill(os.getpid(), 9)
"""
    driver = subprocess.run([sys.executable, "-c", stand_in], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stderr=subprocess.PIPE, timeout=60)
    assert driver.returncode == -signal.SIGKILL
    their_pid, our_pid = int((theirs / "pid").read_text()), int((ours / "pid").read_text())
    try:
        wait_until(lambda: our_pid not in reaper.processes() or reaper.processes()[our_pid].zombie, GONE_S,
                   "the process logging in the driver's session was not stopped")
        time.sleep(0.5)
        assert their_pid in reaper.processes(), "a process of another session was stopped"
    finally:
        os.kill(their_pid, signal.SIGKILL)


def test_kill_monitor_takes_the_sessions_autoscaler_monitor_only(tmp_path):
    """Stand-ins that ignore SIGTERM, as Ray's monitor outlasts it: the one whose script is the autoscaler
    monitor and which logs in the session is killed; one of another session, and another script of
    this session, are not."""
    ours, theirs = tmp_path / "session_1", tmp_path / "session_2"
    script = tmp_path / "ray" / "autoscaler" / "_private" / "monitor.py"
    other = tmp_path / "log_monitor.py"
    script.parent.mkdir(parents=True)
    for path in (script, other):
        path.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)\n")
    children = {}
    for name, folder, path in (("monitor", ours, script), ("theirs", theirs, script), ("other", ours, other)):
        folder.mkdir(exist_ok=True)
        children[name] = subprocess.Popen([sys.executable, "-u", str(path), f"--logs-dir={folder}/logs"])
    try:
        wait_until(lambda: all(reaper.is_monitor(child.pid) == (child.args[2] == str(script))
                               for child in children.values()), 10, "the stand-ins did not start")
        assert reaper.kill_monitor(str(ours)) == 1
        assert children["monitor"].wait(10) == -signal.SIGKILL
        assert children["theirs"].poll() is None and children["other"].poll() is None
    finally:
        for child in children.values():
            child.kill()
            child.wait()


def test_the_session_folder_is_read_from_a_command_line():
    """What the watchdog stops when the driver dies inside ray.init, before it could name its session."""
    folder = "/tmp/rt/session_2026-12-01_18-31-31_740292_7223"  # Ray's own name, under a --temp-dir
    for argument, expected in ((f"--log_dir={folder}/logs", folder), (f"--session_dir={folder}", folder),
                               ("--session_dir=/tmp/ray/session_latest", "")):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", argument])
        command = reaper.PROC / str(process.pid) / "cmdline"
        try:
            wait_until(lambda path=command, text=argument: text.encode() in path.read_bytes(), 30, "no command line")
            assert reaper.session_named(process.pid) == expected, argument
        finally:
            process.kill()
            process.wait()


def test_a_process_belongs_to_a_folder_by_whole_path_only():
    paths = {"--session-dir=/x/session_1": True, "/x/session_1/logs/raylet.out": True,
             "--python_worker_command=python w.py --store=/x/session_1/sockets/plasma --x=1": True,
             "/x/session_12": False, "/y/x/session_1/logs": False}
    for argument, expected in paths.items():
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", argument])
        command = reaper.PROC / str(process.pid) / "cmdline"
        try:  # the kernel may show the new command line a moment after Popen returns
            wait_until(lambda path=command, text=argument: text.encode() in path.read_bytes(), 30, "no command line")
            assert reaper.in_folder(process.pid, "/x/session_1") is expected, argument
        finally:
            process.kill()
            process.wait()

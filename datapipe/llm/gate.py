"""The fidelity gate's text checks in a worker process: `python -m datapipe.llm.gate`, fed by GateProcess.

The checks cost ~1-2 ms of CPU a chunk (regular expressions and fastText, holding the GIL); on
the event loop that keeps a server full they would take 20-40% of its core at 200 requests/s and
delay every answer that arrives meanwhile. The rewriter sends them here in batches instead.
A plain child process, not multiprocessing: spawn re-runs the parent's __main__ script (a user's
script without an `if __name__ == "__main__"` guard would run again in the child), and fork copies
a process that runs threads (aiohttp's, the tokenizer's), which can deadlock the copy.
Frames, both ways: an 8-byte length, then a pickle: (FidelityConfig, items) in, [Verdict] out.
The child exits when its stdin closes, so it never outlives the parent.
"""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

HEADER = struct.Struct("<Q")


class GateProcess:
    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the folder holding datapipe/, wherever it was imported from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-m", "datapipe.llm.gate"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)

    def send(self, cfg, items: list[tuple]) -> None:
        """Starts datapipe.llm.fidelity.check_many(cfg, items) in the child; receive() answers."""
        try:
            write_frame(self.process.stdin, (cfg, items))
        except BrokenPipeError:
            pass  # receive() says why

    def receive(self) -> list:
        verdicts = read_frame(self.process.stdout)
        if verdicts is None:
            raise RuntimeError(f"the fidelity gate's worker process exited (code {self.process.wait()}); its "
                               f"error is above. Set the rephrase stage's gate_processes: 0 to check on the event loop")
        return verdicts

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def write_frame(stream: BinaryIO, value) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO):
    """The next value, or None at the end of the stream."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    return pickle.loads(stream.read(HEADER.unpack(header)[0]))


def main() -> None:
    from datapipe.llm import fidelity

    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library that prints (fastText warns on load) must not corrupt the frames
    requests = sys.stdin.buffer
    while (frame := read_frame(requests)) is not None:
        cfg, items = frame
        write_frame(replies, fidelity.check_many(cfg, items))


if __name__ == "__main__":
    main()

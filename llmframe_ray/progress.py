"""Progress of a long command on stderr: a bar with rate and ETA on a terminal, plain periodic
lines otherwise (CI logs, pipes). Reporters are called as `report(stage, done, total)`."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

BAR = 24
PLAIN_EVERY_S = 10.0  # a plain line at most this often per stage (and at its end)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ProgressReporter:
    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = PLAIN_EVERY_S) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock, self.every_s = clock, every_s
        self.started: dict[str, float] = {}
        self.last_line: dict[str, float] = {}

    def line(self, stage: str, done: int, total: int) -> str:
        """The text of one report: count, share, rate and time left (or taken, at the end)."""
        now = self.clock()
        elapsed = now - self.started.setdefault(stage, now)
        rate = done / elapsed if elapsed > 0 else 0.0
        share = done / total if total else 1.0
        if done >= total:
            when = f"in {_clock(elapsed)}"
        else:
            when = f"ETA {_clock((total - done) / rate)}" if rate > 0 else "ETA ?"
        count = f"{done}/{total} ({share:.0%}), {rate:.1f}/s, {when}"
        if self.tty:
            filled = int(BAR * min(share, 1.0))
            return f"{stage} [{'#' * filled}{'.' * (BAR - filled)}] {count}"
        return f"{stage}: {count}"

    def __call__(self, stage: str, done: int, total: int) -> None:
        text, now, finished = self.line(stage, done, total), self.clock(), done >= total
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if finished else ""))
        elif finished or now - self.last_line.get(stage, float("-inf")) >= self.every_s:
            self.stream.write(text + "\n")
            self.last_line[stage] = now
        self.stream.flush()

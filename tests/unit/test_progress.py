"""Progress reporting of long commands (llmframe_ray/progress.py): a bar with rate and ETA on a
terminal, plain lines at most every 10 s otherwise, and always the last one."""

from __future__ import annotations

import io

from llmframe_ray.progress import ProgressReporter


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_terminal_gets_one_updating_bar_with_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    report = ProgressReporter(out, tty=True, clock=clock)
    report("embed", 0, 400)
    clock.now += 10
    report("embed", 100, 400)
    clock.now += 30
    report("embed", 400, 400)
    frames = out.getvalue().split("\r\x1b[2K")[1:]
    assert frames == [
        "embed [........................] 0/400 (0%), 0.0/s, ETA ?",
        "embed [######..................] 100/400 (25%), 10.0/s, ETA 0:00:30",
        "embed [########################] 400/400 (100%), 10.0/s, in 0:00:40\n",
    ]


def test_a_log_gets_a_plain_line_every_ten_seconds_and_the_last():
    out, clock = io.StringIO(), Clock()
    report = ProgressReporter(out, tty=False, clock=clock)
    for done in range(0, 50, 5):  # one report a second
        report("queries", done, 50)
        clock.now += 1
    report("queries", 50, 50)
    assert out.getvalue().splitlines() == [
        "queries: 0/50 (0%), 0.0/s, ETA ?",
        "queries: 50/50 (100%), 5.0/s, in 0:00:10",
    ]
    report("other", 1, 3)  # stages are timed on their own
    assert out.getvalue().splitlines()[-1] == "other: 1/3 (33%), 0.0/s, ETA ?"

"""How a long call reports its phases (streamwhiten.progress): a Reporter is told each phase's start and end,
a plain callback and None nothing more, a phase that raises never ends, and steps count once each from
several threads."""

from __future__ import annotations

import threading

import pytest

from streamwhiten.progress import Reporter, begin, phase, steps


class Told(Reporter):
    """A reporter that records everything it is told, in order."""

    def __init__(self):
        self.said = []

    def __call__(self, done, total):
        self.said.append(("progress", done, total))

    def started(self, name, unit):
        self.said.append(("started", name, unit))

    def finished(self, name, seconds):
        assert seconds >= 0
        self.said.append(("finished", name))


def test_a_reporter_is_told_each_phase_with_what_it_counts():
    told = Told()
    with phase(told, "read the sample") as progress:
        assert progress is told
        progress(5, 10)
    finish = begin(told, "train faiss-pq:8 on 10 rows", None)
    finish()
    assert told.said == [
        ("started", "read the sample", "rows"),
        ("progress", 5, 10),
        ("finished", "read the sample"),
        ("started", "train faiss-pq:8 on 10 rows", None),
        ("finished", "train faiss-pq:8 on 10 rows"),
    ]


def test_a_plain_callback_and_none_are_told_nothing_more():
    calls = []
    with phase(lambda done, total: calls.append((done, total)), "pass") as progress:
        progress(1, 2)
    with phase(None, "pass") as progress:
        assert progress is None
    begin(None, "pass")()
    assert calls == [(1, 2)]


def test_a_phase_that_raises_never_ends():
    told = Told()
    with pytest.raises(ValueError), phase(told, "train", None):
        raise ValueError("no")
    assert told.said == [("started", "train", None)]


def test_steps_count_each_call_once_from_several_threads():
    seen = []
    lock = threading.Lock()

    def progress(done, total):
        with lock:
            seen.append((done, total))

    step = steps(progress, 400)
    threads = [threading.Thread(target=lambda: [step() for _ in range(100)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(done for done, _ in seen) == list(range(1, 401)) and {total for _, total in seen} == {400}
    steps(None, 3)()  # nothing to tell: no error

"""How a long call reports its phases (streamwhiten.progress): a Reporter is told each phase's start and end,
a plain callback and None nothing more, a phase that raises never ends, steps count once each from
several threads; and the one Watch a caller makes is told of, and stops, the engine's work."""

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


def test_one_watch_is_told_of_a_fit_and_an_apply_and_stops_a_fit_that_then_resumes(tmp_path):
    """The one Watch a caller makes reaches every engine call unchanged: its progress is told each block of
    a fit and of an apply, and its should_stop() stops a fit at its next block with a checkpoint from which
    the same call finishes, to the model an uninterrupted fit writes."""
    import numpy as np
    from conftest import anisotropic, write_h5

    import streamwhiten
    from streamwhiten import FitOptions, InterruptedRunError, ReadOptions, Watch
    from streamwhiten.core.model import file_checksum

    spec = write_h5(tmp_path / "x.h5", anisotropic(1000, 6, seed=3).astype(np.float32), chunk_rows=250)
    read = ReadOptions(block_rows=250)
    told = []
    watch = Watch(progress=lambda done, total: told.append((done, total)))
    whole = streamwhiten.fit(spec, str(tmp_path / "whole.npz"), read=read, watch=watch).model
    assert told == [(250, 1000), (500, 1000), (750, 1000), (1000, 1000)]
    told.clear()
    streamwhiten.apply(whole, spec, str(tmp_path / "y.h5"), read=read, watch=watch)
    assert told and told[-1] == (1000, 1000) and [done for done, _ in told] == sorted({done for done, _ in told})

    asked = []
    stop = Watch(should_stop=lambda: asked.append(1) or len(asked) >= 2)
    options = FitOptions(checkpoint_every=1000)  # only the stop writes a checkpoint
    with pytest.raises(InterruptedRunError, match="interrupted after 500 of 1,000 rows; progress saved to"):
        streamwhiten.fit(spec, str(tmp_path / "m.npz"), options=options, read=read, watch=stop)
    resumed = streamwhiten.fit(spec, str(tmp_path / "m.npz"), options=options, read=read)
    assert resumed.resumed and resumed.n_blocks == 2  # the two blocks left
    assert file_checksum(resumed.model) == file_checksum(whole)

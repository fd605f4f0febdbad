"""The timeline records holds and marks from many threads, and the picture shows them."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from demo.picture import HTML_NAME, SVG_NAME, draw
from demo.timeline import Timeline


def test_a_grant_seen_many_times_from_many_threads_spans_its_first_to_last_sighting() -> None:
    timeline = Timeline()

    def watch(offset: int) -> None:
        for step in range(200):
            timeline.seen("report:1", 7, at=offset + step * 0.01)

    threads = [threading.Thread(target=watch, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    (grant,) = timeline.recorded().grants
    assert (grant.lock, grant.token, grant.start) == ("report:1", 7, 0)
    assert abs((grant.end or 0) - 4.99) < 1e-9


def a_run() -> Timeline:
    """The two scenarios as the demo records them, at made-up times."""
    timeline = Timeline()
    for at in (1.0, 2.0, 3.0):
        timeline.seen("report:2", 11, at=at)
    timeline.mark("report:2", 11, "renewal", "TTL 2.00s", at=2.0)
    timeline.mark("report:2", 11, "sigkill", "SIGKILL pid 4242", at=2.5)
    timeline.mark("report:2", 11, "freed", "freed +1.97s", at=4.47)
    timeline.ended("report:2", 11, 4.47)
    timeline.seen("report:2", 12, at=4.6)
    timeline.name_holder("report:2", 11, "worker pid 4242, build_report 0123abcd")
    timeline.held("order:1", 20, 10.0, 12.0, "the demo (pid 1), thread pause-scenario")
    timeline.mark("order:1", 20, "paused", "pauses", at=10.0)
    timeline.mark("order:1", 20, "expired", "lease ran out", at=12.0)
    timeline.held("order:1", 21, 12.1, 12.2, "web request POST /orders/1/pay/ (web)")
    timeline.mark("order:1", 20, "refused", "write refused (token 20)", at=12.3)
    timeline.mark("order:1", 20, "lost", "release(): LockLostError", at=12.31)
    return timeline


def test_the_picture_labels_every_mark_and_the_page_embeds_it(tmp_path: Path) -> None:
    recorded = a_run().recorded()

    picture = draw(recorded, tmp_path / "out", title="a test run")

    svg = (tmp_path / "out" / SVG_NAME).read_text()
    page = (tmp_path / "out" / HTML_NAME).read_text()
    assert picture.svg == str((tmp_path / "out" / SVG_NAME).resolve())
    assert (picture.holds, picture.renewals) == (4, 1)
    assert picture.marked == ("expired", "freed", "lost", "paused", "refused", "sigkill")
    for label in ("SIGKILL pid 4242", "freed +1.97s", "write refused (token 20)", "pauses"):
        assert f">{label}<" in svg  # kept as text, not drawn as paths
    assert "worker pid 4242, build_report 0123abcd" in svg
    assert "report:2  token 12" in svg  # a holder not named is shown by its token
    # The page holds the very SVG, inline, and lists the events in time order.
    assert svg[svg.index("<svg") :] in page
    events = re.findall(r"<tr><td>([\d.]+)</td>", page)
    assert events == sorted(events, key=float) and len(events) == 14

"""The timeline drawn: an SVG of who held which lock when, and an HTML page showing it.

One lane per holder (a grant of a lock: a worker process's task run, the demo's
paused thread, a web request), grouped by lock, in two panels: the report locks
from the start of the run, and the order lock of the paused holder zoomed on its pause.
A bar is a hold; ticks on it are renewals seen by the monitor; the hatched end
of a bar is the lock outliving its SIGKILLed holder until it expires; a dashed
line is a holder paused past its lease, no longer holding the lock it believes
it holds; labelled markers are the SIGKILL, the freed lock, the pause, the
lease running out, the refused write and the failed release. A dotted arrow
goes from a freed or expired lock to the holder that took it next.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from demo.outcomes import Picture
from demo.timeline import Grant, Mark, MarkKind, Recorded

#: The files written, in the directory given.
SVG_NAME = "demo-timeline.svg"
HTML_NAME = "demo-timeline.html"

#: How each labelled mark is drawn: matplotlib marker, colour, what it means.
MARK_STYLE: dict[MarkKind, tuple[str, str, str]] = {
    "sigkill": ("X", "#d62728", "SIGKILL of the holder's process"),
    "freed": ("o", "#2ca02c", "lock freed (expired)"),
    "paused": ("P", "#ff7f0e", "holder pauses"),
    "expired": ("v", "#9467bd", "lease ran out"),
    "refused": ("D", "#d62728", "late write refused by the fence"),
    "lost": ("s", "#8c564b", "release() raised LockLostError"),
}

#: Labels start this many points from the lane's middle, clear of its bar, and a label
#: closer than LABEL_ROOM (a fraction of the panel's width) to another on the same side
#: goes LABEL_STEP points further out.
LABEL_OFFSET = 13.0
LABEL_STEP = 10.0
LABEL_ROOM = 0.15

#: Lanes of these locks cover the whole run; the others are zoomed on their holds.
WHOLE_RUN_PREFIX = "report:"


def draw(recorded: Recorded, directory: Path, *, title: str) -> Picture:
    """Write the SVG and the HTML page of ``recorded`` in ``directory``; what was drawn."""
    directory.mkdir(parents=True, exist_ok=True)
    svg_path, html_path = directory / SVG_NAME, directory / HTML_NAME
    svg_path.write_text(render_svg(recorded, title))
    html_path.write_text(render_html(recorded, svg_path.read_text(), title))
    marked = [mark.kind for grant in recorded.grants for mark in grant.marks]
    return Picture(
        svg=str(svg_path.resolve()),
        html=str(html_path.resolve()),
        holds=len(recorded.grants),
        renewals=marked.count("renewal"),
        marked=tuple(sorted({kind for kind in marked if kind != "renewal"})),
    )


def panels(recorded: Recorded) -> list[list[Grant]]:
    """The grants in panels: the report locks, then every other lock (empty panels left out)."""
    whole = [grant for grant in recorded.grants if grant.lock.startswith(WHOLE_RUN_PREFIX)]
    zoomed = [grant for grant in recorded.grants if not grant.lock.startswith(WHOLE_RUN_PREFIX)]
    return [panel for panel in (whole, zoomed) if panel]


def render_svg(recorded: Recorded, title: str) -> str:
    """The timeline as an SVG document (its text kept as text, so it can be searched)."""
    groups = panels(recorded)
    lanes = [len(group) for group in groups] or [1]
    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "demo-timeline"}):
        figure = Figure(figsize=(13, 1.6 + 0.55 * sum(lanes) + 1.1 * len(lanes)))
        axes = figure.subplots(len(lanes), 1, squeeze=False, height_ratios=lanes)[:, 0]
        for ax, group in zip(axes, groups, strict=False):
            draw_panel(ax, group, recorded.duration)
        axes[0].set_title(title, loc="left", fontsize=11)
        axes[-1].set_xlabel("seconds since the demo began watching the locks")
        add_legend(figure)
        figure.tight_layout(rect=(0, 0.07, 1, 1))
        out = io.StringIO()
        figure.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def draw_panel(ax: Axes, grants: Sequence[Grant], duration: float) -> None:
    """One lane per grant in ``ax``, first grant at the top."""
    colours = {
        lock: f"C{index % 10}" for index, lock in enumerate(dict.fromkeys(g.lock for g in grants))
    }
    lane = {id(grant): len(grants) - 1 - index for index, grant in enumerate(grants)}
    # The limits first: labels are placed by how close they are across the panel.
    start = min(grant.start for grant in grants)
    end = max(last_moment(grant, duration) for grant in grants)
    pad = max(0.3, (end - start) * 0.06)
    whole_run = grants[0].lock.startswith(WHOLE_RUN_PREFIX)
    ax.set_xlim(max(0.0, start - pad) if whole_run else start - pad, end + pad)
    ax.set_ylim(-0.8, len(grants) - 0.2)
    for grant in grants:
        draw_grant(ax, grant, lane[id(grant)], colours[grant.lock], duration)
    for grant in grants:
        connect_next_holder(ax, grant, grants, lane)
    ax.set_yticks(
        [lane[id(grant)] for grant in grants],
        [f"{grant.lock}  {grant.holder}" for grant in grants],
        fontsize=8,
    )
    ax.grid(axis="x", linestyle=":", linewidth=0.5)


def last_moment(grant: Grant, duration: float) -> float:
    """The latest time drawn for ``grant``: its end or its last mark."""
    ends = [grant.end if grant.end is not None else duration]
    return max(ends + [mark.at for mark in grant.marks])


def draw_grant(ax: Axes, grant: Grant, y: int, colour: str, duration: float) -> None:
    """The bar of one hold, its renewal ticks, its labelled marks."""
    end = grant.end if grant.end is not None else duration
    killed = next((m.at for m in grant.marks if m.kind == "sigkill"), None)
    alive_until = end if killed is None else killed
    ax.broken_barh([(grant.start, alive_until - grant.start)], (y - 0.22, 0.44), color=colour)
    if killed is not None:
        # The holder is dead; its lock is not free until it expires.
        ax.broken_barh(
            [(killed, end - killed)],
            (y - 0.22, 0.44),
            facecolor="white",
            edgecolor=colour,
            hatch="////",
        )
    last = max((m.at for m in grant.marks), default=end)
    if "expired" in grant.kinds() and last > end:
        # Paused past its lease: it no longer holds the lock it believes it holds.
        ax.plot([end, last], [y, y], linestyle="--", color=colour, linewidth=1.2)
    renewals = [m.at for m in grant.marks if m.kind == "renewal"]
    if renewals:
        ax.vlines(renewals, y - 0.3, y + 0.3, color="black", linewidth=0.9)
    labelled = [m for m in grant.marks if m.kind != "renewal"]
    span = max(ax.get_xlim()[1] - ax.get_xlim()[0], 1e-9)
    placed: list[tuple[float, int]] = []  # (x, signed level) of the labels drawn
    for index, mark in enumerate(labelled):
        side = 1 if index % 2 == 0 else -1
        # Labels close together on one side are stacked, away from the bar.
        level = sum(
            1 for x, lvl in placed if lvl * side > 0 and abs(x - mark.at) < LABEL_ROOM * span
        )
        placed.append((mark.at, side * (level + 1)))
        draw_mark(ax, mark, y, offset=side * (LABEL_OFFSET + LABEL_STEP * level))


def draw_mark(ax: Axes, mark: Mark, y: int, *, offset: float) -> None:
    """A labelled marker; its label ``offset`` points above (or, negative, below) the lane."""
    marker, colour, _ = MARK_STYLE[mark.kind]
    # release() fails right after the refused write: drawn larger, beneath it.
    size, z = (12.0, 2.5) if mark.kind == "lost" else (8.0, 3.0)
    ax.plot(
        [mark.at],
        [y],
        marker=marker,
        color=colour,
        markersize=size,
        linestyle="none",
        markeredgecolor="black",
        markeredgewidth=0.5,
        zorder=z,
    )
    ax.annotate(
        mark.label,
        (mark.at, y),
        xytext=(0, offset),
        textcoords="offset points",
        ha="center",
        va="bottom" if offset > 0 else "top",
        fontsize=7.5,
        bbox={
            "boxstyle": "square,pad=0.1",
            "facecolor": "white",
            "edgecolor": "none",
            "alpha": 0.8,
        },
        color=colour,
    )


def connect_next_holder(
    ax: Axes, grant: Grant, grants: Sequence[Grant], lane: dict[int, int]
) -> None:
    """A dotted arrow from where ``grant``'s lock was freed (or expired) to its next holder."""
    freed = next((m.at for m in grant.marks if m.kind in ("freed", "expired")), None)
    if freed is None:
        return
    later = [
        g for g in grants if g.lock == grant.lock and g is not grant and g.start >= freed - 0.1
    ]
    if not later:
        return
    taker = min(later, key=lambda g: g.start)
    ax.annotate(
        "",
        xy=(taker.start, lane[id(taker)]),
        xytext=(freed, lane[id(grant)]),
        arrowprops={"arrowstyle": "->", "linestyle": ":", "color": "black", "linewidth": 1},
    )


def add_legend(figure: Figure) -> None:

    handles: list[Patch | Line2D] = [
        Patch(color="C0", label="hold"),
        Patch(facecolor="white", edgecolor="C0", hatch="////", label="held by a dead process"),
        Line2D([], [], color="C1", linestyle="--", label="paused, lock no longer its own"),
        Line2D(
            [],
            [],
            color="black",
            marker="|",
            linestyle="none",
            markersize=10,
            label="renewal (TTL back up)",
        ),
        Line2D([], [], color="black", linestyle=":", label="next holder takes it"),
    ]
    handles += [
        Line2D(
            [],
            [],
            marker=marker,
            color=colour,
            linestyle="none",
            markeredgecolor="black",
            markeredgewidth=0.5,
            label=meaning,
        )
        for marker, colour, meaning in MARK_STYLE.values()
    ]
    figure.legend(handles=handles, loc="lower center", ncol=6, fontsize=8, frameon=False)


def render_html(recorded: Recorded, svg: str, title: str) -> str:
    """A self-contained page: the SVG inline, how to read it, and every event as a table."""
    inline = svg[svg.index("<svg") :]
    rows = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>"
        for row in event_rows(recorded)
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 1300px; }}
figure {{ margin: 0; }} figure svg {{ height: auto; max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 2px 10px; text-align: left; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>One lane per holder of a lock. A bar is a hold, from when the monitor (or the holder)
first saw it to when the lock stopped being the holder's; ticks are renewals by the holder's
watchdog. The hatched end of a bar is a lock outliving its SIGKILLed holder until it expires;
a dashed line is a holder paused past its lease, still believing it holds the lock while the
next holder has it; a dotted arrow goes to the holder that took a freed lock next.</p>
<figure>
{inline}
</figure>
<h2>Events</h2>
<table>
<tr><th>seconds</th><th>lock</th><th>token</th><th>holder</th><th>event</th></tr>
{rows}
</table>
</body>
</html>
"""


def event_rows(recorded: Recorded) -> list[tuple[str, str, int, str, str]]:
    """Every hold's start and end and every labelled mark, in time order."""
    rows: list[tuple[float, str, int, str, str]] = []
    for grant in recorded.grants:
        renewals = sum(1 for mark in grant.marks if mark.kind == "renewal")
        rows.append((grant.start, grant.lock, grant.token, grant.holder, "holds the lock"))
        if grant.end is not None:
            rows.append(
                (
                    grant.end,
                    grant.lock,
                    grant.token,
                    grant.holder,
                    f"no longer holds it ({renewals} renewals seen)",
                )
            )
        for mark in grant.marks:
            if mark.kind != "renewal":
                rows.append((mark.at, grant.lock, grant.token, grant.holder, mark.label))
    rows.sort(key=lambda row: row[0])
    return [(f"{at:.2f}", lock, token, holder, event) for at, lock, token, holder, event in rows]

"""When the tree's next uplink message goes: just in time for the verifier's next pass.

The verifier never idles: it runs pass after pass and applies what has arrived at the start
of each. A message that lands mid-pass waits for the next start, so a second message inside
one pass interval buys nothing a later one would not, yet costs its own framing and fields
(FRAMING + UP_MESSAGE in acespec.proto.sizes, 23 B: the bytes of ~8 nodes). The Decided
stream gives the verifier's clock: one message per pass, sent as a pass ends and the next
begins; the link gives the one-way delay (half the base round trip) and a message's
serialisation. The edge drafts until the latest moment a message can leave and still make
the next pass start, then sends everything it has in one message.
"""

from __future__ import annotations


def until_due(now: float, pass_end: float, pass_s: float, lead_s: float, late_s: float,
              aimed: float | None = None) -> tuple[float, float]:
    """(seconds until a message should leave, the verifier pass start it then makes).

    pass_end is (in the edge's clock) when a pass ended and the next began, pass_s the pass
    time, lead_s what a message needs to get there (one-way delay, serialisation and a
    margin): the moment for a start S is S - lead_s. Up to late_s past that moment (late_s <
    the margin in lead_s) a message still makes S, so it is due now (0), unless the last
    message already aimed at S (`aimed`; the clock re-read from a newer Decided moves S by
    a few ms, so "the same start" is within half a pass): one message per pass start."""
    if pass_s <= 0:
        return 0.0, now
    past = (now + lead_s - pass_end) % pass_s  # seconds since the last such moment
    start = now - past + lead_s  # the start that moment was for
    if past <= late_s and (aimed is None or start > aimed + pass_s / 2):
        return 0.0, start
    return pass_s - past, start + pass_s

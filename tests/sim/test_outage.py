"""Outages and trace links: the stages on a virtual clock (exact), the shipped traces, the
bench's link syntax, and the asyncio proxy's cut/reset over real loopback sockets (timing
bounds loose enough for a shared, noisy machine)."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import numpy as np
import pytest

from acespec.sim.bench import parse_links
from acespec.sim.proxy import CountingProxy, LinkProxy, ProxyThread
from acespec.sim.stages import (
    Chunk,
    Link,
    LinkSpec,
    Outage,
    OutageSchedule,
    Rate,
    Trace,
    TraceDelay,
    TraceLoss,
    TraceSteps,
    read_trace,
    shipped_traces,
    simulate,
    trace_path,
)

# --- the Outage stage and the schedule, virtual clock ---


def test_outage_holds_chunks_to_the_window_end_in_order():
    o = Link(Outage([(1.0, 2.0), (2.0, 2.5), (4.0, 5.0)]))  # abutting windows: one outage
    out = simulate(o, [Chunk(1, t) for t in (0.5, 1.2, 1.9, 2.2, 3.0, 4.5, 5.0)])
    assert [c.t for c in out] == pytest.approx([0.5, 2.5, 2.5, 2.5, 3.0, 5.0, 5.0])


def test_schedule_is_shared_and_grows_while_the_link_runs():
    sched = OutageSchedule()
    a, b = Outage(sched), Outage(sched)
    assert a(Chunk(1, 1.0)).t == 1.0
    sched.add(2.0, 1.0)  # cut both after they were built
    assert a(Chunk(1, 2.5)).t == 3.0 and b(Chunk(1, 2.9)).t == 3.0
    windows: list[tuple[float, float]] = []
    c = Outage(windows)  # a plain list is kept, not copied
    windows.append((0.0, 1.0))
    assert c(Chunk(1, 0.5)).t == 1.0
    with pytest.raises(ValueError, match="duration"):
        sched.add(1.0, 0.0)


def test_rate_sends_nothing_during_an_outage():
    """1000 B/s, five 100-B chunks at t=0, down over [0.25, 1.25): the third chunk's sending
    pauses mid-way, everything behind it moves by the window's length."""
    r = Link(Rate(8000, outages=OutageSchedule([(0.25, 1.25)])))
    out = simulate(r, [Chunk(100, 0.0) for _ in range(5)])
    assert [c.t for c in out] == pytest.approx([0.1, 0.2, 1.3, 1.4, 1.5])


def test_linkspec_outage_both_ways_and_on_the_wire():
    """10 kB/s, 100 ms RTT, down over [1, 3): a chunk on the wire when the link goes is
    retransmitted at its end; one sent during it leaves once the link is back."""
    up, down = LinkSpec(80_000, 80_000, 0.1, outages=((1.0, 2.0),)).build()
    assert up(Chunk(100, 0.0)).t == pytest.approx(0.06)
    assert up(Chunk(100, 0.97)).t == pytest.approx(3.0)  # sent at 0.98, on the wire at 1.0
    assert up(Chunk(100, 1.5)).t == pytest.approx(3.06)
    assert down(Chunk(100, 2.0)).t == pytest.approx(3.06)  # the same schedule downstream
    plain, _ = LinkSpec(80_000, 80_000, 0.1).build()  # no outages: the chain is as before
    assert not any(isinstance(s, Outage) for s in plain.stages)


def test_linkspec_outages_survive_a_json_round_trip():
    spec = LinkSpec(1e6, 1e6, 0.05, outages=[[10, 5]])  # as `bench load` hands it back
    assert spec.outages == ((10.0, 5.0),)
    with pytest.raises(ValueError):
        LinkSpec(1e6, 1e6, 0.05, outages=((1.0, -1.0),))


# --- richer traces, virtual clock ---


def test_trace_gap_holds_chunks_for_the_next_step_with_a_rate():
    tr = Trace([(0.0, 8.0), (1.0, 0.0), (3.0, 8.0)])  # 1000 B/s, nothing over [1, 3)
    assert tr(Chunk(500, 0.8)).t == pytest.approx(3.3)  # 200 B by t=1, 300 B from t=3
    assert tr(Chunk(100, 1.5)).t == pytest.approx(3.4)  # sent during the gap: FIFO behind
    assert Trace([(0.0, 8.0), (1.0, 0.0), (3.0, 8.0)])(Chunk(100, 2.0)).t == pytest.approx(3.1)
    assert TraceSteps.from_rows([(0, 8), (1, 0), (3, 8)]).gaps() == [(1.0, 3.0)]
    paused = Trace([(0.0, 8.0)], OutageSchedule([(0.2, 1.2)]))  # an outage pauses it too
    assert paused(Chunk(500, 0.0)).t == pytest.approx(1.5)
    with pytest.raises(ValueError, match="last step"):
        Trace([(0.0, 8.0), (1.0, 0.0)])  # a gap that never ends
    with pytest.raises(ValueError):
        Trace([(0.0, -8.0), (1.0, 8.0)])


def test_trace_rtt_changes_the_delay_per_step_fifo_kept():
    d = Link(TraceDelay(TraceSteps.from_rows([(0, 800, 100), (1, 800, 20)])))
    out = simulate(d, [Chunk(1, t) for t in (0.5, 0.99, 1.0, 2.0)])
    # half the RTT each way; the chunk at 1.0 would arrive at 1.01, before the one at 0.99
    assert [c.t for c in out] == pytest.approx([0.55, 1.04, 1.04, 2.01])


def test_trace_loss_is_per_step_seeded_and_drops_nothing():
    steps = TraceSteps.from_rows([(0, 800, 300, 0.0), (10, 800, 300, 0.3), (20, 800, 300, 0.0)])
    chunks = [Chunk(10, i * 0.1) for i in range(300)]  # 0 .. 29.9 s

    def run(seed):
        loss = TraceLoss(steps, np.random.default_rng(seed))
        return [c.t for c in simulate(Link(loss), chunks)], loss.stalls

    a, stalls = run(7)
    assert (a, stalls) == run(7) and a != run(8)[0] and stalls > 10
    assert len(a) == 300 and all(x <= y for x, y in zip(a, a[1:]))
    late = [c.t for c, t in zip(chunks, a) if t > c.t + 1e-9]
    assert late and min(late) >= 10.0  # the first lossy step starts at 10 s
    stall = max(t - c.t for c, t in zip(chunks, a) if c.t < 20)
    assert stall >= 0.3 - 1e-9  # a stall is max(rto 0.2 s, the step's 300 ms RTT)


def test_trace_csv_with_comments_and_all_columns_in_a_linkspec(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("# a comment\n#  another\ntime_s,kbps,rtt_ms,loss\n0,800,100,0\n"
                 "1,0,100,0\n2,800,20,0\n")
    steps = read_trace(f)
    assert steps.rtt_s == (0.1, 0.1, 0.02) and steps.loss == (0.0, 0.0, 0.0)
    up, _ = LinkSpec(1.0, 1.0, 5.0, loss=0.5, trace=str(f)).build()  # the trace's RTT, loss
    assert up(Chunk(100, 0.0)).t == pytest.approx(0.001 + 0.05)
    assert up(Chunk(100, 1.5)).t == pytest.approx(2.001 + 0.01)  # after the gap, 20 ms RTT
    assert Trace.from_csv(f).rate_at(2.5) == pytest.approx(100_000)


@pytest.mark.parametrize("text, match", [("0,8\n1,8,50\n", "columns"),
                                         ("0,8\n1,eight\n", "t.csv:2"),
                                         ("0,8,50,1.5\n", "loss")])
def test_trace_csv_errors_name_the_problem(tmp_path, text, match):
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_trace(f)


# --- shipped traces ---


def _runs(flags: list[bool]) -> list[int]:
    out, n = [], 0
    for f in [*flags, False]:
        if f:
            n += 1
        elif n:
            out.append(n)
            n = 0
    return out


def test_shipped_traces_have_the_promised_shape():
    assert {"lte", "wifi-handover"} <= set(shipped_traces())
    for name in ("lte", "wifi-handover"):
        path = trace_path(name)
        assert path.read_text().startswith("#") and "Synthetic" in path.read_text()
        s = read_trace(path)
        steps = np.diff(s.times)
        assert 55 <= s.times[-1] <= 61 and steps.min() >= 0.5 and steps.max() <= 1.0
        assert max(e - b for b, e in s.gaps()) >= 2.0, name
        assert s.rtt_s is not None and s.loss is not None
    lte = read_trace(trace_path("lte"))
    rates = [k for k in lte.kbps if k > 0]
    assert 200 <= min(rates) < 500 and 3000 < max(rates) <= 5000
    assert 0.03 <= min(lte.rtt_s) < 0.06 and 0.25 < max(lte.rtt_s) <= 0.3
    assert max(_runs([p > 0 for p in lte.loss])) >= 2  # loss comes in bursts
    assert sum(p > 0 for p in lte.loss) < len(lte.loss) / 4
    wifi = read_trace(trace_path("wifi-handover"))
    (g0, g1), = wifi.gaps()
    before = [i for i, t in enumerate(wifi.times) if t < g0]
    after = [i for i, t in enumerate(wifi.times) if t >= g1]
    assert min(wifi.kbps[i] for i in before) >= 2000  # Wi-Fi: several Mbit/s
    assert all(0.02 <= wifi.rtt_s[i] <= 0.04 for i in before)
    mean = lambda col, idx: sum(col[i] for i in idx) / len(idx)  # noqa: E731
    assert mean(wifi.kbps, after) < mean(wifi.kbps, before) / 2
    assert mean(wifi.rtt_s, after) > 2 * mean(wifi.rtt_s, before)


def test_shipped_traces_rebuild_exactly_from_their_script():
    script = trace_path("lte").parent / "make_traces.py"
    spec = importlib.util.spec_from_file_location("make_traces", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("lte", "wifi-handover"):
        assert mod.render(name) == trace_path(name).read_text(), name


def test_trace_path_names_the_shipped_traces():
    with pytest.raises(ValueError, match="lte.*wifi-handover"):
        trace_path("3g")


def test_the_lte_trace_sends_nothing_during_its_gap():
    s = read_trace(trace_path("lte"))
    (g0, g1), = s.gaps()
    out = simulate(Link(Trace(s)), [Chunk(1448, i * 0.05) for i in range(1200)])  # 0 .. 60 s
    assert not [c.t for c in out if g0 < c.t < g1]
    assert all(x.t <= y.t for x, y in zip(out, out[1:]))


# --- the bench's link syntax ---


def test_parse_links_traces_and_outages():
    links = dict(parse_links("trace:lte, 50kbit:50ms+outage=10:5+outage=30s:500ms,none"))
    assert list(links) == ["trace:lte", "50kbit:50ms+outage=10:5+outage=30s:500ms", "loopback"]
    lte = links["trace:lte"]
    assert lte.trace == str(trace_path("lte")) and 200e3 < lte.up_bps < 5e6
    assert 0.03 < lte.rtt_s < 0.3
    assert links["50kbit:50ms+outage=10:5+outage=30s:500ms"].outages == ((10.0, 5.0),
                                                                        (30.0, 0.5))


def test_parse_links_a_csv_path(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("time_s,kbps\n0,400\n1,32\n")
    (label, spec), = parse_links(f"trace:{f}:40ms")
    assert label == f"trace:{f}:40ms" and spec.rtt_s == pytest.approx(0.04)
    assert spec.trace == str(f) and spec.up_bps == pytest.approx(216e3)


@pytest.mark.parametrize("text, match", [
    ("50kbit:50ms+outage=10", "bad outage '10'"),
    ("50kbit:50ms+delay=1", r"unknown '\+delay=1'"),
    ("trace:nope", "nope.*lte"),
    ("trace:lte:50ms", "own rtt_ms"),
    ("fast:50ms", "bad rate 'fast'"),
])
def test_parse_links_errors_name_the_bad_part(text, match):
    with pytest.raises(ValueError, match=match):
        parse_links(text)


def test_sim_link_rejects_a_bad_outage_or_trace(capsys):
    from acespec.cli import main

    base = ["sim", "link", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:1"]
    assert main([*base, "--outage", "5"]) == 2
    assert "bad outage '5'" in capsys.readouterr().err
    assert main([*base, "--trace", "nope"]) == 2
    assert "wifi-handover" in capsys.readouterr().err


# --- the proxy over real sockets ---


async def _echo_server(accepted: list[float] | None = None):
    async def handle(r, w):
        if accepted is not None:
            accepted.append(time.perf_counter())
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        w.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_cut_mid_stream_holds_everything_then_delivers_it_in_order():
    """A 70-byte message every 20 ms, echoed through 10 Mbit/s and 20 ms RTT; the link is cut
    for 1 s after 0.5 s. Nothing comes back during the cut; then everything, in order."""
    n, cut_after = 100, 25

    async def go():
        server, port = await _echo_server()
        proxy = LinkProxy("127.0.0.1", port, spec=LinkSpec(10e6, 10e6, 0.02))
        r, w = await asyncio.open_connection("127.0.0.1", await proxy.start())
        sent = [f"{i:06d}|".encode() * 10 for i in range(n)]
        arrivals: list[tuple[float, bytes]] = []  # (perf_counter s, bytes)

        async def read_all(total: int):
            while total > 0:
                data = await r.read(65536)
                assert data, "the connection closed"
                arrivals.append((time.perf_counter(), data))
                total -= len(data)

        reader = asyncio.create_task(read_all(sum(map(len, sent))))
        cut_at = 0.0
        for i, msg in enumerate(sent):
            w.write(msg)
            await w.drain()
            if i == cut_after:
                proxy.cut(1.0)
                cut_at = time.perf_counter()
            await asyncio.sleep(0.02)
        await asyncio.wait_for(reader, 20)
        w.close()
        await proxy.stop()
        server.close()
        return sent, arrivals, cut_at, proxy.counts

    sent, arrivals, cut_at, counts = asyncio.run(asyncio.wait_for(go(), 60))
    assert b"".join(d for _, d in arrivals) == b"".join(sent)  # all of it, in order
    assert counts.up == counts.down == sum(map(len, sent))
    assert not [t for t, _ in arrivals if cut_at + 0.1 < t < cut_at + 0.95]
    resumed = min(t for t, _ in arrivals if t > cut_at + 0.1) - cut_at
    assert 0.95 <= resumed < 1.6, resumed
    assert [t for t, _ in arrivals if t > cut_at + 1.3]  # and the stream goes on after


def test_a_new_connection_during_an_outage_hangs_until_it_ends():
    """Without a link spec too: the target sees no connection, the client no reply, until
    the window ends (then the connection works)."""
    async def go():
        accepted: list[float] = []
        server, port = await _echo_server(accepted)
        proxy = CountingProxy("127.0.0.1", port)
        pport = await proxy.start()
        proxy.cut(1.0)
        t0 = time.perf_counter()
        r, w = await asyncio.open_connection("127.0.0.1", pport)
        w.write(b"ping")
        await w.drain()
        assert await asyncio.wait_for(r.readexactly(4), 10) == b"ping"
        took = time.perf_counter() - t0
        w.close()
        await proxy.stop()
        server.close()
        return took, accepted[0] - t0

    took, reached = asyncio.run(asyncio.wait_for(go(), 30))
    assert 0.95 <= reached and 0.95 <= took < 2.0, (reached, took)


def test_outages_from_the_spec_count_from_the_proxys_start():
    async def go():
        server, port = await _echo_server()
        proxy = LinkProxy("127.0.0.1", port, spec=LinkSpec(10e6, 10e6, 0.0,
                                                          outages=((0.0, 0.8),)))
        t0 = time.perf_counter()
        r, w = await asyncio.open_connection("127.0.0.1", await proxy.start())
        w.write(b"x")
        await w.drain()
        await asyncio.wait_for(r.readexactly(1), 10)
        took = time.perf_counter() - t0
        w.close()
        await proxy.stop()
        server.close()
        return took

    took = asyncio.run(asyncio.wait_for(go(), 30))
    assert 0.75 <= took < 1.8, took


def test_reset_closes_every_connection_abruptly():
    """Two live connections and one held by an outage: reset() ends all three at once with
    a TCP reset; a new connection afterwards works."""
    async def go():
        server, port = await _echo_server()
        proxy = LinkProxy("127.0.0.1", port, spec=LinkSpec(10e6, 10e6, 0.01))
        pport = await proxy.start()
        conns = [await asyncio.open_connection("127.0.0.1", pport) for _ in range(2)]
        for r, w in conns:
            w.write(b"a")
            await w.drain()
            assert await asyncio.wait_for(r.readexactly(1), 10) == b"a"
        proxy.cut(30.0)
        held = await asyncio.open_connection("127.0.0.1", pport)
        await asyncio.sleep(0.05)  # the proxy has taken it and holds it
        t0 = time.perf_counter()
        assert proxy.reset() == 3
        ends = []
        for r, _ in [*conns, held]:
            try:
                ends.append(await asyncio.wait_for(r.read(1), 5))
            except ConnectionResetError as e:
                ends.append(type(e).__name__)
        took = time.perf_counter() - t0
        proxy.outage_schedule.windows.clear()  # the link is back
        r, w = await asyncio.open_connection("127.0.0.1", pport)
        w.write(b"b")
        await w.drain()
        again = await asyncio.wait_for(r.readexactly(1), 10)
        w.close()
        await proxy.stop()
        server.close()
        return ends, took, again

    ends, took, again = asyncio.run(asyncio.wait_for(go(), 30))
    assert ends == ["ConnectionResetError"] * 3 and took < 1.0 and again == b"b"


def test_proxy_thread_cut_and_reset():
    async def go():
        server, port = await _echo_server()
        proxy = ProxyThread("127.0.0.1", port, spec=LinkSpec(10e6, 10e6, 0.0))
        r, w = await asyncio.open_connection("127.0.0.1", await proxy.start())
        t0 = time.perf_counter()  # before: the cut begins in the proxy's thread
        await proxy.cut(0.5)
        w.write(b"x")
        await w.drain()
        await asyncio.wait_for(r.readexactly(1), 10)
        took = time.perf_counter() - t0
        closed = await proxy.reset()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r.read(1), 5)
        await proxy.stop()
        server.close()
        return took, closed

    took, closed = asyncio.run(asyncio.wait_for(go(), 30))
    assert 0.5 <= took < 2.5 and closed == 1, (took, closed)

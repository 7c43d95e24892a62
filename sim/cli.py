"""`acespec sim ...`: the link emulator as a standalone TCP proxy."""

from __future__ import annotations

import sys

from acespec.argtypes import command_group
from acespec.sim.trace import shipped_traces


def add_parser(sub) -> None:
    ssub = command_group(sub, "sim", "WAN link emulation")
    lk = ssub.add_parser(
        "link", help="a TCP proxy that behaves like a slow WAN link",
        description="Forward TCP from --listen to --to through an emulated link: rate limit "
        "(token bucket) each way, propagation delay (half the RTT each way), jitter, loss as "
        "retransmission stalls, or a trace of rate, RTT and loss; outages (the link carries "
        "nothing, connections live on, new ones hang). No root needed; counts bytes each way.")
    lk.add_argument("--listen", required=True, metavar="HOST:PORT")
    lk.add_argument("--to", required=True, metavar="HOST:PORT")
    lk.add_argument("--up", default="50kbit", help="edge->cloud rate (default: %(default)s)")
    lk.add_argument("--down", default="50kbit", help="cloud->edge rate (default: %(default)s)")
    lk.add_argument("--rtt", default="50ms", help="round-trip propagation (default: %(default)s)")
    lk.add_argument("--jitter", default="0ms")
    lk.add_argument("--loss", type=float, default=0.0, help="segment loss probability")
    lk.add_argument("--burst", type=int, default=0, help="token-bucket burst, bytes")
    lk.add_argument("--trace", metavar="NAME|PATH",
                    help=f"a shipped trace ({', '.join(shipped_traces())}) or a CSV of "
                    "time_s,kbps[,rtt_ms[,loss]]: replaces --up/--down, and --rtt/--loss where "
                    "it has those columns")
    lk.add_argument("--outage", action="append", default=[], metavar="START:DURATION",
                    help="the link is down for DURATION from START after it starts (seconds, "
                    "or with ms/s; repeatable)")
    lk.add_argument("--seed", type=int, default=0)
    lk.set_defaults(func=run_link)


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def run_link(args) -> int:
    # lazy: a command's start (the link's stages import numpy, which building the parsers
    # does without)
    import asyncio
    import signal

    from acespec.sim.proxy import LinkProxy
    from acespec.sim.stages import LinkSpec, find_trace, parse_outage, parse_rate, parse_time

    try:
        spec = LinkSpec(parse_rate(args.up), parse_rate(args.down), parse_time(args.rtt),
                        parse_time(args.jitter), args.loss, args.burst,
                        str(find_trace(args.trace)) if args.trace else None,
                        tuple(parse_outage(o) for o in args.outage))
        spec.build()  # validates rates, loss and the trace file
        lhost, lport = _hostport(args.listen)
        thost, tport = _hostport(args.to)
    except (ValueError, OSError) as e:
        print(f"acespec sim link: error: {e}", file=sys.stderr)
        return 2

    async def main():
        proxy = LinkProxy(thost, tport, lhost, lport, spec, args.seed)
        port = await proxy.start()
        print(f"acespec link {lhost}:{port} -> {thost}:{tport}: up {args.up}, down "
              f"{args.down}, rtt {args.rtt}, jitter {args.jitter}, loss {args.loss}"
              + (f", trace {args.trace}" if args.trace else "")
              + "".join(f", outage {s:g}s for {d:g}s" for s, d in spec.outages), flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await proxy.stop()
        print(f"bytes up {proxy.counts.up}, down {proxy.counts.down}", flush=True)

    asyncio.run(main())
    return 0

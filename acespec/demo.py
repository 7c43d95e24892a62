"""`acespec demo`: the WAN demo. Starts the verifier and a 50 kbit/s, 50 ms link emulator
as child processes, streams a generation through them from the edge (acespec mode), runs the
same prompt in ar mode, and prints both side by side. The pair is SmolLM2-135M-Instruct
(fetched and converted on first use) answering a chat question, unless --pair demo (the
tiny shipped pair, offline) or --model/--drafter say otherwise. Every child process is
stopped on exit, also on Ctrl-C or an error. Its flags are in acespec.cli.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from acespec import pairs
from acespec.edge.client import channel
from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig
from acespec.edge.session import EdgeEngine, EngineConfig
from acespec.edge.text import StreamDecoder, TextCodec
from acespec.procs import free_port, python_module, wait_port
from acespec.shared import modes
from acespec.shared.tokenizer import ModelFileError
from acespec.sim.bench import parse_links

SAMPLE = "def fibonacci(n):\n    "
DEFAULT_PAIR = "smollm2"  # above ar in `acespec bench --pair smollm2 --dataset sharegpt`
COLUMNS = ("tokens_per_s", "ttft_s", "mean_acceptance_length", "cache_hit_rate",
           "passes_per_token", "wire_bytes_up_per_token", "wire_bytes_down_per_token",
           "rtt_ms")


class Children:
    """Child processes in their own process groups, all stopped on exit."""

    def __init__(self):
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, what: str, argv: list[str], log: Path) -> subprocess.Popen:
        f = open(log, "w")  # noqa: SIM115 - closed with the process below
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        p.log = f
        self.procs.append((what, p))
        print(f"[demo] started the {what} (pid {p.pid}, log {log})", file=sys.stderr, flush=True)
        return p

    def stop(self) -> None:
        for what, p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            p.log.close()
            print(f"[demo] stopped the {what} (pid {p.pid})", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run(args) -> int:
    try:
        (label, spec), = parse_links(args.link)
        modes.check(args.modes.split(","), who="acespec demo")
        if args.pair is None and args.model == args._pair_defaults["model"] \
                and args.drafter == args._pair_defaults["drafter"]:
            args.pair = DEFAULT_PAIR  # no files named: the real pair
            print(f"[demo] pair {DEFAULT_PAIR} (the default; --pair demo is the tiny "
                  "shipped pair, offline)", file=sys.stderr, flush=True)
        pairs.apply(args)
        pairs.check_files(args.model, args.drafter)
    except (ValueError, FileNotFoundError) as e:
        hint = "; --pair demo runs offline" if args.pair == DEFAULT_PAIR else ""
        print(f"acespec demo: error: {e}{hint}", file=sys.stderr)
        return 2
    if args.emulate_step_ms is None:
        args.emulate_step_ms = "0" if args.pair not in (None, "demo") else "40,0.5"
    logs = Path(tempfile.mkdtemp(prefix="acespec-demo-"))
    cloud, link = free_port(), free_port()
    me = python_module("acespec")
    with Children() as kids:
        try:
            # The verifier shares this machine with the edge's drafter: half the cores.
            serve = me + ["cloud", "serve", "--host", "127.0.0.1", "--port", str(cloud),
                          "--threads", str(max(1, (os.cpu_count() or 2) // 2))]
            if args.model:
                serve += ["--model", args.model]
            if args.emulate_step_ms not in ("0", ""):
                serve += ["--emulate-step-ms", args.emulate_step_ms]
            if any(modes.mode(m).gap for m in args.modes.split(",")):
                serve += ["--gap-drafter", args.drafter]  # hybrid drafting
            print(f"[demo] verifier on :{cloud}", file=sys.stderr, flush=True)
            v = kids.start("verifier", serve, logs / "cloud.log")
            rate, _, rtt = args.link.partition(":")
            print(f"[demo] starting a {rate} / {rtt or '0ms'} link on :{link} -> :{cloud}",
                  file=sys.stderr, flush=True)
            lk = kids.start("link emulator", me + [
                "sim", "link", "--listen", f"127.0.0.1:{link}", "--to", f"127.0.0.1:{cloud}",
                "--up", rate, "--down", rate, "--rtt", rtt or "0ms"], logs / "link.log")
            wait_port(link, lk, "link emulator", 30)
            wait_port(cloud, v, "verifier")
            figures = asyncio.run(_generate(args, f"127.0.0.1:{link}"))
            code = 0
        except KeyboardInterrupt:
            print("\n[demo] interrupted; cleaning up", file=sys.stderr)
            code = 130
        except ModelFileError as e:  # the drafter's file
            print(f"acespec demo: error: {e}", file=sys.stderr)
            code = 2
        except (RuntimeError, ConnectionError, OSError) as e:  # the logs stay, to read
            print(f"acespec demo: error: {e} (logs in {logs})", file=sys.stderr)
            return 1
    shutil.rmtree(logs, ignore_errors=True)  # the children's logs, once they are gone
    if code == 0:
        _table(figures, label, args.emulate_step_ms)
    return code


async def _generate(args, addr: str) -> dict:
    """Each mode on the prompt through the link; the first one streamed to stdout."""
    drafter = LlamaDrafter(args.drafter, LlamaDrafterConfig(n_seq_max=2))
    codec = TextCodec.from_drafter(drafter)
    shown, text = _prompt(args, drafter)
    prompt = codec.encode(text)
    ch = channel(addr)
    figures = {}
    try:
        for i, mode in enumerate(args.modes.split(",")):
            engine = EdgeEngine(lambda: ch, codec.vocab_hash,
                                drafter if modes.mode(mode).edge_drafts else None,
                                owns_channels=False)
            cfg = EngineConfig(mode=mode, max_tokens=args.max_tokens, adaptive=mode != "ar",
                               stop_ids=codec.stop_ids)
            stream = StreamDecoder(codec)
            if i == 0:
                print(f"[demo] {mode}: streaming through the link\n", file=sys.stderr, flush=True)
                sys.stdout.write(shown)

            def show(ids, st, stream=stream, live=i == 0):
                if live:
                    sys.stdout.write(stream.feed(ids))
                    sys.stdout.flush()

            if i == 1:
                print(f"\n[demo] now the same prompt in {mode} mode ...", file=sys.stderr,
                      flush=True)
            _, stats = await engine.generate(prompt, cfg, show)
            if i == 0:
                sys.stdout.write(stream.finish() + "\n")
            figures[mode] = stats.as_dict()
    finally:
        await ch.close()
        drafter.close()
    return figures


def _prompt(args, drafter) -> tuple[str, str]:
    """(what the user sees, the text the model gets): a chat pair's question goes through
    its chat template; otherwise the prompt is continued as it is."""
    template = args.pair and (drafter.chat_template() or pairs.chat_template(args.pair))
    if not template:
        return (args.prompt or SAMPLE), (args.prompt or SAMPLE)
    question = args.prompt or pairs.CHAT_SAMPLE
    return f"User: {question}\nAssistant: ", pairs.render_chat(template, question)


def _table(figures: dict, link: str, emulate: str) -> None:
    modes = list(figures)
    step = ("the target's own step time on this CPU" if emulate in ("0", "") else
            f"each pass padded to {emulate} ms (TESTBED: a big target's step time on this CPU)")
    print(f"\nlink {link}; verifier: {step}")
    print("| figure | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for c in COLUMNS:
        if any(figures[m].get(c) is not None for m in modes):  # e.g. no RTT timed: no row
            print(f"| {c} | " + " | ".join(str(figures[m].get(c)) for m in modes) + " |")
    if "ar" in figures and len(modes) > 1 and figures["ar"]["tokens_per_s"]:
        m = modes[0]
        print(f"\n{m} / ar: {figures[m]['tokens_per_s'] / figures['ar']['tokens_per_s']:.2f}x "
              "tokens/s")

"""`acespec bench ...`: the side-by-side benchmark, its model and its load and hostile
runs, from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from acespec import pairs
from acespec.argtypes import draft_ms, number
from acespec.sim.datasets import DATASETS


def add_bench_parser(sub) -> None:
    from acespec.models import DEMO_DRAFTER
    from acespec.sim.bench import CLOUD_DRAFT_MS

    b = sub.add_parser(
        "bench", help="side-by-side benchmark of the modes through emulated links",
        description="Start the verifier (with a big-model step-time profile), a link emulator "
        "and the edge; run every mode on every prompt through the same link; report tokens/s, "
        "TTFT, inter-token latency, acceptance, wire bytes/token (socket level), "
        "passes/token, the ideal bound and speedups over ar and sd.\n\n"
        "  acespec bench calibrate --out costs.json   measure the discrete-event model's costs\n"
        "  acespec bench sweep --calibration costs.json [--accept 0.8]   sweep it (_lone columns:\n"
        "      the decided modes' passes no edge draft covered, of all passes)\n"
        "  acespec bench hostile   an honest client's tok/s alone and beside wasteful, "
        "long-prompt\n      and honest peers, on one verifier",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("what", nargs="?", default="run",
                   choices=["run", "calibrate", "sweep", "hostile", "load"],
                   help="run the real benchmark (default), calibrate the model, sweep it, "
                   "measure what hostile and heavy clients cost an honest one (hostile), or "
                   "many clients at once on one verifier (load)")
    b.add_argument("--clients", default="1,2,4,6,8,12,16,24,32,48,64",
                   help="load: client counts, each a run of that many clients at once, "
                   "closed loop, each through its own --link (default: %(default)s)")
    b.add_argument("--requests", type=number(int, 1), default=2,
                   help="load: generations per client at each count (default: %(default)s)")
    b.add_argument("--per-process", type=number(int, 1, 32), default=16,
                   help="load: clients per edge process (default: %(default)s)")
    b.add_argument("--predict", action="store_true",
                   help="load: the discrete-event model's prediction beside each measured "
                   "row (ar, acespec, colo, cloud-lookup), on the same link and profiles, "
                   "with --accept (default 0.8) and --lookup-accept (default 0.3)")
    b.add_argument("--edge-nice", type=number(int, 0, 19), default=10,
                   help="load: the edge processes' niceness, so that they take the CPU the "
                   "verifier leaves, as edges on their users' own devices would not slow it "
                   "(0: same priority) (default: %(default)s)")
    b.add_argument("--slo-speedup", type=number(float, 0.0, lo_open=True), default=1.3,
                   help="load: goodput counts the clients whose p10 client makes this x ar's "
                   "one-client tokens/s, measured in the run (default: %(default)s)")
    b.add_argument("--slo-tok-s", type=number(float, 0.0, lo_open=True),
                   help="load: the per-client tokens/s of the SLO instead (then ar with one "
                   "client need not run)")
    b.add_argument("--slo-ttft-s", type=number(float, 0.0, lo_open=True), default=2.0,
                   help="load: ... and TTFT p90 at most this (default: %(default)s)")
    b.add_argument("--scenarios", default="alone,peer,waste1,waste4,long2",
                   help="hostile: beside an honest `edge generate` (acespec mode, greedy, "
                   "--max-tokens, on 5 code prompts): alone, peerN (N honest clients), "
                   "wasteN (N clients extending 256 random nodes per round), longN (N clients "
                   "opening sessions on 4,000-token prompts) (default: %(default)s)")
    b.add_argument("--calibration", help="sweep: costs JSON from 'bench calibrate'")
    b.add_argument("--accept", type=float, help="sweep, load --predict: per-position "
                   "acceptance of the edge's drafts (default: the calibrated pair's)")
    b.add_argument("--hit-rate", type=float, help="sweep: acespec cache hit rate (default: "
                   "calibrated)")
    b.add_argument("--lookup-accept", type=number(float, 0.0, 0.99), metavar="A",
                   help="sweep, load --predict: per-position acceptance of the verifier's "
                   "prompt-lookup proposals in lone passes of the decided modes (default: the calibration's "
                   "lookup_acceptance, fitted to its run's tokens per lone pass; 0: none)")
    b.add_argument("--hold-ms", type=number(float, 0.0), default=0.0, metavar="MS",
                   help="sweep: the decided modes' verifier idles up to MS before a pass no "
                   "draft covers, for drafts already on their way (what waiting for the edge "
                   "would buy; the real verifier never waits; default: %(default)s)")
    b.add_argument("--rates", default="20kbit,50kbit,200kbit,1mbit,10mbit",
                   help="sweep: link rates (default: %(default)s)")
    b.add_argument("--rtts", default="10ms,50ms,100ms,200ms", help="sweep: RTTs")
    b.add_argument("--depths", default="2,4,8", help="sweep: draft depths")
    b.add_argument("--link", default="50kbit:50ms",
                   help="comma-separated links: RATE:RTT, 'loopback', or trace:NAME (a "
                   "shipped mobile-like trace: lte, wifi-handover) or trace:FILE.csv "
                   "(time_s,kbps[,rtt_ms[,loss]]); any may add +outage=START:DURATION "
                   "(repeatable). A link that changes in time starts each prompt's run at "
                   "its own point of the link's cycle, the same for every mode "
                   "(default: %(default)s)")
    b.add_argument("--modes", default=None,
                   help="comma-separated, from: ar, sd, pipeline, acespec, acespec-chain "
                   "(acespec with one drafted chain instead of the speculation tree), "
                   "acespec-local (acespec answering from the drafter, unverified, while the "
                   "verifier is unreachable: edge --offline local), "
                   "acespec-gap (hybrid: the tree, and the verifier's gap drafter proposing in "
                   "the passes no edge draft covers while the device has room for its steps; "
                   "the verifier then gets --gap-drafter, which the other modes' sessions "
                   "turn off), and the rivals that speculate at "
                   "the verifier while the edge drafts nothing: colo (co-located: the "
                   "verifier's gap drafter, the edge's own drafter file, beside the target) "
                   "and cloud-lookup (prompt lookup at the verifier only) (default: "
                   "ar,sd,pipeline,acespec; load: ar,acespec,acespec-gap,colo,cloud-lookup)")
    b.add_argument("--emulate-cloud-draft-ms", default=CLOUD_DRAFT_MS, metavar="T0[,PER_SEQ]",
                   help="TESTBED step of the verifier's gap drafter (acespec-gap, colo): each "
                   "batched draft step takes at least T0 ms + PER_SEQ ms per session, on the "
                   "target's device between its passes; 5 ms is an eighth of the default "
                   "profile's 40 ms target step, a 1B-class drafter beside a 70B-class target "
                   "(default: %(default)s)")
    b.add_argument("--prompts", help="JSONL of {id, category, prompt} (default: shipped set)")
    b.add_argument("--dataset", default="shipped", choices=DATASETS,
                   help="'shipped' (the shipped prompts or --prompts) or 'sharegpt' (real chats "
                   "of ShareGPT V3, fetched on first use, rendered with the pair's chat "
                   "template; categories code/writing/explain/other) (default: %(default)s)")
    b.add_argument("--split", default="eval", choices=["train", "eval"],
                   help="--dataset sharegpt: records [0, 12000) or [12000, end), the split no "
                   "drafter is trained on (default: %(default)s)")
    b.add_argument("--per-category", type=number(int, 1), default=10,
                   help="prompts per category")
    b.add_argument("--max-tokens", type=number(int, 1), default=64)
    b.add_argument("--depth", type=number(int, 1), default=4)
    b.add_argument("--window", type=number(int, 1), default=16)
    b.add_argument("--netns", action="store_true",
                   help="shape each link with tc tbf on a veth into a network namespace that "
                   "runs the verifier (Linux, root; the proxy then only adds the delay)")
    b.add_argument("--adaptive", action="store_true",
                   help="pipeline/acespec start at --depth/--window and follow the link")
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--sampling", default="coupled", choices=["coupled", "exact"],
                   help="with --temperature > 0: coupled (the verifier decides) or exact "
                   "(rejection sampling at the edge) (default: %(default)s)")
    b.add_argument("--emulate-step-ms", default=None, metavar="T0[,PER_NODE[,KNEE]]",
                   help="TESTBED step-time profile of the verifier: T0 ms a pass plus PER_NODE "
                   "ms a node (beyond KNEE nodes, a GPU-like roofline) (default: 40,0.5, "
                   "per-node heavy; load: 25,0.1,256, flat 25 ms up to 256 nodes)")
    b.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the verifier's --dtype, for every mode (`ar` too). bfloat16 with "
                   "--linear torch makes a multi-token pass cheap on a CPU with native "
                   "bfloat16 (AVX512-BF16, AMX), but its logits depend on the pass's size, "
                   "so greedy text can differ from ar's (see same_as_ar); float32 with the "
                   "default oneDNN linears is flat too (default: %(default)s)")
    b.add_argument("--linear", default="auto", choices=["auto", "onednn", "torch"],
                   help="the verifier's --linear, for every mode: oneDNN with prepacked "
                   "weights (auto, on the CPU) or torch's F.linear (default: %(default)s)")
    b.add_argument("--emulate-draft-ms", type=draft_ms, default=(0.0, 0.0),
                   metavar="T[,PER_TOKEN]",
                   help="TESTBED profile of the edge: pad each drafter decode to T ms "
                   "(+ PER_TOKEN ms per extra token in a batch) (default: off)")
    b.add_argument("--propose", type=number(int, 0, 64), default=8, metavar="N",
                   help="the verifier's --propose: its own prompt-lookup proposals in a pass "
                   "no draft covers (0: off) (default: %(default)s)")
    b.add_argument("--gap-drafter", metavar="PATH",
                   help="acespec-gap: the verifier's gap drafter (default: --drafter, the "
                   "edge's own drafter file)")
    b.add_argument("--model", default="", help="target HF folder (default: the demo target)")
    b.add_argument("--drafter", default=str(DEMO_DRAFTER))
    pairs.add_argument(b, target="model", drafter="drafter")
    b.add_argument("--out", help="write results JSON here")
    b.add_argument("--plot", help="write PNG plots into this folder")
    b.set_defaults(func=run_bench_cli)


def run_bench_cli(args) -> int:
    from acespec.shared.tokenizer import ModelFileError

    try:
        pairs.apply(args)
        _check_files(args)
    except (pairs.PairError, ModelFileError, FileNotFoundError) as e:
        print(f"acespec bench: error: {e}", file=sys.stderr)
        return 2
    if args.what == "calibrate":
        return _calibrate(args)
    if args.what == "sweep":
        return _sweep(args)
    if args.emulate_step_ms is None:
        args.emulate_step_ms = "25,0.1,256" if args.what == "load" else "40,0.5"
    if args.modes is None:
        args.modes = ("ar,acespec,acespec-gap,colo,cloud-lookup" if args.what == "load" else
                      "ar,sd,pipeline,acespec")
    if args.what == "hostile":
        return _hostile(args)
    if args.what == "load":
        return _load(args)
    import asyncio
    import json

    from acespec.sim.bench import BENCH_MODES, BenchConfig, parse_links, progress_bar, run_bench
    from acespec.sim.bench_report import by_category, markdown, plot, summarize

    try:
        cfg = BenchConfig(links=parse_links(args.link), modes=tuple(args.modes.split(",")),
                          max_tokens=args.max_tokens, depth=args.depth, window=args.window,
                          adaptive=args.adaptive, netns=args.netns,
                          temperature=args.temperature, sampling=args.sampling,
                          emulate=args.emulate_step_ms, per_category=args.per_category,
                          emulate_draft=args.emulate_draft_ms, propose=args.propose,
                          dtype=args.dtype, linear=args.linear,
                          gap_drafter=args.gap_drafter or args.drafter,
                          cloud_draft=args.emulate_cloud_draft_ms)
        bad = [m for m in cfg.modes if m not in BENCH_MODES]
        if bad:
            raise ValueError(f"unknown modes {bad}; available: {', '.join(BENCH_MODES)}")
        prompts = _prompts(args)
    except (ValueError, OSError) as e:
        print(f"acespec bench: error: {e}", file=sys.stderr)
        return 2
    records = asyncio.run(run_bench(cfg, args.model, args.drafter, prompts, progress_bar))
    summary, cats = summarize(records, cfg), by_category(records)
    draft = ",".join(f"{x:g}" for x in cfg.emulate_draft) if any(cfg.emulate_draft) else "off"
    print(f"profile: --emulate-step-ms {cfg.emulate}, --emulate-draft-ms {draft}, "
          f"--propose {cfg.propose}, verifier {cfg.dtype} ({cfg.linear} linear), "
          f"depth {cfg.depth}, window {cfg.window}"
          f"{' (adaptive)' if cfg.adaptive else ''}, "
          f"{len(prompts)} prompts, {cfg.max_tokens} tokens each, temperature {cfg.temperature}"
          f"{f' ({cfg.sampling} sampling)' if cfg.temperature else ''}")
    print(markdown(summary))
    print("\nper category:")
    print(markdown(cats))
    if args.out:
        from dataclasses import asdict

        Path(args.out).write_text(json.dumps({"config": asdict(cfg), "summary": summary,
                                              "by_category": cats, "runs": records},
                                             indent=1, default=str))
    if args.plot:
        for f in plot(summary, cats, args.plot):
            print(f"plot: {f}")
    return 0


def _check_files(args) -> None:
    """The target folder and the drafter GGUF read (their headers): a bad file is one line
    here, not a child process's traceback."""
    from acespec.cloud.target.loader import check_checkpoint
    from acespec.cloud.verify.gap_file import check_gguf

    if args.what in ("run", "calibrate", "hostile"):
        if args.model:
            check_checkpoint(args.model)
        if args.drafter and args.drafter != "ngram":
            check_gguf(Path(args.drafter), "--drafter")


def _hostile(args) -> int:
    import asyncio

    from acespec.sim import hostile
    from acespec.sim.bench import BenchConfig, _verifier_process

    try:
        scenarios = [hostile.Scenario.parse(x) for x in args.scenarios.split(",")]
        cfg = BenchConfig(links=(), modes=("acespec",), max_tokens=args.max_tokens,
                          emulate=args.emulate_step_ms, propose=args.propose,
                          dtype=args.dtype, linear=args.linear)
    except ValueError as e:
        print(f"acespec bench: error: {e}", file=sys.stderr)
        return 2
    from acespec.models import DEMO_TARGET
    from acespec.shared.tokenizer import Tokenizer

    pair_args = ["--drafter", args.drafter]
    vh = Tokenizer.load(args.model or DEMO_TARGET).vocab_hash()

    async def main() -> list[dict]:
        async with _verifier_process(cfg, args.model) as start:
            async with start(None) as (host, port, _, _busy):
                return await asyncio.to_thread(
                    hostile.run, scenarios, f"{host}:{port}", vh, list(hostile.HONEST_PROMPTS),
                    args.max_tokens, pair_args, lambda m: print(m, file=sys.stderr))

    rows = asyncio.run(main())
    print(f"profile: --emulate-step-ms {cfg.emulate}, --propose {cfg.propose}, honest "
          f"`edge generate` (acespec, greedy), {args.max_tokens} tokens, "
          f"{len(hostile.HONEST_PROMPTS)} prompts per scenario")
    print(hostile.markdown(rows))
    if args.out:
        import json

        Path(args.out).write_text(json.dumps({"runs": rows}, indent=1))
    return 0


def _load(args) -> int:
    import json

    from acespec.sim import load

    try:
        cfg = load.LoadConfig(
            clients=tuple(int(x) for x in args.clients.split(",")),
            modes=tuple(args.modes.split(",")), link=args.link, emulate=args.emulate_step_ms,
            cloud_draft=args.emulate_cloud_draft_ms, propose=args.propose,
            requests=args.requests, max_tokens=args.max_tokens, temperature=args.temperature,
            per_process=args.per_process, edge_nice=args.edge_nice,
            slo_speedup=args.slo_speedup,
            slo_ttft_s=args.slo_ttft_s, slo_tok_s=args.slo_tok_s)
        prompts = [p["prompt"] for p in _prompts(args)]
    except (ValueError, OSError) as e:
        print(f"acespec bench: error: {e}", file=sys.stderr)
        return 2
    result = load.run_load(cfg, args.model, args.drafter, prompts,
                           lambda m: print(m, file=sys.stderr, flush=True))
    print(f"profile: --emulate-step-ms {cfg.emulate}, --emulate-cloud-draft-ms "
          f"{cfg.cloud_draft}, --propose {cfg.propose}, --edge-nice {cfg.edge_nice}, "
          f"link {cfg.link} per client, "
          f"{cfg.requests} generations of {cfg.max_tokens} tokens per client, "
          f"{len(prompts)} prompts, temperature {cfg.temperature}")
    print(load.markdown(result["runs"]))
    if args.predict:
        accept = 0.8 if args.accept is None else args.accept
        lookup = 0.3 if args.lookup_accept is None else args.lookup_accept
        result["predicted"] = load.predict(cfg, result["runs"], accept, lookup)
        print(f"\nthe discrete-event model (acceptance {accept}, prompt-lookup acceptance "
              f"{lookup}), the same rows:")
        print(load.markdown(result["predicted"], load.PREDICTED_KEYS))
    slo = result["slo"]
    print(f"\ngoodput (clients whose p10 makes {slo['per_client_tok_s']} tok/s with TTFT p90 "
          f"<= {slo['ttft_p90_s']} s): " +
          ", ".join(f"{m} {n}" for m, n in result["goodput"].items()))
    good = result["goodput"]
    if good.get("colo"):
        best = max((n for m, n in good.items() if m.startswith("acespec")), default=0)
        print(f"acespec / colo goodput: {best / good['colo']:.2f}x; the capacity bound, "
              f"1 + gamma t_d / t_v: {result['capacity_bound']}x")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.plot:
        print(f"plot: {load.plot_frontier(result['runs'], args.plot)}")
    return 0


def _prompts(args) -> list[dict]:
    from acespec.sim.bench import load_prompts

    if args.dataset == "shipped":
        return load_prompts(args.prompts, args.per_category)
    if args.prompts:
        raise ValueError("--prompts and --dataset sharegpt: pass one or the other")
    from acespec.sim.datasets import sharegpt_prompts

    return sharegpt_prompts(_template(args), args.split, args.per_category)


def _template(args) -> str | None:
    """The chat template of --pair, else of the drafter GGUF (None if it has none)."""
    if args.pair:
        return pairs.chat_template(args.pair)
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig

    gguf = LlamaDrafter(args.drafter, LlamaDrafterConfig(n_ctx=16, n_seq_max=1))
    try:
        return gguf.chat_template()
    finally:
        gguf.close()


def _calibrate(args) -> int:
    import json

    from acespec.sim.calibrate import calibrate

    print("calibrating: drafter, target passes and wire bytes of real sessions (loopback) ...",
          file=sys.stderr, flush=True)
    data = calibrate(args.model, args.drafter, args.emulate_step_ms,
                     per_category=min(args.per_category, 2), max_tokens=args.max_tokens)
    text = json.dumps(data, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def _sweep(args) -> int:
    import json

    from acespec.sim.bench_report import markdown
    from acespec.sim.calibrate import load_calibration
    from acespec.sim.des import ModelCosts
    from acespec.sim.stages import parse_rate, parse_time
    from acespec.sim.sweep import best_per_link, sweep

    try:
        costs, data = load_calibration(args.calibration) if args.calibration else (ModelCosts(), {})
        rates = [parse_rate(r) for r in args.rates.split(",")]
        rtts = [parse_time(t) for t in args.rtts.split(",")]
        depths = [int(d) for d in args.depths.split(",")]
    except (ValueError, OSError, KeyError) as e:
        print(f"acespec bench sweep: error: {e}", file=sys.stderr)
        return 2
    accept = args.accept if args.accept is not None else data.get("acceptance", 0.8)
    hit = args.hit_rate if args.hit_rate is not None else data.get("hit_rate", 0.5)
    lookup = (args.lookup_accept if args.lookup_accept is not None
              else data.get("lookup_acceptance", 0.0))
    rows = sweep(costs, accept, hit, rates, rtts, depths, lookup_accept=lookup,
                 hold_s=args.hold_ms / 1000)
    hold = f", verifier holds up to {args.hold_ms:g} ms" if args.hold_ms else ""
    print(f"discrete-event model: acceptance {accept}, hit rate {hit}, prompt-lookup "
          f"acceptance {lookup}{hold}, costs "
          f"{'from ' + args.calibration if args.calibration else '(defaults)'}; best depth/window per "
          "link")
    print(markdown(best_per_link(rows)))
    if args.out:
        Path(args.out).write_text(json.dumps({"accept": accept, "hit_rate": hit,
                                              "lookup_accept": lookup, "rows": rows},
                                             indent=1))
    return 0

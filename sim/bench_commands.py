"""What each `acespec bench` command does with its parsed arguments (acespec.sim.bench_cli):
check the model files, run, print the report and write --out and --plot."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path

from acespec import pairs
from acespec.argtypes import EXIT_USAGE
from acespec.models import DEMO_TARGET
from acespec.shared.tokenizer import ModelFileError, Tokenizer
from acespec.sim import bench, bench_report, calibrate, hostile, load, sweep
from acespec.sim.datasets import sharegpt_prompts
from acespec.sim.des import ModelCosts
from acespec.sim.stages import parse_rate, parse_time


def _fail(message: object, command: str = "acespec bench") -> int:
    print(f"{command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _models_ready(args, check: bool) -> bool:
    """--pair's files set into --model/--drafter and, with check, their headers read (a bad
    file is one line here, not a child process's traceback); False, said on stderr, if not."""
    try:
        pairs.apply(args)
        if check:
            pairs.check_files(args.model, "" if args.drafter == "ngram" else args.drafter)
    except (pairs.PairError, ModelFileError, FileNotFoundError) as e:
        _fail(e)
        return False
    return True


def bench_run(args) -> int:
    if not _models_ready(args, check=True):
        return EXIT_USAGE
    try:
        cfg = bench.BenchConfig(
            links=bench.parse_links(args.link), modes=tuple(args.modes.split(",")),
            max_tokens=args.max_tokens, depth=args.depth, window=args.window,
            adaptive=args.adaptive, netns=args.netns, temperature=args.temperature,
            sampling=args.sampling, emulate=args.emulate_step_ms,
            per_category=args.per_category, emulate_draft=args.emulate_draft_ms,
            propose=args.propose, dtype=args.dtype, linear=args.linear,
            gap_drafter=args.gap_drafter or args.drafter,
            cloud_draft=args.emulate_cloud_draft_ms)  # ValueError naming an unknown mode
        prompts = _prompts(args)
    except (ValueError, OSError) as e:
        return _fail(e)
    records = asyncio.run(bench.run_bench(cfg, args.model, args.drafter, prompts,
                                          bench.progress_bar))
    summary, cats = bench_report.summarize(records, cfg), bench_report.by_category(records)
    draft = ",".join(f"{x:g}" for x in cfg.emulate_draft) if any(cfg.emulate_draft) else "off"
    print(f"profile: --emulate-step-ms {cfg.emulate}, --emulate-draft-ms {draft}, "
          f"--propose {cfg.propose}, verifier {cfg.dtype} ({cfg.linear} linear), "
          f"depth {cfg.depth}, window {cfg.window}"
          f"{' (adaptive)' if cfg.adaptive else ''}, "
          f"{len(prompts)} prompts, {cfg.max_tokens} tokens each, temperature {cfg.temperature}"
          f"{f' ({cfg.sampling} sampling)' if cfg.temperature else ''}")
    print(bench_report.markdown(summary))
    print("\nper category:")
    print(bench_report.markdown(cats))
    if args.out:
        Path(args.out).write_text(json.dumps({"config": asdict(cfg), "summary": summary,
                                              "by_category": cats, "runs": records},
                                             indent=1, default=str))
    if args.plot:
        for f in bench_report.plot(summary, cats, args.plot):
            print(f"plot: {f}")
    return 0


def bench_hostile(args) -> int:
    if not _models_ready(args, check=True):
        return EXIT_USAGE
    try:
        scenarios = [hostile.Scenario.parse(x) for x in args.scenarios.split(",")]
        cfg = bench.BenchConfig(links=(), modes=("acespec",), max_tokens=args.max_tokens,
                                emulate=args.emulate_step_ms, propose=args.propose,
                                dtype=args.dtype, linear=args.linear)
    except ValueError as e:
        return _fail(e)
    pair_args = ["--drafter", args.drafter]
    vh = Tokenizer.load(args.model or DEMO_TARGET).vocab_hash()

    async def main() -> list[dict]:
        async with bench._verifier_process(cfg, args.model) as start:
            async with start(None) as (host, port, _, meter):
                return await asyncio.to_thread(
                    hostile.run, scenarios, f"{host}:{port}", vh, list(hostile.HONEST_PROMPTS),
                    args.max_tokens, pair_args, lambda m: print(m, file=sys.stderr),
                    meter.rss)

    rows = asyncio.run(main())
    print(f"profile: --emulate-step-ms {cfg.emulate}, --propose {cfg.propose}, honest "
          f"`edge generate` (acespec, greedy), {args.max_tokens} tokens, "
          f"{len(hostile.HONEST_PROMPTS)} prompts per scenario")
    print(hostile.markdown(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": rows}, indent=1))
    return 0


def bench_load(args) -> int:
    if not _models_ready(args, check=False):
        return EXIT_USAGE
    try:
        cfg = load.LoadConfig(
            clients=tuple(int(x) for x in args.clients.split(",")),
            modes=tuple(args.modes.split(",")), link=args.link, emulate=args.emulate_step_ms,
            cloud_draft=args.emulate_cloud_draft_ms, propose=args.propose,
            requests=args.requests, max_tokens=args.max_tokens, temperature=args.temperature,
            per_process=args.per_process, edge_nice=args.edge_nice,
            slo_speedup=args.slo_speedup, slo_ttft_s=args.slo_ttft_s, slo_tok_s=args.slo_tok_s,
            emulate_draft=args.emulate_draft_ms, dilate=args.dilate)
        prompts = [p["prompt"] for p in _prompts(args)]
    except (ValueError, OSError) as e:
        return _fail(e)
    result = load.run_load(cfg, args.model, args.drafter, prompts,
                           lambda m: print(m, file=sys.stderr, flush=True))
    print(f"profile: --emulate-step-ms {cfg.emulate}, --emulate-cloud-draft-ms "
          f"{cfg.cloud_draft}, --emulate-draft-ms {cfg.emulate_draft[0]:g},"
          f"{cfg.emulate_draft[1]:g} (edges), --dilate {cfg.dilate:g} (figures undilated), "
          f"--propose {cfg.propose}, --edge-nice {cfg.edge_nice}, "
          f"link {cfg.link} per client, "
          f"{cfg.requests} generations of {cfg.max_tokens} tokens per client, "
          f"{len(prompts)} prompts, temperature {cfg.temperature}")
    print(load.markdown(result["runs"]))
    if args.predict:
        result["predicted"] = load.predict(cfg, result["runs"], args.accept, args.lookup_accept)
        print(f"\nthe discrete-event model (acceptance {args.accept}, prompt-lookup acceptance "
              f"{args.lookup_accept}), the same rows:")
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
        for plot in (load.plot_frontier, load.plot_timeline):
            print(f"plot: {plot(result['runs'], args.plot)}")
    return 0


def _prompts(args) -> list[dict]:
    if args.dataset == "shipped":
        return bench.load_prompts(args.prompts, args.per_category)
    if args.prompts:
        raise ValueError("--prompts and --dataset sharegpt: pass one or the other")
    return sharegpt_prompts(_template(args), args.split, args.per_category)


def _template(args) -> str | None:
    """The chat template of --pair, else of the drafter GGUF (None if it has none)."""
    if args.pair:
        return pairs.chat_template(args.pair)
    # lazy: llama.cpp, an optional dependency
    from acespec.edge.drafting.llama import LlamaDrafter, LlamaDrafterConfig

    gguf = LlamaDrafter(args.drafter, LlamaDrafterConfig(n_ctx=16, n_seq_max=1))
    try:
        return gguf.chat_template()
    finally:
        gguf.close()


def bench_calibrate(args) -> int:
    if not _models_ready(args, check=True):
        return EXIT_USAGE
    print("calibrating: drafter, target passes and wire bytes of real sessions (loopback) ...",
          file=sys.stderr, flush=True)
    data = calibrate.calibrate(args.model, args.drafter, args.emulate_step_ms,
                               per_category=args.per_category,
                               max_tokens=args.max_tokens)
    text = json.dumps(data, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def bench_sweep(args) -> int:
    try:
        costs, data = (calibrate.load_calibration(args.calibration) if args.calibration
                       else (ModelCosts(), {}))
        rates = [parse_rate(r) for r in args.rates.split(",")]
        rtts = [parse_time(t) for t in args.rtts.split(",")]
        depths = [int(d) for d in args.depths.split(",")]
    except (ValueError, OSError, KeyError) as e:
        return _fail(e, "acespec bench sweep")
    accept = args.accept if args.accept is not None else data.get("acceptance", 0.8)
    hit = args.hit_rate if args.hit_rate is not None else data.get("hit_rate", 0.5)
    lookup = (args.lookup_accept if args.lookup_accept is not None
              else data.get("lookup_acceptance", 0.0))
    rows = sweep.sweep(costs, accept, hit, rates, rtts, depths, lookup_accept=lookup,
                       hold_s=args.hold_ms / 1000)
    hold = f", verifier holds up to {args.hold_ms:g} ms" if args.hold_ms else ""
    print(f"discrete-event model: acceptance {accept}, hit rate {hit}, prompt-lookup "
          f"acceptance {lookup}{hold}, costs "
          f"{'from ' + args.calibration if args.calibration else '(defaults)'}; best "
          "depth/window per link")
    print(bench_report.markdown(sweep.best_per_link(rows)))
    if args.out:
        Path(args.out).write_text(json.dumps({"accept": accept, "hit_rate": hit,
                                              "lookup_accept": lookup, "rows": rows},
                                             indent=1))
    return 0

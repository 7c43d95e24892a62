"""`acespec bench ...` on the command line: the side-by-side benchmark (`run`, the default),
many clients on one verifier (`load`), what hostile clients cost an honest one (`hostile`),
and the discrete-event model (`calibrate`, `sweep`).

Each command has its own parser, assembled from the option groups below, so that its
`--help` shows its options only; what it then does is in acespec.sim.bench_commands. The
parsers import neither the bench nor the verifier (every `acespec` command builds them), so
the defaults below are the library's, restated (tests/sim/test_bench_cli.py holds them
equal)."""

from __future__ import annotations

from acespec import pairs
from acespec.argtypes import command, draft_ms, number
from acespec.shared import modes

DEMO_ACCEPT, DEMO_LOOKUP_ACCEPT = 0.74, 0.566  # the demo pair's, from `bench calibrate`
# (docs/benchmarks.md §2): the edge drafter's per-position acceptance, prompt lookup's
STEP_MS = "40,0.5"  # acespec.sim.bench.BenchConfig.emulate: per-node heavy
GPU_LIKE = "25,0.1,256"  # acespec.sim.load.GPU_LIKE: flat up to 256 nodes
CLOUD_DRAFT_MS = "5,0.05"  # acespec.sim.bench.CLOUD_DRAFT_MS
EDGE_DRAFT_MS = "12,1"  # acespec.sim.load.EDGE_DRAFT_MS: a 1B-class drafter on a laptop
DATASETS = ("shipped", "sharegpt")  # acespec.sim.datasets.DATASETS


def add_bench_parser(sub) -> None:
    b = sub.add_parser(
        "bench", help="benchmarks through emulated links, and the discrete-event model",
        description="Benchmarks of the real system through emulated links, and a "
        "discrete-event model of it. With no command, `run`: `acespec bench --modes "
        "ar,acespec` is `acespec bench run --modes ar,acespec`.")
    b.default_command = "run"
    cmds = b.add_subparsers(dest="bench_cmd", metavar="COMMAND")
    for add in (_add_run, _add_load, _add_hostile, _add_calibrate, _add_sweep):
        add(cmds)


def _add_run(cmds) -> None:
    p = cmds.add_parser(
        "run", help="every mode on every prompt through the same links (the default)",
        description="Start the verifier (with a big-model step-time profile), a link emulator "
        "and the edge; run every mode on every prompt through the same link; report tokens/s, "
        "TTFT, inter-token latency, acceptance, wire bytes/token (socket level), "
        "passes/token, the ideal bound and speedups over ar and sd.")
    g = _link_options(p, netns=True)
    g.add_argument("--modes", default=",".join(modes.BENCH_DEFAULT),
                   help=f"comma-separated, from: {modes.help_text()}. The verifier gets "
                   "--gap-drafter when a mode with a gap drafter runs; the other modes' "
                   "sessions turn it off (default: %(default)s)")
    _prompt_options(p)
    g = _generation_options(p, temperature=True)
    g.add_argument("--sampling", default="coupled", choices=["coupled", "exact"],
                   help="with --temperature > 0: coupled (the verifier decides) or exact "
                   "(rejection sampling at the edge) (default: %(default)s)")
    g.add_argument("--depth", type=number(int, 1), default=4)
    g.add_argument("--window", type=number(int, 1), default=16)
    g.add_argument("--adaptive", action="store_true",
                   help="pipeline/acespec start at --depth/--window and follow the link")
    g = _verifier_options(p, STEP_MS, "per-node heavy", dtype=True, cloud_draft=True)
    g.add_argument("--gap-drafter", metavar="PATH",
                   help="acespec-gap: the verifier's gap drafter (default: --drafter, the "
                   "edge's own drafter file)")
    g.add_argument("--emulate-draft-ms", type=draft_ms, default=(0.0, 0.0),
                   metavar="T[,PER_TOKEN]",
                   help="TESTBED profile of the edge: pad each drafter decode to T ms "
                   "(+ PER_TOKEN ms per extra token in a batch) (default: off)")
    _model_options(p)
    _output_options(p, plot=True)
    p.set_defaults(func=command(_commands, "bench_run"))


def _add_load(cmds) -> None:
    p = cmds.add_parser(
        "load", help="many clients at once on one verifier: tokens/s, TTFT and goodput",
        description="One verifier, N clients at once, closed loop, each through its own "
        "--link: per-client tokens/s (p10, median), TTFT, the aggregate tokens/s over the "
        "run and while every client is in it (all_live_tok_s: from the last client's first "
        "token to the first client's last), the verifier's passes a second and requests per "
        "pass, its turnaround (turnaround_ms: the device's wait between passes while their "
        "sessions queue again, a pass on average; turnaround_share: of the run), the "
        "sessions the edges re-dialled (reconnects: a session silent past the "
        "stall threshold is opened again, its text prefilled again), how the edges' drafts "
        "fared (edge_drafts_scored: the share that reached a pass before their positions "
        "were decided; edge_draft_tok_s: the drafts an edge sent a second of its "
        "generation, against its drafter's steps a second; edge_grows_ahead: the share of "
        "their Grow messages that reached past the verifier's decided end; "
        "edge_grow_reach_p50: the median message's reach, "
        "negative where it arrived that many positions behind), and goodput (the clients "
        "that meet the SLO), for every mode at every client count. --out's rows also carry "
        "each point's timeline (tokens/s and clients in their run per 0.1 s from the "
        "burst's start), which --plot draws beside the frontier.")
    g = p.add_argument_group("clients")
    g.add_argument("--clients", default="1,2,4,6,8,12,16,24,32,48,64",
                   help="client counts, each a run of that many clients at once "
                   "(default: %(default)s)")
    g.add_argument("--requests", type=number(int, 1), default=2,
                   help="generations per client at each count (default: %(default)s)")
    g.add_argument("--per-process", type=number(int, 1, 32), default=16,
                   help="clients per edge process (default: %(default)s)")
    g.add_argument("--edge-nice", type=number(int, 0, 19), default=19,
                   help="the edge processes' niceness, so that they take the CPU the "
                   "verifier leaves, as edges on their users' own devices would not slow it "
                   "(0: same priority) (default: %(default)s)")
    g = p.add_argument_group("goodput")
    g.add_argument("--slo-speedup", type=number(float, 0.0, lo_open=True), default=1.3,
                   help="goodput counts the clients whose p10 client makes this x ar's "
                   "one-client tokens/s, measured in the run (default: %(default)s)")
    g.add_argument("--slo-tok-s", type=number(float, 0.0, lo_open=True),
                   help="the per-client tokens/s of the SLO instead (then ar with one client "
                   "need not run)")
    g.add_argument("--slo-ttft-s", type=number(float, 0.0, lo_open=True), default=2.0,
                   help="... and TTFT p90 at most this (default: %(default)s)")
    g = _link_options(p, netns=False)
    g.add_argument("--modes", default=",".join(modes.LOAD_DEFAULT),
                   help="comma-separated, of the modes the verifier decides and that wait "
                   "while it is unreachable (see `bench run --help`) (default: %(default)s)")
    _prompt_options(p)
    _generation_options(p, temperature=True)
    _verifier_options(p, GPU_LIKE, "flat 25 ms up to 256 nodes", dtype=False,
                      cloud_draft=True)
    g = p.add_argument_group("the emulated world")
    g.add_argument("--emulate-draft-ms", type=draft_ms, default=EDGE_DRAFT_MS,
                   metavar="T[,PER_TOKEN]",
                   help="TESTBED profile of each client's device: pad each drafter decode to "
                   "T ms (+ PER_TOKEN ms per extra sequence in a batch), waited out by that "
                   "client alone; the default is a 1B-class drafter on a laptop, and the demo "
                   "drafter's real decode stays below it (default: %(default)s)")
    g.add_argument("--dilate", type=number(float, 1.0, 100.0), default=1.0, metavar="K",
                   help="time dilation: every time constant of the emulated world (the step "
                   "profiles, the edges' drafter step, the link's delay, the edges' stall "
                   "threshold and reconnect delay, the verifier's scheduling windows: cloud "
                   "serve --emulate-dilate) x K and the link's rate / K, so that the "
                   "machine's own compute shrinks against the emulated device; figures are "
                   "reported in undilated units, and each row states the "
                   "machine's CPU busy fraction (a row above 0.8 is CPU-bound and does not "
                   "count toward goodput) (default: %(default)s)")
    _model_options(p)
    g = p.add_argument_group("prediction")
    g.add_argument("--predict", action="store_true",
                   help="the discrete-event model's prediction beside each measured row (ar, "
                   "acespec, colo, cloud-lookup), on the same link and profiles, with its "
                   "aggregate over the measured one (vs_aggregate) and over the measured "
                   "aggregate while every client is live (vs_all_live: the model, too, has "
                   "no burst start or tail); its acceptances default to the demo pair's, "
                   "as `bench calibrate` measures them")
    _acceptance_options(g, accept=DEMO_ACCEPT, lookup=DEMO_LOOKUP_ACCEPT)
    _output_options(p, plot=True)
    p.set_defaults(func=command(_commands, "bench_load"))


def _add_hostile(cmds) -> None:
    p = cmds.add_parser(
        "hostile", help="an honest client's tokens/s alone and beside wasteful, long-prompt "
        "and honest peers, on one verifier",
        description="Beside an honest `edge generate` (acespec mode, greedy, --max-tokens, on "
        "5 code prompts), run each scenario's peers on the same verifier and report the "
        "honest client's tokens/s.")
    p.add_argument("--scenarios", default="alone,peer,waste1,waste4,long2",
                   help="alone, peerN (N honest clients), wasteN (N clients extending 256 "
                   "random nodes per round), longN (N clients opening sessions on 4,000-token "
                   "prompts), schemaN (N clients opening sessions constrained by a "
                   "3,000-property JSON schema), echoN (N clients scoring 2,000-token prompts "
                   "for their logprobs), streamsN (one client with N sessions at once) "
                   "(default: %(default)s)")
    _generation_options(p, temperature=False)
    _verifier_options(p, STEP_MS, "per-node heavy", dtype=True, cloud_draft=False)
    _model_options(p)
    _output_options(p, plot=False)
    p.set_defaults(func=command(_commands, "bench_hostile"))


def _add_calibrate(cmds) -> None:
    p = cmds.add_parser(
        "calibrate", help="measure the discrete-event model's costs",
        description="Measure the discrete-event model's costs on real sessions over loopback: "
        "the drafter's time per token, the target's pass time, the wire bytes of each message "
        "kind, the acceptance, the hit rate and the verifier's prompt-lookup acceptance. "
        "Then: acespec bench sweep --calibration costs.json.")
    p.add_argument("--per-category", type=number(int, 1, 2), default=2,
                   help="prompts per category (default: %(default)s)")
    _generation_options(p, temperature=False)
    g = p.add_argument_group("verifier")
    g.add_argument("--emulate-step-ms", metavar="T0[,PER_NODE[,KNEE]]",
                   help="TESTBED step-time profile of the verifier: T0 ms a pass plus PER_NODE "
                   "ms a node (beyond KNEE nodes, a GPU-like roofline) (default: none, the "
                   "target's own passes)")
    _model_options(p)
    _output_options(p, plot=False)
    p.set_defaults(func=command(_commands, "bench_calibrate"))


def _add_sweep(cmds) -> None:
    p = cmds.add_parser(
        "sweep", help="sweep the discrete-event model over links and draft depths",
        description="Run the discrete-event model over rates x RTTs x depths and report the "
        "best depth/window per link (_lone columns: the decided modes' passes no edge draft "
        "covered, of all passes).")
    p.add_argument("--calibration", help="costs JSON from `bench calibrate` (default: the "
                   "model's default costs)")
    g = p.add_argument_group("grid")
    g.add_argument("--rates", default="20kbit,50kbit,200kbit,1mbit,10mbit",
                   help="link rates (default: %(default)s)")
    g.add_argument("--rtts", default="10ms,50ms,100ms,200ms",
                   help="RTTs (default: %(default)s)")
    g.add_argument("--depths", default="2,4,8", help="draft depths (default: %(default)s)")
    g = p.add_argument_group("model")
    _acceptance_options(g, accept=None, lookup=None)
    g.add_argument("--hit-rate", type=float,
                   help="acespec cache hit rate (default: the calibration's, else 0.5)")
    g.add_argument("--hold-ms", type=number(float, 0.0), default=0.0, metavar="MS",
                   help="the decided modes' verifier idles up to MS before a pass no draft "
                   "covers, for drafts already on their way (what waiting for the edge would "
                   "buy; the real verifier never waits; default: %(default)s)")
    _output_options(p, plot=False)
    p.set_defaults(func=command(_commands, "bench_sweep"))


def _commands():
    """acespec.sim.bench_commands, imported when a command runs."""
    from acespec.sim import bench_commands  # lazy: a command's start, the runners' modules

    return bench_commands


# -- option groups shared by the commands ----------------------------------------------

def _link_options(p, netns: bool):
    g = p.add_argument_group("links and modes")
    g.add_argument("--link", default="50kbit:50ms",
                   help="comma-separated links: RATE:RTT, 'loopback', or trace:NAME (a "
                   "shipped mobile-like trace: lte, wifi-handover) or trace:FILE.csv "
                   "(time_s,kbps[,rtt_ms[,loss]]); any may add +outage=START:DURATION "
                   "(repeatable). A link that changes in time starts each prompt's run at "
                   "its own point of the link's cycle, the same for every mode "
                   "(default: %(default)s)")
    if netns:
        g.add_argument("--netns", action="store_true",
                       help="shape each link with tc tbf on a veth into a network namespace "
                       "that runs the verifier (Linux, root; the proxy then only adds the delay)")
    return g


def _prompt_options(p) -> None:
    g = p.add_argument_group("prompts")
    g.add_argument("--prompts", help="JSONL of {id, category, prompt} (default: shipped set)")
    g.add_argument("--dataset", default="shipped", choices=DATASETS,
                   help="'shipped' (the shipped prompts or --prompts) or 'sharegpt' (real chats "
                   "of ShareGPT V3, fetched on first use, rendered with the pair's chat "
                   "template; categories code/writing/explain/other) (default: %(default)s)")
    g.add_argument("--split", default="eval", choices=["train", "eval"],
                   help="--dataset sharegpt: records [0, 12000) or [12000, end), the split no "
                   "drafter is trained on (default: %(default)s)")
    g.add_argument("--per-category", type=number(int, 1), default=10,
                   help="prompts per category (default: %(default)s)")


def _generation_options(p, temperature: bool):
    g = p.add_argument_group("generation")
    g.add_argument("--max-tokens", type=number(int, 1), default=64,
                   help="tokens per generation (default: %(default)s)")
    if temperature:
        g.add_argument("--temperature", type=float, default=0.0,
                       help="0: greedy (default: %(default)s)")
    return g


def _verifier_options(p, step: str, step_shape: str, dtype: bool, cloud_draft: bool):
    """The verifier's step-time profile and its own proposals; with dtype, its --dtype and
    --linear; with cloud_draft, its gap drafter's step."""
    g = p.add_argument_group("verifier")
    g.add_argument("--emulate-step-ms", default=step, metavar="T0[,PER_NODE[,KNEE]]",
                   help="TESTBED step-time profile of the verifier: T0 ms a pass plus PER_NODE "
                   "ms a node (beyond KNEE nodes, a GPU-like roofline) (default: %(default)s, "
                   f"{step_shape})")
    g.add_argument("--propose", type=number(int, 0, 64), default=8, metavar="N",
                   help="the verifier's --propose: its own prompt-lookup proposals in a pass "
                   "no draft covers (0: off) (default: %(default)s)")
    if cloud_draft:
        g.add_argument("--emulate-cloud-draft-ms", default=CLOUD_DRAFT_MS,
                       metavar="T0[,PER_SEQ]",
                       help="TESTBED step of the verifier's gap drafter (acespec-gap, colo): "
                       "each batched draft step takes at least T0 ms + PER_SEQ ms per session, "
                       "on the target's device between its passes; 5 ms is an eighth of the "
                       "40,0.5 profile's 40 ms target step, a 1B-class drafter beside a "
                       "70B-class target (default: %(default)s)")
    if dtype:
        g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="the verifier's --dtype, for every mode (`ar` too). bfloat16 with "
                       "--linear torch makes a multi-token pass cheap on a CPU with native "
                       "bfloat16 (AVX512-BF16, AMX), but its logits depend on the pass's "
                       "size, so greedy text can differ from ar's (see same_as_ar); float32 "
                       "with the default oneDNN linears is flat too (default: %(default)s)")
        g.add_argument("--linear", default="auto", choices=["auto", "onednn", "torch"],
                       help="the verifier's --linear, for every mode: oneDNN with prepacked "
                       "weights (auto, on the CPU) or torch's F.linear (default: %(default)s)")
    return g


def _model_options(p) -> None:
    pairs.add_model_flags(p.add_argument_group("models"),
                          "target HF folder (default: the demo target)",
                          "the edge's drafter GGUF (default: %(default)s)")


def _acceptance_options(g, accept: float | None, lookup: float | None) -> None:
    """--accept and --lookup-accept, the discrete-event model's acceptances; None: the
    calibration's."""
    def default(value: float | None, calibrated: str) -> str:
        return f"{value}" if value is not None else f"the calibration's {calibrated}"

    g.add_argument("--accept", type=float, default=accept,
                   help="per-position acceptance of the edge's drafts (default: "
                   f"{default(accept, 'acceptance, else 0.8')})")
    g.add_argument("--lookup-accept", type=number(float, 0.0, 0.99), default=lookup,
                   metavar="A",
                   help="per-position acceptance of the verifier's prompt-lookup proposals in "
                   "lone passes of the decided modes (0: none) (default: "
                   f"{default(lookup, 'lookup_acceptance, fitted to its tokens per lone pass, else 0')})")


def _output_options(p, plot: bool) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--out", help="write results JSON here")
    if plot:
        g.add_argument("--plot", help="write PNG plots into this folder")


"""`acespec edge generate` (one prompt against a remote verifier, to stdout), `acespec edge
serve` (the local OpenAI-compatible API), `edge config` (the settings serve runs with),
`edge doctor` (checks the verifier) and `edge service` (serve at login): their flags, whose
starting values come from the settings file (acespec.edge.config). generate and serve run in
acespec.edge.commands, doctor and service in their own modules, each imported when it runs
(the engine, grpc and llama.cpp; `acespec --help` needs none)."""

from __future__ import annotations

from acespec import pairs
from acespec.argtypes import command, draft_ms, number
from acespec.edge import config
from acespec.edge.config import SettingsParser
from acespec.models import DEMO_DRAFTER, DEMO_TARGET
from acespec.shared import modes

# acespec.edge.session.config's MAX_DEPTH and MAX_WINDOW, restated so that the parser does not
# import the engine (tests/edge/test_edge_hardening.py holds them equal)
MAX_DEPTH, MAX_WINDOW = 64, 1024
MAX_CONCURRENT = 32  # sequences: 1 + GROW_SEQS per generation, + 1, within llama.cpp's 256
U64 = 2**64 - 1  # the wire's seed is a uint64
U32 = 2**32 - 1  # ... and top_k a uint32


def add_parser(sub) -> None:
    edge = sub.add_parser("edge", help="the edge: drafter + engine talking to a cloud verifier")
    # each command reads the settings file (acespec.edge.config) for its flags' starting values
    esub = edge.add_subparsers(dest="edge_cmd", required=True, metavar="COMMAND",
                               parser_class=SettingsParser)
    g = esub.add_parser(
        "generate", help="stream a continuation of PROMPT, drafting locally, verified remotely",
        description="Speculative decoding against a cloud verifier: the llama.cpp drafter "
        "drafts tokens and the verifier decides them (or scores them and this process "
        "decides, with exact sampling), the text distributed exactly as the target's. "
        "Streams the decided text with a live status line on stderr.")
    g.add_argument("prompt")
    _drafting_options(g, "verifier HOST:PORT (default: %(default)s)",
                      "drafter GGUF, or 'ngram' (default: the demo drafter)")
    g.add_argument("--max-tokens", type=number(int, 1, 2**31 - 1), default=128,
                   help="tokens to generate, >= 1 (default: %(default)s)")
    g.add_argument("--temperature", type=number(float, 0.0), default=0.0,
                   help="0 = greedy (default)")
    g.add_argument("--top-k", type=number(int, 0, U32), default=0, help="0 = no limit")
    g.add_argument("--top-p", type=number(float, 0.0, 1.0, lo_open=True), default=1.0)
    g.add_argument("--send-mass", type=number(float, 0.0, 1.0, lo_open=True), default=0.9,
                   help="downlink: sent mass per node")
    g.add_argument("--seed", type=number(int, 0, U64), default=0)
    _verifier_credentials(g)
    g.add_argument("--reconnect-deadline", type=number(float, 0.0), default=30.0, metavar="S",
                   help="when the verifier goes away mid-generation, retry this long in all "
                   "(each attempt included) and resume with the committed text; then give "
                   "up (default: %(default)s)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object {text, token_ids, stats} at the end")
    g.add_argument("--chat", action="store_true",
                   help="PROMPT is a user message: render it with the chat template (the "
                   "drafter GGUF's, --pair's or --chat-template's) and generate the answer")
    g.add_argument("--chat-template", metavar="FILE",
                   help="with --chat: Jinja chat template (messages, add_generation_prompt, "
                   "bos_token, eos_token) instead of the drafter GGUF's")
    _config_flag(g)
    g.set_defaults(func=command(_commands, "run_generate"))
    sv = esub.add_parser(
        "serve", help="a local OpenAI-compatible server (completions, chat, SSE streaming)",
        description="Serve /v1/completions, /v1/chat/completions (when the drafter's GGUF has a "
        "chat template), /v1/models, Ollama's /api/chat, /api/generate, /api/tags, /api/show, "
        "/api/ps and /api/version, /health and /metrics on a local port; generation is "
        "drafted here and verified by the cloud verifier.")
    _serve_flags(sv)
    sv.set_defaults(func=command(_commands, "run_serve"))
    cf = esub.add_parser(
        "config", help="print the settings edge serve runs with, and where each comes from",
        description="Print every setting of `acespec edge serve` as it would run with these "
        "flags and the settings file: its value and where it comes from (a flag, the file, "
        "or the flag's default), in the file's own syntax; secrets are redacted. The file's "
        "keys are the long flags of edge serve, generate and doctor (cloud, pair, drafter, "
        "tokenizer, auth-token-file, tls-ca, api-key, offline, host, port, ...).")
    _serve_flags(cf)
    cf.set_defaults(func=config.run_show)
    dr = esub.add_parser(
        "doctor", help="check the verifier (key, TLS, vocabulary) and measure the link",
        description="Reach the verifier with the settings edge serve would use (the file "
        "and the same flags as serve), check that it accepts the key and the TLS root and that the "
        "drafter's vocabulary is the target's, measure the round trip and the link's rate "
        "each way with a short probe (about 10 s at 50 kbit/s), and say what it found. Exit "
        "status 0 when every check passes, 1 when one fails.")
    _serve_flags(dr)  # so that `edge serve ...` checks as `edge doctor ...`
    dr.add_argument("--timeout", type=number(float, 0.0, lo_open=True), default=10.0,
                    metavar="S", help="give up on the verifier after S seconds per check "
                    "(default: %(default)s)")
    dr.set_defaults(func=command(_doctor, "run"))
    sc = esub.add_parser(
        "service", help="start edge serve at login: a systemd user unit or a launchd agent",
        description="install: write a systemd user unit (Linux) or a launchd agent "
        "(macOS) that runs `acespec edge serve --config FILE` at login and restarts it when "
        "it fails, then enable and start it; uninstall: stop it and remove the file; "
        "status: whether it is installed (exit 0) or not (exit 3), and whether it runs.")
    sc.add_argument("action", choices=["install", "uninstall", "status"])
    sc.add_argument("--manager", choices=["systemd", "launchd"], default=None,
                    help="which service manager's file to write (default: launchd on macOS, "
                    "systemd elsewhere)")
    _config_flag(sc)
    sc.set_defaults(func=command(_service, "run"), _serve_parser=sv)
    family = (g, sv, cf, dr, sc)
    for p in family:
        p.family = family


def _serve_flags(sv) -> None:
    """`edge serve`'s flags (also `edge config`'s, which shows what they come to)."""
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=number(int, 1, 65535), default=8000)
    _drafting_options(sv, "verifier HOST:PORT",
                      "drafter GGUF, or 'ngram' (prompt lookup; tokenizes with --tokenizer)")
    sv.add_argument("--send-mass", type=number(float, 0.0, 1.0, lo_open=True), default=0.9)
    cap = sv.add_argument_group(
        "capacity (the drafter's context holds max-concurrent x (ctx-per-request + a reserve "
        "for drafts and branches) tokens; requests beyond max-concurrent wait in a queue, "
        "beyond max-queue they get 503 with Retry-After)")
    cap.add_argument("--max-concurrent", type=number(int, 1, MAX_CONCURRENT), default=8,
                     help="generations running at once (default: %(default)s)")
    cap.add_argument("--ctx-per-request", type=number(int, 16, 2**20), default=2048,
                     help="most prompt + max_tokens tokens of one request; longer ones get "
                     "400 (default: %(default)s)")
    cap.add_argument("--max-queue", type=number(int, 0, 2**20), default=64,
                     help="generations waiting for a slot (default: %(default)s)")
    sv.add_argument("--served-model-name", nargs="+", metavar="NAME",
                    help="the model names requests may give (others get 404); the first is "
                    "the one responses report (default: --pair's model name, e.g. "
                    f"{pairs.SERVED_NAMES['smollm2']}, then '{pairs.SERVED_NAME}')")
    sv.add_argument("--reconnect-deadline", type=number(float, 0.0), default=30.0, metavar="S",
                    help="a generation in flight when the verifier goes away keeps retrying "
                    "this long and resumes with its committed text (default: %(default)s)")
    sec = sv.add_argument_group(
        "who may call (a web page must not drive a local API: requests with an Origin header "
        "and Host names other than localhost/loopback/--host are refused)")
    sec.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                     help="accept requests from this browser origin, e.g. "
                     "http://localhost:3000 ('*': any); repeatable (default: none)")
    sec.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                     help="accept this Host name too, e.g. the machine's LAN name when "
                     "serving on 0.0.0.0 ('*': any); repeatable")
    sec.add_argument("--api-key", help="require Authorization: Bearer KEY on /v1/* and "
                     "/metrics")
    sec.add_argument("--api-key-file", metavar="FILE",
                     help="... the KEY in FILE (its first non-empty line), kept out of the "
                     "process list")
    sec.add_argument("--metrics-without-key", action="store_true",
                     help="with --api-key: serve /metrics without the key too (for a "
                     "scraper that cannot send one; default: /metrics needs the key)")
    sec.add_argument("--max-body-bytes", type=number(int, 1024, 1 << 30), default=4 << 20,
                     help="largest request body; larger ones get 413 (default: %(default)s)")
    sv.add_argument("--chat-template", metavar="FILE",
                    help="Jinja chat template for /v1/chat/completions (messages, "
                    "add_generation_prompt, bos_token, eos_token), used instead of the "
                    "drafter GGUF's own (needed when the GGUF has none)")
    _verifier_credentials(sv)
    _config_flag(sv)


def _config_flag(p) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="settings file (TOML; keys are these long flags, which override it; "
                   "default: acespec/edge.toml in $XDG_CONFIG_HOME or ~/.config, if it exists)")


def _commands():
    """The commands' module, imported when one runs."""
    from acespec.edge import commands  # lazy: a command's start (the engine, grpc, llama.cpp)

    return commands


def _doctor():
    from acespec.edge import doctor  # lazy: a command's start (grpc, llama.cpp)

    return doctor


def _service():
    from acespec.edge import service  # lazy: a command's start

    return service


def _drafting_options(p, cloud_help: str, drafter_help: str) -> None:
    """The verifier, the drafter and the engine's flags, shared by `generate` and `serve`."""
    p.add_argument("--cloud", default="localhost:50051", help=cloud_help)
    p.add_argument("--drafter", default=str(DEMO_DRAFTER), help=drafter_help)
    pairs.add_argument(p, drafter="drafter")
    p.add_argument("--tokenizer", default=str(DEMO_TARGET),
                   help="tokenizer.json or its folder, used with --drafter ngram")
    _add_engine_args(p, modes.EDGE_DEFAULT)


def _verifier_credentials(p) -> None:
    p.add_argument("--auth-token-file", help="bearer token for the verifier")
    p.add_argument("--tls-ca", help="PEM root certificate: connect with TLS")


def _add_engine_args(p, mode: str) -> None:
    """Mode, shape and speculation-tree flags shared by `generate` and `serve`."""
    p.add_argument("--mode", default=mode, choices=modes.NAMES, metavar="MODE",
                   help=f"{modes.help_text()} (default: %(default)s)")
    p.add_argument("--sampling", default="coupled", choices=["coupled", "exact"],
                   help="'coupled': Gumbel-max with noise shared by edge and cloud (with "
                   "--temperature > 0; greedy at 0): the text for a seed equals cloud-only "
                   "decoding's, and the verifier decides where the mode has it decide. 'exact': "
                   "the edge decides every verdict (rejection sampling; greedy verification at "
                   "0) and the verifier scores trees. Both sample the served distribution exactly "
                   "(default: %(default)s)")
    p.add_argument("--depth", type=number(int, 1, MAX_DEPTH), default=None,
                   help="drafts per Extend; unset: adaptive (starts at 4, follows the link)")
    p.add_argument("--window", type=number(int, 1, MAX_WINDOW), default=None,
                   help="most live drafted nodes, >= --depth; unset: adaptive (starts at 16)")
    p.add_argument("--emulate-draft-ms", type=draft_ms, default=(0.0, 0.0),
                   metavar="T[,PER_TOKEN]",
                   help="TESTBED knob: pad every drafter decode to T ms (+ PER_TOKEN ms per "
                   "token beyond the first in a batch), a small edge device's step time, "
                   "e.g. 8 = a 135M Q4 model on one laptop core (default: off)")
    o = p.add_argument_group("when the verifier cannot be reached (docs/offline.md)")
    o.add_argument("--offline", default="wait", choices=["wait", "local"],
                   help="wait: pause, then resume losslessly when a verifier answers; "
                   "local: keep answering from the drafter meanwhile, every such token "
                   "marked unverified, then verify it and replace it from the first "
                   "token the target disagrees with (default: %(default)s)")
    o.add_argument("--stall-after", type=number(float, 0.0, lo_open=True), default=None,
                   metavar="S", help="a verifier silent this long while it owes an answer "
                   "counts as unreachable (default: 5 with --offline wait, 0.4 with local)")
    b = p.add_argument_group("speculation tree: the guessed branches' budgets per chunk "
                             "(modes with branches; unset = derived from the measured link "
                             "and drafter)")
    amount = number(float, 0.0)
    b.add_argument("--branch-draft-ms", type=amount, default=None,
                   help="drafter time for branches")
    b.add_argument("--branch-uplink-bytes", type=amount, default=None)
    b.add_argument("--branch-downlink-bytes", type=amount, default=None)
    b.add_argument("--branch-cloud-nodes", type=amount, default=8.0,
                   help="branch nodes the verifier scores per chunk (default: %(default)s)")
    b.add_argument("--branch-kv-mb", type=amount, default=64.0,
                   help="edge memory for branch KV, MB (default: %(default)s)")

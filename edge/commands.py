"""`acespec edge generate` (one prompt against a remote verifier, to stdout) and `acespec edge
serve` (the local OpenAI-compatible API), once acespec.edge.cli has parsed them: the checks
and one-line errors of both. The parser imports this module only when a command runs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import jinja2

from acespec import pairs
from acespec.argtypes import EXIT_USAGE
from acespec.edge import config
from acespec.edge.api.guard import GuardConfig
from acespec.edge.api.service import EdgeService
from acespec.edge.client import VerifierUnfit, channel, read_token_file
from acespec.edge.drafting.llama import DrafterError, LlamaDrafter, LlamaDrafterConfig
from acespec.edge.drafting.ngram import NgramDrafter
from acespec.edge.session import EdgeEngine, EngineConfig
from acespec.edge.session.config import GROW_SEQS
from acespec.edge.speculation.branches import CacheConfig
from acespec.edge.status import LiveStatus, TerminalAnswer
from acespec.edge.text import TextCodec
from acespec.shared import modes
from acespec.shared.config import ConfigError, SamplingParams
from acespec.shared.served import ServeParams
from acespec.shared.tokenizer import ModelFileError, Tokenizer

EXIT_UNREACHABLE, EXIT_REFUSED = 3, 4


def engine_config(args, **kw):
    """EngineConfig from the shared flags (an unset depth or window makes it adaptive)."""
    adaptive = args.depth is None and args.window is None
    if args.offline == "local" and not modes.mode(args.mode).edge_drafts:
        raise ValueError(f"--offline local answers from the drafter, and --mode {args.mode} "
                         "drafts nothing at the edge")
    if args.depth is not None and args.window is not None and args.window < args.depth:
        raise ValueError(f"--window {args.window} must be >= --depth {args.depth}")
    depth = 4 if args.depth is None else args.depth
    window = max(16 if args.window is None else args.window, depth)
    cache = CacheConfig(kv_bytes=args.branch_kv_mb * 1e6, draft_ms=args.branch_draft_ms,
                        uplink_bytes=args.branch_uplink_bytes,
                        downlink_bytes=args.branch_downlink_bytes,
                        cloud_nodes=args.branch_cloud_nodes)
    return EngineConfig(mode=args.mode, depth=depth, window=window, cache=cache,
                        sampling=args.sampling, adaptive=adaptive, offline=args.offline,
                        stall_s=args.stall_after, **kw)


def codec_and_drafter(args):
    """(TextCodec, drafter) from --drafter (and --tokenizer for 'ngram'); ValueError naming
    the flag when a file cannot be used."""
    if args.drafter == "ngram":
        try:
            codec = TextCodec.from_tokenizer(args.tokenizer)
            vocab = Tokenizer.load(args.tokenizer).vocab_size
        except ModelFileError as e:  # its message starts with the file's path
            raise ValueError(f"--tokenizer {e}") from None
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises bare Exception
            raise ValueError(f"--tokenizer {args.tokenizer}: cannot load a tokenizer.json "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                             ) from None
        return codec, NgramDrafter(vocab)
    return llama_codec_and_drafter(args.drafter, n_seq_max=1 + GROW_SEQS,
                                    **_emulation(args))


def _emulation(args) -> dict:
    ms, per = args.emulate_draft_ms
    return {"emulate_ms": ms, "emulate_per_token_ms": per}


def llama_codec_and_drafter(path: str, **config):
    if not Path(path).is_file():
        raise ValueError(f"--drafter {path}: no such file; pass a GGUF file or 'ngram'")
    try:
        drafter = LlamaDrafter(path, LlamaDrafterConfig(**config))
    except DrafterError as e:  # its message starts with the file's path
        raise ValueError(f"--drafter {e}") from None
    return TextCodec.from_drafter(drafter), drafter


def _check_context(drafter, prompt: list[int], cfg) -> None:
    """The request must fit the drafter's context: refuse it up front, not mid-generation."""
    n_ctx = getattr(getattr(drafter, "config", None), "n_ctx", None)
    if n_ctx is None or not cfg.spec.edge_drafts:
        return
    need = len(prompt) + cfg.max_tokens + cfg.drafter_reserve()
    if need > n_ctx:
        raise ValueError(f"--max-tokens {cfg.max_tokens}: the prompt ({len(prompt)} tokens) "
                         f"plus {cfg.max_tokens} tokens exceed the drafter's context of "
                         f"{n_ctx} tokens ({cfg.drafter_reserve()} are kept for drafts)")


def run_generate(args) -> int:
    def fail(code: int, msg: str) -> int:
        print(f"acespec edge generate: error: {config.blame(args, msg)}", file=sys.stderr)
        return code

    try:
        serve = ServeParams(SamplingParams(args.temperature, args.top_k, args.top_p,
                                           coupled=args.sampling == "coupled"),
                            send_mass=args.send_mass)
        cfg = engine_config(args, serve=serve, seed=args.seed, max_tokens=args.max_tokens,
                            reconnect_deadline_s=args.reconnect_deadline)
        token = read_token_file(args.auth_token_file) if args.auth_token_file else None
        root_cert = read_file("--tls-ca", args.tls_ca) if args.tls_ca else None
        pairs.apply(args)
        codec, drafter = codec_and_drafter(args)
        prompt = codec.encode(_chat_prompt(args, drafter) if args.chat else args.prompt)
        _check_context(drafter, prompt, cfg)
    except (ConfigError, ValueError, OSError) as e:
        return fail(EXIT_USAGE, str(e))
    cfg = EngineConfig(**{**cfg.__dict__, "stop_ids": codec.stop_ids})
    engine = EdgeEngine(lambda: channel(args.cloud, root_cert), codec.vocab_hash,
                        drafter if modes.mode(args.mode).edge_drafts else None, token)
    status = LiveStatus(not args.json)
    answer = TerminalAnswer(codec, status, cfg.offline, quiet=args.json)
    try:
        out, stats = asyncio.run(engine.generate(prompt, cfg, answer.on_tokens,
                                                 on_event=answer.on_event))
    except ConnectionError as e:
        return fail(EXIT_UNREACHABLE, f"cannot reach the verifier at {args.cloud}: {e}")
    except grpc.aio.AioRpcError as e:
        return fail(EXIT_REFUSED, f"verifier refused the request ({e.code().name}): {e.details()}")
    except VerifierUnfit as e:
        return fail(EXIT_REFUSED, str(e))
    except DrafterError as e:
        return fail(1, f"the drafter failed: {e}")
    figures = {**stats.as_dict(), "mode": args.mode, "depth": cfg.depth,
               "window": cfg.window, "adaptive": cfg.adaptive, "offline": cfg.offline}
    tail = codec.decode(stats.unverified_tail)
    if args.json:
        print(json.dumps({"text": codec.decode(out), "token_ids": out, "stats": figures,
                          **({"unverified_text": tail, "unverified_token_ids":
                              stats.unverified_tail} if tail else {})}))
    else:
        answer.finish(tail)
        print(_summary(figures), file=sys.stderr)
    return 0


def read_file(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from None


def _summary(f: dict) -> str:
    return (f"[{f['mode']}: {f['tokens']} tokens, {f['tokens_per_s']} tok/s, mean acceptance "
            f"length {f['mean_acceptance_length']}, {f['passes_per_token']} "
            f"passes/token, wire {f['wire_bytes_up_per_token']} B/token up, "
            f"{f['wire_bytes_down_per_token']} B/token down"
            + (f", RTT {f['rtt_ms']} ms" if f.get("rtt_ms") is not None else "")
            + (f"; link down {f['outages']}x for {f['offline_s']} s" if f["outages"] else "")
            + (f", {f['unverified_tokens']} tokens answered unverified ("
               f"{f['unverified_confirmed']} confirmed, {f['unverified_replaced']} replaced"
               f"{', ' + str(f['unverified_tail_tokens']) + ' never verified' if f['unverified_tail_tokens'] else ''})"
               if f["unverified_tokens"] else "") + "]")


def build_service(args):
    """The EdgeService for `serve` (also used by tests). ValueError/OSError naming the flag."""
    from acespec.edge.api.app import EdgeMetrics  # lazy: starlette is the edge extra's

    names = served_model_names(args)
    pairs.apply(args)
    base = engine_config(args, serve=ServeParams(
        SamplingParams(coupled=args.sampling == "coupled"), send_mass=args.send_mass))
    token = read_token_file(args.auth_token_file) if args.auth_token_file else None
    root_cert = read_file("--tls-ca", args.tls_ca) if args.tls_ca else None
    n = args.max_concurrent
    if args.drafter == "ngram":  # no model: lookup in the context, any number of sequences
        codec, drafter = codec_and_drafter(args)
    elif not modes.mode(args.mode).edge_drafts:  # the drafter only tokenizes
        codec, drafter = llama_codec_and_drafter(args.drafter, n_ctx=256, n_seq_max=1)
    else:  # each generation: a main sequence and its tree's; seq 0 stays free for tools
        per_request = args.ctx_per_request + base.drafter_reserve()
        codec, drafter = llama_codec_and_drafter(args.drafter, n_ctx=n * per_request,
                                                  n_seq_max=(1 + GROW_SEQS) * n + 1,
                                                  **_emulation(args))
    return EdgeService(codec=codec,
                       drafter=drafter if modes.mode(args.mode).edge_drafts else None,
                       connect=lambda: channel(args.cloud, root_cert),
                       model_name=names[0], aliases=names[1:],
                       base=base, chat_template=_chat_template(args, drafter), token=token,
                       metrics=EdgeMetrics(), max_concurrent=n,
                       ctx_per_request=args.ctx_per_request, max_queue=args.max_queue,
                       reconnect_deadline_s=args.reconnect_deadline)


def served_model_names(args) -> tuple[str, ...]:
    """--served-model-name, else --pair's model name and 'acespec'; the first is the name
    responses report. ValueError naming the flag."""
    names = args.served_model_name
    if names is None:
        names = [pairs.SERVED_NAMES[args.pair]] if args.pair else []
        names.append(pairs.SERVED_NAME)
    for name in names:
        if not name or name != name.strip():
            raise ValueError(f"--served-model-name {name!r}: a name must be non-empty, with "
                             "no leading or trailing space")
    return tuple(dict.fromkeys(names))


def _chat_prompt(args, drafter) -> str:
    """`edge generate --chat`: PROMPT as one user message, rendered for the answer."""
    template = _chat_template(args, drafter)
    if not template:
        raise ValueError(f"--chat: the drafter {args.drafter} has no chat template; give "
                         "--chat-template FILE (or use --pair smollm2)")
    return pairs.render_chat(template, args.prompt)


def _chat_template(args, drafter) -> str | None:
    """--chat-template FILE (checked now: a bad template is a start-up error, not a 400 per
    request), else the drafter GGUF's template, else --pair's, else None (chat then answers
    400)."""
    if not args.chat_template:
        own = getattr(drafter, "chat_template", None)  # the n-gram drafter has none
        return (own and own()) or (pairs.chat_template(args.pair) if args.pair else None)
    text = read_file("--chat-template", args.chat_template).decode("utf-8", "replace")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"--chat-template {args.chat_template}: line {e.lineno}: "
                         f"{e.message}") from None
    return text


def run_serve(args) -> int:
    from acespec.edge.api.app import serve  # lazy: starlette is the edge extra's

    try:
        svc = build_service(args)
        api_key = _api_key(args)
    except (ValueError, OSError) as e:
        print(f"acespec edge serve: error: {config.blame(args, str(e))}", file=sys.stderr)
        return EXIT_USAGE
    also = "".join(f", also {a!r}" for a in svc.aliases)
    print(f"acespec edge listening on http://{args.host}:{args.port} (model "
          f"{svc.model_name!r}{also}, mode {args.mode}, verifier {args.cloud}"
          f"{_kv_reserved(svc.drafter)})", flush=True)
    serve(svc, GuardConfig.for_bind(args.host, args.allow_host, args.allow_origin,
                                    api_key, args.max_body_bytes,
                                    args.metrics_without_key), args.host, args.port)
    return 0


def _kv_reserved(drafter) -> str:
    """', drafter reserves N MiB': the address space llama.cpp reserves at start for the
    drafter's KV cache and compute buffers (resident as its sequences first reach it), where
    it said."""
    mib = getattr(drafter, "reserved_mib", None)
    return "" if mib is None else f", drafter reserves {mib:.0f} MiB"


def _api_key(args) -> str | None:
    """--api-key, or the first non-empty line of --api-key-file; ValueError naming the flag."""
    if args.api_key and args.api_key_file:
        raise ValueError("--api-key and --api-key-file: give one of them")
    if not args.api_key_file:
        return args.api_key
    text = read_file("--api-key-file", args.api_key_file).decode("utf-8", "replace")
    key = next((ln.strip() for ln in text.splitlines() if ln.strip()), None)
    if key is None:
        raise ValueError(f"--api-key-file {args.api_key_file}: the file holds no key")
    return key

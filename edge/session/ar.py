"""The `ar` driver: cloud-only decoding over `Generate` (the baseline; no drafter)."""

from __future__ import annotations

import contextlib

import grpc

from acespec.edge.client import generate_chunks
from acespec.edge.session.runner import Runner
from acespec.proto.sizes import FRAMING


class ArDriver:
    """One `Generate` call: the verifier streams each token it decodes."""

    def __init__(self, run: Runner, ch: grpc.aio.Channel, vocab_hash: str, token: str | None,
                 client: str | None = None):
        self.run, self.ch, self.vocab_hash, self.token = run, ch, vocab_hash, token
        self.client = client

    async def drive(self) -> None:
        run, cfg = self.run, self.run.cfg
        sizes: list[int] = []  # message sizes: the request, then each token's
        try:
            stream = generate_chunks(self.ch, run.context, cfg.serve, cfg.seed,
                                     cfg.max_tokens - len(run.out), self.vocab_hash, self.token,
                                     list(cfg.stop_ids), sizes, cfg.logprobs, self.client)
            async with contextlib.aclosing(stream) as chunks:  # closing cancels the call
                async for tokens, logprobs in chunks:
                    run.connected = True
                    run.stats.passes += len(tokens)
                    run.stats.rounds += len(tokens)
                    if logprobs is not None:
                        run.expect_logprobs(run.committed_end, logprobs)
                    run.emit(tokens)
                    if run.finished:  # max_tokens or a stop: read no further
                        break
            run.finished = True
        finally:
            if sizes:
                run.stats.wire_bytes_up += sizes[0] + FRAMING
                run.stats.wire_bytes_down += sum(sizes[1:]) + FRAMING * (len(sizes) - 1)

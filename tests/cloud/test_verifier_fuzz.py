"""Fuzzing the verifier: >= 10,000 random, mutated and mis-ordered uplink messages.

A seeded generator builds streams of four kinds: valid sessions (must end OK), sessions
with one deliberately bad message injected (must end with that message's status code),
mis-ordered valid messages (Extend/Commit/MoreTail before Open: FAILED_PRECONDITION), random
or mutated bytes (any outcome but a crash), and sessions the verifier decides (Open.decide,
then Grow: valid ones end OK, one bad Grow or a message of the other session kind ends them
with its code). Throughout, a healthy session runs alongside and must produce the right
tokens; afterwards no session may be left open and the servicer must not have hit an
internal error.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from acespec.cloud.serving.server import ServerConfig  # noqa: E402
from acespec.cloud.verify.engine import Limits  # noqa: E402
from acespec.proto import PROTOCOL_VERSION  # noqa: E402
from acespec.proto import acespec_pb2 as pb  # noqa: E402
from acespec.shared.tokenizer import Tokenizer  # noqa: E402

from test_verifier_errors import healthy  # noqa: E402
from verifier_harness import run, running_verifier  # noqa: E402

N_MESSAGES = 10_000
ALLOWED = {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "NOT_FOUND"}
CFG = ServerConfig(limits=Limits(max_sessions=64, max_live_nodes=16, max_prompt_tokens=48))
V1_DRAFTS = b"\x2a\x02\x08\x01"  # an Uplink holding protocol 1's Drafts (field 5, now reserved)


def grow(**fields) -> pb.Uplink:
    return pb.Uplink(grow=pb.Grow(**fields))


def raw_open(version: int, vocab_hash: str, prompt: list[int]) -> pb.Uplink:
    return pb.Uplink(open=pb.Open(protocol_version=version, vocab_hash=vocab_hash,
                                  prompt_tokens=prompt))


class Fuzzer:
    def __init__(self, vocab: int, vh: str, seed: int = 0):
        self.rng, self.vocab, self.vh = np.random.default_rng(seed), vocab, vh

    def open(self, **kw) -> pb.Uplink:
        n = int(self.rng.integers(1, 12))
        return pb.Uplink(open=pb.Open(protocol_version=PROTOCOL_VERSION, vocab_hash=self.vh,
                                      prompt_tokens=self.rng.integers(0, self.vocab, n).tolist(),
                                      seed=int(self.rng.integers(0, 2**63)), **kw))

    def valid_session(self) -> list[pb.Uplink]:
        msgs, next_id = [self.open()], 1
        for _ in range(int(self.rng.integers(1, 5))):
            n = int(self.rng.integers(1, 4))
            msgs.append(pb.Uplink(extend=pb.Extend(tokens=self.rng.integers(0, self.vocab, n).tolist())))
            next_id += n
            msgs.append(pb.Uplink(commit=pb.Commit(node_id=next_id - 1 - int(self.rng.integers(0, n)))))
        return msgs

    def decided_session(self) -> list[pb.Uplink]:
        """A session the verifier decides (greedy or coupled): Open.decide, then Grow
        messages (chains on top of the previous message's last node or restarting at the
        prompt's end, now and then with a branch under any earlier node)."""
        r = self.rng
        coupled = bool(r.integers(2))
        sampling = pb.Sampling(temperature=0.8, coupled=True) if coupled else pb.Sampling()
        msgs = [self.open(sampling=sampling, decide=pb.Decide(
            max_tokens=int(r.integers(0, 6)), stop_tokens=[int(r.integers(self.vocab))]))]
        end, next_id = len(msgs[0].open.prompt_tokens), 0
        for _ in range(int(r.integers(1, 4))):
            n = int(r.integers(1, 4))
            idx = [i for i in range(1, n) if r.random() < 0.3]
            msgs.append(pb.Uplink(grow=pb.Grow(
                anchor=end, tokens=r.integers(0, self.vocab, n).tolist(),
                first_parent=1 if next_id and r.integers(2) else 0, branch_index=idx,
                branch_parent=[int(r.integers(1, next_id + i + 1)) for i in idx])))
            next_id += n
        return msgs

    def bad_decided(self) -> tuple[list[pb.Uplink], str]:
        """A decided session that runs until the edge half-closes, with one bad message."""
        r, v = self.rng, self.vocab
        opened = self.open(decide=pb.Decide(max_tokens=0))
        end = len(opened.open.prompt_tokens)
        options = [
            (grow(anchor=end, tokens=[int(r.integers(v, 2**32))]), "INVALID_ARGUMENT"),
            (grow(anchor=end, tokens=[]), "INVALID_ARGUMENT"),
            (grow(anchor=end + 1000, tokens=[1]), "INVALID_ARGUMENT"),  # beyond the decided
            (grow(anchor=int(r.integers(0, end)), tokens=[1]), "INVALID_ARGUMENT"),  # in the prompt
            (grow(anchor=end, tokens=[1], first_parent=1), "INVALID_ARGUMENT"),  # before node 0
            (grow(anchor=end, tokens=[1, 2], branch_index=[1]), "INVALID_ARGUMENT"),  # no parent
            (grow(anchor=end, tokens=[1, 2], branch_index=[int(r.choice([0, 2]))],
                  branch_parent=[1]), "INVALID_ARGUMENT"),
            (grow(anchor=end, tokens=[1] * 200), "RESOURCE_EXHAUSTED"),  # over 8 x max_live_nodes
            (pb.Uplink.FromString(V1_DRAFTS), "FAILED_PRECONDITION"),
            (pb.Uplink(extend=pb.Extend(tokens=[1])), "FAILED_PRECONDITION"),
            (pb.Uplink(commit=pb.Commit(node_id=0)), "FAILED_PRECONDITION"),
            (self.open(), "FAILED_PRECONDITION"),
        ]
        bad, code = options[int(r.integers(len(options)))]
        return [opened, bad], code

    def bad_message(self, next_id: int) -> tuple[pb.Uplink, str]:
        r, v = self.rng, self.vocab
        options = [
            (pb.Uplink(extend=pb.Extend(tokens=[int(r.integers(v, 2**32))])), "INVALID_ARGUMENT"),
            (pb.Uplink(extend=pb.Extend(tokens=[1, 2], branch_index=[1], branch_parent=[next_id + 5])), "INVALID_ARGUMENT"),
            (pb.Uplink(extend=pb.Extend(tokens=[1], branch_index=[0, 0], branch_parent=[0])), "INVALID_ARGUMENT"),
            (pb.Uplink(extend=pb.Extend(tokens=[])), "INVALID_ARGUMENT"),
            (pb.Uplink(extend=pb.Extend(tokens=list(range(20)))), "RESOURCE_EXHAUSTED"),
            (pb.Uplink(commit=pb.Commit(node_id=next_id + int(r.integers(0, 1000)))), "NOT_FOUND"),
            (pb.Uplink(more_tail=pb.MoreTail(node_id=0, n=int(r.integers(65, 1000)))), "INVALID_ARGUMENT"),
            (pb.Uplink(), "INVALID_ARGUMENT"),
            (self.open(), "FAILED_PRECONDITION"),
            (grow(anchor=1, tokens=[1]), "FAILED_PRECONDITION"),
            (pb.Uplink.FromString(V1_DRAFTS), "INVALID_ARGUMENT"),
        ]
        return options[int(r.integers(len(options)))]

    def bad_open(self) -> tuple[pb.Uplink, str]:
        r = self.rng
        other_version = (PROTOCOL_VERSION + int(r.integers(1, 100))) % 100  # 0 and 1 among them
        options = [
            (self.open(sampling=pb.Sampling(temperature=float(-r.random() - 0.1))), "INVALID_ARGUMENT"),
            (self.open(sampling=pb.Sampling(temperature=1.0, top_p=float(1.1 + r.random()))), "INVALID_ARGUMENT"),
            (raw_open(other_version, self.vh, [1]), "FAILED_PRECONDITION"),
            (raw_open(PROTOCOL_VERSION, "v1:0000", [1]), "FAILED_PRECONDITION"),
            (raw_open(PROTOCOL_VERSION, self.vh, []), "INVALID_ARGUMENT"),
            (raw_open(PROTOCOL_VERSION, self.vh, [1] * 100), "RESOURCE_EXHAUSTED"),
            (self.open(sampling=pb.Sampling(temperature=0.8), decide=pb.Decide()), "FAILED_PRECONDITION"),
        ]
        return options[int(r.integers(len(options)))]

    def stream(self) -> tuple[list[bytes], str | None]:
        """(serialized messages, expected final code; None = any allowed outcome)."""
        kind = self.rng.integers(7)
        if kind == 0:
            return [m.SerializeToString() for m in self.valid_session()], "OK"
        if kind == 5:
            return [m.SerializeToString() for m in self.decided_session()], "OK"
        if kind == 6:
            msgs, code = self.bad_decided()
            return [m.SerializeToString() for m in msgs], code
        if kind == 1:
            msgs = self.valid_session()
            cut = int(self.rng.integers(1, len(msgs) + 1))
            next_id = 1 + sum(len(m.extend.tokens) for m in msgs[:cut])
            bad, code = self.bad_message(next_id)
            return [m.SerializeToString() for m in msgs[:cut] + [bad]], code
        if kind == 2:
            bad, code = self.bad_open()
            return [bad.SerializeToString()], code
        if kind == 3:  # valid messages, wrong order: no Open first
            msgs = self.valid_session()[1:]
            return [m.SerializeToString() for m in msgs], "FAILED_PRECONDITION"
        return self.garbage(), None

    def garbage(self) -> list[bytes]:
        out = []
        for m in self.valid_session():
            raw = bytearray(m.SerializeToString())
            op = self.rng.integers(4)
            if op == 0 and raw:
                raw[int(self.rng.integers(len(raw)))] ^= 1 << int(self.rng.integers(8))
            elif op == 1:
                raw = raw[: int(self.rng.integers(len(raw) + 1))]
            elif op == 2:
                raw += self.rng.bytes(int(self.rng.integers(1, 20)))
            else:
                raw = bytearray(self.rng.bytes(int(self.rng.integers(1, 40))))
            out.append(bytes(raw))
        return out


def throw(ch: grpc.Channel, msgs: list[bytes]) -> tuple[str, str]:
    """Send raw messages on one stream with the *sync* client; returns (code, details).
    (The asyncio client can replace the server's status with 'INTERNAL: Internal error from
    Core' when a write races with the server ending the stream: grpc/grpc#36066.)"""
    call = ch.stream_stream("/acespec.v1.Verifier/Session", request_serializer=bytes,
                            response_deserializer=pb.Downlink.FromString)(iter(msgs))
    try:
        for _ in call:
            pass
    except grpc.RpcError:
        pass
    return call.code().name, call.details() or ""


@pytest.mark.slow
def test_fuzz_uplink(tiny_pair, caplog):
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    vh, prompt = tok.vocab_hash(), tok.encode("def main():\n")
    seq = list(prompt)
    for _ in range(6):
        seq.append(int(model(seq, model.new_cache(), last_only=True)[0].argmax()))
    expected = seq[len(prompt):]
    fuzz = Fuzzer(model.args.vocab_size, vh, seed=2024)
    caplog.set_level(logging.ERROR, logger="acespec.cloud.serving.servicer")

    async def go():
        async with running_verifier(model, vh, CFG) as (engine, addr):
            total, outcomes, mismatches = 0, {}, []

            async def worker():
                nonlocal total
                ch = grpc.insecure_channel(addr)
                while total < N_MESSAGES:
                    msgs, want = fuzz.stream()
                    total += len(msgs)
                    code, details = await asyncio.to_thread(throw, ch, msgs)
                    outcomes[code] = outcomes.get(code, 0) + 1
                    if (want is not None and code != want) or (want is None and code not in ALLOWED):
                        mismatches.append((want, code, details))
                ch.close()

            async def keep_healthy():
                runs = 0
                while total < N_MESSAGES:
                    assert await healthy(addr, vh, prompt, expected) == expected
                    runs += 1
                return runs

            results = await asyncio.gather(keep_healthy(), *(worker() for _ in range(6)))
            await asyncio.sleep(0.1)
            return total, outcomes, mismatches, results[0], len(engine.sessions)

    total, outcomes, mismatches, healthy_runs, leaked = run(go())
    print(f"fuzz: {total} messages, outcomes {outcomes}, healthy runs {healthy_runs}")
    assert total >= N_MESSAGES
    assert not mismatches, mismatches[:5]
    assert healthy_runs >= 1 and leaked == 0
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]

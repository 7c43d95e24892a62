"""The llama.cpp drafter: a GGUF model driven through llama-cpp-python's low-level API.

Token ids in, draft distributions out. The KV cache is managed per sequence: each `seq`
remembers which tokens it holds, so `draft` only feeds what is new (after truncating what
diverged), and `fork` copies a prefix to another sequence without recomputing it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from acespec.edge.drafting.base import Draft, draw
from acespec.edge.drafting.llama_lib import (
    DrafterError,
    load_model,
    new_context,
    silence,
    tokenize,
)
from acespec.shared.config import SamplingParams
from acespec.shared.grammar import Cursor
from acespec.shared.sampling import transform
from acespec.shared.shaping import shape
from acespec.shared.tokenizer import vocab_hash

log = logging.getLogger(__name__)
PREPARED = 8  # grammars whose matchers a drafter keeps built (prepare_grammar)


@dataclass(frozen=True)
class LlamaDrafterConfig:
    n_ctx: int = 4096  # tokens of KV shared by all sequences (unified cache)
    n_seq_max: int = 64  # sequences (requests x branches) the context can hold
    n_batch: int = 512  # most tokens fed in one llama_decode call
    n_threads: int = 0  # 0 = auto: 1 below 100M parameters (sync costs more than it saves), else min(4, CPUs)
    f32_kv: bool = False  # F32 K/V (exact comparisons) instead of F16
    quiet: bool = True  # silence llama.cpp's own logging
    # Testbed knob (--emulate-draft-ms T[,PER_TOKEN]): pad every decode call to T ms plus
    # PER_TOKEN ms per token beyond the first, a small edge device's step time (e.g. 8 ms:
    # a 135M Q4 model on one laptop core). 0 = run at this machine's speed.
    emulate_ms: float = 0.0
    emulate_per_token_ms: float = 0.0
    # Each caller waits out its own emulated step after letting go of the context, so that
    # requests sharing this drafter emulate devices of their own (bench load's clients);
    # False: the step holds the context, as one device's would.
    emulate_apart: bool = False


def _locked(method):
    """Serialise a method that touches the llama.cpp context: the edge drafts in a worker
    thread (off its event loop) while other requests' tasks may manage their sequences.
    An emulated step owed apart (LlamaDrafterConfig.emulate_apart) is waited out once the
    outermost call has let go of the context."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            self._depth += 1
            try:
                out = method(self, *args, **kwargs)
            finally:
                self._depth -= 1
                owed, outer = self._owed, self._depth == 0
                if outer:
                    self._owed = 0.0
        if outer and owed > 0:
            time.sleep(owed)
        return out
    return run


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


class LlamaDrafter:
    """Drafter over a GGUF file. Thread-safe: the methods that use the context hold a lock,
    so one decode runs at a time (llama.cpp contexts are single-threaded)."""

    def __init__(self, path: str | Path, config: LlamaDrafterConfig = LlamaDrafterConfig()):
        import llama_cpp  # lazy: llama.cpp's native library, loaded when a drafter is made

        self._lock = threading.RLock()
        self._depth, self._owed = 0, 0.0  # nested locked calls; an emulated step owed apart
        self._ll, self.config, self.path = llama_cpp, config, Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"drafter GGUF not found: {self.path}")
        if config.quiet:
            silence(llama_cpp)
        llama_cpp.llama_backend_init()
        self._model = load_model(llama_cpp, self.path)
        self._ctx, self.reserved_mib = new_context(llama_cpp, self._model,
                                                   self._context_params())
        if not self._ctx:
            raise DrafterError(f"{self.path}: llama.cpp could not create a context "
                               f"({config.n_ctx} tokens, {config.n_seq_max} sequences)")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        self._held: dict[int, list[int]] = {}  # seq -> tokens in its KV
        self._last: dict[int, np.ndarray] = {}  # seq -> logits [V] after its last held token
        self._grammars: dict[int, Cursor] = {}  # seq -> the grammar its request drafts in
        self._grammar_vocab = None  # llguidance's tokenizer of this vocabulary (made once)
        self._prepared: dict[str, object] = {}  # grammar -> its matcher at the start of text
        log.info("drafter %s: vocab %d, n_ctx %d, %d sequences", self.path.name,
                 self.vocab_size, config.n_ctx, config.n_seq_max)

    def _context_params(self):
        ll, c = self._ll, self.config
        p = ll.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = c.n_ctx, c.n_batch, c.n_batch, c.n_seq_max
        threads = c.n_threads or self._auto_threads()
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = True  # forks become metadata-only; per-seq streams abort on partial seq_cp
        p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED  # faster for tiny models
        if c.f32_kv:
            p.type_k = p.type_v = ll.GGML_TYPE_F32
        return p

    def _auto_threads(self) -> int:
        small = self._ll.llama_model_n_params(self._model) < 100_000_000
        return 1 if small else min(4, os.cpu_count() or 1)

    # -- identity and text -------------------------------------------------

    def token_table(self) -> list[str]:
        """tokens[i] = the GGUF's string for id i (as in tokenizer.json)."""
        get = self._ll.llama_vocab_get_text
        return [get(self._vocab, i).decode("utf-8", "surrogatepass") for i in range(self.vocab_size)]

    def vocab_hash(self) -> str:
        return vocab_hash(self.token_table())

    @property
    def kv_bytes_per_token(self) -> float:
        """Drafter KV memory one token takes: layers x (K + V) x kv heads x head dim x dtype."""
        m, ll = self._model, self._ll
        head_dim = ll.llama_model_n_embd(m) // ll.llama_model_n_head(m)
        width = 4 if self.config.f32_kv else 2
        return float(ll.llama_model_n_layer(m) * 2 * ll.llama_model_n_head_kv(m) * head_dim * width)

    @property
    def eos_id(self) -> int:
        return int(self._ll.llama_vocab_eos(self._vocab))

    def chat_template(self) -> str | None:
        """The GGUF's `tokenizer.chat_template` (Jinja), if it has one."""
        raw = self._ll.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def bos_id(self) -> int | None:
        bos = int(self._ll.llama_vocab_bos(self._vocab))
        return bos if bos >= 0 else None

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` with the GGUF's own tokenizer (no BOS, specials not parsed)."""
        return tokenize(self._ll, self._vocab, text, special=False)

    def piece(self, token: int) -> bytes:
        """The bytes token `token` stands for (specials render as nothing)."""
        buf = ctypes.create_string_buffer(64)
        n = self._ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    # -- KV management -----------------------------------------------------

    @_locked
    def fork(self, src: int, dst: int, n_tokens: int | None = None) -> None:
        """Make `dst` hold the first n_tokens (default all) of `src`'s tokens, sharing KV."""
        held = self._held.get(src, [])
        n = len(held) if n_tokens is None else min(n_tokens, len(held))
        self.drop(dst)
        self._ll.llama_memory_seq_cp(self._mem, src, dst, 0, n)
        self._held[dst] = held[:n]
        if n == len(held) and src in self._last:
            self._last[dst] = self._last[src]

    @_locked
    def truncate(self, seq: int, n_tokens: int) -> None:
        """Keep the first n_tokens of `seq`."""
        held = self._held.get(seq, [])
        if n_tokens < len(held):
            self._ll.llama_memory_seq_rm(self._mem, seq, n_tokens, -1)
            del held[n_tokens:]
            self._last.pop(seq, None)

    @_locked
    def drop(self, seq: int) -> None:
        """Free everything `seq` holds."""
        self._ll.llama_memory_seq_rm(self._mem, seq, 0, -1)
        self._held.pop(seq, None)
        self._last.pop(seq, None)
        self._grammars.pop(seq, None)

    @_locked
    def held(self, seq: int = 0) -> list[int]:
        return list(self._held.get(seq, []))

    @_locked
    def grammar_tokenizer(self):
        """llguidance's tokenizer of this vocabulary (made on first use)."""
        if self._grammar_vocab is None:  # (it reads self._vocab: dropped by close)
            # lazy: only a request that asks for structure loads llguidance
            from llguidance.llamacpp import lltokenizer_from_vocab

            with warnings.catch_warnings():  # it calls a llama.cpp name now deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                self._grammar_vocab = lltokenizer_from_vocab(self._vocab)
        return self._grammar_vocab

    @_locked
    def prepare_grammar(self, grammar: str, matcher) -> None:
        """Keep `grammar`'s matcher at the start of text, built over grammar_tokenizer() by
        the caller (seconds for a large schema) without this drafter's lock: a request's
        first draft in it then copies it, and others' drafting does not wait on the build.
        The last PREPARED grammars are kept."""
        self._prepared.pop(grammar, None)
        self._prepared[grammar] = matcher
        while len(self._prepared) > PREPARED:
            del self._prepared[next(iter(self._prepared))]

    def is_prepared(self, grammar: str) -> bool:
        return grammar in self._prepared

    def _grammar(self, sampling: SamplingParams, seq: int) -> Cursor | None:
        """The request's grammar as seen from `seq` (a cursor per sequence: the tree's
        branches each follow their own text)."""
        if sampling.grammar is None:
            return None
        cur = self._grammars.get(seq)
        if cur is None or (cur.grammar, cur.output_from) != (sampling.grammar,
                                                             sampling.output_from):
            cur = self._grammars[seq] = Cursor(self.grammar_tokenizer(), sampling.grammar,
                                               sampling.output_from, self.vocab_size,
                                               self._prepared.get(sampling.grammar))
        return cur

    # -- evaluation --------------------------------------------------------

    @_locked
    def logits(self, context: Sequence[int], seq: int = 0) -> np.ndarray:
        """Logits [len(context), V] float32 for every position of `context`, fed from scratch."""
        self.drop(seq)
        return self._feed(seq, list(context), all_logits=True)

    @_locked
    def next_logits(self, context: Sequence[int], seq: int = 0) -> np.ndarray:
        """Logits [V] float32 after `context`, reusing whatever prefix `seq` already holds."""
        context = list(context)
        if not context:
            raise ValueError("the drafter needs a non-empty context (at least BOS)")
        rest = self._reuse(seq, context)
        return self._last[seq] if rest is None else self._feed(seq, rest)[-1]

    def _reuse(self, seq: int, context: list[int]) -> list[int] | None:
        """Keep the prefix `seq` shares with context (at least one token is left to feed);
        returns the tokens still to feed, or None when seq holds exactly context and its
        logits are cached."""
        held = self._held.get(seq, [])
        common = _common_prefix(held, context)
        if common == len(context) == len(held) and seq in self._last:
            return None
        self.truncate(seq, min(common, len(context) - 1))
        return context[len(self._held.get(seq, [])):]

    @_locked
    def next_logits_many(self, contexts: Sequence[Sequence[int]], seqs: Sequence[int]
                         ) -> np.ndarray:
        """Logits [k, V] after each context, its own sequence reusing what it holds. What
        every sequence still needs (often one token, a few after a fork) is fed in ONE
        batched decode (several sequence ids per batch) while it fits n_batch, so growing k
        leaves costs about one decode, not k. Sequences must differ."""
        if len(set(seqs)) != len(seqs):
            raise ValueError(f"one sequence per context, got {list(seqs)}")
        out: list[np.ndarray | None] = [None] * len(contexts)
        feed: list[tuple[int, int, list[int]]] = []  # (index, seq, tokens still to feed)
        for i, (ctx, seq) in enumerate(zip(contexts, seqs)):
            ctx = list(ctx)
            if not ctx:
                raise ValueError("the drafter needs a non-empty context (at least BOS)")
            rest = self._reuse(seq, ctx)
            if rest is None:
                out[i] = self._last[seq]
            else:
                feed.append((i, seq, rest))
        for group in self._batches(feed):
            for (i, _, _), row in zip(group, self._feed_many(group)):
                out[i] = row
        return np.stack(out)

    def _batches(self, feed: list[tuple[int, int, list[int]]]):
        """Split the feeds into groups of at most n_batch tokens; a feed longer than that
        first goes in alone, all but its last n_batch - 1 tokens (its logits are not needed)."""
        cap, group, used = self.config.n_batch, [], 0
        for i, seq, rest in feed:
            if len(rest) > cap:
                self._feed(seq, rest[:-(cap - 1)])
                rest = rest[-(cap - 1):]
            if used + len(rest) > cap:
                yield group
                group, used = [], 0
            group.append((i, seq, rest))
            used += len(rest)
        if group:
            yield group

    @_locked
    def draft_many(self, contexts: Sequence[Sequence[int]], sampling: SamplingParams,
                     rngs: Sequence, seqs: Sequence[int]) -> list[Draft]:
        """One draft token after each context (batched; see next_logits_many)."""
        rows = self.next_logits_many(contexts, seqs)
        return [_one_draft(row, sampling, rng, ctx, self._grammar(sampling, seq))
                for row, rng, ctx, seq in zip(rows, rngs, contexts, seqs)]

    @_locked
    def draft(self, context: Sequence[int], n: int, sampling: SamplingParams,
                rng: np.random.Generator, seq: int = 0) -> Draft:
        """Draft n tokens after `context` in sequence `seq`; q after the sampling transform."""
        steps, logits = [], self.next_logits(context, seq)
        text = list(context) if sampling.shaped else []  # what penalties and grammars count
        grammar = self._grammar(sampling, seq)
        for i in range(n):
            steps.append(_one_draft(logits, sampling, rng, text, grammar))
            if sampling.shaped:
                text.append(int(steps[-1].tokens[0]))
            if i + 1 < n:
                logits = self._feed(seq, [int(steps[-1].tokens[0])])[-1]
        return Draft(tokens=np.concatenate([d.tokens for d in steps]),
                     q=np.concatenate([d.q for d in steps]),
                     ranks=np.concatenate([d.ranks for d in steps]))

    def _feed(self, seq: int, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        """Append tokens to `seq`'s KV in chunks of n_batch; logits [k, V] for the fed rows
        (all of them, or only the last)."""
        b, held = self._batch, self._held.setdefault(seq, [])
        if len(held) + len(tokens) > self.config.n_ctx:
            raise DrafterError(f"context of {len(held) + len(tokens)} tokens exceeds "
                               f"n_ctx={self.config.n_ctx}")
        out = []
        for start in range(0, len(tokens), self.config.n_batch):
            chunk = tokens[start:start + self.config.n_batch]
            last_chunk = start + len(chunk) == len(tokens)
            for i, tok in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = tok, len(held) + i, 1
                b.seq_id[i][0] = seq
                b.logits[i] = all_logits or (last_chunk and i == len(chunk) - 1)
            b.n_tokens = len(chunk)
            self._decode(len(chunk))
            rows = range(len(chunk)) if all_logits else ([len(chunk) - 1] if last_chunk else [])
            out.extend(self._logits_row(i) for i in rows)
            held.extend(chunk)
        self._last[seq] = out[-1]
        return np.stack(out)

    def _feed_many(self, items: list[tuple[int, int, list[int]]]) -> list[np.ndarray]:
        """One decode: tokens appended to sequence seq for each (_, seq, tokens), logits only
        after each sequence's last token; those rows, in order."""
        b, j, last = self._batch, 0, []
        for _, seq, tokens in items:
            held = self._held.setdefault(seq, [])
            if len(held) + len(tokens) > self.config.n_ctx:
                raise DrafterError(f"context of {len(held) + len(tokens)} tokens exceeds "
                                   f"n_ctx={self.config.n_ctx}")
            for k, tok in enumerate(tokens):
                b.token[j], b.pos[j], b.n_seq_id[j] = tok, len(held) + k, 1
                b.seq_id[j][0], b.logits[j] = seq, k == len(tokens) - 1
                j += 1
            last.append(j - 1)
        b.n_tokens = j
        self._decode(j)
        rows = []
        for (_, seq, tokens), row in zip(items, last):
            self._held[seq].extend(tokens)
            rows.append(self._logits_row(row))
            self._last[seq] = rows[-1]
        return rows

    def _decode(self, n_tokens: int) -> None:
        """llama_decode of the prepared batch, padded to the emulated step time if set."""
        t0 = time.perf_counter()
        rc = self._ll.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise DrafterError(f"llama_decode failed with code {rc} (KV full?)")
        c = self.config
        pad = (c.emulate_ms + c.emulate_per_token_ms * (n_tokens - 1)) / 1000
        left = pad - (time.perf_counter() - t0)
        if left > 0 and c.emulate_apart:
            self._owed += left
        elif left > 0:
            time.sleep(left)

    def _logits_row(self, i: int) -> np.ndarray:
        ptr = self._ll.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy()

    @_locked
    def close(self) -> None:
        self._grammars, self._grammar_vocab = {}, None  # they read the vocabulary freed here
        self._prepared = {}
        if getattr(self, "_ctx", None):
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ll.llama_model_free(self._model)
            self._ctx = self._model = None

    def __del__(self):
        self.close()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    if len(a) <= len(b) and list(a) == list(b[:len(a)]):  # the usual case, at C speed
        return len(a)
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _one_draft(logits: np.ndarray, sampling: SamplingParams, rng,
               text: Sequence[int] = (), grammar: Cursor | None = None) -> Draft:
    """A one-token Draft from logits [V] after `text` (every token before it), as `draft`
    draws it: penalised and constrained as the verifier's target is, if the request asks."""
    logits = shape(logits, text, sampling, grammar)
    q = transform(logits[None], sampling)[0]
    plain = sampling.temperature == 1.0 and not sampling.top_k and sampling.top_p == 1.0
    ranks = q if plain else _softmax(logits)
    tok = draw(q, sampling, rng)
    return Draft(tokens=np.array([tok], dtype=np.int32), q=q[None], ranks=ranks[None])

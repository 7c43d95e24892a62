"""The target's logprobs and repetition penalties through `acespec edge serve` started from
the shell, in acespec mode and in ar mode, against `acespec cloud serve` serving the tiny
target: compared with the target run alone (one forward pass per token over what precedes
it), logprobs in OpenAI's chat and completions shapes, streamed and not, greedy and coupled;
penalised text equal in both modes and to the penalised target's, exact sampling following
the penalised target (chi-square); the drafter penalised as the target is; and the requests
that cannot have them refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import api_stack  # noqa: E402

from conftest import stdlib_texts  # noqa: E402

pytestmark = pytest.mark.slow
servers = api_stack.servers  # the stack's fixture

TOL = 2e-4  # the verifier's batched tree passes against one plain forward, float32
PROMPT = "def parse(text):\n"


@pytest.fixture(scope="module")
def target(tiny_pair):
    """(answer(n, sampling params, seed) -> (ids [n], log-softmax rows [n, V]), a token's
    text, the prompt's ids, the text of ids): the target alone deciding each token from one
    forward pass over what precedes it, by the verifier's own rule
    (acespec.cloud.verify.verdict.decide)."""
    from acespec.cloud.verify.verdict import decide
    from acespec.edge.text import TextCodec
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, model, _ = tiny_pair
    prompt = Tokenizer.load(tok_dir).encode(PROMPT)
    piece = TextCodec.from_tokenizer(tok_dir / "tokenizer.json").piece_fn

    def answer(n: int, params, seed: int) -> tuple[list[int], np.ndarray]:
        ids, rows = [], []
        for i in range(n):
            with torch.no_grad():
                row = model(prompt + ids, model.new_cache(), last_only=True)[0]
            rows.append(torch.log_softmax(row.double(), -1).numpy())
            ids.append(decide(row.numpy(), params, seed, len(prompt) + i, prompt + ids))
        return ids, np.stack(rows)
    return answer, lambda t: piece(t).decode("utf-8", errors="replace"), prompt, \
        lambda ids: b"".join(map(piece, ids)).decode("utf-8", errors="replace")


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json={"model": "acespec", **body}, timeout=60)


def check_completion(target, lp: dict, n_top: int, params, seed: int) -> None:
    """A completion's tokens are the target's, and so are their logprobs and the values of
    their n_top alternatives (a completions `logprobs` names tokens by text alone)."""
    answer, text_of = target[:2]
    ids, rows = answer(len(lp["tokens"]), params, seed)
    assert len(ids) >= 8
    assert lp["tokens"] == [text_of(t) for t in ids]
    assert lp["token_logprobs"] == pytest.approx([rows[i, t] for i, t in enumerate(ids)],
                                                 abs=TOL)
    for i, d in enumerate(lp["top_logprobs"]):
        # the dict holds the alternatives and the chosen token, keyed by text (tokens that
        # share a text, such as pieces of a character, share an entry)
        want = [*np.sort(rows[i])[::-1][:n_top], rows[i, ids[i]]]
        assert all(any(abs(g - w) <= TOL for w in want) for g in d.values()), i
        assert max(d.values()) == pytest.approx(want[0], abs=TOL)
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)


@pytest.mark.parametrize("mode", ["acespec", "ar"])
def test_completions_greedy_logprobs_are_the_targets(servers, target, mode):
    from acespec.shared.served import ServeParams

    r = post(servers[mode], "/v1/completions", {"prompt": PROMPT, "max_tokens": 24,
                                               "temperature": 0, "logprobs": 5})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == r.json()["usage"]["completion_tokens"]
    check_completion(target, lp, 5, ServeParams(), 0)


def test_chat_logprobs_streamed_and_not_through_the_sdk(servers):
    client = openai.OpenAI(base_url=servers["acespec"] + "/v1", api_key="unused", timeout=60,
                           max_retries=0)
    ask = {"model": "acespec", "messages": [{"role": "user", "content": "a loop"}],
           "max_tokens": 20, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    whole = client.chat.completions.create(**ask).choices[0]
    content = whole.logprobs.content

    def text(entries) -> str:
        return b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")
    assert text(content) == whole.message.content
    assert all(e.token == bytes(e.bytes).decode("utf-8", errors="replace") for e in content)
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6
               and [t.logprob for t in e.top_logprobs] ==
               sorted((t.logprob for t in e.top_logprobs), reverse=True) for e in content)
    streamed = [e for ch in client.chat.completions.create(**ask, stream=True)
                if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.bytes for e in streamed] == [e.bytes for e in content]
    # (a pass's shape, which follows the drafts, moves the float rounding)
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=TOL)
    # a stop string: logprobs for the tokens of the text returned, and no more
    full = whole.message.content
    cut = full[len(full) // 2:][:2]
    stopped = client.chat.completions.create(**ask, stop=[cut]).choices[0]
    assert stopped.finish_reason == "stop" and cut not in stopped.message.content
    kept = stopped.logprobs.content
    assert stopped.message.content.startswith(text(kept))
    assert [e.bytes for e in kept] == [e.bytes for e in content[:len(kept)]]
    assert len(text(content[:len(kept) + 1])) > len(stopped.message.content)


def test_coupled_sampling_logprobs_are_the_targets_in_both_modes(servers, target):
    from acespec.shared.config import SamplingParams
    from acespec.shared.served import ServeParams

    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0.8, "seed": 7, "logprobs": 2,
            "sampling": "coupled", "ignore_eos": True}
    got = {m: post(servers[m], "/v1/completions", body).json()["choices"][0] for m in servers}
    assert got["acespec"]["text"] == got["ar"]["text"]
    for m in servers:
        check_completion(target, got[m]["logprobs"], 2,
                         ServeParams(SamplingParams(0.8, coupled=True)), 7)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": 1, "temperature": 0.8, "sampling": "exact"}, "logprobs"),
    ("/v1/completions", {"logprobs": 1, "temperature": 0, "offline": "local"}, "logprobs"),
    ("/v1/completions", {"repetition_penalty": 5e-324}, "repetition_penalty"),
    ("/v1/completions", {"repetition_penalty": 0.09}, "repetition_penalty"),
    ("/v1/chat/completions", {"repetition_penalty": 10.5}, "repetition_penalty"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_requests_that_cannot_be_served_are_refused_by_name(servers, path, body, param, stream):
    """Streamed or not, the same 400 in OpenAI's error shape, before any stream starts."""
    ask = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else \
        {"prompt": PROMPT}
    r = post(servers["acespec"], path, {**ask, "max_tokens": 4, "stream": stream, **body})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("penalty", [0.1, 10.0])
def test_repetition_penalty_at_the_ends_of_its_range_is_served(servers, penalty):
    """A prompt that repeats itself, greedy, the penalty at either end of [0.1, 10]: both
    modes answer 200 with the same text (nothing overflows on either side)."""
    body = {"prompt": "abc abc abc abc abc", "max_tokens": 12, "temperature": 0,
            "repetition_penalty": penalty}
    got = [post(servers[m], "/v1/completions", body) for m in servers]
    assert all(r.status_code == 200 for r in got), [r.text for r in got]
    assert len({r.json()["choices"][0]["text"] for r in got}) == 1


def test_logprobs_cost_downlink_bytes_only_when_asked(servers):
    """The downlink's cost of logprobs, per token, with 0 and 5 alternatives."""
    base = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    down = {}
    for k in (None, 0, 5):
        u = post(servers["acespec"], "/v1/completions",
                 {**base, **({} if k is None else {"logprobs": k})}).json()["usage"]
        down[k] = u["wire_bytes_down"] / u["completion_tokens"]
    print(json.dumps({"downlink_bytes_per_token": down}))
    assert down[None] < down[0] < down[5]


PENALTIES = {"presence_penalty": 0.8, "frequency_penalty": 0.6, "repetition_penalty": 1.3}


def serve_params(temperature: float, penalised: bool, n_prompt: int):
    from acespec.shared.config import Penalties, SamplingParams
    from acespec.shared.served import ServeParams

    pen = Penalties(0.8, 0.6, 1.3) if penalised else Penalties()
    return ServeParams(SamplingParams(temperature, coupled=temperature > 0, penalties=pen,
                                      output_from=n_prompt))


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.8, 11)])
def test_penalised_text_is_the_penalised_targets_in_both_modes(servers, target, temperature,
                                                               seed):
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": temperature, "seed": seed,
            "ignore_eos": True, "sampling": "coupled"}
    got = {m: post(servers[m], "/v1/completions", {**body, **PENALTIES}).json()
           for m in servers}
    text = got["acespec"]["choices"][0]["text"]
    assert text == got["ar"]["choices"][0]["text"]
    answer, _, prompt, decode = target
    ids, _ = answer(32, serve_params(temperature, True, len(prompt)), seed)
    assert text == decode(ids)
    plain, _ = answer(32, serve_params(temperature, False, len(prompt)), seed)
    assert plain != ids  # the penalties changed the text
    usage = got["acespec"]["usage"]
    print(json.dumps({"temperature": temperature, "drafted": usage["drafted_tokens"],
                      "accepted": usage["accepted_tokens"]}))


def test_the_drafter_is_penalised_as_the_target(tiny_pair, target):
    """The f32 drafter (the target's own weights in llama.cpp) drafts the penalised target's
    greedy text: the same penalties, from the same text."""
    from acespec.edge.drafting.llama import LlamaDrafter

    answer, _, prompt, _ = target
    params = serve_params(0.0, True, len(prompt))
    drafter = LlamaDrafter(tiny_pair[2]["f32"])
    try:
        draft = drafter.draft(prompt, 12, params.sampling, np.random.default_rng(0))
        unpenalised = drafter.draft(prompt, 12, serve_params(0.0, False, 0).sampling,
                                      np.random.default_rng(0), seq=1)
    finally:
        drafter.close()
    ids, _ = answer(12, params, 0)
    assert list(draft.tokens) == ids
    assert list(unpenalised.tokens) != ids
def test_exact_sampling_follows_the_penalised_target(servers, target, tiny_pair):
    """sampling "exact" (rejection sampling at the edge, from the penalised drafter's q and
    the verifier's penalised p~): over 400 seeds, the first token is distributed as the
    penalised target's p~ (chi-square, p > 0.001), and not as the unpenalised one's."""
    from concurrent.futures import ThreadPoolExecutor

    from scipy.stats import chisquare

    from acespec.shared.config import Penalties, SamplingParams
    from acespec.shared.penalties import penalise
    from acespec.shared.served import ServeParams, served
    from acespec.shared.tokenizer import Tokenizer

    text_of = target[1]
    tok_dir, model, _ = tiny_pair
    tok = Tokenizer.load(tok_dir)
    pen = Penalties(repetition=4.0)

    def dists(text: str):
        prompt = tok.encode(text)
        with torch.no_grad():
            row = model(prompt, model.new_cache(), last_only=True)[0].numpy()
        params = ServeParams(SamplingParams(1.0, top_k=6, penalties=pen,
                                            output_from=len(prompt)))
        return (served(penalise(row, prompt, pen, len(prompt)), params),
                served(row, ServeParams(SamplingParams(1.0, top_k=6))))

    def moved(d) -> float:  # the penalised p~'s mass on tokens it took from the plain one
        want, plain = d
        return sum(max(0, u - want.units_of(int(i))) for i, u in zip(plain.ids, plain.units)) \
            / 65536
    # a prompt whose likely next tokens it holds itself, so the penalty moves them
    lines = [ln for t in stdlib_texts(8) for ln in t.splitlines() if len(ln.strip()) > 10][:60]
    text = max(lines, key=lambda ln: moved(dists(ln)))
    want, plain = dists(text)
    assert moved((want, plain)) > 0.3
    body = {"prompt": text, "max_tokens": 1, "temperature": 1.0, "top_k": 6,
            "sampling": "exact", "repetition_penalty": 4.0, "ignore_eos": True}

    def first(seed: int) -> str:
        return post(servers["acespec"], "/v1/completions",
                    {**body, "seed": seed}).json()["choices"][0]["text"]
    n = 400
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(first, range(n)))
    counts = {}
    for t in texts:
        counts[t] = counts.get(t, 0) + 1

    def expected(dist) -> dict:
        out = {}
        for i, u in zip(dist.ids, dist.units):
            out[text_of(int(i))] = out.get(text_of(int(i)), 0) + u / 65536 * n
        return out
    for dist, should_fit in ((want, True), (plain, False)):
        exp = expected(dist)
        keys = sorted(set(exp) | set(counts))
        observed = [counts.get(k, 0) for k in keys]
        expect = [exp.get(k, 1e-9) for k in keys]
        p = chisquare(observed, expect).pvalue
        assert (p > 1e-3) == should_fit, (should_fit, p, counts, exp)


@pytest.mark.parametrize("mode", ["acespec", "ar"])
def test_echo_scores_the_prompt_as_the_target_does(servers, tiny_pair, mode):
    """echo with logprobs and max_tokens 0 (how evaluation harnesses score a text): the
    prompt's tokens with the target's logprobs, each given what precedes it; with max_tokens
    8 the answer follows, its offsets after the prompt's."""
    from acespec.shared.tokenizer import Tokenizer

    tok_dir, model, _ = tiny_pair
    ids = Tokenizer.load(tok_dir).encode(PROMPT)
    with torch.no_grad():
        rows = torch.log_softmax(model(ids, model.new_cache()).double(), -1).numpy()
    want = [rows[i - 1, ids[i]] for i in range(1, len(ids))]  # ids[0] is BOS: not shown
    only = post(servers[mode], "/v1/completions", {"prompt": PROMPT, "max_tokens": 0,
                                                   "echo": True, "logprobs": 3}).json()
    c = only["choices"][0]
    assert c["text"] == PROMPT and only["usage"]["completion_tokens"] == 0
    lp = c["logprobs"]
    assert "".join(lp["tokens"]) == PROMPT
    assert lp["token_logprobs"] == pytest.approx(want, abs=TOL)
    assert all(max(d.values()) >= x - 1e-6 for d, x in zip(lp["top_logprobs"], want))
    both = post(servers[mode], "/v1/completions", {"prompt": PROMPT, "max_tokens": 8,
                                                   "echo": True, "logprobs": 1,
                                                   "temperature": 0}).json()["choices"][0]
    plain = post(servers[mode], "/v1/completions", {"prompt": PROMPT, "max_tokens": 8,
                                                    "temperature": 0}).json()["choices"][0]
    assert both["text"] == PROMPT + plain["text"]
    n = len(lp["tokens"])
    assert both["logprobs"]["token_logprobs"][:n] == pytest.approx(want, abs=TOL)
    assert len(both["logprobs"]["tokens"]) == n + 8
    assert both["logprobs"]["text_offset"][n] == len(PROMPT)
    text = post(servers[mode], "/v1/completions", {"prompt": PROMPT, "max_tokens": 4,
                                                   "echo": True}).json()["choices"][0]
    assert text["text"].startswith(PROMPT) and text["logprobs"] is None
    client = openai.OpenAI(base_url=servers[mode] + "/v1", api_key="unused", timeout=60,
                           max_retries=0)  # as evaluation harnesses ask, through the SDK
    sdk = client.completions.create(model="acespec", prompt=PROMPT, max_tokens=0, echo=True,
                                    logprobs=1).choices[0]
    assert sdk.text == PROMPT and sdk.logprobs.token_logprobs == pytest.approx(want, abs=TOL)


def test_echo_streams_the_prompt_first(servers):
    with httpx.stream("POST", servers["acespec"] + "/v1/completions", timeout=60, json={
            "model": "acespec", "prompt": PROMPT, "max_tokens": 6, "echo": True,
            "logprobs": 0, "stream": True, "temperature": 0}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    first = events[0]["choices"][0]
    assert first["text"] == PROMPT and first["logprobs"]["text_offset"][0] == 0
    later = [e["choices"][0]["logprobs"]["text_offset"] for e in events[1:]
             if e["choices"][0].get("logprobs")]
    assert later and all(o >= len(PROMPT) for offs in later for o in offs)


def test_max_tokens_zero_needs_echo(servers):
    r = post(servers["acespec"], "/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text

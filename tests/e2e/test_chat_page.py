"""The chat page in a browser (headless chromium, driven by playwright) against `edge serve`
started from the shell, as a user runs it: with a verifier, `--offline local` and
`--api-key`. The page asks for the key; Enter sends and Shift+Enter breaks the line; each
answer on the page is the API's greedy answer to the same conversation; with the verifier
killed mid-answer the page shows the drafter's text marked unverified, and once a verifier
is back, the verified text in its place; it follows every sequence of the stream's
acespec fields as the server makes them. Everything the page loads comes from the server."""

from __future__ import annotations

import os
import random
import shutil

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from acespec.edge.api.answer import stream_parts  # noqa: E402
from acespec.edge.api.openai_types import parse_request  # noqa: E402
from acespec.edge.shown import ShownText  # noqa: E402

from cli_harness import edge_serve, verifier_at  # noqa: E402
from conftest import free_port  # noqa: E402
from process_guard import TAG  # noqa: E402

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser fixture says so: a skip, or a failure where required
    expect = sync_playwright = None

pytestmark = pytest.mark.slow
KEY = "page-key"
STEP_MS = "100"  # the verifier's pass time: an answer lasts long enough to cut it
CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
DONE = '.msg.assistant[data-state="done"]'


class Stack:
    """The demo verifier on a fixed port (so it can be killed and started again) and
    `edge serve` in front of it."""

    def __init__(self, cport: int):
        self.cport, self.url = cport, ""
        self.cloud = verifier_at(cport, "--emulate-step-ms", STEP_MS)
        self.env = {TAG: os.environ.get(TAG, "")}  # a restarted verifier is the module's

    def kill(self) -> None:
        self.cloud.kill()

    def restart(self) -> None:
        self.cloud = verifier_at(self.cport, "--emulate-step-ms", STEP_MS, env=self.env)

    def answer(self, messages: list[dict], max_tokens: int) -> str:
        """The API's greedy answer to the conversation."""
        r = httpx.post(f"{self.url}/v1/chat/completions", timeout=120,
                       headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": "acespec", "messages": messages, "temperature": 0,
                             "max_tokens": max_tokens})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    template = tmp_path_factory.mktemp("chat-page") / "chat.jinja"
    template.write_text(CHAT)
    s = Stack(free_port())
    try:
        with edge_serve(f"127.0.0.1:{s.cport}", "--offline", "local", "--api-key", KEY,
                        "--chat-template", str(template), "--reconnect-deadline", "60") \
                as (url, _):
            s.url = url
            yield s
    finally:
        s.cloud.kill()


@pytest.fixture(scope="module")
def browser():
    why = "the playwright package is not installed" if sync_playwright is None else None
    exe = shutil.which("chromium")
    if why is None and exe is None:
        why = "no chromium on PATH (Debian: apt-get install chromium)"
    if why is not None:
        if os.environ.get("ACESPEC_REQUIRE_CHROMIUM"):
            pytest.fail(f"{why}, and ACESPEC_REQUIRE_CHROMIUM is set")
        pytest.skip(why)
    expect.set_options(timeout=30_000)  # the answers share 2 cores with other tests
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, stack):
    """A fresh page (its own localStorage) that has been asked for the key and given it;
    every request it made, and every error it logged, are checked at the end."""
    context = browser.new_context()
    pg = context.new_page()
    requests, errors = [], []
    pg.on("request", lambda r: requests.append(r.url))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(stack.url + "/")
    pg.wait_for_selector("#key-row", state="visible")  # the server wants a key: asked
    assert "API key" in pg.text_content("#key-note")
    pg.fill("#api-key", KEY)
    pg.press("#api-key", "Tab")  # change: the page checks the key
    expect(pg.locator("#key-note")).to_have_text("")  # (the page's CSP forbids eval:
    # playwright's wait_for_function cannot run there; its locators can)
    yield pg
    context.close()
    assert requests and all(u.startswith(stack.url + "/") for u in requests), requests
    assert not [e for e in errors if "status of 401" not in e], errors  # 401: the key probe


def _settings(page, max_tokens: int) -> None:
    page.click("#settings summary")
    page.fill("#max-tokens", str(max_tokens))
    assert page.input_value("#temperature") == "0"  # the page's default: greedy


def _answers(page) -> list[str]:
    return page.locator(".msg.assistant .text").all_text_contents()


def test_enter_sends_shift_enter_breaks_the_line_answers_are_the_apis(page, stack):
    _settings(page, 40)
    page.click("#prompt")
    page.keyboard.type("def add(a, b):")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("    return")
    first = "def add(a, b):\n    return"
    assert page.input_value("#prompt") == first
    assert page.locator(".msg").count() == 0  # Shift+Enter sent nothing
    page.keyboard.press("Enter")
    page.wait_for_selector(DONE)
    assert page.input_value("#prompt") == ""
    assert page.locator(".msg.user .text").text_content() == first
    talk = [{"role": "user", "content": first}]
    ref = stack.answer(talk, 40)
    assert _answers(page) == [ref]
    page.keyboard.type("class Stack:")
    page.keyboard.press("Enter")
    expect(page.locator(DONE)).to_have_count(2)
    talk += [{"role": "assistant", "content": ref}, {"role": "user", "content": "class Stack:"}]
    assert _answers(page) == [ref, stack.answer(talk, 40)]  # the history went with it
    assert "tokens/s" in page.text_content("#status-speed")
    assert "drafted here:" in page.text_content("#status-drafts")
    assert page.get_attribute("#status-link", "data-state") == "up"


def test_unverified_text_is_marked_then_replaced_by_the_verified_text(page, stack):
    prompt, n = "def fibonacci(n):", 300
    ref = stack.answer([{"role": "user", "content": prompt}], n)
    _settings(page, n)
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    expect(page.locator(".msg.assistant .text")).not_to_have_text("")
    stack.kill()  # mid-answer
    try:
        page.wait_for_selector(".msg.assistant .unverified", timeout=20_000)
        answer = page.locator(".msg.assistant")
        assert answer.get_attribute("data-unverified") is not None
        assert answer.get_attribute("data-state") == "streaming"
        text, style = page.evaluate(  # at once: each redraw makes new spans
            "() => { const e = document.querySelector('.msg.assistant .unverified');"
            " return [e.textContent, getComputedStyle(e).fontStyle]; }")
        assert text and style == "italic"  # shown, and shown as unverified
        page.wait_for_selector('#status-link[data-state="down"]')
    finally:
        stack.restart()
    page.wait_for_selector(DONE, timeout=60_000)
    assert page.locator(".unverified").count() == 0
    assert page.locator(".msg.assistant").get_attribute("data-unverified") is None
    assert _answers(page) == [ref]
    assert "confirmed" in page.text_content("#status-unverified")


def _states(rng: random.Random, steps: int) -> list[tuple[str, str]]:
    """A run of (verified text, unverified text after it), as an answer goes through local
    offline mode: the verified text only grows, the unverified text comes and goes, and both
    hold characters beyond UTF-16's basic plane (JS strings count those twice)."""
    chars, verified, out = ["a", "b", "\u00e9", "\U0001F600", "\n"], "", []
    for _ in range(steps):
        verified += "".join(rng.choices(chars, k=rng.randrange(3)))
        out.append((verified, "".join(rng.choices(chars, k=rng.randrange(4)))))
    return out


def test_the_page_follows_every_sequence_of_acespec_fields(page):
    """The page's ShownAnswer against the server's own stream parts (ShownText, stream_parts)
    for random answers: after each step it shows the verified text, then the unverified text
    marked, never verified text after unverified."""
    req = parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "stream": True}, True, lambda messages, tools=None: [("x", False)])
    rng = random.Random(0)
    for _ in range(20):
        shown, steps, want = ShownText(), [], []
        for verified, unverified in _states(rng, 12):
            steps.append(stream_parts(req, 0, shown.update(verified, unverified), None, None))
            want.append([verified, unverified])
        got = page.evaluate("""steps => {
            const message = document.createElement("div");
            message.append(Object.assign(document.createElement("div"), {className: "text"}));
            const answer = new ShownAnswer(message), seen = [];
            for (const choices of steps) {
                choices.forEach((c) => answer.apply(c));
                const runs = answer.runs, cut = runs.findIndex((r) => !r.verified);
                const tail = cut < 0 ? [] : runs.slice(cut);
                seen.push(tail.some((r) => r.verified) ? ["unverified before verified"]
                    : [runs.slice(0, cut < 0 ? runs.length : cut).map((r) => r.text).join(""),
                       tail.map((r) => r.text).join("")]);
            }
            return seen; }""", steps)
        assert got == want

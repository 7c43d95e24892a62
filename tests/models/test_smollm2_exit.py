"""The SmolLM2 drafter build (the target's first layers, distilled on ShareGPT) on its tiny
preset, end to end with the real target: every stage runs, the GGUF loads in llama.cpp and
tokenizes as the target does, a rerun resumes, and no training stage reads the eval split."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.slow
TEXTS = ["<|im_start|>user\nWrite a function that checks for primes.<|im_end|>\n",
         "def f(x):\n\treturn x**2  # ok\n", "Ünïcödé naïve café ß 😀👍🏽 数字 123456",
         "  leading spaces and trailing  ", "'s 're 'll don't\r\n\x00ctrl"]


@pytest.fixture(scope="module")
def built(chat_cache, tmp_path_factory):
    from acespec.models import sharegpt
    from acespec.models.smollm2 import GGUF_NAME
    from acespec.models.smollm2.build import build

    mp = pytest.MonkeyPatch()
    mp.setenv("ACESPEC_CACHE_DIR", str(chat_cache))
    asked: list[tuple[str, str]] = []  # (stage, split) of every records() call
    real = sharegpt.records

    def spy(split, *a, **kw):
        import traceback

        stage = next((f.name for f in reversed(traceback.extract_stack())
                      if f.name.startswith(("build_", "train_"))), "?")
        asked.append((stage, split))
        return real(split, *a, **kw)

    mp.setattr(sharegpt, "records", spy)
    out = tmp_path_factory.mktemp("smollm2-exit")
    gguf = chat_cache / "smollm2" / GGUF_NAME
    card = build(chat_cache / "smollm2" / "target", gguf, out / "out", out / "work", "tiny")
    yield gguf, out, card, asked
    mp.undo()


@pytest.mark.slow
def test_training_stages_read_only_the_training_split(built):
    *_, asked = built
    assert ("build_eval", "eval") in asked
    train_side = {split for stage, split in asked if stage != "build_eval"}
    assert train_side == {"train"}, asked
    assert {stage for stage, _ in asked} >= {"build_answers", "build_scored"}


def test_gguf_loads_and_tokenizes_like_the_target(built):
    from acespec.models.smollm2.corpus import LlamaBatch

    gguf, out, card, _ = built
    t = LlamaBatch(gguf, n_seq=1, n_ctx_seq=256)
    d = LlamaBatch(out / "out" / "drafter-q8_0.gguf", n_seq=1, n_ctx_seq=256)
    assert d.vocab_size == t.vocab_size == 49152 and d.eos_id == t.eos_id
    assert d.chat_template() == t.chat_template()
    for text in TEXTS:
        for special in (True, False):
            assert d.tokenize(text, special) == t.tokenize(text, special), text
    ids, p = d.topk(t.tokenize(TEXTS[0]), 4)
    assert ids.shape == (len(t.tokenize(TEXTS[0])), 4) and np.isfinite(p.astype(float)).all()
    assert card["drafter"]["num_layers"] == 1 and card["layers"] == 1


def test_card_reports_acceptance_per_category(built):
    _, out, card, _ = built
    saved = json.loads((out / "out" / "build.json").read_text())
    assert saved["greedy_acceptance"] == card["greedy_acceptance"]
    acc = card["greedy_acceptance"]
    assert set(acc) == {"code", "writing", "explain", "other", "all"}
    assert all(1.0 <= acc[c]["2"] <= 3.0 for c in acc)
    assert acc["all"]["chats"] == sum(acc[c]["chats"] for c in acc if c != "all")
    assert card["corpus"]["answers"]["sequences"] > 0 and card["corpus"]["scored"]["sequences"] > 0
    assert set(card["agreement"]) == set(acc) and all(0 <= v <= 1 for v in card["agreement"].values())
    readme = (out / "out" / "README.md").read_text()
    assert "Greedy acceptance" in readme and "| all | 4 |" in readme
    assert f"**{card['agreement']['all']:.1%}** of answer positions" in readme


def test_cut_target_keeps_the_targets_first_layers(chat_cache):
    import torch

    from acespec.cloud.target.loader import load_model
    from acespec.models.smollm2.teacher import cut_target

    full = load_model(chat_cache / "smollm2" / "target")
    cut = cut_target(chat_cache / "smollm2" / "target", 2)
    assert cut.args.num_layers == 2
    for name, p in cut.state_dict().items():
        if name != "model.norm.weight":  # rescaled to the target's logit spread
            assert torch.equal(p, full.state_dict()[name]), name
    with pytest.raises(ValueError, match=r"layers must be in \[1, 30\]"):
        cut_target(chat_cache / "smollm2" / "target", 31)


@pytest.mark.slow
def test_resume_skips_finished_stages(built, chat_cache):
    from acespec.models.smollm2.build import build

    gguf, out, card, _ = built
    again = build(chat_cache / "smollm2" / "target", gguf, out / "out", out / "work", "tiny")
    assert again["greedy_acceptance"] == card["greedy_acceptance"]
    assert again["corpus"] == card["corpus"]


@pytest.mark.slow
def test_a_grown_cut_computes_what_the_trained_one_does(chat_cache):
    """teacher.grow: a deeper cut started from a shallower (here: perturbed) one keeps its
    layers and norm and adds the target's next layers with zero output projections, so its
    logits equal the shallower model's; the rest of each added layer is the target's."""
    import torch

    from acespec.models.smollm2.teacher import cut_target, grow

    target = chat_cache / "smollm2" / "target"
    small = cut_target(target, 1)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.01 * torch.randn_like(p))  # "trained": no longer the target's weights
    big = cut_target(target, 3)
    grow(big, small.state_dict())
    x = torch.randint(100, 49000, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(small.causal_logits(x), big.causal_logits(x))
    full = cut_target(target, 3).state_dict()
    for name, p in big.state_dict().items():
        if name.startswith("model.layers.2.") and not name.endswith(("o_proj.weight",
                                                                      "down_proj.weight")):
            assert torch.equal(p, full[name]), name
    with pytest.raises(ValueError, match="cannot grow 3 trained layers into 3"):
        grow(big, big.state_dict())


@pytest.mark.slow
def test_a_grown_preset_trains_on_from_its_base(built, chat_cache):
    """Preset tiny-2 grows the tiny build's trained layer: it starts from that checkpoint
    (its own checkpoint beside it), trains its steps, and the card says what it grew from."""
    import torch

    from acespec.models.smollm2.build import PRESETS, build

    gguf, out, _, _ = built
    card = build(chat_cache / "smollm2" / "target", gguf, out / "out2", out / "work", "tiny-2")
    assert card["layers"] == 2 and card["drafter"]["num_layers"] == 2
    assert card["grown_from"] == "tiny"
    state = torch.load(out / "work" / PRESETS["tiny-2"].ckpt, weights_only=False)
    assert state["step"] == PRESETS["tiny-2"].train.steps
    base = torch.load(out / "work" / PRESETS["tiny"].ckpt, weights_only=False)["model"]
    assert not torch.equal(state["model"]["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])  # trained on
    assert (out / "out2" / "drafter-q8_0.gguf").is_file()


@pytest.mark.slow
def test_start_from_gguf_restores_a_built_drafter(built, chat_cache):
    """teacher.start_from_gguf: a fresh cut loaded from the build's F16 GGUF has the trained
    checkpoint's layers and norm (to F16 precision) and the target's own embedding; a GGUF
    of another depth is refused, naming both."""
    import torch

    from acespec.models.smollm2.build import PRESETS
    from acespec.models.smollm2.teacher import cut_target, start_from_gguf

    _, out, _, _ = built
    target = chat_cache / "smollm2" / "target"
    trained = torch.load(out / "work" / PRESETS["tiny"].ckpt, weights_only=False)["model"]
    model = cut_target(target, 1)
    embed = model.model.embed_tokens.weight.clone()
    start_from_gguf(model, out / "out" / "drafter-f16.gguf")
    state = model.state_dict()
    for name, p in trained.items():
        if name.startswith("model.layers.") or name == "model.norm.weight":
            torch.testing.assert_close(state[name], p, rtol=2e-3, atol=2e-3, msg=name)
    assert torch.equal(model.model.embed_tokens.weight, embed)
    with pytest.raises(ValueError, match="1 layers of width 576.*not a 2-layer cut"):
        start_from_gguf(cut_target(target, 2), out / "out" / "drafter-f16.gguf")


@pytest.mark.slow
def test_a_preset_started_from_a_gguf_trains_on_from_it(built, chat_cache, monkeypatch):
    """A preset with start_gguf begins at that drafter (not at the untrained cut), trains its
    steps, and its card names the file it started from with its sha256."""
    import hashlib

    import torch

    from acespec.models.smollm2 import build as b
    from acespec.models.smollm2.teacher import cut_target

    gguf, out, _, _ = built
    start = out / "out" / "drafter-f16.gguf"
    monkeypatch.setitem(b.PRESETS, "tiny-c", replace(b.PRESETS["tiny"], ckpt="drafter-c.ckpt",
                                                      start_gguf=str(start)))
    target = chat_cache / "smollm2" / "target"
    card = b.build(target, gguf, out / "out3", out / "work", "tiny-c")
    sha = hashlib.sha256(start.read_bytes()).hexdigest()
    assert card["started_from"] == {"file": str(start), "sha256": sha}
    assert f"Trained on from `{start}` (sha256 `{sha[:16]}" in (out / "out3" / "README.md").read_text()
    state = torch.load(out / "work" / "drafter-c.ckpt", weights_only=False)
    assert state["step"] == b.PRESETS["tiny-c"].train.steps
    name = "model.layers.0.mlp.down_proj.weight"
    began = torch.load(out / "work" / b.PRESETS["tiny"].ckpt, weights_only=False)["model"][name]
    untrained = cut_target(target, 1).state_dict()[name]
    w = state["model"][name]
    assert (w - began).norm() < (w - untrained).norm()
    assert not torch.equal(w, began)  # trained on


def test_batched_torch_answers_are_the_targets_own(chat_cache):
    """answers.TorchBatch (KV cache per chat, chats of different lengths side by side):
    every greedy answer token, and the top-1 kept after every position (prompt and answer),
    is the full causal forward's argmax over the same text; a sampled chat runs beside
    them; records are shaped as corpus.LlamaBatch.generate's."""
    import torch

    from acespec.models.smollm2 import GGUF_NAME
    from acespec.models.smollm2.answers import TorchBatch
    from acespec.models.smollm2.corpus import LlamaBatch, render_chat

    tok = LlamaBatch(chat_cache / "smollm2" / GGUF_NAME, n_seq=1, n_ctx_seq=64)
    tb = TorchBatch(chat_cache / "smollm2" / "target", tok, n_seq=2, n_ctx_seq=128)
    tb.model.float()  # exact comparison; the build runs it in bfloat16 where that is fast
    texts = ["Name a prime number.", "Write one line of Python that prints hello.",
             "Why is the sky blue? Answer in one short sentence, please."]
    prompts = [tok.tokenize(render_chat(tok.chat_template(), t)) for t in texts]
    temps = [0.0, 0.7, 0.0]
    recs = tb.generate(prompts, 6, temps, np.random.default_rng(0), 4)
    assert len(recs) == 3
    for rec, prompt, temp in zip(recs, prompts, temps):
        ids = rec["ids"].tolist()
        assert ids[:len(prompt)] == prompt and rec["n_prompt"] == len(prompt)
        assert 1 <= len(ids) - len(prompt) <= 6
        assert rec["top_ids"].shape == rec["top_p"].shape == (len(ids) - 1, 4)
        with torch.no_grad():
            full = tb.model.causal_logits(torch.tensor([ids]))[0, :-1]  # [n - 1, V]
        top2 = full.topk(2, dim=-1)
        clear = (top2.values[:, 0] - top2.values[:, 1] > 1e-3).numpy()
        best = top2.indices[:, 0].numpy()
        assert (rec["top_ids"][:, 0].astype(np.int64)[clear] == best[clear]).all()
        if temp == 0:
            answer = np.array(ids[len(prompt):])
            assert (answer == best[len(prompt) - 1:])[clear[len(prompt) - 1:]].all()
    tok.close()


def test_greedy_steps_counts_accepted_drafts_and_the_bonus():
    """build.greedy_steps: a drafter that is always right emits depth + 1 per step (the last
    step only what the answer has left); one that is always wrong, one per step."""
    from acespec.models.smollm2.build import greedy_steps

    seq = list(range(10, 30))  # 5 prompt tokens, 15 answer tokens

    class Fake:
        def __init__(self, right: bool):
            self.right = right

        def next_logits(self, ids):
            logits = np.zeros(64)
            logits[seq[len(ids)] if self.right and len(ids) < len(seq) else 0] = 1
            return logits

        def drop(self, seq_id):
            pass

    assert greedy_steps(Fake(True), seq, 5, 4) == (15, 3)  # 5 + 5 + 5
    assert greedy_steps(Fake(True), seq, 5, 8) == (15, 2)  # 9 + 6
    assert greedy_steps(Fake(False), seq, 5, 4) == (15, 15)


@pytest.mark.slow
def test_agreement_of_the_target_with_its_own_answers_is_near_one(built):
    """build.agreement lines the drafter's top-1 after each position up with the next answer
    token: the target's own GGUF, teacher-forced on its greedy eval answers, agrees at (almost:
    llama.cpp's batched and single-sequence numerics may split a near-tie) every position."""
    from acespec.models.smollm2.build import agreement

    gguf, out, _, _ = built
    agree = agreement(gguf, out / "work")
    assert agree["all"] >= 0.95, agree

"""The table of modes (acespec.shared.modes) and what the edge engine reads from it."""

from pathlib import Path

import pytest

from acespec.edge.session.config import EngineConfig
from acespec.shared import modes
from acespec.shared.config import SamplingParams
from acespec.shared.served import ServeParams

COUPLED = ServeParams(SamplingParams(0.8, coupled=True))
EXACT = ServeParams(SamplingParams(0.8))


def test_every_row_is_named_for_its_key_and_says_what_it_is():
    for name, m in modes.MODES.items():
        assert m.name == name and m.help
        assert m.drafts in ("edge", "verifier", "both", "none")
        assert m.decides in ("edge", "verifier")
        assert not (m.gap and m.drafts == "edge"), "a gap drafter is the verifier drafting"
    assert {"ar", "sd", "pipeline", "acespec", "colo", "cloud-lookup"} <= set(modes.NAMES)


@pytest.mark.parametrize("name", modes.NAMES)
def test_who_decides_follows_the_row_and_the_sampling(name):
    m = modes.mode(name)
    greedy = EngineConfig(mode=name)
    assert greedy.decided == (m.decides == "verifier" and not m.cloud_only)
    assert greedy.verifier_decides_all == (m.cloud_only or greedy.decided)
    assert EngineConfig(mode=name, serve=COUPLED).decided == greedy.decided
    if m.drafts == "verifier":  # the rivals' edge drafts nothing: the verifier must decide
        with pytest.raises(ValueError, match="must decide"):
            EngineConfig(mode=name, serve=EXACT)
        with pytest.raises(ValueError, match="must decide"):
            EngineConfig(mode=name, sampling="exact")
    else:  # exact sampling is decided at the edge in every mode that drafts there
        assert not EngineConfig(mode=name, serve=EXACT).decided
        assert not EngineConfig(mode=name, sampling="exact").decided


def test_a_local_row_answers_locally_and_names_are_checked():
    assert EngineConfig(mode="acespec-local").offline == "local"
    assert EngineConfig(mode="acespec").offline == "wait"
    with pytest.raises(ValueError, match="unknown mode 'tree'.*acespec-chain"):
        EngineConfig(mode="tree")
    with pytest.raises(ValueError, match="unknown modes sd; bench load runs ar"):
        modes.check(("ar", "sd"), ("ar", "acespec"), "bench load")
    assert modes.check(("ar", "acespec")) == ("ar", "acespec")


def test_help_names_every_mode_once():
    text = modes.help_text()
    for name in modes.NAMES:
        assert text.count(f"{name}: ") == 1


def test_the_design_documents_the_table_as_it_is():
    """docs/design.md's table of modes says what acespec.shared.modes says, row for row."""
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    head = "| mode | drafts | decides | branches | gap drafter | what runs |"
    rows = design[design.index(head):].split("\n\n")[0].splitlines()[2:]
    yes = {"yes": True, "no": False}
    got = {}
    for row in rows:
        name, drafts, decides, branches, gap = (c.strip(" `") for c in row.split("|")[1:6])
        got[name] = (drafts, decides, yes[branches], yes[gap])
    assert got == {n: (m.drafts, m.decides, m.branches, m.gap) for n, m in modes.MODES.items()}

"""Bad shape flags are one line on stderr and exit 2, naming the flag and its limits, in every
command that takes them (bench, edge generate, edge serve); nothing starts."""

import pytest

from cli_harness import acespec


@pytest.mark.parametrize("args,names", [
    (["bench", "--adaptive", "--depth", "16", "--window", "8"], ["--window 8", "--depth 16"]),
    (["bench", "--depth", "100"], ["--depth 100", "[1, 64]"]),
    (["bench", "--depth", "0"], ["--depth", "[1, inf)"]),
    (["bench", "--propose", "-1"], ["--propose", "[0, 64]"]),
    (["edge", "generate", "hi", "--depth", "8", "--window", "4"], ["--window 4", "--depth 8"]),
    (["edge", "generate", "hi", "--depth", "65"], ["--depth", "[1, 64]"]),
    (["edge", "serve", "--window", "2000"], ["--window", "[1, 1024]"]),
    (["edge", "serve", "--depth", "0"], ["--depth", "[1, 64]"]),
    (["cloud", "serve", "--propose", "65"], ["--propose", "[0, 64]"]),
])
def test_a_bad_shape_is_one_line_and_exit_2(args, names):
    p = acespec(*args, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in p.stderr, p.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])

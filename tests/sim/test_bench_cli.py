"""`acespec bench COMMAND`: each command parses its own options only, and `acespec bench` with
no command is `acespec bench run`."""

from __future__ import annotations

import pytest

from acespec.argtypes import draft_ms
from acespec.cli import build_parser
from acespec.sim import bench, bench_cli, datasets, load

from cli_harness import acespec

COMMANDS = ("run", "load", "hostile", "calibrate", "sweep")


def parse(*argv: str):
    return build_parser().parse_args(["bench", *argv])


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        parse(command, "--help")
    assert e.value.code == 0
    return capsys.readouterr().out


def test_no_command_is_run():
    bare, run = parse("--modes", "ar,acespec", "--depth", "8"), parse("run", "--modes",
                                                                     "ar,acespec", "--depth", "8")
    assert bare.bench_cmd == run.bench_cmd == "run"
    assert {k: v for k, v in vars(bare).items() if k != "func"} == \
        {k: v for k, v in vars(run).items() if k != "func"}
    assert parse().bench_cmd == "run" and parse().modes == "ar,sd,pipeline,acespec"


@pytest.mark.parametrize("command,own,foreign", [
    ("run", "--sampling", "--clients"),
    ("load", "--clients", "--scenarios"),
    ("load", "--predict", "--calibration"),
    ("hostile", "--scenarios", "--link"),
    ("calibrate", "--emulate-step-ms", "--rates"),
    ("sweep", "--hit-rate", "--model"),
])
def test_a_command_refuses_another_commands_option(command, own, foreign, capsys):
    assert own in help_text(command, capsys) and foreign not in help_text(command, capsys)
    with pytest.raises(SystemExit) as e:
        parse(command, foreign, "1")
    assert e.value.code == 2 and f"unrecognized arguments: {foreign}" in capsys.readouterr().err


def test_the_parsers_defaults_are_the_librarys():
    assert bench_cli.STEP_MS == bench.BenchConfig.emulate
    assert bench_cli.GPU_LIKE == load.GPU_LIKE == load.LoadConfig.emulate
    assert bench_cli.CLOUD_DRAFT_MS == bench.CLOUD_DRAFT_MS == load.LoadConfig.cloud_draft
    assert draft_ms(bench_cli.EDGE_DRAFT_MS) == load.EDGE_DRAFT_MS == \
        load.LoadConfig.emulate_draft
    assert bench_cli.DATASETS == datasets.DATASETS


def test_defaults_follow_the_command():
    assert parse("run").emulate_step_ms == parse("hostile").emulate_step_ms == "40,0.5"
    assert parse("load").emulate_step_ms == "25,0.1,256"
    assert parse("calibrate").emulate_step_ms is None  # the target's own passes
    # the load bench's model: the demo pair's calibration (docs/benchmarks.md §2); the
    # sweep's: its --calibration file's
    assert (parse("load").accept, parse("load").lookup_accept) == (0.74, 0.566)
    assert (parse("sweep").accept, parse("sweep").lookup_accept) == (None, None)


def test_load_help_shows_loads_options_only():
    r = acespec("bench", "load", "--help", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--clients" in r.stdout and "--predict" in r.stdout
    for foreign in ("--scenarios", "--calibration", "--hit-rate", "--rates", "--netns"):
        assert foreign not in r.stdout, foreign


def test_bench_help_lists_the_commands():
    r = acespec("bench", "--help", timeout=120)
    assert r.returncode == 0, r.stderr
    assert all(f"\n    {c}" in r.stdout for c in COMMANDS), r.stdout
    assert "--modes" not in r.stdout.split("\n\n", 2)[0]  # its usage line: commands, no options


@pytest.mark.slow
def test_calibrate_times_the_targets_own_passes_by_default(tiny_hf_dir, noisy_gguf, tmp_path):
    """`bench calibrate` with no --emulate-step-ms, from the shell: its verifier runs the
    target's own passes (no profile flag, none empty), and the costs are written."""
    import json

    out = tmp_path / "costs.json"
    r = acespec("bench", "calibrate", "--per-category", "1", "--max-tokens", "8", "--model",
                str(tiny_hf_dir), "--drafter", str(noisy_gguf), "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["emulate_step_ms"] is None and data["max_tokens"] == 8, data
    assert data["costs"]["target_base_s"] > 0 and 0 <= data["acceptance"] <= 1, data

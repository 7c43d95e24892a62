"""The edge's settings file (edge.toml) as a user meets it: `acespec edge config`, `edge serve`
and `edge generate` started from the shell with a temporary home, the file found in
$XDG_CONFIG_HOME (else ~/.config) or named by --config; flags override it; a bad file is one
line naming the file, the key and what it takes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from cli_harness import Proc, acespec, wait_http
from conftest import free_port


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """A user's environment whose home is a fresh folder (XDG_CONFIG_HOME unset, here too:
    the harness's processes start from this process's environment)."""
    (tmp_path / "home").mkdir()
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "XDG_CONFIG_HOME"}
    return {**env, "HOME": str(tmp_path / "home")}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def settings(stdout: str) -> dict[str, tuple[str, str]]:
    """`edge config`'s lines: key -> (value as written, source)."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        m = re.fullmatch(r"(?:# )?([\w-]+)(?: = (.*?)| \(unset\))\s+# (\w+)", line)
        assert m, line
        rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_config_shows_each_setting_with_where_it_came_from(home, tmp_path):
    conf = write(Path(home["HOME"]) / ".config" / "acespec" / "edge.toml",
                 'cloud = "gpu-host:50051"\nport = 9000\napi_key = "s3cret"\n'
                 'offline = "local"\ntls-ca = "certs/ca.pem"\n'
                 'allow-origin = ["http://localhost:3000"]\n')
    r = acespec("edge", "config", "--port", "8123", env=home, timeout=60)
    assert r.returncode == 0, r.stderr
    assert str(conf) in r.stdout.splitlines()[0]
    rows = settings(r.stdout)
    assert rows["cloud"] == ('"gpu-host:50051"', "file")
    assert rows["port"] == ("8123", "flag")  # the flag overrides the file
    assert rows["offline"] == ('"local"', "file")
    assert rows["host"] == ('"127.0.0.1"', "default")
    assert rows["tls-ca"] == (f'"{conf.parent / "certs" / "ca.pem"}"', "file")  # its folder's
    assert rows["allow-origin"] == ('["http://localhost:3000"]', "file")
    assert rows["api-key"] == ('"<redacted>"', "file")
    assert "s3cret" not in r.stdout + r.stderr
    assert rows["depth"] == (None, "default")


def test_xdg_config_home_and_config_flag_choose_the_file(home, tmp_path):
    write(Path(home["HOME"]) / ".config" / "acespec" / "edge.toml", 'cloud = "home:1"\n')
    write(tmp_path / "xdg" / "acespec" / "edge.toml", 'cloud = "xdg:2"\n')
    named = write(tmp_path / "named.toml", 'cloud = "named:3"\n')
    cases = [((), home, '"home:1"'),
             ((), {**home, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}, '"xdg:2"'),
             (("--config", str(named)), {**home, "XDG_CONFIG_HOME": str(tmp_path / "xdg")},
              '"named:3"')]
    for flags, env, cloud in cases:
        r = acespec("edge", "config", *flags, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert settings(r.stdout)["cloud"] == (cloud, "file"), flags
    r = acespec("edge", "config", env=home | {"HOME": str(tmp_path / "nobody")}, timeout=60)
    assert r.returncode == 0 and "file: none" in r.stdout, r.stdout + r.stderr
    assert settings(r.stdout)["cloud"] == ('"localhost:50051"', "default")


@pytest.mark.parametrize("body,message", [
    ('clod = "x"\n', "unknown key 'clod' (did you mean 'cloud'?); the keys are the flags"),
    ("port = 70000\n", "port: must be an integer in [1, 65535], got '70000'"),
    ('offline = "maybe"\n', 'offline: must be one of wait, local, got "maybe"'),
    ("cloud = 5\n", "cloud: must be a string, got 5"),
    ('max-tokens = 0\n', "max-tokens: must be an integer in [1, 2147483647], got '0'"),
    ('json = "yes"\n', 'json: must be true or false, got "yes"'),
    ('pair = "demo"\ndrafter = "d.gguf"\n', "pair and drafter: set one of them"),
    ("[serve]\nport = 1\n", "[serve]: settings are top-level `key = value` lines"),
    ("port = \n", "not a TOML file: "),
])
def test_a_bad_file_is_one_line_naming_file_and_key(home, tmp_path, body, message):
    conf = write(tmp_path / "edge.toml", body)
    for command in ("config", "serve", "generate"):
        args = ("edge", command, *(["hello"] if command == "generate" else []))
        r = acespec(*args, "--config", str(conf), env=home, timeout=60)
        assert r.returncode == 2, r.stdout
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(
            f"acespec edge {command}: error: {conf}: "), r.stderr
        assert message in r.stderr, r.stderr


def test_a_missing_named_file_is_an_error_but_a_missing_default_is_not(home, tmp_path):
    r = acespec("edge", "config", "--config", str(tmp_path / "nope.toml"), env=home, timeout=60)
    assert r.returncode == 2
    assert f"{tmp_path / 'nope.toml'}: cannot read it: No such file" in r.stderr


def test_a_flag_for_pair_or_drafter_replaces_the_files_other(home, tmp_path):
    conf = write(tmp_path / "edge.toml", 'drafter = "my.gguf"\napi-key = "k"\n')
    r = acespec("edge", "config", "--config", str(conf), "--pair", "demo",
                "--api-key-file", "key.txt", env=home, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = settings(r.stdout)
    assert rows["pair"] == ('"demo"', "flag") and rows["drafter"][1] == "default"
    assert rows["api-key-file"] == ('"key.txt"', "flag") and rows["api-key"][1] == "default"


def test_generate_names_the_file_when_its_value_is_bad(home, tmp_path):
    conf = write(tmp_path / "edge.toml", 'drafter = "missing.gguf"\n')
    r = acespec("edge", "generate", "hello", "--config", str(conf), env=home, timeout=120)
    assert r.returncode == 2
    assert (f"--drafter {tmp_path / 'missing.gguf'}: no such file; pass a GGUF file or 'ngram' "
            f"(key drafter in {conf})") in r.stderr


@pytest.mark.slow
def test_serve_runs_with_the_file_and_its_key_file(home, tmp_path):
    """`edge serve` with no flags at all: host, port, the local API's key (from a key file
    beside the settings) and the verifier's address come from ~/.config/acespec/edge.toml."""
    port = free_port()
    conf_dir = Path(home["HOME"]) / ".config" / "acespec"
    write(conf_dir / "api.key", "\n  local-key-123\n")
    write(conf_dir / "edge.toml", f'host = "127.0.0.1"\nport = {port}\ncloud = '
          f'"127.0.0.1:{free_port()}"\napi-key-file = "api.key"\npair = "demo"\n')
    with Proc("edge", "serve", env=home) as edge:
        edge.wait_for(rf"listening on http://127\.0\.0\.1:{port} ")
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health")
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        ok = httpx.get(f"{url}/v1/models", timeout=10,
                       headers={"Authorization": "Bearer local-key-123"})
        assert ok.status_code == 200, ok.text
        edge.stop(timeout=20)

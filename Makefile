# One command each, on a fresh machine (README.md):
#   make demo   set up a virtualenv and run the proxy in front of its built-in mock MindIE upstream
#   make test   set up (incl. prometheus and redis-server from Debian when root), lint (ruff, mypy --strict), run pytest
#   make test-cli  install the client CLIs (Codex, Claude Code) with npm into .venv/cli and run the `cli` tests
#   make test-compliance  llm-comply's suites against the proxy in front of each mock upstream (docs/compliance.md)
#   make test-http  install HTTPolice into .venv-httpolice and judge the front end's HTTP/1.1 with it (part of make test)
#   make test-otel  install Arize Phoenix into .venv-phoenix and check the proxy's traces in it (tests/test_phoenix.py)
#   make test-compiled  the whole test suite on a copy of the tree whose request path is compiled with mypyc (setup.py)
#   make bench  the benchmark (separate from the tests; prints figures)
#   make bench-felt  speed as users feel it: the public gateway board's figures for every relay, and a memory soak
#   make bench-workers  --workers 2 vs 1 under wrk against nginx (Debian packages, installed when root)
#   make soak   a bounded soak run against the mock (loopback only); SECONDS=N (default 120)
#   make gateway-soak  a bounded soak with mock replicas going down and up (loopback only)
#   make affinity-bench  prefix-cache hit rate: least_outstanding vs prefix_affinity
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: demo test test-limits bench-limits test-http httpolice test-cli test-compliance test-otel test-image test-compiled bench bench-felt test-bench bench-instructions bench-workers soak gateway-soak affinity-bench lint system-deps clean

# The package (and the openai SDK for the snippet the demo prints) ...
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[demo]"
	touch $(STAMP)

# ... and with the test and dev extras (openai SDK, pytest, hypothesis, schema validators, ruff, mypy).
$(DEVSTAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,dev]"
	touch $(DEVSTAMP)

demo: $(STAMP)
	$(BIN)/dialect-proxy demo

# promtool and the Prometheus server come from Debian's `prometheus` package, redis-server (the Redis state store's
# tests) from `redis-server`; tests that need them skip with a reason when they cannot be installed (not root, no apt).
system-deps:
	@missing=""; \
	if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then missing="prometheus"; fi; \
	if ! command -v redis-server >/dev/null 2>&1; then missing="$$missing redis-server"; fi; \
	if ! command -v redis-sentinel >/dev/null 2>&1; then missing="$$missing redis-sentinel"; fi; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install Debian package(s)$$missing; their tests will skip"; \
	  else echo "note: Debian package(s) $$missing missing and not root; their tests will skip"; fi; \
	fi

test: $(DEVSTAMP) system-deps httpolice lint
	$(BIN)/python -m pytest -q

# HTTPolice (an HTTP message linter, PyPI) judges the front end's answers on raw connections
# (tests/conformance/test_httpolice.py). Its own virtualenv: it needs bitstring < 4, which nothing else should be held
# to. Installed by `make test` when it can be (the test skips otherwise); `make test-http` runs that test alone.
HTTPOLICE_VENV := .venv-httpolice
httpolice:
	@test -x $(HTTPOLICE_VENV)/bin/python && $(HTTPOLICE_VENV)/bin/python -c "import httpolice" 2>/dev/null || \
	  { $(PYTHON) -m venv $(HTTPOLICE_VENV) && \
	    $(HTTPOLICE_VENV)/bin/python -m pip install -q "HTTPolice==0.9.0" "bitstring<4"; } || \
	  echo "warning: could not install HTTPolice; tests/conformance/test_httpolice.py will skip"

test-http: $(DEVSTAMP) httpolice
	HTTPOLICE_PYTHON=$(abspath $(HTTPOLICE_VENV))/bin/python $(BIN)/python -m pytest -q tests/conformance

# The independent compliance suite (llm-comply, pinned in the test extra); part of plain `pytest` too, and fast.
test-compliance: $(DEVSTAMP)
	$(BIN)/python -m pytest -q tests/compliance

# Real client CLIs and SDKs from npm (not part of `make test`). Codex is pinned: the tests name its shell tool. The
# Vercel AI SDK is pinned too (tests/cli/test_vercel_ai.py reads what its providers return).
CLI_DIR := $(VENV)/cli
CODEX_VERSION ?= 0.169.0
VERCEL_AI_PACKAGES ?= ai@6.0.326 @ai-sdk/openai@3.0.141 @ai-sdk/anthropic@3.0.140 zod@4.6.7
CLI_PACKAGES ?= @openai/codex@$(CODEX_VERSION) @anthropic-ai/claude-code $(VERCEL_AI_PACKAGES)
test-cli: $(DEVSTAMP)
	npm install --prefix $(CLI_DIR) --no-audit --no-fund --no-update-notifier $(CLI_PACKAGES)
	PATH="$(abspath $(CLI_DIR))/node_modules/.bin:$$PATH" $(BIN)/python -m pytest -q -m cli

# The proxy's OpenTelemetry traces in a real trace viewer: Arize Phoenix in a virtualenv of its own (its dependencies
# are many and not the proxy's), started on loopback by the tests with its telemetry off. Not part of `make test`.
# SCREENSHOT=docs/img/phoenix-agent-turn.png also photographs the agent turn's trace (headless Chromium, Debian
# package chromium).
PHOENIX_VENV := .venv-phoenix
PHOENIX_VERSION ?= 20.26.1
test-otel: $(DEVSTAMP)
	test -x $(PHOENIX_VENV)/bin/phoenix || { $(PYTHON) -m venv $(PHOENIX_VENV) && \
	  $(PHOENIX_VENV)/bin/python -m pip install -q "arize-phoenix==$(PHOENIX_VERSION)"; }
	PHOENIX_BIN=$(abspath $(PHOENIX_VENV))/bin/phoenix $(if $(SCREENSHOT),DIALECT_PROXY_SCREENSHOT=$(abspath $(SCREENSHOT))) \
	  $(BIN)/python -m pytest -q -m phoenix tests/test_phoenix.py

# The container image (deploy/Dockerfile) built and run with Docker (not part of `make test`: needs a daemon and base
# images). PYTHON_IMAGE, BUILD_IMAGE and COMPILE are the Dockerfile's build arguments (COMPILE= builds pure Python).
IMAGE ?= dialect-proxy:test
COMPILE ?= mypyc
DOCKER_BUILD_ARGS := $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
  $(if $(BUILD_IMAGE),--build-arg BUILD_IMAGE=$(BUILD_IMAGE)) --build-arg COMPILE=$(COMPILE)
test-image: $(DEVSTAMP) system-deps
	docker build --network host -f deploy/Dockerfile $(DOCKER_BUILD_ARGS) -t $(IMAGE) .
	DIALECT_PROXY_TEST_IMAGE=$(IMAGE) DIALECT_PROXY_TEST_BUILD=$(if $(COMPILE),$(COMPILE),python) \
	  $(BIN)/python -m pytest -q -m image tests/deploy/test_image.py

# The optional compiled build (setup.py), tested whole: a copy of the tree in build/compiled-tree (never the tree itself:
# a compiled module shadows its .py), compiled there, and the suite run in it against that copy's modules; every
# proxy process the tests start must report the build mypyc (tests/conftest.py EXPECTED_BUILD). Needs a C compiler.
COMPILED_TREE := build/compiled-tree
test-compiled: $(DEVSTAMP) system-deps
	$(BIN)/python tests/compiled_tree.py $(COMPILED_TREE)
	cd $(COMPILED_TREE) && PROXY_EXPECT_BUILD=mypyc $(abspath $(BIN))/python -m pytest -q -p no:cacheprovider

lint: $(DEVSTAMP)
	$(BIN)/ruff check proxy tests
	$(BIN)/mypy

# make bench [REF=COMMIT] [COMPILED=1] [REF_COMPILED=1]: COMPILED=1 measures a compiled copy of this tree (setup.py)
# as the proxy, REF_COMPILED=1 a compiled copy of REF.
# nginx (Debian package) is the floor row: installed when root; without it the table leaves its columns out.
bench: $(DEVSTAMP)
	@if ! command -v nginx >/dev/null 2>&1 && ! test -x /usr/sbin/nginx && [ "$$(id -u)" = 0 ] \
	  && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null \
	    || echo "warning: could not install nginx; the bench runs without its floor row"; \
	fi
	$(BIN)/python tests/bench/bench.py $(if $(REF),--ref $(REF)) $(if $(COMPILED),--compiled) \
	    $(if $(REF_COMPILED),--ref-compiled)

# The issue's two-minute token-limit run (three serve processes, one redis-server, tokens_per_minute 2000, a 60 s
# window, 8 openai SDK callers); the default suite runs the same test with a 10 s window for 20 s.
test-limits: $(DEVSTAMP)
	LIMITS_RUN_SECONDS=120 LIMITS_WINDOW=60 LIMITS_TPM=2000 $(BIN)/python -m pytest -q -p no:cacheprovider \
	    tests/state/test_limits_shared.py

# What a limited key costs per request: the limiter's Redis round trip, and whole requests (docs/sharing.md).
bench-limits: $(DEVSTAMP)
	$(BIN)/python tests/bench/limits_cost.py

# Speed as users feel it (tests/bench/felt.py, docs/speed.md): added latency, the throughput frontier, streams, memory,
# for nginx, the bare relay, the proxy pure and compiled and LiteLLM in one run. wrk and nginx from Debian (installed
# when root), LiteLLM's proxy into its own virtualenv (LITELLM_VENV). ~20 minutes; shorter: FELT_SOAK_SECONDS=60,
# FELT_SMOKE=1 (every duration short), FELT_RELAYS=nginx,bare,pure,compiled,litellm (a subset).
LITELLM_VENV ?= .bench/litellm-venv
bench-felt: $(DEVSTAMP)
	@if ! command -v wrk >/dev/null 2>&1 || ! { command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx >/dev/null; \
	  else echo "bench-felt needs the Debian packages wrk and nginx (apt-get install wrk nginx)"; exit 1; fi; \
	fi
	@test -x $(LITELLM_VENV)/bin/litellm || { $(PYTHON) -m venv $(LITELLM_VENV) \
	  && $(LITELLM_VENV)/bin/python -m pip install -q "litellm[proxy]"; } \
	  || echo "warning: could not install LiteLLM; the bench runs without its row"
	FELT_LITELLM=$(abspath $(LITELLM_VENV))/bin/litellm $(BIN)/python tests/bench/felt.py \
	    $(if $(FELT_RELAYS),--relays $(FELT_RELAYS))

# The harness itself, in its short form (~2 minutes; needs wrk): every figure present, the load not the bottleneck.
test-bench: $(DEVSTAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m bench tests/test_bench_felt.py

# --workers 2 against --workers 1 (tests/bench/workers.py): the load is wrk and the upstream nginx (Debian packages
# `wrk`, `nginx`), C programs that leave the cores to the relays. make bench-workers [COMPILED=1]
bench-workers: $(DEVSTAMP)
	@if ! command -v wrk >/dev/null 2>&1 || ! { command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx >/dev/null; \
	  else echo "bench-workers needs the Debian packages wrk and nginx (apt-get install wrk nginx)"; exit 1; fi; \
	fi
	$(BIN)/python tests/bench/workers.py $(if $(COMPILED),--compiled)

# Instructions per request under valgrind (Debian package valgrind): exact before/after.
# make bench-instructions [REF=COMMIT] [COMPILED=1] [REF_COMPILED=1]
bench-instructions: $(DEVSTAMP)
	$(BIN)/python tests/bench/instructions.py $(if $(REF),--ref $(REF)) $(if $(COMPILED),--compiled) \
	    $(if $(REF_COMPILED),--ref-compiled)

# make soak SECONDS=600 CONCURRENCY=64 DIALECT=deepseek (each optional)
soak: $(DEVSTAMP)
	$(BIN)/python tests/bench/soak.py $(if $(SECONDS),--seconds $(SECONDS)) \
	    $(if $(CONCURRENCY),--concurrency $(CONCURRENCY)) $(if $(DIALECT),--dialect $(DIALECT))

gateway-soak: $(DEVSTAMP)
	$(BIN)/python tests/bench/gateway_soak.py

affinity-bench: $(DEVSTAMP)
	$(BIN)/python tests/bench/affinity.py

clean:
	rm -rf $(VENV) $(HTTPOLICE_VENV) build *.egg-info .pytest_cache .hypothesis

# The README's two commands: `make serve` and `make test`. Both install first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
# Which torch build, installed before the project so nothing else picks one:
#   TORCH=default  pip's own index (PyPI unless pip is configured otherwise). PyPI's Linux
#                  x86_64 wheel is the CUDA build and pulls in its nvidia-* packages (GBs);
#                  on macOS and Windows it is the CPU build.
#   TORCH=cpu      the CPU build from PyTorch's index (download.pytorch.org/whl/cpu): on Linux
#                  torch 2.13.0+cpu, no nvidia-* packages. The right one for the default app.
#   TORCH=cu126    (any cuXYZ) the CUDA XY.Z build from download.pytorch.org/whl/cuXYZ.
# It applies at install: on an existing .venv, `make clean` first.
TORCH ?= default
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX = $(if $(filter default,$(TORCH)),,--index-url https://download.pytorch.org/whl/$(TORCH))
# Ray's Prometheus endpoint for `make serve`: http://127.0.0.1:$(METRICS_PORT)/metrics
METRICS_PORT ?= 8080
export RAY_USAGE_STATS_ENABLED := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install browser redis serve test test-fast lint bench reliability soak clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@case "$(TORCH)" in default|cpu|cu[0-9]*) ;; \
		*) echo "TORCH=$(TORCH): use default, cpu or cuXYZ (e.g. cu126)"; exit 1;; esac
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found; set PYTHON=..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,bench,openvino,onnx]"
	touch $(STAMP)

serve: install
	$(BIN)/python -m deployments.launch --metrics-port $(METRICS_PORT) serve_config.yaml

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy

# The browser tests (/status, /docs, /redoc) drive a real headless browser: Debian's
# chromium, installed here when it is missing and we are root with apt-get (as in CI).
# Otherwise one line says why they will be skipped and how to run them; make test goes on.
browser:
	@if command -v chromium >/dev/null || [ -x "$$TRIBUTARY_CHROMIUM" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; \
	else echo "make: browser tests (/status, /docs, /redoc) will be skipped: chromium is missing and installing it needs root and apt-get; to run them: sudo make browser (Debian/Ubuntu), or TRIBUTARY_CHROMIUM=/path/to/chromium make test"; fi

# The result cache's Redis tests start a real redis-server (Debian's package) on a free
# port: installed here when it is missing and we are root with apt-get, as chromium above.
redis:
	@if command -v redis-server >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q redis-server || { apt-get update -q && apt-get install -y -q redis-server; }; \
	else echo "make: the Redis cache tests will be skipped: redis-server is missing and installing it needs root and apt-get; to run them: sudo make redis (Debian/Ubuntu)"; fi

# The edit-test loop: unit and integration tests on fakes and tiny models built in memory
# (no Ray, no shipped weights, no servers), under a minute. The real parts alone
# (tests/parts: weights, runtimes, HAProxy, Redis) run in `make test`.
test-fast: install
	$(BIN)/python -m pytest tests/unit tests/integration -q -n 2

test: lint browser redis
	$(BIN)/python -m pytest

# The release run of the reliability suite (docs/reliability.md): >= 10,000 fuzzed
# requests and RELIABILITY_OVERLOAD_S seconds at twice capacity (600 for the full run).
# `make test` runs the same tests in their bounded form.
RELIABILITY_OVERLOAD_S ?= 180
reliability: install
	RELIABILITY_FULL=1 RELIABILITY_OVERLOAD_S=$(RELIABILITY_OVERLOAD_S) \
		$(BIN)/python -m pytest tests/reliability -p no:cacheprovider

# Hours, not minutes (docs/reliability.md, "Soak"): the default app with its result cache
# on a Redis of its own, ~1.5x capacity of mixed load for SOAK_MINUTES, a replica killed
# and Redis restarted along the way; per-minute figures and the goals checked at the end.
SOAK_MINUTES ?= 60
soak: install redis
	SOAK_MINUTES=$(SOAK_MINUTES) $(BIN)/python -m tests.reliability.soak

bench: install
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

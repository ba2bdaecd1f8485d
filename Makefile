# The front door. `make run` and `make test` install what they need on first use.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Every transitive dependency of `.[test]`, pinned for Python 3.11 on this platform (`make lock` writes it).
LOCK   := constraints.txt

.PHONY: install lock run test test-unit lint bench-eval bench-quality bench-tune bench-load bench-admission bench-embed bench-scale bench-access bench-chain bench-change-log bench-record clean

install: $(STAMP)

# torch is pinned and installed first: pip then takes the CPU wheel that lies on disk, and never
# resolves a multi-GB CUDA build for sentence-transformers. Everything else comes at the versions in $(LOCK).
$(STAMP): pyproject.toml $(LOCK)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (Sieve needs Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(LOCK) torch==2.13.0
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[test]'
	touch $(STAMP)

# Rewrites $(LOCK) from pyproject.toml with pip-compile (pip-tools, in a venv of its own under target/, so
# the tool never enters the app's environment). Pins already in $(LOCK) stay where pyproject.toml allows
# them; `make lock LOCK_FLAGS=--upgrade` moves every pin to the newest release allowed.
LOCK_FLAGS ?=
lock:
	$(PYTHON) -m venv target/pip-tools
	target/pip-tools/bin/pip install --quiet 'pip-tools>=7.4,<8'
	CUSTOM_COMPILE_COMMAND="make lock" target/pip-tools/bin/pip-compile --quiet $(LOCK_FLAGS) \
		--extra test --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
		--output-file $(LOCK) pyproject.toml

# Where `make run` listens: `make run HOST=0.0.0.0 PORT=8010` wins over RAG__SERVER__HOST / RAG__SERVER__PORT in
# the environment, which win over rag.server in the config file (127.0.0.1:8000). HOST and PORT count only on
# make's command line: zsh and tcsh export HOST as the machine's name, and a PORT in the environment is often
# meant for another program.
given = $(if $(and $(filter command line,$(origin $(1))),$($(1))),$(2) $($(1)))
run: install
	RAG__EVALUATE__ENABLED=true $(strip $(BIN)/sieve serve $(call given,HOST,--host) $(call given,PORT,--port))

# The modules run side by side, one process a core (pytest-xdist; a module's tests stay in one process, so its
# fixtures are made once): `make test TEST_WORKERS=1` runs them one after another.
TEST_WORKERS ?= auto
test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-unit: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/unit

# mypy checks app/ (the [tool.mypy] section of pyproject.toml); tests/ and scripts/ get ruff only.
lint: install
	$(BIN)/ruff check app tests scripts
	$(BIN)/ruff format --check app tests scripts
	$(BIN)/mypy

bench-eval: install
	$(BIN)/python scripts/bench_eval.py

# Quality on the BEIR datasets in ../shared/datasets (SIEVE_DATASETS=DIR elsewhere) -> docs/benchmarks.md.
# The first run embeds SciFact's corpus (about 18 min on 2 idle cores); later runs reuse the store.
bench-quality: install
	$(BIN)/python scripts/bench_quality.py

# The grid the defaults were chosen from, on SciFact's train split -> docs/benchmarks.md.
bench-tune: install
	$(BIN)/python scripts/bench_quality.py --tune

# Query latency idle, during a 300-chunk write, and with 8 concurrent clients -> docs/benchmarks.md.
bench-load: install
	$(BIN)/python scripts/bench_load.py

# A burst of 500 concurrent retrievals with admission on and effectively off: /health and /ready latency,
# answers, RSS (prints the table of docs/benchmarks.md).
bench-admission: install
	$(BIN)/python scripts/bench_admission.py

# Embedding speed: torch threads and batch sizes, ONNX Runtime, and the default ingest against one thread.
bench-embed: install
	$(BIN)/python scripts/bench_embed.py

# Scale: synthetic 100k and 1M chunk collections (kept in target/bench-scale), start-up, writes, query
# time, dense recall, replicas -> docs/benchmarks.md. The first run builds the stores (hours for 1M on 2 cores).
bench-scale: install
	$(BIN)/python scripts/bench_scale.py

# Access scopes: candidate generation unscoped, scoped (a big tenant, the 1% tenant) and tagged, on a
# synthetic 100k-chunk collection (kept in target/bench-access; the first run builds it, minutes on 2 cores),
# HNSW against the vectors held for filtered queries -> docs/benchmarks.md. `parts` times the parts at 1M.
bench-access: install
	$(BIN)/python scripts/bench_access.py

# Chain-only time per query (query vectors given) over the SciFact collection, per part, with a profile.
# An embedded store opens in one process only: RAG__STORE__PATH=<a copy> while a server holds the original.
bench-chain: install
	$(BIN)/python scripts/bench_chain.py --profile

# The change log's catch-up read with a week of entries, and after pruning it to a day.
bench-change-log: install
	$(BIN)/python scripts/bench_change_log.py

# What the document record costs (a one-document write, an ingest, a put on each kind of record) and a rebuild
# from it at 18k and 100k chunks -> docs/benchmarks.md. The SciFact rebuild with the model is the long part.
bench-record: install
	$(BIN)/python scripts/bench_record.py

clean:
	rm -rf $(VENV)
	find target -mindepth 1 ! -name .gitkeep -prune -exec rm -rf {} +

# Benchmarks (bench/README.md). The test suite itself runs with ./scripts/test.sh.
PYTHON ?= .venv/bin/python

.PHONY: bench bench-smoke

# The whole suite against the peers (installs them into bench/.venv-peers on first use; ~30-40 min,
# mostly the 10M-row table generation and the 1M-job RSS drain). Writes bench/results/<stamp>.{jsonl,md}.
bench:
	$(PYTHON) -m pip install --quiet -e '.[bench]'
	$(PYTHON) -m bench $(BENCH_ARGS)

# Seconds-long: Conveyor only, tiny sizes, no network (tests/bench/test_bench_smoke.py runs it in CI).
bench-smoke:
	$(PYTHON) -m bench --smoke $(BENCH_ARGS)

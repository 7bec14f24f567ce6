#!/usr/bin/env bash
# The Conveyor demo on the embedded default (SQLite): enqueue, drain with 2 worker processes, show stats and the DLQ.
source "$(dirname "$0")/_setup.sh"
export CONVEYOR_DATABASE_URL="${CONVEYOR_DATABASE_URL:-sqlite:///demo.db}"
rm -f demo.db demo.db-wal demo.db-shm
echo "== producer"
python -m examples.demo produce
echo "== worker: 2 processes x 10 slots, --burst (drain, retries included, then exit)"
conveyor worker examples.demo:app --processes 2 --concurrency 10 --burst
echo "== stats"
conveyor stats
echo "== dead letters (first 5)"
conveyor dlq list --limit 5
echo "== replay the image dead letters? try: conveyor --db $CONVEYOR_DATABASE_URL dlq replay --all --queue images --reason 'fixed widths'"

"""Conveyor's benchmark suite: ``python -m bench`` (see bench/README.md)."""

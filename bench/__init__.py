"""Benchmarks for kvwatch's speed and memory targets (`make bench`); never run by `make test`."""

"""Benchmarks (`realbench bench NAME --json`): performance targets are measured here, as ratios
or rates taken in one run, never in timed unit tests."""

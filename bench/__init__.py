"""Benchmark tooling for Tributary: load generator, bare-model baseline, text corpus."""

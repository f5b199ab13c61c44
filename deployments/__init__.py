"""Tributary: a Ray Serve application that batches requests for local models."""

"""Pure-Python building blocks: no Ray, no HTTP (tests/unit/test_core_is_pure.py checks)."""

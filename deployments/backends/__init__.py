"""Model code only: load weights, tokenize, run a batch. No Ray, no HTTP."""

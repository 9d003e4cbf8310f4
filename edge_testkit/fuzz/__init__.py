"""Fuzzing through the real server: request generators by endpoint family (`strategies`,
`schemas`, `cases`, `bounds`, `edges`, `extras`, `nested`, `ollama`, `stored`) and
`judge`, the one place that says which answers are failures. Used by
tests/fuzz/test_fuzz.py and, for far longer, by scripts/soak/fuzz.py."""

"""Soaks that a test runs briefly and a script under scripts/soak/ runs for longer."""

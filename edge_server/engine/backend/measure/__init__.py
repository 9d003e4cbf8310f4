"""Measured once on the loaded model: what one decode step costs (it decides lookup
drafting), the thread count that decodes fastest, how fast the model file reads."""

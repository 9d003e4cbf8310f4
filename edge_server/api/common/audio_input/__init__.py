"""Audio in requests: base64 clips and uploaded files decoded, mixed down, resampled and
checked in Python before llama.cpp."""

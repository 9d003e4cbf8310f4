"""Real server processes for tests and scripts: edge_server itself (`process`) and a local
stand-in for the Hugging Face Hub (`local_hub`)."""

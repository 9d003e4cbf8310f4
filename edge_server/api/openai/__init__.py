"""OpenAI's protocol: chat completions, completions, Responses, embeddings and models."""

"""Serving code shared by the generation endpoints: request fields common to every
endpoint (protocol), turning them into engine requests and engine output into answers
(serving), prompt size checks (prompt_bounds), numeric fields held to what the model
and its context can use (model_bounds), logprobs in OpenAI's shapes (logprobs_format),
and image_input/: image decoding (images) and image URLs fetched before preparation
(image_fetch; one fetch in url_fetch, the addresses it may reach in fetch_address).

May import: api.http, the engine's request interface and its grammar package.
Imported by: the endpoint packages (openai/*, anthropic/messages, ollama, llama_server/*).
"""

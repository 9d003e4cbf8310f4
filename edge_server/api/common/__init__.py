"""Serving code shared by the generation endpoints: request fields common to every
endpoint (protocol), those fields as the engine's sampling parameters and budgets
(sampling_fields) and grammars (grammars), running requests on the engine and reading
their output (serving), server-sent events (sse), logprobs in OpenAI's shapes
(logprobs_format), llama-server's fields and names (llama_fields, llama_format),
fill-in-the-middle prompts (fim) and waits on engine jobs (job_wait).
bounds/: what a request may ask for, held to the model before any costly work.
image_input/: image decoding (images) and image URLs fetched before preparation
(image_fetch; one fetch in url_fetch, the addresses it may reach in fetch_address).

May import: api.http, the engine's request interface and its grammar package.
Imported by: the endpoint packages (openai/*, anthropic/messages, ollama, llama_server/*).
"""

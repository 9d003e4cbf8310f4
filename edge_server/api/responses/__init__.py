"""POST /v1/responses: OpenAI's Responses API, stateless, over the chat serving path."""

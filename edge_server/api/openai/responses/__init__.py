"""/v1/responses: OpenAI's Responses API over the chat serving path, with stored responses
(store.py) that later turns continue by previous_response_id (continuation.py)."""

"""LangChain's Ollama integration (langchain-ollama: ChatOllama, OllamaEmbeddings) against
the server's /api/* routes, on the real default model."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_MODEL, RunningServer
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_ollama import ChatOllama, OllamaEmbeddings
from pydantic import BaseModel, Field


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int


def _chat(server: RunningServer, **kwargs: object) -> ChatOllama:
    return ChatOllama(base_url=server.base_url, model=DEFAULT_MODEL, **kwargs)  # type: ignore[arg-type]


def test_invoke_and_stream(server: RunningServer) -> None:
    llm = _chat(server, num_predict=8, temperature=0)
    reply = llm.invoke([SystemMessage("Be brief."), HumanMessage("Name a colour.")])
    assert isinstance(reply, AIMessage) and reply.content
    usage = reply.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 8
    assert reply.response_metadata["done_reason"] in ("stop", "length")
    chunks = list(llm.stream("Name a colour."))
    assert "".join(str(c.content) for c in chunks)
    reasons = [c.response_metadata.get("done_reason") for c in chunks]
    assert [r for r in reasons if r] in (["stop"], ["length"])  # once, at the end


def test_seeded_sampling_repeats(server: RunningServer) -> None:
    llm = _chat(server, num_predict=10, temperature=1.0, seed=5, top_k=40, top_p=0.9)
    texts = [llm.invoke("Tell me a fact.").content for _ in range(3)]
    assert texts[1] == texts[2]  # the first only warms the prompt's KV


def test_structured_output_through_format(server: RunningServer) -> None:
    llm = _chat(server, num_predict=60, temperature=0)
    person = llm.with_structured_output(Person, method="json_schema").invoke(
        "Describe a person as JSON.")
    assert isinstance(person, Person) and len(person.name) <= 12


def test_tools_come_back_as_tool_calls(server: RunningServer) -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = _chat(server, num_predict=60, temperature=0).bind_tools([add])
    history = [
        HumanMessage("Add 2 and 3."),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 3}, "id": "c1"}]),
        ToolMessage("5", tool_call_id="c1", name="add"),
        AIMessage("5"),
        HumanMessage("Add 4 and 7."),
    ]
    reply = llm.invoke(history)
    assert reply.content or reply.tool_calls
    for call in reply.tool_calls:
        assert call["name"] == "add" and isinstance(call["args"], dict)


def test_embeddings(server: RunningServer) -> None:
    embedder = OllamaEmbeddings(base_url=server.base_url, model=DEFAULT_MODEL)
    vectors = embedder.embed_documents(["first", "second"])
    assert len(vectors) == 2 and len(vectors[0]) == 576
    assert len(embedder.embed_query("first")) == 576


def test_unknown_model_is_an_error(server: RunningServer) -> None:
    import ollama

    with pytest.raises(ollama.ResponseError) as missing:
        ChatOllama(base_url=server.base_url, model="llama3.2").invoke("Hi")
    assert missing.value.status_code == 404

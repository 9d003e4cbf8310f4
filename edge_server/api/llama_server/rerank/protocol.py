"""Schemas of POST /v1/rerank (and /rerank, /v1/reranking, /reranking): llama-server's
rerank API, which takes Jina's and Cohere's request shape (`query`, `documents`,
`top_n`, `return_documents`), and TEI's (`texts`, `return_text`) answered as a bare list."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edge_server.catalogue.default_model import DEFAULT_ALIAS

MAX_RERANK_DOCUMENTS = 1000  # documents of one request (Cohere's limit)


class TextDocument(BaseModel):
    """A document as an object (Jina's and Cohere's other form); how results echo it."""

    text: str


Document = str | TextDocument


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = DEFAULT_ALIAS  # optional, as llama-server has it: the default model
    query: str
    # One of the two is required (checked when served, naming the field).
    documents: list[Document] | None = Field(default=None, min_length=1,
                                             max_length=MAX_RERANK_DOCUMENTS)
    texts: list[str] | None = Field(default=None, min_length=1,
                                    max_length=MAX_RERANK_DOCUMENTS)  # TEI
    top_n: int | None = Field(default=None, ge=1)  # the best n; default: every document
    return_documents: bool = False
    return_text: bool = False  # TEI's return_documents

    @property
    def tei(self) -> bool:
        """TEI's shape: `texts` in, a bare list of {index, score} out."""
        return self.texts is not None

    @property
    def document_texts(self) -> list[str]:
        if self.texts is not None:
            return self.texts
        assert self.documents is not None
        return [d if isinstance(d, str) else d.text for d in self.documents]

    @property
    def documents_param(self) -> str:
        return "texts" if self.tei else "documents"


class RerankResult(BaseModel):
    index: int  # the document's place in the request
    relevance_score: float  # the classifier's raw score, as llama-server gives it
    document: TextDocument | None = None  # with return_documents


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    model: str
    results: list[RerankResult]  # best first, at most top_n
    usage: RerankUsage


class TeiRank(BaseModel):
    """One item of TEI's answer (a bare list, best first)."""

    index: int
    score: float
    text: str | None = None  # with return_text

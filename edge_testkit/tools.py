"""Tool-calling material several suites send (chat tools, the Responses API, chained
clients): a small function with bounded integer arguments and a pydantic model with an
Enum field, a nested model and a bounded string."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

ADD: dict[str, Any] = {
    "name": "add",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["a", "b"],
    },
}


class Color(Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Point(BaseModel):
    x: int = Field(ge=0, le=100)
    y: int = Field(ge=0, le=100)


class Paint(BaseModel):
    color: Color
    at: Point
    label: str = Field(max_length=12)

"""What names one inference engine deployment and how a prompt is sent to it: values every adapter here takes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["PromptForm", "Target"]


class PromptForm(str, Enum):
    """How requests send a prompt's head: as the head of a completion prompt, or as the system message of a chat."""

    COMPLETION = "completion"
    CHAT = "chat"


@dataclass(frozen=True)
class Target:
    """One vLLM deployment: its OpenAI-compatible base URL (without ``/v1``) and served model name."""

    base_url: str
    model: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

"""A strands-agents agent on the strands-vllm provider, one `@tool`, against a live server.

Run by tests/e2e/test_clients.py in the strands virtualenv: `python strands_agent.py BASE_URL
MODEL`. Prints one JSON line: the tool calls the agent ran, the ids the provider captured per
model call (strands-vllm's `VLLMTokenRecorder`), and the agent's last text.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from strands import Agent, tool
from strands_vllm import VLLMModel, VLLMTokenRecorder

CALLS: list[str] = []


@tool
def get_weather(city: str) -> str:
    """The current weather of a city.

    Args:
        city: The city's name.
    """
    CALLS.append(city)
    return f"sunny and 21 C in {city}"


class FirstTurnCalls(VLLMModel):
    """The agent's first model call must use the tool (strands' own `{"any": {}}` choice, sent
    as OpenAI's "required"); later calls choose freely (a 135M model rarely calls unasked)."""

    def stream(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, *,
               tool_choice: Any = None, **kwargs: Any) -> Any:
        answered = any("toolResult" in block for m in messages for block in m["content"])
        if not answered and tool_specs:
            tool_choice = {"any": {}}
        return super().stream(messages, tool_specs, system_prompt, tool_choice=tool_choice,
                              **kwargs)


def main() -> None:
    base_url, model_id = sys.argv[1], sys.argv[2]
    model = FirstTurnCalls(base_url=base_url, model_id=model_id, return_token_ids=True,
                           params={"temperature": 0, "max_tokens": 160})
    recorder = VLLMTokenRecorder(add_to_span=False)
    agent = Agent(model=model, tools=[get_weather], callback_handler=recorder,
                  system_prompt="You are a weather assistant. Use the tools.")
    result = agent("What is the weather in Paris?")
    print(json.dumps({"calls": CALLS, "history": recorder.history, "text": str(result)}))


if __name__ == "__main__":
    main()

"""A two-turn rollout with verifiers' TrainClient, which renders the chat locally with the
model's Hugging Face tokenizer and calls vLLM's /inference/v1/generate. Run with the verifiers
virtualenv (`make test` builds it; verifiers pins openai<3, so it cannot share ours):

    python tests/clients/verifiers_rollout.py BASE_URL TOKENIZER_DIR MODEL

Prints one JSON line per turn: the ids TrainClient sent and got, and what it made of them."""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from renderers import DefaultRendererConfig  # noqa: E402
from verifiers.v1.clients.train import TrainClient  # noqa: E402
from verifiers.v1.configs.client import TrainClientConfig  # noqa: E402
from verifiers.v1.dialects import ChatDialect  # noqa: E402
from verifiers.v1.types import SamplingConfig  # noqa: E402


async def main(base_url: str, tokenizer_dir: str, model: str) -> None:
    client = TrainClient(TrainClientConfig(base_url=base_url, renderer=DefaultRendererConfig(),
                                           renderer_model_name=tokenizer_dir))
    messages: list[dict[str, str]] = []
    try:
        for question in ["What is 2 + 2?", "Now add 3 to that."]:
            messages.append({"role": "user", "content": question})
            r = await client.get_response(ChatDialect(), {"model": model, "messages": messages},
                                          SamplingConfig(temperature=0.0, max_tokens=24),
                                          session_id="rollout-1")
            content = r.message.content or ""
            print(json.dumps({"messages": list(messages), "prompt_ids": r.tokens.prompt_ids,
                              "completion_ids": r.tokens.completion_ids,
                              "completion_logprobs": r.tokens.completion_logprobs,
                              "finish_reason": r.finish_reason, "content": content}),
                  flush=True)
            messages.append({"role": "assistant", "content": content})
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

"""Writes records through SQLiteStore as fast as it can, printing each id once its put has
returned (acknowledged), until it is killed. Run by test_crash.py: `python crash_writer.py PATH`.
"""

from __future__ import annotations

import asyncio
import sys

from tokenwire.storage import Document, SQLiteStore, StoredCompletion

VOCAB = 49_152


def prompt_of(i: int) -> list[int]:
    """What record i holds: checkable after the crash without any other record."""
    return [(i * 7919 + k) % VOCAB for k in range(500 + i % 64)]


async def writer(store: SQLiteStore, lane: int, lanes: int) -> None:
    i = lane
    while True:
        if i % 5 == 4:
            await store.put_document(Document(f"doc-{i}", "crash", "tv", prompt_of(i), i, VOCAB))
            print(f"doc-{i}", flush=True)
        else:
            await store.put_completion(StoredCompletion(
                id=f"c-{i}", owner="crash", model="m", created=i, tokenizer_version="tv",
                template_version=None, prompt_ids=prompt_of(i), vocab_size=VOCAB,
                request={"i": i, "pad": "x" * (i % 300)}, response={"i": i},
                metadata={"i": str(i)}))
            print(f"c-{i}", flush=True)
        i += lanes


async def main(path: str) -> None:
    store = SQLiteStore(path)
    lanes = 4  # several puts in flight at once, so the kill lands mid-burst
    await asyncio.gather(*(writer(store, lane, lanes) for lane in range(lanes)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

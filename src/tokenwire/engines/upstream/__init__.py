"""What every upstream engine shares: replicas, health, routing, admission with fail-over, and
reading a streamed response into engine events.

An upstream engine is a transport to one or more HTTP servers that run the model (vLLM,
SGLang, llama-server, an OpenAI-compatible text server). Its protocol module (vllm.py,
sglang.py, llama_server.py, openai.py) subclasses `UpstreamEngine` and says only how that server
spells a request, a chunk and an error: the methods `describe`, `tokenize`, `request`,
`decoder` and `protocol_error` (engine.py). This package does the rest:

- start: wait for a first replica, learn its model and context length, check its tokenizer
  against the pinned one on the probe corpus (a mismatch refuses to start, naming the string);
- admission: try the replicas in the router's order; a connection failure, a 5xx, a 429 or a
  stream that ends before its first event moves on to the next replica. Nothing has reached the
  client yet, so fail-over is safe; after the first event it never happens;
- streaming: upstreams are always asked to stream, so a closed client closes the upstream
  response (the upstream aborts the request) and one code path serves both response kinds;
- health: a background task checks every replica; a replica that fails a request is marked
  down at once and comes back when its health check passes (a new replica is verified first).

Transport errors become `ServiceUnavailableError` at the boundary (`raise ... from`), in
engine.py and stream.py; error bodies become our tree in errors.py.

One job a module:
  engine.py     `UpstreamEngine`: the protocol module's contract, start and close, admission
                with fail-over
  replica.py    `Replica`, `UpstreamInfo`: one replica's state
  health.py     the background health checks, and verifying a replica before its first use
  stream.py     `ChunkDecoder`, and reading one response into engine events
  transport.py  the aiohttp session and the helper requests (why aiohttp: its docstring)
  errors.py     `upstream_error`: an upstream's error body in our tree
  grammar.py    grammars in the upstreams' terms: the schema keywords a backend would
                drop, refused by name (`structural_tag`: engines/grammars/xgrammar.py)
  gbnf.py       tool calls as GBNF, for llama-server
"""

from .engine import UpstreamEngine
from .error_body import upstream_error
from .replica import Replica, UpstreamInfo
from .stream import ChunkDecoder
from .transport import UpstreamStatusError

__all__ = ["ChunkDecoder", "Replica", "UpstreamEngine", "UpstreamInfo", "UpstreamStatusError",
           "upstream_error"]

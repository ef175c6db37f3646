"""A request's `Grammar` (engines/base.py) compiled for each engine, in one place: the request
side (what a client's `response_format`, tools and `structured_outputs` become) stays in
serving/structured.py.

- guide.py: the embedded engine's, by llguidance into a token mask a step at a time (with
  _unique.py, the tool names' unique prefixes);
- xgrammar.py: tagged spans as xgrammar's `structural_tag`, what vLLM and SGLang compile;
- upstream.py: a JSON schema and the keywords each upstream's backend would drop, checked;
- gbnf.py: tagged spans as GBNF, for llama-server.
"""

"""Framework integrations (ADR 0010's integrations floor; ADR 0019): each signs at the point where a
framework's agents emit bytes, through the client package, and checks with a
:class:`countersign.client.Consumer` (ADR 0034). Each needs its own extra
(``countersign-mesh[langgraph]``, ``[mcp]``, ``[a2a]``, ``[openai-agents]``), which brings the client SDK
too. They import the core and the client, never the daemons or their plumbing, and import their framework
lazily with an error that names the extra. What they share is one module, :mod:`.kit` (ADR 0037); adding
one: docs/extending.md."""

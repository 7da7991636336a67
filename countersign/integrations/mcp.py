"""MCP: sign every tool result where the tool server emits it, and check it where a client reads it.

Server side. :class:`SigningMiddleware` is an ``mcp`` 2.x server middleware (``MCPServer(...,
middleware=[...])`` or ``server.middleware.append(...)``; the low-level ``Server`` too) over the
deployer's :class:`countersign.client.AsyncRuntime`::

    runtime = AsyncRuntime.from_env()                      # COUNTERSIGN_SIGNER, _DEPLOYER, _CLIENT_*
    server = MCPServer("weather", middleware=[SigningMiddleware(runtime, system="weather-tools")])
    # or: sign_server(server, runtime, system="weather-tools")  -> the middleware it appended

Every ``tools/call`` result (``isError`` ones included) is signed as a ``per_tool_call`` receipt
before it leaves the server: the signed bytes are :func:`result_bytes` of the result exactly as sent
(RFC 8785 JSON of ``{"content", "isError", "structuredContent"}``, null members of content blocks
omitted; docs/spec.md "MCP binding", ADR 0023). Each client session (one MCP connection: a stdio
process, a Streamable HTTP session) is one agent and one Countersign session: its first tool call
obtains the agent record (a root of ``system``, or, when the request's ``_meta`` carries a
``Delegation`` string under :data:`DELEGATION_KEY`, the co-signed child record accepting it), and its
tool results are receipts ``seq`` 0, 1, 2, ... chained in the order the signer signed them. The
evidence, the receipt path (agent path + receipt), goes in the result's ``_meta`` under
:data:`EVIDENCE_KEY` as ``{"v": 1, "path": <path JSON>}``.

A refusal fails closed: no unsigned result leaves. The client gets a JSON-RPC error with code
:data:`REFUSAL_CODE` and ``data`` ``{"countersign.dev/error": "<ErrorCode>"}`` (a signer that refuses
or cannot be reached, a delegation for another deployer, expired, or refused by the parent's signer).

Client side, over results as ``ClientSession.call_tool`` returns them (``CallToolResult``) or as
raw JSON objects:

    verdict = await averify_result(result, registry=registry)   # or verifier="host:port"; verify_result sync
    verdict.emitter.deployer, verdict.emitter.seq                # who emitted these bytes, where in the session
    check = check_results([r1, r2, r3], registry=registry)       # dropped / reordered / duplicated results
    meta = delegation_meta(handoff)                              # call_tool(..., meta=meta) on the first call
    refusal(mcp_error)                                           # the ServiceError a refusal carried, else None

:func:`evidence_of` extracts the path (raises :class:`EvidenceMissing`, a ServiceError with
``INVALID_ARGUMENT``, when there is none or it does not parse). A rejected result is a verdict, not an
error (``verdict.reason``: ``OUTPUT_MISMATCH`` for a tampered result).

Wrapping an existing server unchanged: ``countersign mcp-proxy -- COMMAND ARGS...`` runs
:func:`run_stdio_proxy`, a newline-delimited JSON-RPC relay between its own stdio and the child's that
signs every ``tools/call`` result the child sends back (one session per proxy process: one stdio
client) and passes everything else through byte for byte. Configured by the runtime SDK's environment
variables (:meth:`countersign.client.AsyncRuntime.from_env`) plus ``COUNTERSIGN_MCP_SYSTEM``.

Needs the ``mcp`` extra (``pip install 'countersign[mcp]'``); ``mcp`` is imported only when a
middleware is built or a result is read as a model (:func:`require_mcp`).
"""

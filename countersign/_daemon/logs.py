"""Structured logs: one JSON object per line on stderr. Never log keys, signatures' secrets or outputs."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, daemon: str) -> None:
        super().__init__()
        self.daemon = daemon

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "daemon": self.daemon,
            "logger": record.name,
            "event": record.getMessage(),
        }
        body.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def setup_logging(daemon: str, level: str) -> logging.handlers.QueueListener:
    """Log JSON lines to stderr from a background thread: a request thread only queues its record, so
    formatting and the write stay off the request path. Stop the returned listener to flush."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(daemon))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    root = logging.getLogger()
    root.handlers[:] = [_QueueHandler(records)]
    root.setLevel(level.upper())
    listener.start()
    atexit.register(stop_logging, listener)  # also on an exit that does not reach the daemon's own stop
    return listener


class _QueueHandler(logging.handlers.QueueHandler):
    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The listener's formatter needs the original record (its ``extra`` fields and exc_info);
        # the stock QueueHandler would pre-format it and drop both. Only resolve the message now,
        # while its arguments are still what they were when logged.
        record.msg, record.args = record.getMessage(), None
        return record


def stop_logging(listener: logging.handlers.QueueListener) -> None:
    """Write out what is queued and stop the logging thread (once; later calls do nothing)."""
    if listener._thread is not None:
        listener.stop()

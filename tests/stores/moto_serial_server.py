"""Run moto's DynamoDB emulator in server mode with requests applied one at a time.

moto applies a request without any lock, so two concurrent TransactWriteItems can interleave inside
the emulator and both pass their conditions: that is moto's limitation, not DynamoDB's, which
documents conditional writes and transactions as serialisable. Serialising whole requests gives the
emulator exactly that guarantee (each request atomic, any interleaving BETWEEN requests), which is
what the store's own logic must be correct against. Usage: ``python moto_serial_server.py PORT``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


def main() -> None:
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serial(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    run_simple("127.0.0.1", port, serial, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()

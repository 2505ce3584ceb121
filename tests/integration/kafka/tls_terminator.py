"""A TLS terminator in front of a broker: TLS with client certificates outside, plain inside.

It plays a broker's TLS listener (``ssl.client.auth=required``) for a broker that has none, the
way a TLS sidecar or load balancer does. Blocking sockets in threads on purpose: OpenSSL then
writes its alert ("unknown ca", "certificate required") to the client before closing, as a real
TLS listener does, where asyncio's TLS server would close without one. Bounded: it only ever
talks to 127.0.0.1 and stops with :meth:`close`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading

from scripts import services


class TlsTerminator:
    def __init__(self, target_port: int, context: ssl.SSLContext) -> None:
        self.target_port = target_port
        self.port = services.free_port()
        self.context = context
        self.refused = 0  # handshakes that failed: clients whose certificate was rejected
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open: set[socket.socket] = set()
        self._closed = False

    def start(self) -> TlsTerminator:
        threading.Thread(target=self._accept_loop, daemon=True, name="tls-terminator").start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(10)
        try:
            tls = self.context.wrap_socket(client, server_side=True)
        except (OSError, ssl.SSLError):
            self.refused += 1
            client.close()
            return
        tls.settimeout(None)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            tls.close()
            return
        self._open.update((tls, upstream))
        threading.Thread(target=self._pipe, args=(upstream, tls), daemon=True).start()
        self._pipe(tls, upstream)

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                self._open.discard(end)
                with contextlib.suppress(OSError):
                    end.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for end in list(self._open):
            with contextlib.suppress(OSError):
                end.close()

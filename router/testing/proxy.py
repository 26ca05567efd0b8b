"""A loopback TCP proxy in front of a real server that can cut the connection carrying a chosen command.

It forwards bytes untouched; ``cut_next(b"insert", n)`` makes it close, without
forwarding, the next *n* client messages that contain that command name: the
driver sees a network error mid-operation, as with a real network blip.
"""

from __future__ import annotations

import socket
import threading


class BlipProxy:
    """Listens on 127.0.0.1:<port> and forwards to 127.0.0.1:<target>."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._cut: dict[bytes, int] = {}
        self._cut_reply: dict[bytes, int] = {}
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}"

    def cut_next(self, marker: bytes, times: int = 1) -> None:
        """Drop the connection on the next *times* client messages containing *marker*."""
        with self._lock:
            self._cut[marker] = times

    def cut_reply_next(self, marker: bytes, times: int = 1) -> None:
        """Forward the next *times* messages containing *marker*, then cut the connection before the reply."""
        with self._lock:
            self._cut_reply[marker] = times

    def _take(self, table: dict[bytes, int], data: bytes) -> bool:
        """Use up one planned cut from *table* if *data* carries one of its markers."""
        with self._lock:
            for marker, left in table.items():
                if left and marker in data:
                    table[marker] = left - 1
                    self.cuts += 1
                    return True
        return False

    def _should_cut(self, data: bytes) -> bool:
        return self._take(self._cut, data)

    def _should_cut_reply(self, data: bytes) -> bool:
        return self._take(self._cut_reply, data)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            doomed = threading.Event()  # the request went through; its reply must not
            threading.Thread(target=self._pump, args=(client, upstream, True, doomed), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False, doomed), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool, doomed: threading.Event) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_client and self._should_cut(data):
                    break
                if not from_client and doomed.is_set():
                    break
                if from_client and self._should_cut_reply(data):
                    doomed.set()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

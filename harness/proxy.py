"""Loopback TCP proxies in front of a real server, for testing what the router does when the wire misbehaves.

* :class:`BlipProxy` forwards bytes untouched; ``cut_next(b"insert", n)`` makes it close,
  without forwarding, the next *n* client messages that contain that command name: the
  driver sees a network error mid-operation, as with a real network blip.
* :class:`LegacyHelloProxy` makes the server look older than MongoDB 4.4 (no ``hello``).
"""

from __future__ import annotations

import socket
import threading

import bson


class _Proxy:
    """Listens on 127.0.0.1:<port>; each connection accepted is paired with one to 127.0.0.1:<target>."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False

    def _start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}"

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
            self._pair(client, upstream)

    def _pair(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


class BlipProxy(_Proxy):
    """Forwards bytes untouched, except the messages it was told to cut."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self._lock = threading.Lock()
        self._cut: dict[bytes, int] = {}
        self._cut_reply: dict[bytes, int] = {}
        self.cuts = 0
        self._start()

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

    def _pair(self, client: socket.socket, upstream: socket.socket) -> None:
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
            self._close(src, dst)


class LegacyHelloProxy(_Proxy):
    """A loopback proxy that makes a real server look older than MongoDB 4.4: it does not know ``hello``.

    Like mongo-java-server and other MongoDB-wire servers: a ``hello`` command gets
    ``CommandNotFound`` (code 59) back, and ``helloOk`` is removed from every reply, so the
    driver keeps using ``isMaster`` for its own handshakes and monitoring. Everything else
    is forwarded untouched, message by message.
    """

    _OP_REPLY, _OP_MSG = 1, 2013

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.refused = 0
        self._start()

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def _pair(self, client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=self._from_client, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._from_server, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _read(sock: socket.socket) -> bytes | None:
        header = b""
        while len(header) < 4:
            chunk = sock.recv(4 - len(header))
            if not chunk:
                return None
            header += chunk
        length = int.from_bytes(header, "little")
        body = header
        while len(body) < length:
            chunk = sock.recv(length - len(body))
            if not chunk:
                return None
            body += chunk
        return body

    def _from_client(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while (message := self._read(src)) is not None:
                request_id = int.from_bytes(message[4:8], "little")
                opcode = int.from_bytes(message[12:16], "little")
                if opcode == self._OP_MSG and message[20] == 0:
                    command = bson.decode(message[21 : 21 + int.from_bytes(message[21:25], "little")])
                    if next(iter(command), "") == "hello":
                        self.refused += 1
                        reply = bson.encode({"ok": 0.0, "errmsg": "no such command: 'hello'", "code": 59,
                                             "codeName": "CommandNotFound"})
                        body = (0).to_bytes(4, "little") + b"\x00" + reply
                        header = (16 + len(body)).to_bytes(4, "little") + (0).to_bytes(4, "little") + \
                            request_id.to_bytes(4, "little") + self._OP_MSG.to_bytes(4, "little")
                        src.sendall(header + body)
                        continue
                dst.sendall(message)
        except OSError:
            pass
        finally:
            self._close(src, dst)

    def _from_server(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while (message := self._read(src)) is not None:
                dst.sendall(self._without_hello_ok(message))
        except OSError:
            pass
        finally:
            self._close(src, dst)

    def _without_hello_ok(self, message: bytes) -> bytes:
        opcode = int.from_bytes(message[12:16], "little")
        if opcode == self._OP_MSG and message[20] == 0:
            start = 21
        elif opcode == self._OP_REPLY:
            start = 36
        else:
            return message
        size = int.from_bytes(message[start : start + 4], "little")
        doc = bson.decode(message[start : start + size])
        if "helloOk" not in doc:
            return message
        del doc["helloOk"]
        encoded = bson.encode(doc)
        rebuilt = message[4:start] + encoded + message[start + size :]
        return (len(rebuilt) + 4).to_bytes(4, "little") + rebuilt


class CutProxy(_Proxy):
    """Forwards bytes untouched until :meth:`cut`: then every connection through it is closed and new ones are closed at
    once, until :meth:`restore`. What a network partition between one client and its server looks like (the
    server itself stays up for everyone else).

    Example::

        proxy = CutProxy(redis.port)          # then give clients redis://127.0.0.1:{proxy.port}/0
        proxy.cut(); ...; proxy.restore()
    """

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.is_cut = False
        self._start()

    def cut(self) -> None:
        with self._lock:
            self.is_cut = True
            socks, self._open = self._open, []
        self._close(*socks)

    def restore(self) -> None:
        with self._lock:
            self.is_cut = False

    def _pair(self, client: socket.socket, upstream: socket.socket) -> None:
        with self._lock:
            if self.is_cut:
                self._close(client, upstream)
                return
            self._open += [client, upstream]
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        self._close(src, dst)

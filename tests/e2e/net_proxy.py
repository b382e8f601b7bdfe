"""A TCP proxy on loopback that can stop forwarding, as a network that drops does.

While paused it accepts no connection and moves no byte in either direction: what the
client sends waits in the kernel's buffers, and the client sees its requests hang, as on a
link that went dark (not one that refuses). Resumed, it forwards everything that waited."""

import socket
import threading
import time


class PausableProxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.running = threading.Event()
        self.running.set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self):
        self.running.clear()

    def resume(self):
        self.running.set()

    def close(self):
        self.closed = True
        self.running.set()
        self.listener.close()

    def _accept(self):
        while not self.closed:
            self.running.wait()
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _send(self, dst: socket.socket, data: bytes):
        # The sockets carry a short timeout for the pumps' polling: a slow reader is waited for.
        view = memoryview(data)
        while view:
            try:
                view = view[dst.send(view):]
            except socket.timeout:
                if self.closed:
                    raise

    def _pump(self, src: socket.socket, dst: socket.socket):
        src.settimeout(0.1)
        try:
            while not self.closed:
                if not self.running.is_set():
                    time.sleep(0.05)
                    continue
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                self.running.wait()
                self._send(dst, data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

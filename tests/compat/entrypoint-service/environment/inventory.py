"""A small inventory service: GET /items, and a key-value store under /kv/<key> (GET, PUT)."""

import http.server
import json
import sys
import threading

PORT, ITEMS = int(sys.argv[1]), sys.argv[2]
STORE = {}
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/items":
            with open(ITEMS) as handle:
                return self.reply(200, handle.read())
        if self.path.startswith("/kv/"):
            with LOCK:
                value = STORE.get(self.path[4:])
            if value is None:
                return self.reply(404, "no such key\n", "text/plain")
            return self.reply(200, value, "text/plain")
        self.reply(404, json.dumps({"error": "not found"}))

    def do_PUT(self):
        if not self.path.startswith("/kv/") or len(self.path) == 4:
            return self.reply(404, json.dumps({"error": "not found"}))
        length = int(self.headers.get("Content-Length") or 0)
        with LOCK:
            STORE[self.path[4:]] = self.rfile.read(length).decode()
        self.reply(204, "")

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()

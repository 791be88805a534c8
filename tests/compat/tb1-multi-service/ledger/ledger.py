"""The ledger: POST a JSON list to /reorders; GET /reorders lists every POST received."""

import http.server
import json
import os
import threading

NAME = os.environ["LEDGER_NAME"]
ENTRIES = []
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != f"/{NAME}":
            return self.reply(404, {"error": "not found"})
        with LOCK:
            self.reply(200, ENTRIES)

    def do_POST(self):
        if self.path != f"/{NAME}":
            return self.reply(404, {"error": "not found"})
        try:
            entry = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError:
            return self.reply(400, {"error": "not JSON"})
        with LOCK:
            ENTRIES.append(entry)
        self.reply(201, entry)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", 7100), Handler).serve_forever()

"""The inventory: GET /stock."""

import http.server
import sys

with open("/opt/stock.json", "rb") as handle:
    STOCK = handle.read()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code, body = (200, STOCK) if self.path == "/stock" else (404, b"{}")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[2])), Handler).serve_forever()

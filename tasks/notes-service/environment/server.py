"""The notes service: GET /health and GET /notes, configured by /etc/notes/notes.ini."""
import configparser
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

config = configparser.ConfigParser()
if not config.read("/etc/notes/notes.ini"):
    sys.exit("notes: cannot read /etc/notes/notes.ini")
HOST = config.get("server", "host")
PORT = config.getint("server", "port")
NOTES = Path(config.get("storage", "dir"))
if not NOTES.is_dir():
    sys.exit(f"notes: storage dir {NOTES} does not exist")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            self.reply(200, "text/plain", b"ok\n")
        elif self.path == "/notes":
            titles = sorted(p.stem for p in NOTES.glob("*.txt"))
            self.reply(200, "application/json", json.dumps(titles).encode())
        else:
            self.reply(404, "text/plain", b"not found\n")

    def reply(self, status, kind, body):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer((HOST, PORT), Handler).serve_forever()

"""The bookshop's catalogue: one HTML page of books, and /health for the compose health check."""

import html
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOOKS = json.load(open("books.json", encoding="utf-8"))
ROW = (
    '<div class="book"><h2 class="title">{title}</h2><p>by <span class="author">{author}</span>, '
    '<span class="year">{year}</span></p><p class="price">${price}</p></div>'
)
PAGE = "<!doctype html><html><head><meta charset='utf-8'><title>Books</title></head><body><h1>Catalogue</h1>{rows}</body></html>"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            body = b"ok"
        elif self.path == "/":
            rows = "".join(ROW.format(**{k: html.escape(str(v)) for k, v in book.items()}) for book in BOOKS)
            body = PAGE.format(rows=rows).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()

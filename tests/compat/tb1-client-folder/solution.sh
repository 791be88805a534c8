#!/bin/bash
set -euo pipefail
cat > scraper.py <<'PY'  # relative: in the client image's WORKDIR, /app
import csv
import urllib.request
from html.parser import HTMLParser

FIELDS = ("title", "author", "year", "price")


class Books(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.field = [], None

    def handle_starttag(self, tag, attrs):
        css = dict(attrs).get("class")
        if css == "book":
            self.rows.append({})
        elif css in FIELDS:
            self.field = css

    def handle_data(self, data):
        if self.field:
            self.rows[-1][self.field] = data.strip().lstrip("$")
            self.field = None


page = urllib.request.urlopen("http://server:8000/", timeout=10).read().decode("utf-8")
parser = Books()
parser.feed(page)
with open("books.csv", "w", newline="", encoding="utf-8") as out:
    writer = csv.DictWriter(out, FIELDS)
    writer.writeheader()
    writer.writerows(parser.rows)
PY
python3 scraper.py

import json
import time
import urllib.request


def get(path, attempts=6):
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:8080{path}", timeout=3) as response:
                return response.status, response.read().decode()
        except OSError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)


def test_listening_and_healthy():
    assert get("/health") == (200, "ok\n")


def test_lists_notes():
    status, body = get("/notes")
    assert status == 200
    assert json.loads(body) == ["groceries", "todo"]

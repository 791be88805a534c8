from pathlib import Path

WWW = Path("/srv/www")


def test_index_at_top():
    assert (WWW / "index.html").read_text() == "<html><body>Welcome back</body></html>\n"


def test_rest_of_site_beside_it():
    assert (WWW / "about.html").read_text() == "About us\n"
    assert (WWW / "assets" / "style.css").read_text() == "h1 { color: teal; }\n"

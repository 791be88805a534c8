import csv
from pathlib import Path

EXPECTED = [
    {"title": "The Quiet Compiler", "author": "Ada Brandt", "year": "2019", "price": "12.50"},
    {"title": "Shells by the Sea", "author": "Tomás Ortega", "year": "2021", "price": "8.99"},
    {"title": "Pipes, Plainly", "author": "Mei Lin", "year": "2017", "price": "15.00"},
    {"title": "A Grep in Time", "author": "Olu Adeyemi", "year": "2023", "price": "21.75"},
]


def test_scraper_exists():
    assert Path("/app/scraper.py").is_file()


def test_books_csv_lists_every_book_in_page_order():
    with open("/app/books.csv", newline="", encoding="utf-8") as found:
        reader = csv.DictReader(found)
        assert reader.fieldnames == ["title", "author", "year", "price"]
        assert list(reader) == EXPECTED

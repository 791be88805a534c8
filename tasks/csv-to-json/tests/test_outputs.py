import json
from pathlib import Path

EXPECTED = [
    {"id": 1, "name": "Ada Lovelace", "title": "Engineer, Principal", "age": 36, "salary": 185000.5, "remote": True},
    {"id": 2, "name": "O'Brien, Pat", "title": "Analyst", "age": 29, "salary": 72000, "remote": False},
    {"id": 3, "name": "Grace Hopper", "title": 'Rear Admiral "Amazing Grace"', "age": 85, "salary": None, "remote": True},
    {"id": 4, "name": "Linus", "title": None, "age": 27, "salary": 99000, "remote": False},
    {"id": 5, "name": "Zhang, Wei", "title": "Manager, Platform", "age": None, "salary": 120500.75, "remote": True},
]


def load():
    return json.loads(Path("/app/employees.json").read_text())


def test_rows_and_values():
    assert load() == EXPECTED


def test_types_are_exact():
    for row in load():
        assert isinstance(row["remote"], bool)
        assert row["id"] is not True and isinstance(row["id"], int)
        assert row["age"] is None or (isinstance(row["age"], int) and not isinstance(row["age"], bool))
        assert row["salary"] is None or isinstance(row["salary"], (int, float))

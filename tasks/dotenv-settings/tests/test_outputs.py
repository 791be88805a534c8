from pathlib import Path


def settings():
    pairs = []
    for line in Path("/opt/billing/.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def test_each_key_once():
    keys = [k for k, _ in settings()]
    assert len(keys) == len(set(keys)), keys


def test_requested_values():
    values = dict(settings())
    assert values["PORT"] == "8080"
    assert values["LOG_LEVEL"] == "debug"
    assert values["FEATURE_INVOICES"] == "on"


def test_other_settings_kept():
    values = dict(settings())
    assert values["APP_NAME"] == "billing"
    assert values["DATABASE_URL"] == "postgres://billing@db:5432/billing?sslmode=disable"
    assert values["SUPPORT_PORT"] == "3001"

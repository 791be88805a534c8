import subprocess
from pathlib import Path

SOURCE = Path("/opt/src/wordstats/wordstats/__init__.py")


def python(code):
    return subprocess.run(["python3", "-c", code], cwd="/tmp", capture_output=True, text=True)


def test_the_module_imports_from_anywhere():
    result = python("import wordstats; print(wordstats.count_words('one two three'))")
    assert result.stdout.strip() == "3", result.stderr


def test_the_command_is_on_the_path():
    result = subprocess.run(["wordstats"], input="a b c d\n", capture_output=True, text=True, cwd="/tmp")
    assert result.stdout.strip() == "4", result.stderr


def test_edits_take_effect_without_reinstalling():
    original = SOURCE.read_text()
    try:
        SOURCE.write_text(original.replace('GREETING = "wordstats"', 'GREETING = "edited"'))
        assert python("import wordstats; print(wordstats.GREETING)").stdout.strip() == "edited"
    finally:
        SOURCE.write_text(original)

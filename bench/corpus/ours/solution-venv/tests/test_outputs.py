import os
import subprocess


def test_the_tool_lives_in_its_own_venv():
    assert os.path.isfile("/opt/wordfreq-venv/pyvenv.cfg")
    assert os.path.realpath("/usr/local/bin/wordfreq") == "/opt/wordfreq-venv/bin/wordfreq"


def test_wordfreq_counts_words(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat and the dog and the bird\n")
    result = subprocess.run(["wordfreq", str(text)], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["the 3", "and 2", "cat 1"]

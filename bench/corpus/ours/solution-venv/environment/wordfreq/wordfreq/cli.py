"""`wordfreq FILE`: the three most frequent words of FILE, one `word count` per line."""

import collections
import re
import sys


def main() -> None:
    words = re.findall(r"[a-z']+", open(sys.argv[1]).read().lower())
    for word, count in collections.Counter(words).most_common(3):
        print(word, count)
